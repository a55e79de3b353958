package datapath

import (
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"kvnet.io/kvnet/internal/testenv/golden"
)

// goldenState has one primary dual-stack network, one secondary L2
// network, a port with IPv4+IPv6, a port with IPv4 only and an L2 port.
func goldenState() State {
	return State{
		Networks: []Network{
			{Name: "l2net", ID: 300, Remotes: []netip.Addr{netip.MustParseAddr("192.168.100.2")}},
			{Name: "tenant-a_udn", ID: 1, Primary: true,
				Subnets:               []netip.Prefix{netip.MustParsePrefix("10.1.1.0/24"), netip.MustParsePrefix("fd00:1::/64")},
				Gateways:              []netip.Addr{netip.MustParseAddr("10.1.1.1"), netip.MustParseAddr("fd00:1::1")},
				DefaultNetworkSubnets: []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24"), netip.MustParsePrefix("fd00:244::/64")}},
		},
		Ports: []Port{
			{Network: "tenant-a_udn", HostIfName: "pa2", MAC: net.HardwareAddr{0x02, 0, 0, 0, 0, 0x02},
				IPs: []netip.Prefix{netip.MustParsePrefix("10.1.1.3/24")}},
			{Network: "tenant-a_udn", HostIfName: "pa1", MAC: net.HardwareAddr{0x02, 0, 0, 0, 0, 0x01},
				IPs: []netip.Prefix{netip.MustParsePrefix("10.1.1.2/24"), netip.MustParsePrefix("fd00:1::2/64")}},
			{Network: "l2net", HostIfName: "l2p", MAC: net.HardwareAddr{0x02, 0, 0, 0, 0, 0x03}},
		},
	}
}

func TestNodeRulesGolden(t *testing.T) {
	golden.CheckString(t, "node.nft", renderTables(nodeRules(goldenState())))
}

func TestRouterRulesGolden(t *testing.T) {
	golden.CheckString(t, "router.nft", renderTables(routerRules(goldenState().Networks[1], nil, nil)))
}

// goldenServices are services of goldenState's primary network: one TCP
// service with three endpoints, a UDP one without, an IPv6 one; the TCP
// ones with a node port and an external address each (a dual-stack
// LoadBalancer), the UDP one with a node port.
func goldenServices() []Service {
	ap := netip.MustParseAddrPort
	return []Service{
		{Network: "tenant-a_udn", Name: "a/web:http", Protocol: "TCP", VIP: ap("10.96.0.10:80"), NodePort: 30080,
			External:      []netip.Addr{netip.MustParseAddr("203.0.113.10")},
			Endpoints:     []netip.AddrPort{ap("10.1.1.2:8080"), ap("10.1.1.3:8080"), ap("10.1.1.4:8080")},
			ExternalLocal: true, LocalEndpoints: []netip.AddrPort{ap("10.1.1.2:8080"), ap("10.1.1.4:8080")}},
		{Network: "tenant-a_udn", Name: "a/dns:dns", Protocol: "UDP", VIP: ap("10.96.0.53:53"), NodePort: 30053},
		{Network: "tenant-a_udn", Name: "a/web6:http", Protocol: "TCP", VIP: ap("[fd00:96::10]:80"), NodePort: 30080, Affinity: 3 * time.Hour,
			External:  []netip.Addr{netip.MustParseAddr("2001:db8::10")},
			Endpoints: []netip.AddrPort{ap("[fd00:1::2]:8080")}},
		{Network: "tenant-a_udn", Name: "kube-system/kube-dns:dns", Protocol: "UDP", VIP: ap("10.96.0.10:53"), ViaNode: true,
			Endpoints: []netip.AddrPort{ap("10.244.0.5:53"), ap("10.244.1.7:53")}},
	}
}

// goldenServiceState is goldenState with service addresses and
// goldenServices.
func goldenServiceState() State {
	s := withServiceAddrs(goldenState())
	s.Services = goldenServices()
	s.NodeAddrs = []netip.Addr{netip.MustParseAddr("192.168.100.2"), netip.MustParseAddr("192.168.100.1"), netip.MustParseAddr("fd00:100::1")}
	return s
}

func TestNodeServiceRulesGolden(t *testing.T) {
	golden.CheckString(t, "node-services.nft", renderTables(nodeRules(goldenServiceState())))
}

// withServiceAddrs gives goldenState's primary network node 2's service
// addresses and MAC.
func withServiceAddrs(s State) State {
	s.Networks[1].ServiceAddrs = []netip.Prefix{netip.MustParsePrefix("100.88.0.2/16"), netip.MustParsePrefix("fd97::2/64")}
	s.Networks[1].ServiceMAC = net.HardwareAddr{0x0a, 0x58, 0x64, 0x58, 0, 2}
	s.Networks[1].ServiceCIDRs = []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16"), netip.MustParsePrefix("fd00:96::/112")}
	return s
}

func TestRouterServiceRulesGolden(t *testing.T) {
	golden.CheckString(t, "router-services.nft", renderTables(routerRules(withServiceAddrs(goldenState()).Networks[1], goldenServices(), nil)))
}

func TestValidateServices(t *testing.T) {
	s := withServiceAddrs(goldenState())
	s.Services = goldenServices()
	if err := Validate(s); err != nil {
		t.Fatalf("valid services rejected: %v", err)
	}
	ap := netip.MustParseAddrPort
	s.Networks[1].ServiceAddrs[0] = netip.MustParsePrefix("10.1.1.200/24")
	if err := Validate(s); err == nil || !strings.Contains(err.Error(), `service address "10.1.1.200/24" overlaps subnet "10.1.1.0/24"`) {
		t.Errorf("service address in a subnet: %v", err)
	}
	for _, tt := range []struct {
		name   string
		mutate func(*Service)
		want   string
	}{
		{"unknown network", func(sv *Service) { sv.Network = "zz" }, `services[0] "a/web:http": unknown network "zz"`},
		{"secondary network", func(sv *Service) { sv.Network = "l2net" }, `network "l2net" is not primary`},
		{"protocol", func(sv *Service) { sv.Protocol = "SCTP" }, `protocol "SCTP": must be TCP or UDP`},
		{"local endpoint elsewhere", func(sv *Service) { sv.LocalEndpoints = []netip.AddrPort{ap("10.1.1.9:8080")} }, `service "a/web:http": local endpoint "10.1.1.9:8080" is not one of its endpoints`},
		{"local endpoints, policy Cluster", func(sv *Service) { sv.ExternalLocal = false }, `local endpoints [10.1.1.2:8080 10.1.1.4:8080] without externalTrafficPolicy Local`},
		{"affinity too long", func(sv *Service) { sv.Affinity = 25 * time.Hour }, `service "a/web:http": affinity 25h0m0s: must be whole seconds from 0 to 24h0m0s`},
		{"affinity negative", func(sv *Service) { sv.Affinity = -time.Second }, `affinity -1s: must be whole seconds`},
		{"affinity fraction", func(sv *Service) { sv.Affinity = 1500 * time.Millisecond }, `affinity 1.5s: must be whole seconds`},
		{"no port", func(sv *Service) { sv.VIP = netip.AddrPortFrom(sv.VIP.Addr(), 0) }, `address "10.96.0.10:0" is not an IP and port`},
		{"endpoint family", func(sv *Service) { sv.Endpoints[0] = ap("[fd00:1::2]:8080") }, `endpoint "[fd00:1::2]:8080" is not an address of the service's family`},
		{"endpoint outside", func(sv *Service) { sv.Endpoints[0] = ap("10.9.9.9:8080") }, `endpoint "10.9.9.9:8080" outside network "tenant-a_udn"'s subnets`},
		{"duplicate", func(sv *Service) { sv.VIP = ap("10.96.0.53:53"); sv.Protocol = "UDP" }, `UDP 10.96.0.53:53 already used by service "a/web:http"`},
		{"no service address", func(sv *Service) { sv.VIP = ap("[fd00:96::11]:80"); sv.Endpoints = nil }, ""},
		{"node port twice", func(sv *Service) { sv.Protocol, sv.NodePort = "UDP", 30053 }, `node port UDP 30053 already used by service "a/web:http"`},
		{"external without node port", func(sv *Service) { sv.NodePort = 0 }, `external address "203.0.113.10" needs a node port`},
		{"external family", func(sv *Service) { sv.External = []netip.Addr{netip.MustParseAddr("2001:db8::1")} }, `external address "2001:db8::1" is not a unicast address of the service's family`},
		{"external loopback", func(sv *Service) { sv.External = []netip.Addr{netip.MustParseAddr("127.0.0.1")} }, `external address "127.0.0.1" is not a unicast address`},
		{"via node with a node port", func(sv *Service) { sv.ViaNode = true }, `service "a/web:http": a service reached through the node has no node port nor external addresses`},
		{"via node inside the network", func(sv *Service) { sv.ViaNode, sv.NodePort, sv.External = true, 0, nil }, `endpoint "10.1.1.2:8080", reached through the node, is inside network "tenant-a_udn"'s subnets`},
	} {
		s := withServiceAddrs(goldenState())
		s.Services = goldenServices()
		if tt.want == "" {
			// Without a service address of the family, any service of it is refused.
			s.Networks[1].ServiceAddrs = s.Networks[1].ServiceAddrs[:1]
			tt.want = `service "a/web6:http": network "tenant-a_udn" has no service address of its family`
		}
		tt.mutate(&s.Services[0])
		err := Validate(s)
		if err == nil || !strings.Contains(err.Error(), tt.want) || !errors.Is(err, ErrInvalidState) {
			t.Errorf("%s: Validate = %v, want an error containing %q", tt.name, err, tt.want)
		}
	}
}

func TestNodeRulesEmptyState(t *testing.T) {
	if got := nodeRules(State{}); got != nil {
		t.Errorf("nodeRules(empty) = %v, want no tables", got)
	}
}

// Counters are keyed by comment, so comments of counted rules must be
// unique on a node, and every port rule must name its port.
func TestRuleComments(t *testing.T) {
	seen := map[string]bool{}
	for _, tb := range nodeRules(goldenState()) {
		for _, c := range tb.chains {
			for _, r := range c.rules {
				if r.comment == "" {
					t.Errorf("chain %s: rule %q has no comment", c.name, r.text)
				}
				if r.counted() {
					if seen[r.comment] {
						t.Errorf("comment %q used twice", r.comment)
					}
					seen[r.comment] = true
				}
			}
		}
	}
	for _, p := range goldenState().Ports {
		for _, r := range portRules(p) {
			if want := "port " + p.HostIfName + ":"; len(r.comment) < len(want) || r.comment[:len(want)] != want {
				t.Errorf("port %s: rule comment %q does not name the port", p.HostIfName, r.comment)
			}
		}
	}
}

func TestLongCommentTruncated(t *testing.T) {
	long := make([]byte, 300)
	for i := range long {
		long[i] = 'n'
	}
	n := Network{Name: string(long), ID: 5, Primary: true}
	for _, tb := range routerRules(n, nil, nil) {
		for _, c := range tb.chains {
			for _, r := range c.rules {
				if len(r.comment) > maxCommentLen {
					t.Errorf("comment of %d bytes, limit %d", len(r.comment), maxCommentLen)
				}
			}
		}
	}
}
