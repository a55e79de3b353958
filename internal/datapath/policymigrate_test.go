package datapath

import (
	"net/netip"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"kvnet.io/kvnet/internal/testenv/golden"
)

// midStreamState is goldenState with port pa1 isolated both ways: its
// ingress chain admits mid-stream TCP by its egress rules (on the source
// port), its egress chain by its ingress rules.
func midStreamState() State {
	s := goldenState()
	pp := netip.MustParsePrefix
	s.Policies = []PortPolicy{{Port: "pa1",
		Ingress: &PolicyDirection{Policies: []string{"x/in"}, Rules: []PolicyRule{
			{Name: "x/in ingress[0]", Peers: []netip.Prefix{pp("10.1.1.3/32"), pp("10.1.0.0/24")},
				Ports: []PolicyPort{{Protocol: "TCP", Port: 80}, {Protocol: "UDP", Port: 53}}},
			{Name: "x/in ingress[1]", Peers: []netip.Prefix{pp("10.1.1.4/32")}, Ports: []PolicyPort{{Protocol: "UDP", Port: 53}}},
		}},
		Egress: &PolicyDirection{Policies: []string{"x/out"}, Rules: []PolicyRule{
			{Name: "x/out egress[0]", Peers: []netip.Prefix{pp("10.1.1.3/32")}, Ports: []PolicyPort{{Protocol: "TCP", Port: 8000, EndPort: 8080}}},
			{Name: "x/out egress[1]", AnyPeer: true},
		}},
	}}
	return s
}

func TestNodeMidStreamRulesGolden(t *testing.T) {
	s := midStreamState()
	if err := Validate(s); err != nil {
		t.Fatal(err)
	}
	golden.CheckString(t, "node-policies-midstream.nft", renderTables(nodeRules(s)))
}

// TestCtPolicyAction: cutDenied keeps what the policies allow, judges a
// connection picked up mid-stream both ways, marks refused TCP ones cut
// and deletes the rest, and deletes a cut one allowed again.
func TestCtPolicyAction(t *testing.T) {
	s := midStreamState()
	s.Policies[0].Egress = nil // pa1 (10.1.1.2) isolated for ingress only
	f := ctPolicyFilter{zones: policyZones(s)}
	flow := func(proto uint8, src, dst string, sport, dport uint16, mark uint32) *netlink.ConntrackFlow {
		return &netlink.ConntrackFlow{Zone: 1, Mark: mark, Forward: netlink.IPTuple{Protocol: proto,
			SrcIP: netip.MustParseAddr(src).AsSlice(), DstIP: netip.MustParseAddr(dst).AsSlice(), SrcPort: sport, DstPort: dport}}
	}
	const mid, cut = ctMarkBase | ctMidStream, ctMarkBase | ctCut
	for _, tc := range []struct {
		what string
		flow *netlink.ConntrackFlow
		want ctAction
	}{
		{"allowed into pa1", flow(unix.IPPROTO_TCP, "10.1.1.3", "10.1.1.2", 40000, 80, 0), ctKeep},
		{"pa1's own (egress not isolated)", flow(unix.IPPROTO_TCP, "10.1.1.2", "10.1.1.9", 40000, 443, 0), ctKeep},
		{"refused TCP into pa1", flow(unix.IPPROTO_TCP, "10.1.1.9", "10.1.1.2", 40000, 80, 0), ctTombstone},
		{"refused UDP into pa1", flow(unix.IPPROTO_UDP, "10.1.1.9", "10.1.1.2", 40000, 53, 0), ctDelete},
		{"pa1's own, picked up from the server's segment", flow(unix.IPPROTO_TCP, "10.1.1.9", "10.1.1.2", 443, 40000, mid), ctKeep},
		{"the same without the mark", flow(unix.IPPROTO_TCP, "10.1.1.9", "10.1.1.2", 443, 40000, 0), ctTombstone},
		{"cut, still refused", flow(unix.IPPROTO_TCP, "10.1.1.9", "10.1.1.2", 40000, 80, cut), ctKeep},
		{"cut, allowed again", flow(unix.IPPROTO_TCP, "10.1.1.3", "10.1.1.2", 40000, 80, cut), ctDelete},
		{"another zone", &netlink.ConntrackFlow{Zone: 7, Forward: netlink.IPTuple{Protocol: unix.IPPROTO_TCP,
			SrcIP: netip.MustParseAddr("10.1.1.9").AsSlice(), DstIP: netip.MustParseAddr("10.1.1.2").AsSlice(), DstPort: 80}}, ctKeep},
	} {
		if got := f.action(tc.flow); got != tc.want {
			t.Errorf("%s: action %d, want %d", tc.what, got, tc.want)
		}
	}
}
