package node_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"kvnet.io/kvnet/internal/testenv"
	"kvnet.io/kvnet/internal/testenv/nstest"
)

// TestAgentNetworkPolicyService: policies apply to connections through a
// Service as Kubernetes defines them, on the endpoints the Service
// translates to and the clients themselves: an ingress policy admitting
// clients by label admits them through the cluster IP from either node
// and refuses the others; an egress policy allowing a client only the
// endpoints by label lets it reach them through the cluster IP and
// refuses it another Service (and that Service's endpoint directly),
// which it reached before; an update that no longer admits a client cuts
// its open connection through the cluster IP.
func TestAgentNetworkPolicyService(t *testing.T) {
	l := newLab(t, "n1", "n2")
	const ns = "nps"
	nad := tenant(t, ns, "10.62.0.0/24", false)
	e1 := l.runPod(nad, "e1", "n1", labelled("web"))
	e2 := l.runPod(nad, "e2", "n2", labelled("web"))
	role := func(r string) func(*corev1.Pod) { return func(p *corev1.Pod) { p.Labels["role"] = r } }
	near := l.runPod(nad, "near", "n1", role("client")) // a client on an endpoint's node
	far := l.runPod(nad, "far", "n2", role("client"))
	other := l.runPod(nad, "other", "n1", role("other"))
	for _, p := range []*pod{e1, e2} {
		serveToken(t, p)
		nstest.Serve(nstest.Listen(t, p.netns, ":82"), func(conn net.Conn) { _, _ = io.Copy(conn, conn) })
		running(t, p)
	}
	// other is the endpoint of another Service, which the clients'
	// egress policy below does not allow.
	serveToken(t, other)
	running(t, other)
	otherSvc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "other"},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"role": "other"}, Ports: []corev1.ServicePort{
			{Name: "token", Port: 80, TargetPort: intstr.FromInt32(tokenPort)},
		}},
	}
	testenv.Create(t, c, otherSvc)
	otherVIP := net.JoinHostPort(otherSvc.Spec.ClusterIP, "80")
	otherDirect := net.JoinHostPort(other.ip(), fmt.Sprint(tokenPort))
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web"},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "web"}, Ports: []corev1.ServicePort{
			{Name: "token", Port: 80, TargetPort: intstr.FromInt32(tokenPort)},
			{Name: "echo", Port: 82, TargetPort: intstr.FromInt32(82)},
		}},
	}
	testenv.Create(t, c, svc)
	vip := net.JoinHostPort(svc.Spec.ClusterIP, "80")
	reachesBoth := func(from *pod) func() error {
		seen := map[string]int{}
		return func() error {
			token, err := tokenAt(from, vip)
			if err != nil {
				return err
			}
			seen[token]++
			if seen["e1"] == 0 || seen["e2"] == 0 {
				return fmt.Errorf("answered so far: %v", seen)
			}
			return nil
		}
	}
	refusedAt := func(from *pod, addr string) error {
		for range 4 {
			if token, err := tokenAt(from, addr); err == nil {
				return fmt.Errorf("%s reached %s: answered by %s", from.name, addr, token)
			}
		}
		return nil
	}
	refused := func(from *pod) error { return refusedAt(from, vip) }
	reaches := func(from *pod, addr, want string) func() error {
		return func() error {
			token, err := tokenAt(from, addr)
			if err == nil && token != want {
				err = fmt.Errorf("answered by %s, want %s", token, want)
			}
			return err
		}
	}
	for _, p := range []*pod{near, far, other} {
		testenv.Eventually(t, waitTimeout, p.name+" reaches both endpoints before any policy", reachesBoth(p))
	}
	for _, p := range []*pod{near, far} {
		testenv.Eventually(t, waitTimeout, p.name+" reaches the other Service before any policy", reaches(p, otherVIP, other.name))
		testenv.Eventually(t, waitTimeout, p.name+" reaches other directly before any policy", reaches(p, otherDirect, other.name))
	}

	// The endpoints admit clients only.
	np := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web-from-clients"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: *labels("app", "web"),
			Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{PodSelector: labels("role", "client")}},
				Ports: []networkingv1.NetworkPolicyPort{npPort("TCP", intstr.FromInt32(tokenPort), 0), npPort("TCP", intstr.FromInt32(82), 0)}}},
		}}
	testenv.Create(t, c, np)
	testenv.Eventually(t, waitTimeout, "other refused through the cluster IP", func() error { return refused(other) })
	for _, p := range []*pod{near, far} {
		testenv.Eventually(t, waitTimeout, p.name+" reaches both endpoints through the cluster IP under the ingress policy", reachesBoth(p))
	}

	// The clients may only open connections to the endpoints: the
	// cluster IP translates to them; the other Service's does not.
	egress := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "clients-to-web"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: *labels("role", "client"),
			PolicyTypes: egressOnly,
			Egress:      []networkingv1.NetworkPolicyEgressRule{{To: []networkingv1.NetworkPolicyPeer{{PodSelector: labels("app", "web")}}}},
		}}
	testenv.Create(t, c, egress)
	for _, p := range []*pod{near, far} {
		waitEgressApplied(t, l, p)
	}
	for _, p := range []*pod{near, far} {
		testenv.Eventually(t, waitTimeout, p.name+" reaches both endpoints through the cluster IP under its egress policy", reachesBoth(p))
		if err := refusedAt(p, otherVIP); err != nil {
			t.Errorf("under its egress policy: %v", err)
		}
		if err := refusedAt(p, otherDirect); err != nil {
			t.Errorf("under its egress policy: %v", err)
		}
	}
	if err := refused(other); err != nil {
		t.Error(err)
	}

	// An open connection through the cluster IP is cut when the policy
	// stops admitting its client.
	roundTrip := echoConn(t, far.netns, net.JoinHostPort(svc.Spec.ClusterIP, "82"))
	if err := roundTrip(); err != nil {
		t.Fatalf("far's connection through the cluster IP: %v", err)
	}
	np.Spec.Ingress[0].From[0].PodSelector = labels("role", "other")
	if err := c.Update(context.Background(), np); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, waitTimeout, "other admitted after the update", reachesBoth(other))
	waitRefused(t, l, far, 82, e1, e2)
	if err := roundTrip(); err == nil {
		t.Error("far's open connection through the cluster IP survived the update that no longer admits it")
	}
	if err := refused(far); err != nil {
		t.Error(err)
	}
}

// waitEgressApplied waits until p's node has applied, without error, a
// plan isolating p's port for egress.
func waitEgressApplied(t *testing.T, l *lab, p *pod) {
	t.Helper()
	hostIf := p.hostIf(t, l)
	testenv.Eventually(t, waitTimeout, p.name+"'s egress isolated in the applied plan", func() error {
		for _, pp := range l.agent(p.node).LastApplied().State.Policies {
			if pp.Port == hostIf && pp.Egress != nil && len(pp.Egress.Policies) > 0 {
				return nil
			}
		}
		return fmt.Errorf("no egress policy applied on %s's port %s", p.node, hostIf)
	})
}
