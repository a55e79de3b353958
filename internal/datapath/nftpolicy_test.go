package datapath

import (
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"

	"kvnet.io/kvnet/internal/testenv/golden"
)

// goldenPolicies isolate goldenState's dual-stack port pa1 for ingress
// (pods by address, an ipBlock with an exception, a port range; a named
// port resolved) and pa2 for egress (any peer on UDP 53; the same peer
// set as pa1's first rule).
func goldenPolicies() []PortPolicy {
	pp := netip.MustParsePrefix
	fromPods := PolicyRule{Name: "x/allow-web ingress[0]",
		Peers: []netip.Prefix{pp("10.1.1.3/32"), pp("10.1.1.4/32"), pp("fd00:1::3/128")},
		Ports: []PolicyPort{{Protocol: "TCP", Port: 80}, {Protocol: "TCP", Port: 8000, EndPort: 8080}}}
	return []PortPolicy{
		{Port: "pa1", Ingress: &PolicyDirection{Policies: []string{"x/allow-web", "x/deny-all"}, Rules: []PolicyRule{
			fromPods,
			{Name: "x/allow-web ingress[1]", Peers: []netip.Prefix{pp("10.1.0.0/24"), pp("10.1.1.128/25")},
				Ports: []PolicyPort{{Protocol: "SCTP"}}},
		}}},
		{Port: "pa2", Egress: &PolicyDirection{Policies: []string{"x/dns-only"}, Rules: []PolicyRule{
			{Name: "x/dns-only egress[0]", AnyPeer: true, Ports: []PolicyPort{{Protocol: "UDP", Port: 53}}},
			{Name: "x/allow-web ingress[0]", Peers: fromPods.Peers},
		}}},
	}
}

// withPolicies returns s with goldenPolicies, and the cluster's Service
// ranges on its primary network.
func withPolicies(s State) State {
	s.Policies = goldenPolicies()
	s.Networks[1].ServiceCIDRs = []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16"), netip.MustParsePrefix("fd00:96::/112")}
	return s
}

func TestNodePolicyRulesGolden(t *testing.T) {
	s := withPolicies(goldenState())
	if err := Validate(s); err != nil {
		t.Fatal(err)
	}
	golden.CheckString(t, "node-policies.nft", renderTables(nodeRules(s)))
}

func TestValidatePolicies(t *testing.T) {
	pp := netip.MustParsePrefix
	cases := []struct {
		name string
		pols []PortPolicy
		want string
	}{
		{"unknown port", []PortPolicy{{Port: "nope", Ingress: &PolicyDirection{}}}, `policies[0] (port "nope"): no such port`},
		{"port without IPs", []PortPolicy{{Port: "l2p", Ingress: &PolicyDirection{}}}, `port "l2p"): port has no IPs`},
		{"twice", []PortPolicy{{Port: "pa1"}, {Port: "pa1"}}, `policies[1] (port "pa1"): port has two policies`},
		{"protocol", []PortPolicy{{Port: "pa1", Ingress: &PolicyDirection{Rules: []PolicyRule{{Name: "r", AnyPeer: true,
			Ports: []PolicyPort{{Protocol: "ICMP"}}}}}}}, `ingress rule "r": protocol "ICMP"`},
		{"range", []PortPolicy{{Port: "pa1", Egress: &PolicyDirection{Rules: []PolicyRule{{Name: "r", AnyPeer: true,
			Ports: []PolicyPort{{Protocol: "TCP", Port: 90, EndPort: 80}}}}}}}, `egress rule "r": port range 90-80`},
		{"same name, other peers", []PortPolicy{
			{Port: "pa1", Ingress: &PolicyDirection{Rules: []PolicyRule{{Name: "r", Peers: []netip.Prefix{pp("10.0.0.1/32")}}}}},
			{Port: "pa2", Ingress: &PolicyDirection{Rules: []PolicyRule{{Name: "r", Peers: []netip.Prefix{pp("10.0.0.2/32")}}}}},
		}, `policies[1] (port "pa2"): ingress rule "r": peers [10.0.0.2/32] differ`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := goldenState()
			s.Policies = tc.pols
			if err := Validate(s); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate: %v, want an error with %q", err, tc.want)
			}
		})
	}
}

func TestPolicyDirectionAllows(t *testing.T) {
	d := goldenPolicies()[0].Ingress
	a := netip.MustParseAddr
	for _, tc := range []struct {
		peer  string
		proto byte
		port  uint16
		want  string
	}{
		{"10.1.1.3", 6, 80, "x/allow-web ingress[0]"},
		{"10.1.1.3", 6, 8042, "x/allow-web ingress[0]"},
		{"10.1.1.3", 17, 80, ""},
		{"10.1.1.5", 6, 80, ""},
		{"10.1.1.200", 132, 9, "x/allow-web ingress[1]"},
		{"10.1.1.100", 132, 9, ""},
	} {
		got, ok := d.Allows(a(tc.peer), tc.proto, tc.port)
		if got != tc.want || ok != (tc.want != "") {
			t.Errorf("Allows(%s, %d, %d) = %q, %v; want %q", tc.peer, tc.proto, tc.port, got, ok, tc.want)
		}
	}
	if _, ok := (*PolicyDirection)(nil).Allows(a("10.9.9.9"), 6, 1); !ok {
		t.Error("a nil direction (not isolated) refused")
	}
}

// TestPolicySetsPerNetwork: one policy applied on two networks (a
// MultiNetworkPolicy for NADs of both) has the same rule names with
// other peers on each: valid, one set per network.
func TestPolicySetsPerNetwork(t *testing.T) {
	pp := netip.MustParsePrefix
	s := State{
		Networks: []Network{
			{Name: "net-a", ID: 10, Subnets: []netip.Prefix{pp("10.10.0.0/24")}},
			{Name: "net-b", ID: 11, Subnets: []netip.Prefix{pp("10.10.0.0/24")}},
		},
		Ports: []Port{
			{Network: "net-a", HostIfName: "pa", MAC: net.HardwareAddr{2, 0, 0, 0, 0, 1}, IPs: []netip.Prefix{pp("10.10.0.2/24")}},
			{Network: "net-b", HostIfName: "pb", MAC: net.HardwareAddr{2, 0, 0, 0, 0, 2}, IPs: []netip.Prefix{pp("10.10.0.2/24")}},
		},
	}
	rule := func(peer string) *PolicyDirection {
		return &PolicyDirection{Policies: []string{"x/p"}, Rules: []PolicyRule{{Name: "x/p ingress[0]", Peers: []netip.Prefix{pp(peer)}}}}
	}
	s.Policies = []PortPolicy{{Port: "pa", Ingress: rule("10.10.0.3/32")}, {Port: "pb", Ingress: rule("10.10.0.4/32")}}
	if err := Validate(s); err != nil {
		t.Fatal(err)
	}
	sets := map[string]string{}
	for _, st := range policyRules(s).sets {
		sets[st.name] = fmt.Sprint(st.elems)
	}
	a, b := policySetName("net-a", "x/p ingress[0]", false), policySetName("net-b", "x/p ingress[0]", false)
	if a == b || sets[a] != "[10.10.0.3]" || sets[b] != "[10.10.0.4]" {
		t.Errorf("sets %v; want %s with [10.10.0.3] and %s with [10.10.0.4]", sets, a, b)
	}
}
