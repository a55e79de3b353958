package node

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	nadv1 "kvnet.io/kvnet/api/k8scni/v1"
	kubevirtv1 "kvnet.io/kvnet/api/kubevirt/v1"
	"kvnet.io/kvnet/internal/physnet"
	"kvnet.io/kvnet/internal/podnetworks"
	"kvnet.io/kvnet/internal/portalias"
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

// TestDesiredDHCPv6Secondary checks which secondary networks get IPv6 for
// their guests: a Layer2 secondary network with an IPv6 subnet gets a
// router that advertises no default route and serves DHCPv6 only (no
// DHCPv4: KubeVirt's bridge binding serves that), an IPv4-only one and a
// localnet one get neither, and the primary network's advertisements
// still name its gateway the default router.
func TestDesiredDHCPv6Secondary(t *testing.T) {
	primary := primaryNAD("a", "7")
	dual := nad("a", "dual", `{"cniVersion":"1.1.0","type":"kvnet-cni","name":"a_dual","netAttachDefName":"a/dual","topology":"layer2","role":"secondary","subnets":"10.9.0.0/24,fd10:9::/64"}`, "9")
	v4 := nad("a", "v4", `{"cniVersion":"1.1.0","type":"kvnet-cni","name":"a_v4","netAttachDefName":"a/v4","topology":"layer2","role":"secondary","subnets":"10.10.0.0/24"}`, "10")
	ln := nad("a", "ln", `{"cniVersion":"1.1.0","type":"kvnet-cni","name":"a_ln","netAttachDefName":"a/ln","topology":"localnet","role":"secondary","subnets":"fd11::/64","physicalNetworkName":"physnet"}`, "11")
	vm := pod("a", "vm", "n1", "10.1.1.5", "0a:58:0a:01:01:05", time.Hour)
	vm.Annotations[podnetworks.Annotation] = `{` +
		`"a/udn":{"ip_addresses":["10.1.1.5/24"],"mac_address":"0a:58:0a:01:01:05","gateway_ips":["10.1.1.1"],"role":"primary","network":"a_udn"},` +
		`"a/dual":{"ip_addresses":["10.9.0.5/24","fd10:9::5/64"],"mac_address":"0a:58:0a:09:00:05","role":"secondary","network":"a_dual"},` +
		`"a/v4":{"ip_addresses":["10.10.0.5/24"],"mac_address":"0a:58:0a:0a:00:05","role":"secondary","network":"a_v4"},` +
		`"a/ln":{"ip_addresses":["fd11::5/64"],"mac_address":"0a:58:0a:0b:00:05","role":"secondary","network":"a_ln"}}`
	self := kvnode("n1", "192.168.100.1")
	self.Annotations[physnet.BridgeMappingsAnnotation] = "physnet:br-phys"
	lk := map[string]string{}
	for i, n := range []string{"a/udn", "a/dual", "a/v4", "a/ln"} {
		lk[portalias.Format("a/vm", n)] = fmt.Sprintf("kvp%d", i)
	}
	plan := Desired(Input{
		Node:  "n1",
		NADs:  []nadv1.NetworkAttachmentDefinition{primary, dual, v4, ln},
		Pods:  []corev1.Pod{vm},
		Nodes: []corev1.Node{self},
		Links: lk,
		MTU:   1450,
		DNS:   []netip.Addr{netip.MustParseAddr("2001:db8:53::53")},
	})
	if len(plan.Problems) != 0 || len(plan.Unserved) != 0 {
		t.Fatalf("problems %v, unserved %v", plan.Problems, plan.Unserved)
	}
	byNet := map[string]DHCPNetwork{}
	for _, d := range plan.DHCP {
		byNet[d.Network] = d
	}
	if len(byNet) != 2 {
		t.Errorf("DHCP on %d networks %v, want a_udn and a_dual", len(byNet), plan.DHCP)
	}
	if p := byNet["a_udn"]; !p.DefaultRouter || p.ServerIP.String() != "10.1.1.1" {
		t.Errorf("primary network's DHCP %+v: want DHCPv4 from 10.1.1.1 and the gateway as default router", p)
	}
	d, ok := byNet["a_dual"]
	if !ok || d.DefaultRouter || d.ServerIP.IsValid() || fmt.Sprint(d.Prefixes6) != "[fd10:9::/64]" {
		t.Errorf("dual-stack secondary network's DHCP %+v: want IPv6 on fd10:9::/64 only, no default router", d)
	}
	if l, ok := d.Leases["0a:58:0a:09:00:05"]; !ok || l.IP6.String() != "fd10:9::5" {
		t.Errorf("secondary lease %+v (found %v), want fd10:9::5", l, ok)
	}
	routers := map[string]bool{}
	for _, n := range plan.State.Networks {
		routers[n.Name] = n.HasRouter()
	}
	if want := map[string]bool{"a_udn": true, "a_dual": true, "a_v4": false, "a_ln": false}; fmt.Sprint(routers) != fmt.Sprint(want) {
		t.Errorf("networks with a router %v, want %v", routers, want)
	}
}

