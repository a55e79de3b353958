package node

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	nadv1 "kvnet.io/kvnet/api/k8scni/v1"
	"kvnet.io/kvnet/internal/podnetworks"
)

// TestDesiredDHCPv6 checks what the DHCP servers of a dual-stack and of an
// IPv6-only primary network get: the IPv6 subnets to advertise, the MTU,
// and leases with the pod's IPv6 address and IPv6 DNS servers.
func TestDesiredDHCPv6(t *testing.T) {
	dualNAD := nad("a", "udn", `{"cniVersion":"1.1.0","type":"kvnet-cni","name":"a_udn","netAttachDefName":"a/udn","topology":"layer2","role":"primary","subnets":"10.1.1.0/24,2001:db8::/60","mtu":1400}`, "7")
	v6NAD := nad("b", "udn", `{"cniVersion":"1.1.0","type":"kvnet-cni","name":"b_udn","netAttachDefName":"b/udn","topology":"layer2","role":"primary","subnets":"2001:db9::/64"}`, "8")
	dual := pod("a", "vm-a", "n1", "10.1.1.5", "0a:58:0a:01:01:05", time.Hour)
	dual.Annotations[podnetworks.Annotation] = `{"a/udn":{"ip_addresses":["10.1.1.5/24","2001:db8::5/60"],"mac_address":"0a:58:0a:01:01:05","gateway_ips":["10.1.1.1","2001:db8::1"],"role":"primary","network":"a_udn"}}`
	v6 := pod("b", "vm-b", "n1", "", "", time.Hour)
	v6.Annotations[podnetworks.Annotation] = `{"b/udn":{"ip_addresses":["2001:db9::7/64"],"mac_address":"0a:58:0a:01:01:07","gateway_ips":["2001:db9::1"],"role":"primary","network":"b_udn"}}`
	in := Input{
		Node:  "n1",
		NADs:  []nadv1.NetworkAttachmentDefinition{dualNAD, v6NAD},
		Pods:  []corev1.Pod{dual, v6},
		Nodes: []corev1.Node{kvnode("n1", "192.168.100.1")},
		Links: links(dual, v6),
		MTU:   1450,
		DNS:   []netip.Addr{netip.MustParseAddr("192.0.2.53"), netip.MustParseAddr("2001:db8:53::53")},
	}
	plan := Desired(in)
	if len(plan.Problems) != 0 {
		t.Fatalf("problems: %v", plan.Problems)
	}
	byNet := map[string]DHCPNetwork{}
	for _, d := range plan.DHCP {
		byNet[d.Network] = d
	}
	a, b := byNet["a_udn"], byNet["b_udn"]
	if a.ServerIP.String() != "10.1.1.1" || fmt.Sprint(a.Prefixes6) != "[2001:db8::/60]" || a.MTU != 1400 {
		t.Errorf("dual-stack network's DHCP %+v: want DHCPv4 from 10.1.1.1, IPv6 on 2001:db8::/60, MTU 1400", a)
	}
	if l := a.Leases["0a:58:0a:01:01:05"]; l.IP.String() != "10.1.1.5/24" || l.IP6.String() != "2001:db8::5" || fmt.Sprint(l.DNS) != "[192.0.2.53 2001:db8:53::53]" {
		t.Errorf("dual-stack lease %+v", l)
	}
	if b.ServerIP.IsValid() || fmt.Sprint(b.Prefixes6) != "[2001:db9::/64]" || b.MTU != 1450 {
		t.Errorf("IPv6-only network's DHCP %+v: want no DHCPv4, IPv6 on 2001:db9::/64, the node's MTU", b)
	}
	if l, ok := b.Leases["0a:58:0a:01:01:07"]; !ok || l.IP.IsValid() || l.IP6.String() != "2001:db9::7" {
		t.Errorf("IPv6-only lease %+v (found %v)", l, ok)
	}
}

func TestGuestDNS(t *testing.T) {
	addrs := func(s ...string) []netip.Addr {
		var out []netip.Addr
		for _, a := range s {
			out = append(out, netip.MustParseAddr(a))
		}
		return out
	}
	node := addrs("192.0.2.53", "2001:db8::53")
	for _, tc := range []struct {
		cluster []netip.Addr
		want    string
	}{
		{nil, "[192.0.2.53 2001:db8::53]"},
		{addrs("10.96.0.10"), "[10.96.0.10 2001:db8::53]"},
		{addrs("10.96.0.10", "fd00:96::a"), "[10.96.0.10 fd00:96::a]"},
		{addrs("fd00:96::a"), "[192.0.2.53 fd00:96::a]"},
	} {
		if got := fmt.Sprint(guestDNS(tc.cluster, node)); got != tc.want {
			t.Errorf("guestDNS(%v, %v) = %s, want %s", tc.cluster, node, got, tc.want)
		}
	}
}
