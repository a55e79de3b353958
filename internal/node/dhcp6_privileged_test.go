package node_test

import (
	"context"
	"fmt"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nadv1 "kvnet.io/kvnet/api/k8scni/v1"
	ipamclaimv1alpha1 "kvnet.io/kvnet/api/k8scni/v1alpha1"
	kubevirtv1 "kvnet.io/kvnet/api/kubevirt/v1"
	udnv1 "kvnet.io/kvnet/api/udn/v1"
	"kvnet.io/kvnet/internal/lab/simcluster"
	"kvnet.io/kvnet/internal/testenv"
	"kvnet.io/kvnet/internal/testenv/nstest"
	"kvnet.io/kvnet/internal/udn"
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

// TestAgentDHCPv6Clients: two VMs with persistent IPAMClaims on a
// dual-stack primary Layer2 UDN ask kvnet-node for IPv6, one with dhcpcd
// (the lab's guests' client), one with ISC dhclient -6 (Debian's
// isc-dhcp-client, the kernel taking the router advertisement), and each
// gets its claim's IPv6 address, the node's IPv6 DNS server and the
// default route via the network's gateway from the advertisement.
func TestAgentDHCPv6Clients(t *testing.T) {
	const dns6 = "fd53::53"
	l := newLabWith(t, env.Config, kubeconfig, func(cfg *simcluster.Config) {
		cfg.DNS = append(cfg.DNS, netip.MustParseAddr(dns6))
	}, "n1")
	const ns = "agent-v6clients"
	testenv.Create(t, c, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{udn.PrimaryNamespaceLabel: ""}}})
	testenv.Create(t, c, &udnv1.UserDefinedNetwork{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "udn"},
		Spec: udnv1.UserDefinedNetworkSpec{Topology: udnv1.NetworkTopologyLayer2, Layer2: &udnv1.Layer2Config{
			Role: udnv1.NetworkRolePrimary, Subnets: udnv1.DualStackCIDRs{"10.31.0.0/24", "fd31::/64"},
			IPAM: &udnv1.IPAMConfig{Lifecycle: udnv1.IPAMLifecyclePersistent},
		}},
	})
	var nad nadv1.NetworkAttachmentDefinition
	testenv.Eventually(t, waitTimeout, "NAD of "+ns, func() error {
		return c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "udn"}, &nad)
	})
	// vm starts VM name's launcher pod with its claim and returns the
	// pod and the claim's IPv6 address.
	vm := func(name string) (*pod, string) {
		claim := &ipamclaimv1alpha1.IPAMClaim{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name + ".udn"},
			Spec:       ipamclaimv1alpha1.IPAMClaimSpec{Network: ns + "_udn", Interface: "ovn-udn1"},
		}
		testenv.Create(t, c, claim)
		testenv.Create(t, c, &kubevirtv1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}})
		p := l.runPod(&nad, "virt-launcher-"+name, "n1", func(p *corev1.Pod) {
			p.Labels["kubevirt.io"] = "virt-launcher"
			p.Labels["vm.kubevirt.io/name"] = name
			p.Annotations[kubevirtv1.DomainAnnotation] = name
			p.Annotations["k8s.ovn.org/primary-udn-ipamclaim"] = name + ".udn"
		})
		var want string
		testenv.Eventually(t, waitTimeout, "the IPv6 address of claim "+claim.Name, func() error {
			if err := c.Get(context.Background(), client.ObjectKeyFromObject(claim), claim); err != nil {
				return err
			}
			for _, s := range claim.Status.IPs {
				if p, err := netip.ParsePrefix(s); err == nil && p.Addr().Is6() {
					want = p.Addr().String()
					return nil
				}
			}
			return fmt.Errorf("claim IPs %v", claim.Status.IPs)
		})
		if !slices.ContainsFunc(p.a.IPAddresses, func(s string) bool { return strings.HasPrefix(s, want+"/") }) {
			t.Fatalf("pod %s holds %v, not its claim's %s", p.name, p.a.IPAddresses, want)
		}
		// The guest asks: drop the IPv6 address and default route
		// kvnet-cni configured.
		if err := nstest.Exec(p.netns, "ip", "-6", "addr", "flush", "dev", "ovn-udn1", "scope", "global"); err != nil {
			t.Fatal(err)
		}
		for _, gw := range p.a.GatewayIPs {
			if netip.MustParseAddr(gw).Is6() {
				_ = nstest.Exec(p.netns, "ip", "-6", "route", "del", "default", "via", gw) // gone with the address, or not
			}
		}
		return p, want
	}
	// defaultRoute is the guest's IPv6 default route.
	defaultRoute := func(p *pod) error {
		out, err := exec.Command("nsenter", "-n"+p.netns, "ip", "-6", "route", "show", "default").CombinedOutput()
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		if f := strings.Fields(string(out)); len(f) < 3 || f[1] != "via" || !strings.HasPrefix(f[2], "fe80:") || !strings.Contains(string(out), "proto ra") || strings.Count(string(out), "default") != 1 {
			return fmt.Errorf("default route %q, want via the gateway's link-local address, from the advertisement", out)
		}
		return nil
	}

	a, wantA := vm("vm-dhcpcd")
	bound := nstest.DHCPCD6(t, a.netns, "ovn-udn1").Event(t, "BOUND6", 60*time.Second)
	if bound["ip"] != wantA || bound["dns"] != dns6 {
		t.Errorf("dhcpcd got ip %q dns %q, want the claim's %s and %s", bound["ip"], bound["dns"], wantA, dns6)
	}
	testenv.Eventually(t, waitTimeout, "dhcpcd's guest's default route", func() error { return defaultRoute(a) })

	b, wantB := vm("vm-dhclient")
	bound = nstest.DHClient6(t, b.netns, "ovn-udn1").Event(t, "BOUND6", 60*time.Second)
	if bound["ip"] != wantB || bound["dns"] != dns6 {
		t.Errorf("dhclient got ip %q dns %q, want the claim's %s and %s", bound["ip"], bound["dns"], wantB, dns6)
	}
	testenv.Eventually(t, waitTimeout, "dhclient's guest's default route", func() error { return defaultRoute(b) })
	if out, err := exec.Command("nsenter", "-n"+b.netns, "ip", "-6", "-o", "addr", "show", "dev", "ovn-udn1", "scope", "global").CombinedOutput(); err != nil || !strings.Contains(string(out), " "+wantB+"/128 ") {
		t.Errorf("dhclient's guest's addresses %q (%v), want %s/128", out, err, wantB)
	}
}