// recordedEvent is one event of eventLog.
type recordedEvent struct {
	regarding, related string // kind namespace/name
	typ, reason, note  string
}

// eventLog is an events.EventRecorder that keeps what it is given.
type eventLog chan recordedEvent

func (l eventLog) Eventf(regarding, related runtime.Object, typ, reason, _, note string, args ...any) {
	name := func(o runtime.Object) string {
		if o == nil {
			return ""
		}
		m := o.(metav1.Object)
		return fmt.Sprintf("%T %s/%s", o, m.GetNamespace(), m.GetName())
	}
	l <- recordedEvent{name(regarding), name(related), typ, reason, fmt.Sprintf(note, args...)}
}

// TestDeclineReporter: a guest's Decline becomes a Warning event on its
// VMI, related to its IPAMClaim, when its pod is a virt-launcher pod;
// on the pod otherwise; and on nothing when no local pod has the MAC.
func TestDeclineReporter(t *testing.T) {
	scheme, err := newScheme()
	if err != nil {
		t.Fatal(err)
	}
	launcher := pod("a", "virt-launcher-vm1-x", "n1", "", "", time.Hour)
	launcher.Annotations[kubevirtv1.DomainAnnotation] = "vm1"
	launcher.Annotations[podnetworks.Annotation] = `{"a/udn":{"ip_addresses":["2001:db8::5/64"],"mac_address":"0a:58:0a:01:01:05","role":"primary","network":"a_udn","ipam_claim":"vm1.udn"}}`
	plain := pod("b", "web", "n1", "", "", time.Hour)
	plain.Annotations[podnetworks.Annotation] = `{"b/udn":{"ip_addresses":["2001:db9::7/64"],"mac_address":"0a:58:0a:01:01:07","role":"primary","network":"b_udn"}}`
	elsewhere := pod("b", "far", "n2", "", "", time.Hour)
	elsewhere.Annotations[podnetworks.Annotation] = `{"b/udn":{"ip_addresses":["2001:db9::8/64"],"mac_address":"0a:58:0a:01:01:08","role":"primary","network":"b_udn"}}`
	vmi := &kubevirtv1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "vm1"}}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(&launcher, &plain, &elsewhere, vmi).Build()
	events := make(eventLog, 10)
	report := newDeclineReporter(context.Background(), c, events, "n1")
	mac := func(s string) net.HardwareAddr { m, _ := net.ParseMAC(s); return m }

	report("a_udn", mac("0a:58:0a:01:01:05"), netip.MustParseAddr("2001:db8::5"))
	e := <-events
	if e.regarding != "*v1.VirtualMachineInstance a/vm1" || e.related != "*v1alpha1.IPAMClaim a/vm1.udn" || e.typ != corev1.EventTypeWarning || e.reason != EventDHCPv6AddressDeclined || !strings.Contains(e.note, "2001:db8::5") {
		t.Errorf("event %+v: want a Warning %s on VMI a/vm1 related to IPAMClaim a/vm1.udn naming 2001:db8::5", e, EventDHCPv6AddressDeclined)
	}
	report("b_udn", mac("0a:58:0a:01:01:07"), netip.MustParseAddr("2001:db9::7"))
	if e := <-events; e.regarding != "*v1.Pod b/web" || e.related != "" {
		t.Errorf("event %+v: want one on pod b/web", e)
	}
	// Not this node's pod, and not the pod's network: no event (the
	// reporter logs it); a later report still gets through.
	report("b_udn", mac("0a:58:0a:01:01:08"), netip.MustParseAddr("2001:db9::8"))
	report("a_udn", mac("0a:58:0a:01:01:07"), netip.MustParseAddr("2001:db9::7"))
	report("b_udn", mac("0a:58:0a:01:01:07"), netip.MustParseAddr("2001:db9::7"))
	if e := <-events; e.regarding != "*v1.Pod b/web" {
		t.Errorf("event %+v: want only the one on pod b/web", e)
	}
	select {
	case e := <-events:
		t.Errorf("unexpected event %+v", e)
	default:
	}
}
