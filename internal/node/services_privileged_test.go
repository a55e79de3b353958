package node_test

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"kvnet.io/kvnet/internal/testenv"
	"kvnet.io/kvnet/internal/testenv/nstest"
)

// running marks pod p Running and Ready, as its kubelet would.
func running(t *testing.T, p *pod) {
	t.Helper()
	var obj corev1.Pod
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: p.ns, Name: p.name}, &obj); err != nil {
		t.Fatal(err)
	}
	obj.Status.Phase = corev1.PodRunning
	obj.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	if err := c.Status().Update(context.Background(), &obj); err != nil {
		t.Fatal(err)
	}
}

func labelled(app string) func(*corev1.Pod) {
	return func(p *corev1.Pod) { p.Labels["app"] = app }
}

// TestAgentServices: a NodePort Service in a namespace on a primary UDN
// reaches the pods it selects on their UDN addresses, at its cluster IP
// from a pod of the UDN on either node and at its node port from either
// node, spread over both endpoints; a pod that is not Ready gets no
// traffic; another tenant gets nothing, by cluster IP or node port; a pod
// that goes stops getting traffic.
func TestAgentServices(t *testing.T) {
	l := newLab(t, "n1", "n2")
	nad := tenant(t, "svc-a", "10.8.0.0/24", false)
	e1 := l.runPod(nad, "e1", "n1", labelled("web"))
	e2 := l.runPod(nad, "e2", "n2", labelled("web"))
	idle := l.runPod(nad, "idle", "n2", labelled("web")) // never Ready
	client1 := l.runPod(nad, "c1", "n1", nil)
	for _, p := range []*pod{e1, e2, idle} {
		serveToken(t, p)
	}
	running(t, e1)
	running(t, e2)
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "svc-a", Name: "web"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort, Selector: map[string]string{"app": "web"},
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(tokenPort)}}},
	}
	testenv.Create(t, c, svc)
	if svc.Spec.ClusterIP == "" {
		t.Fatal("the API server gave the Service no cluster IP")
	}
	vip := net.JoinHostPort(svc.Spec.ClusterIP, "80")
	n1, err := l.Node("n1")
	if err != nil {
		t.Fatal(err)
	}
	nodePort := net.JoinHostPort(n1.IP.String(), fmt.Sprint(svc.Spec.Ports[0].NodePort))
	type client struct{ name, ns, addr string }
	clients := []client{{client1.name, client1.netns, vip}, {e2.name, e2.netns, vip}}
	for _, n := range []string{"n1", "n2"} {
		nd, err := l.Node(n)
		if err != nil {
			t.Fatal(err)
		}
		clients = append(clients, client{"node " + n, nd.NS, nodePort})
	}
	for _, from := range clients {
		seen := map[string]int{}
		testenv.Eventually(t, waitTimeout, from.name+" reaches both endpoints through "+from.addr, func() error {
			token, err := nstest.ReadLine(from.ns, from.addr, 2*time.Second)
			if err != nil {
				return err
			}
			seen[token]++
			if seen["e1"] == 0 || seen["e2"] == 0 {
				return fmt.Errorf("answered so far: %v", seen)
			}
			return nil
		})
		if seen["idle"] != 0 {
			t.Errorf("a pod that is not Ready answered: %v", seen)
		}
	}

	other := tenant(t, "svc-b", "10.8.0.0/24", false)
	b := l.runPod(other, "b1", "n1", nil)
	// b1 is attached (it reaches its own gateway), so what it does not
	// reach below is isolation, not a port still down.
	mustReach(t, b, "10.8.0.1")
	for range 3 {
		for _, addr := range []string{vip, nodePort} {
			if token, err := tokenAt(b, addr); err == nil {
				t.Fatalf("another tenant reached the service at %s: answered by %q", addr, token)
			}
		}
	}

	l.deletePod(nad, e2)
	testenv.Eventually(t, waitTimeout, "only e1 answers once e2 is gone", func() error {
		for range 6 {
			token, err := tokenAt(client1, vip)
			if err != nil {
				return err
			}
			if token != "e1" {
				return fmt.Errorf("answered by %q", token)
			}
		}
		return nil
	})
}
