package ipam_test

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nadv1 "kvnet.io/kvnet/api/k8scni/v1"
	udnv1 "kvnet.io/kvnet/api/udn/v1"
	"kvnet.io/kvnet/internal/hostsubnet"
	"kvnet.io/kvnet/internal/testenv"
)

// hostSubnetOf waits for node's host subnets of network and returns them.
func hostSubnetOf(t testing.TB, node, network string) []netip.Prefix {
	t.Helper()
	var out []netip.Prefix
	testenv.Eventually(t, 30*time.Second, "host subnet of "+node, func() error {
		var n corev1.Node
		if err := c.Get(context.Background(), client.ObjectKey{Name: node}, &n); err != nil {
			return err
		}
		all, err := hostsubnet.Parse(n.Annotations[hostsubnet.Annotation])
		if err != nil {
			return err
		}
		if out = all[network]; len(out) == 0 {
			return fmt.Errorf("node %s: no host subnet of %s in %v", node, network, all)
		}
		return nil
	})
	return out
}

// TestLayer3PodsFromTheirNodesSubnet: on a primary Layer3 UDN, every pod
// gets its addresses from its node's host subnet, with the node's router
// (the host subnet's first address) as gateway and default route; the
// router and the next address are never handed out; a pod on a node
// without host subnets gets a clear event; after a controller restart new
// pods never get an address already held.
func TestLayer3PodsFromTheirNodesSubnet(t *testing.T) {
	const ns, network = "layer3", "layer3_l3"
	for _, n := range []string{"l3-n1", "l3-n2"} {
		create(t, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}})
	}
	mkNS(t, ns, true)
	create(t, &udnv1.UserDefinedNetwork{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "l3"},
		Spec: udnv1.UserDefinedNetworkSpec{Topology: udnv1.NetworkTopologyLayer3,
			Layer3: &udnv1.Layer3Config{Role: udnv1.NetworkRolePrimary,
				Subnets: []udnv1.Layer3Subnet{{CIDR: "10.60.0.0/16", HostSubnet: 24}, {CIDR: "fd60::/48"}}}},
	})
	testenv.Eventually(t, 30*time.Second, "NAD", func() error {
		return c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "l3"}, &nadv1.NetworkAttachmentDefinition{})
	})
	subnets := map[string][]netip.Prefix{
		"l3-n1": hostSubnetOf(t, "l3-n1", network),
		"l3-n2": hostSubnetOf(t, "l3-n2", network),
	}
	if subnets["l3-n1"][0] == subnets["l3-n2"][0] || subnets["l3-n1"][1] == subnets["l3-n2"][1] {
		t.Fatalf("nodes share host subnets: %v", subnets)
	}
	seen := map[string]string{} // IP -> pod
	check := func(pod, node string) {
		t.Helper()
		a, ok := waitAnnotated(t, ns, pod)[ns+"/l3"]
		if !ok || len(a.IPAddresses) != 2 {
			t.Fatalf("pod %s: attachment %+v", pod, a)
		}
		for i, s := range a.IPAddresses {
			p := netip.MustParsePrefix(s)
			hs := subnets[node][i]
			if p.Bits() != hs.Bits() || !hs.Contains(p.Addr()) {
				t.Errorf("pod %s on %s: %s outside its node's host subnet %s", pod, node, p, hs)
			}
			if gw := hostsubnet.Gateway(hs); p.Addr() == gw || p.Addr() == gw.Next() {
				t.Errorf("pod %s: got the router's or the reserved address %s", pod, p)
			}
			if other, dup := seen[p.Addr().String()]; dup {
				t.Errorf("pods %s and %s both hold %s", pod, other, p.Addr())
			}
			seen[p.Addr().String()] = pod
			if a.GatewayIPs[i] != hostsubnet.Gateway(hs).String() || a.Routes[i].NextHop != a.GatewayIPs[i] {
				t.Errorf("pod %s: gateways %v routes %+v, want the node router %s", pod, a.GatewayIPs, a.Routes, hostsubnet.Gateway(hs))
			}
		}
		if a.Routes[0].Dest != "0.0.0.0/0" || a.Routes[1].Dest != "::/0" {
			t.Errorf("pod %s: routes %+v, want default routes", pod, a.Routes)
		}
	}
	onNode := func(name, node string) *corev1.Pod {
		p := mkPod(ns, name, nil)
		p.Spec.NodeName = node
		return p
	}
	for i := range 3 {
		create(t, onNode(fmt.Sprintf("a%d", i), "l3-n1"))
		create(t, onNode(fmt.Sprintf("b%d", i), "l3-n2"))
	}
	for i := range 3 {
		check(fmt.Sprintf("a%d", i), "l3-n1")
		check(fmt.Sprintf("b%d", i), "l3-n2")
	}

	create(t, onNode("ghost", "l3-missing-node"))
	waitEvent(t, ns, "ghost", "IPAllocationFailed", `no host subnet of layer3 network "layer3_l3": node l3-missing-node not found`)

	ctl.Restart(t)
	for i := 3; i < 6; i++ {
		create(t, onNode(fmt.Sprintf("a%d", i), "l3-n1"))
	}
	for i := 3; i < 6; i++ {
		check(fmt.Sprintf("a%d", i), "l3-n1")
	}
}
