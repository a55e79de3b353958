package dynamic_test

import (
	"context"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nadv1 "kvnet.io/kvnet/api/k8scni/v1"
	"kvnet.io/kvnet/internal/hostsubnet"
	"kvnet.io/kvnet/internal/k8s/controllers/hostsubnets"
	"kvnet.io/kvnet/internal/k8s/manager"
	"kvnet.io/kvnet/internal/multus"
	"kvnet.io/kvnet/internal/podnetworks"
	"kvnet.io/kvnet/internal/testenv"
)

var (
	env *testenv.Env
	c   client.Client
	ctl *testenv.Controller
)

// grace is short so that the test sees subnets released.
const grace = 3 * time.Second

func TestMain(m *testing.M) {
	flag.Parse()
	os.Exit(testenv.Main(m, testenv.Options{}, func(e *testenv.Env) (manager.Options, error) {
		c = e.Client
		return manager.Options{DynamicHostSubnets: true, HostSubnetGrace: grace}, nil
	}, &env, &ctl))
}

const network = "dy-tenant_l3"

// held returns what each named node holds of network.
func held(t *testing.T, names ...string) map[string][]netip.Prefix {
	t.Helper()
	out := map[string][]netip.Prefix{}
	for _, name := range names {
		var n corev1.Node
		if err := c.Get(context.Background(), client.ObjectKey{Name: name}, &n); err != nil {
			t.Fatal(err)
		}
		if v, ok := n.Annotations[hostsubnets.Annotation]; ok {
			s, err := hostsubnet.Parse(v)
			if err != nil {
				t.Fatal(err)
			}
			out[name] = s[network]
		} else {
			out[name] = nil
		}
	}
	return out
}

func pod(name, node string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "dy-tenant", Name: name,
			Annotations: map[string]string{multus.NetworksAnnotation: "l3"}},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "busybox"}}},
	}
}

// Only the nodes that run pods of a Layer3 network hold its host
// subnets; a pod gets its address from its node's; a node whose last pod
// ended or went loses them after the grace period, and the next node
// needing one gets the freed subnet.
func TestDynamicHostSubnets(t *testing.T) {
	ctx := context.Background()
	nodes := []string{"dy-a", "dy-b", "dy-c"}
	for _, name := range nodes {
		testenv.Create(t, c, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}})
	}
	testenv.Create(t, c, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "dy-tenant"}})
	testenv.Create(t, c, &nadv1.NetworkAttachmentDefinition{
		ObjectMeta: metav1.ObjectMeta{Namespace: "dy-tenant", Name: "l3"},
		Spec: nadv1.NetworkAttachmentDefinitionSpec{Config: `{"cniVersion":"1.1.0","type":"kvnet-cni","name":"` + network +
			`","netAttachDefName":"dy-tenant/l3","topology":"layer3","role":"secondary","subnets":"10.110.0.0/16/24"}`},
	})

	// A pod on dy-a: dy-a gets a host subnet, in the same pass as the
	// others are planned without one, and the pod an address from it.
	p1 := pod("p1", "dy-a")
	testenv.Create(t, c, p1)
	var aSubnet netip.Prefix
	testenv.Eventually(t, 30*time.Second, "dy-a holds a host subnet and p1 an address in it", func() error {
		h := held(t, nodes...)
		if len(h["dy-a"]) != 1 {
			return fmt.Errorf("dy-a holds %v", h["dy-a"])
		}
		if len(h["dy-b"]) != 0 || len(h["dy-c"]) != 0 {
			t.Fatalf("nodes without pods of the network hold host subnets: %v", h)
		}
		aSubnet = h["dy-a"][0]
		return addressIn(p1, aSubnet)
	})

	// A pod on dy-b that then fails: dy-b holds a subnet while it runs
	// and loses it once the pod ended and the grace passed.
	p2 := pod("p2", "dy-b")
	testenv.Create(t, c, p2)
	testenv.Eventually(t, 30*time.Second, "dy-b holds a host subnet", func() error {
		if h := held(t, "dy-b"); len(h["dy-b"]) != 1 {
			return fmt.Errorf("dy-b holds %v", h["dy-b"])
		}
		return nil
	})
	// The allocator writes p2 too: read it again on a conflict.
	testenv.Eventually(t, 30*time.Second, "p2 marked failed", func() error {
		var cur corev1.Pod
		if err := c.Get(ctx, client.ObjectKeyFromObject(p2), &cur); err != nil {
			return err
		}
		cur.Status.Phase = corev1.PodFailed
		return c.Status().Update(ctx, &cur)
	})
	released(t, "dy-b")

	// A restarted controller finds dy-a's subnet held and in use: kept.
	// (No kubelet here ends a pod's graceful deletion: force it.)
	ctl.Restart(t)
	if err := c.Delete(ctx, p1, client.GracePeriodSeconds(0)); err != nil {
		t.Fatal(err)
	}
	released(t, "dy-a")

	// The freed subnet, the lowest, goes to the next node needing one.
	p3 := pod("p3", "dy-c")
	testenv.Create(t, c, p3)
	testenv.Eventually(t, 30*time.Second, "dy-c holds the freed host subnet", func() error {
		if h := held(t, "dy-c"); len(h["dy-c"]) != 1 || h["dy-c"][0] != aSubnet {
			return fmt.Errorf("dy-c holds %v, want the freed %s", h["dy-c"], aSubnet)
		}
		return addressIn(p3, aSubnet)
	})
}

// released waits until node no longer holds the network.
func released(t *testing.T, node string) {
	t.Helper()
	testenv.Eventually(t, 30*time.Second, node+" releases its host subnet", func() error {
		if h := held(t, node); len(h[node]) != 0 {
			return fmt.Errorf("%s still holds %v", node, h[node])
		}
		return nil
	})
}

// addressIn checks that pod's attachment to the network has an address
// inside subnet.
func addressIn(p *corev1.Pod, subnet netip.Prefix) error {
	var cur corev1.Pod
	if err := c.Get(context.Background(), client.ObjectKeyFromObject(p), &cur); err != nil {
		return err
	}
	v, ok := cur.Annotations[podnetworks.Annotation]
	if !ok {
		return fmt.Errorf("pod %s not allocated yet", p.Name)
	}
	nets, err := podnetworks.Parse(v)
	if err != nil {
		return err
	}
	a, ok := nets["dy-tenant/l3"]
	if !ok || len(a.IPAddresses) != 1 {
		return fmt.Errorf("pod %s: attachment %+v", p.Name, a)
	}
	ip, err := netip.ParsePrefix(a.IPAddresses[0])
	if err != nil || !subnet.Contains(ip.Addr()) {
		return fmt.Errorf("pod %s has %s, want an address in its node's %s (%v)", p.Name, a.IPAddresses[0], subnet, err)
	}
	return nil
}
