package node_test

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nadv1 "kvnet.io/kvnet/api/k8scni/v1"
	udnv1 "kvnet.io/kvnet/api/udn/v1"
	"kvnet.io/kvnet/internal/testenv"
	"kvnet.io/kvnet/internal/testenv/nstest"
)

// TestAgentDHCPv6Secondary: a guest on a dual-stack Layer2 secondary UDN
// (KubeVirt's bridge binding, which serves the guest IPv4 only) asks for
// IPv6 with dhcpcd, as the lab's guests do, and gets its allocation's
// address from kvnet-node's DHCPv6 server, without a default route (the
// secondary network's advertisements name no default router, so the
// guest keeps its primary network's); a pod on another node then reaches
// it at that address.
func TestAgentDHCPv6Secondary(t *testing.T) {
	l := newLab(t, "n1", "n2")
	const ns = "agent-v6sec"
	testenv.Create(t, c, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	testenv.Create(t, c, &udnv1.UserDefinedNetwork{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "sec"},
		Spec: udnv1.UserDefinedNetworkSpec{Topology: udnv1.NetworkTopologyLayer2, Layer2: &udnv1.Layer2Config{
			Role: udnv1.NetworkRoleSecondary, Subnets: udnv1.DualStackCIDRs{"10.20.0.0/24", "fd20::/64"},
		}},
	})
	var nad nadv1.NetworkAttachmentDefinition
	testenv.Eventually(t, waitTimeout, "NAD of "+ns+"/sec", func() error {
		return c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "sec"}, &nad)
	})
	vm := l.runPodOn(&nad, "v6sec-vm", "n1", "net1", selecting("sec"))
	peer := l.runPodOn(&nad, "v6sec-peer", "n2", "net1", selecting("sec"))
	var want string
	for _, a := range vm.a.IPAddresses {
		if p := netip.MustParsePrefix(a); p.Addr().Is6() {
			want = p.Addr().String()
		}
	}
	if want == "" {
		t.Fatalf("the VM pod's allocation %v has no IPv6 address", vm.a.IPAddresses)
	}

	// The guest asks: drop the IPv6 address kvnet-cni configured.
	if err := nstest.Exec(vm.netns, "ip", "-6", "addr", "flush", "dev", "net1", "scope", "global"); err != nil {
		t.Fatal(err)
	}
	client6 := nstest.DHCPCD6(t, vm.netns, "net1")
	bound := client6.Event(t, "BOUND6", 30*time.Second)
	if bound["ip"] != want {
		t.Errorf("DHCPv6 gave %q, want the allocation's %s", bound["ip"], want)
	}
	if bound["route"] != "" {
		t.Errorf("the secondary network gave the guest a default route %q, want none", bound["route"])
	}
	if got := strings.Fields(bound["global"]); len(got) != 1 || !strings.HasPrefix(got[0], want+"/") {
		t.Errorf("global addresses %q, want only %s (no SLAAC)", bound["global"], want)
	}
	mustReach(t, peer, want)
}
