package verdict

import (
	"net/netip"
	"testing"
)

func TestMatch(t *testing.T) {
	rules := []Rule{
		{Name: "web", Peers: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/24")}, Ports: []Port{{Protocol: TCP, Port: 80, EndPort: 82}}},
		{Name: "dns", AnyPeer: true, Ports: []Port{{Protocol: UDP, Port: 53}}},
		{Name: "all-sctp", Peers: []netip.Prefix{netip.MustParsePrefix("fd00::/64")}, Ports: []Port{{Protocol: SCTP}}},
		{Name: "any", Peers: []netip.Prefix{netip.MustParsePrefix("10.9.9.9/32")}},
	}
	for _, tc := range []struct {
		peer  string
		proto string
		port  uint16
		want  string // "" refused
	}{
		{"10.0.0.5", TCP, 80, "web"},
		{"10.0.0.5", TCP, 82, "web"},
		{"10.0.0.5", TCP, 79, ""},
		{"10.0.0.5", TCP, 83, ""},
		{"10.0.0.5", UDP, 81, ""},
		{"10.0.1.5", TCP, 81, ""},
		{"::ffff:10.0.0.5", TCP, 81, "web"}, // IPv4-mapped peers match as IPv4
		{"192.0.2.1", UDP, 53, "dns"},
		{"192.0.2.1", TCP, 53, ""},
		{"fd00::1", SCTP, 9, "all-sctp"},
		{"fd01::1", SCTP, 9, ""},
		{"10.9.9.9", UDP, 7, "any"},
	} {
		got, ok := Match(rules, netip.MustParseAddr(tc.peer), tc.proto, tc.port)
		if ok != (tc.want != "") || got != tc.want {
			t.Errorf("Match(%s, %s/%d) = %q, %v; want %q", tc.peer, tc.proto, tc.port, got, ok, tc.want)
		}
	}
	if _, ok := Match(nil, netip.MustParseAddr("10.0.0.1"), TCP, 80); ok {
		t.Error("no rules (isolated, nothing allowed) matched")
	}
}

func TestPortString(t *testing.T) {
	for p, want := range map[Port]string{{Protocol: TCP}: "TCP", {Protocol: UDP, Port: 53}: "UDP/53", {Protocol: TCP, Port: 80, EndPort: 90}: "TCP/80-90"} {
		if got := p.String(); got != want {
			t.Errorf("%+v: %q, want %q", p, got, want)
		}
	}
}
