package datapath

import (
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	"kvnet.io/kvnet/internal/testenv/golden"
)

// goldenEndpointPolicies isolate two endpoints of goldenServices' a/web
// for ingress: 10.1.1.3 (a remote pod) with pa1's rules, and 10.1.1.4
// admitting TCP 8080 from anyone.
func goldenEndpointPolicies() []EndpointPolicy {
	a := netip.MustParseAddr
	return []EndpointPolicy{
		{Network: "tenant-a_udn", Name: "a/web-2", Addrs: []netip.Addr{a("10.1.1.3"), a("fd00:1::3")}, Ingress: goldenPolicies()[0].Ingress},
		{Network: "tenant-a_udn", Name: "a/web-3", Addrs: []netip.Addr{a("10.1.1.4")}, Ingress: &PolicyDirection{
			Policies: []string{"a/web-open"}, Rules: []PolicyRule{{Name: "a/web-open ingress[0]", AnyPeer: true,
				Ports: []PolicyPort{{Protocol: "TCP", Port: 8080}}}}}},
	}
}

// TestRouterPolicyRulesGolden: a router with Services checks translated
// connections against its clients' egress (pa2) and its endpoints'
// ingress; the node's policy chain lets frames to the network's own
// Services (not the cluster DNS reached through the node) and from the
// routers' service addresses pass.
func TestRouterPolicyRulesGolden(t *testing.T) {
	s := withServiceAddrs(goldenState())
	s.Services = goldenServices()
	s.Policies = goldenPolicies()
	s.EndpointPolicies = goldenEndpointPolicies()
	if err := Validate(s); err != nil {
		t.Fatal(err)
	}
	n := s.Networks[1]
	golden.CheckString(t, "router-policies.nft", renderTables(routerRules(n, servicesOf(s.Services, n.Name), routerPolicies(s)[n.Name])))
	node := renderTables(nodeRules(s))
	for _, want := range []string{
		`ip saddr 100.88.0.0/16 accept comment "network tenant-a_udn: Service connections from its routers, checked there"`,
		`ip daddr @nsvc4-1 accept`, `ip6 daddr @nsvc6-1 accept`, "elements = { 10.96.0.10, 10.96.0.53 }",
	} {
		if !strings.Contains(node, want) {
			t.Errorf("node rules lack %q:\n%s", want, node)
		}
	}
	if routerPolicies(goldenState())["tenant-a_udn"] != nil {
		t.Error("a router policy without policies")
	}
}

func TestValidateEndpointPolicies(t *testing.T) {
	a := netip.MustParseAddr
	ok := goldenEndpointPolicies()[1]
	cases := []struct {
		name string
		ep   EndpointPolicy
		want string
	}{
		{"unknown network", EndpointPolicy{Network: "nope", Name: "x", Addrs: ok.Addrs, Ingress: ok.Ingress}, `endpointPolicies[0] ("x"): network "nope": no such network`},
		{"secondary", EndpointPolicy{Network: "l2net", Name: "x", Addrs: ok.Addrs, Ingress: ok.Ingress}, `network "l2net" is not a primary network`},
		{"outside", EndpointPolicy{Network: ok.Network, Name: "x", Addrs: []netip.Addr{a("10.2.0.1")}, Ingress: ok.Ingress}, `address "10.2.0.1" is not in network "tenant-a_udn"'s subnets`},
		{"no addresses", EndpointPolicy{Network: ok.Network, Name: "x", Ingress: ok.Ingress}, `("x"): no addresses`},
		{"no name", EndpointPolicy{Network: ok.Network, Addrs: ok.Addrs, Ingress: ok.Ingress}, `(""): empty name`},
		{"no ingress", EndpointPolicy{Network: ok.Network, Name: "x", Addrs: ok.Addrs}, `("x"): no ingress policy`},
		{"rule of a port's name, other peers", EndpointPolicy{Network: ok.Network, Name: "x", Addrs: ok.Addrs, Ingress: &PolicyDirection{
			Rules: []PolicyRule{{Name: "x/allow-web ingress[0]", AnyPeer: true}}}}, `ingress rule "x/allow-web ingress[0]": peers [] differ`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := goldenState()
			s.Policies = goldenPolicies()
			s.EndpointPolicies = []EndpointPolicy{tc.ep}
			if err := Validate(s); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate: %v, want an error with %q", err, tc.want)
			}
		})
	}
}

// TestCtRouterFilter: of a router's connections, those translated to an
// endpoint of the network that the client's egress or the endpoint's
// ingress refuses are cut; untranslated ones and those to Services
// reached through the node are left alone.
func TestCtRouterFilter(t *testing.T) {
	s := withServiceAddrs(goldenState())
	s.Policies = goldenPolicies()
	s.EndpointPolicies = goldenEndpointPolicies()
	rp := routerPolicies(s)["tenant-a_udn"]
	f := ctRouterFilter{subnets: s.Networks[1].Subnets, egress: map[netip.Addr]*PolicyDirection{}, ingress: map[netip.Addr]*PolicyDirection{}}
	for _, ap := range rp.egress {
		for _, a := range ap.addrs {
			f.egress[a] = ap.d
		}
	}
	for _, ap := range rp.ingress {
		for _, a := range ap.addrs {
			f.ingress[a] = ap.d
		}
	}
	flow := func(client, vip, ep string, proto uint8, port uint16) *netlink.ConntrackFlow {
		fl := &netlink.ConntrackFlow{}
		fl.Forward.SrcIP, fl.Forward.DstIP, fl.Forward.Protocol, fl.Forward.DstPort = net.ParseIP(client), net.ParseIP(vip), proto, 80
		fl.Reverse.SrcIP, fl.Reverse.SrcPort = net.ParseIP(ep), port
		return fl
	}
	for _, tc := range []struct {
		name string
		f    *netlink.ConntrackFlow
		cut  bool
	}{
		{"allowed client of a/web-2", flow("10.1.1.4", "10.96.0.10", "10.1.1.3", 6, 80), false},
		{"refused client of a/web-2", flow("10.1.1.9", "10.96.0.10", "10.1.1.3", 6, 80), true},
		{"refused port of a/web-2", flow("10.1.1.4", "10.96.0.10", "10.1.1.3", 6, 81), true},
		{"anyone to a/web-3 8080", flow("10.1.1.9", "10.96.0.10", "10.1.1.4", 6, 8080), false},
		{"pa2 (10.1.1.3) may only reach UDP 53 or pa1's peers", flow("10.1.1.3", "10.96.0.10", "10.1.1.5", 6, 80), true},
		{"pa2 to a peer", flow("10.1.1.3", "10.96.0.10", "10.1.1.4", 6, 8080), false},
		{"not translated", flow("10.1.1.9", "10.1.1.3", "10.1.1.3", 6, 81), false},
		{"through the node", flow("10.1.1.3", "10.96.0.10", "10.244.0.5", 6, 80), false},
	} {
		if got := f.MatchConntrackFlow(tc.f); got != tc.cut {
			t.Errorf("%s: cut %v, want %v", tc.name, got, tc.cut)
		}
	}
}
