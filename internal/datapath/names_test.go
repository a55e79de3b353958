package datapath

import (
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"
)

func TestLinkNames(t *testing.T) {
	tests := []struct {
		id                    int
		bridge, vxlan, gw, tr string
	}{
		{1, "kvbr1", "kvvx1", "kvgw1", "kvtr1"},
		{42, "kvbr42", "kvvx42", "kvgw42", "kvtr42"},
		{MaxNetworkID, "kvbr4095", "kvvx4095", "kvgw4095", "kvtr4095"},
	}
	for _, tt := range tests {
		got := []string{BridgeName(tt.id), VXLANName(tt.id), gwPortName(tt.id), transitName(tt.id)}
		want := []string{tt.bridge, tt.vxlan, tt.gw, tt.tr}
		for i := range got {
			if got[i] != want[i] {
				t.Errorf("id %d: name %d = %q, want %q", tt.id, i, got[i], want[i])
			}
			if len(got[i]) > 15 {
				t.Errorf("%q longer than IFNAMSIZ-1", got[i])
			}
			prefix, id, ok := parseOwnedLink(got[i])
			if !ok || id != tt.id || !strings.HasPrefix(got[i], prefix) {
				t.Errorf("parseOwnedLink(%q) = %q, %d, %v", got[i], prefix, id, ok)
			}
		}
	}
}

func TestParseOwnedLinkRejects(t *testing.T) {
	for _, name := range []string{"kvbr", "kvbr0", "kvbr07", "kvbr4096", "kvbr-1", "kvbr1a", "kvbr+1", "eth0", "kvnet", "xkvbr1", "kvbr99999"} {
		if _, _, ok := parseOwnedLink(name); ok {
			t.Errorf("parseOwnedLink(%q) claims a link kvnet does not own", name)
		}
	}
}

func TestGatewayMAC(t *testing.T) {
	tests := []struct {
		id   int
		want string
	}{
		{1, "0a:58:a9:fe:00:01"},
		{258, "0a:58:a9:fe:01:02"},
		{MaxNetworkID, "0a:58:a9:fe:0f:ff"},
	}
	for _, tt := range tests {
		mac := GatewayMAC(tt.id)
		if mac.String() != tt.want {
			t.Errorf("GatewayMAC(%d) = %s, want %s", tt.id, mac, tt.want)
		}
		if !isUnicastMAC(mac) || mac[0]&2 == 0 {
			t.Errorf("GatewayMAC(%d) = %s is not locally administered unicast", tt.id, mac)
		}
	}
}

func TestPodMTU(t *testing.T) {
	tests := []struct {
		underlay int
		ip       string
		want     int
	}{
		{1500, "192.168.0.1", 1450},
		{9000, "192.168.0.1", 8950},
		{1400, "192.168.0.1", 1350},
		{1500, "2001:db8::1", 1430},
		{1500, "::ffff:192.168.0.1", 1450},
	}
	for _, tt := range tests {
		if got := podMTUFor(tt.underlay, netip.MustParseAddr(tt.ip)); got != tt.want {
			t.Errorf("podMTUFor(%d, %s) = %d, want %d", tt.underlay, tt.ip, got, tt.want)
		}
	}
	if PodMTU(1500) != 1450 {
		t.Errorf("PodMTU(1500) = %d, want 1450", PodMTU(1500))
	}
}

func TestTransitAddrs(t *testing.T) {
	tests := []struct {
		id           int
		v6           bool
		router, node string
	}{
		{1, false, "169.254.0.11", "169.254.0.12"},
		{2, false, "169.254.0.13", "169.254.0.14"},
		{122, false, "169.254.0.253", "169.254.0.254"},
		{123, false, "169.254.0.255", "169.254.1.0"},
		{200, false, "169.254.1.153", "169.254.1.154"},
		{MaxNetworkID, false, "169.254.32.7", "169.254.32.8"},
		{1, true, "fd69::b", "fd69::c"},
		{MaxNetworkID, true, "fd69::2007", "fd69::2008"},
	}
	for _, tt := range tests {
		r, n, err := TransitAddrs(tt.id, tt.v6)
		if err != nil {
			t.Fatalf("TransitAddrs(%d): %v", tt.id, err)
		}
		if r.String() != tt.router || n.String() != tt.node {
			t.Errorf("TransitAddrs(%d, v6=%v) = %s, %s; want %s, %s", tt.id, tt.v6, r, n, tt.router, tt.node)
		}
		p := transitPrefix4
		if tt.v6 {
			p = transitPrefix6
		}
		if !p.Contains(r) || !p.Contains(n) {
			t.Errorf("TransitAddrs(%d) outside %s", tt.id, p)
		}
	}
	// Every ID gets its own pair.
	seen := map[netip.Addr]int{}
	for id := 1; id <= MaxNetworkID; id++ {
		r, n, _ := TransitAddrs(id, false)
		for _, a := range []netip.Addr{r, n} {
			if other, dup := seen[a]; dup {
				t.Fatalf("%s used by IDs %d and %d", a, other, id)
			}
			seen[a] = id
		}
	}
	for _, id := range []int{0, -1, MaxNetworkID + 1} {
		if _, _, err := TransitAddrs(id, false); err == nil {
			t.Errorf("TransitAddrs(%d) succeeded, want an error", id)
		}
	}
}

func TestRouterNSName(t *testing.T) {
	tests := []struct {
		cfg  NodeConfig
		want string
	}{
		{NodeConfig{}, "kvnet-r7"},
		{NodeConfig{NetNS: "/run/netns/lab-node1"}, "kvnet-lab-node1-r7"},
		{NodeConfig{NetNS: "/run/netns/lab-node1", RouterNSPrefix: "x-"}, "x-7"},
	}
	for _, tt := range tests {
		if got := RouterNSName(tt.cfg, 7); got != tt.want {
			t.Errorf("RouterNSName(%+v, 7) = %q, want %q", tt.cfg, got, tt.want)
		}
	}
}

func TestValidate(t *testing.T) {
	mac := net.HardwareAddr{2, 0, 0, 0, 0, 1}
	good := func() State {
		return State{
			Networks: []Network{
				{Name: "a", ID: 1, Primary: true, Subnets: []netip.Prefix{netip.MustParsePrefix("10.1.1.0/24")},
					Gateways: []netip.Addr{netip.MustParseAddr("10.1.1.1")}},
				{Name: "l2", ID: 2},
				{Name: "ln", ID: 3, Physical: "br-phys", VLAN: 100, MTU: 1500},
			},
			Ports:      []Port{{Network: "a", HostIfName: "p1", MAC: mac}},
			RemoteMACs: []RemoteMAC{{Network: "l2", MAC: mac, VTEP: netip.MustParseAddr("192.168.0.2")}},
		}
	}
	s := good()
	if _, err := s.validate(); err != nil {
		t.Fatalf("valid state rejected: %v", err)
	}
	tests := []struct {
		name   string
		mutate func(*State)
		want   string
	}{
		{"id zero", func(s *State) { s.Networks[1].ID = 0 }, `network "l2": id 0 out of range`},
		{"duplicate id", func(s *State) { s.Networks[1].ID = 1 }, `id 1 already used by network "a"`},
		{"duplicate name", func(s *State) { s.Networks[1].Name = "a" }, `network "a": listed twice`},
		{"primary without subnets", func(s *State) { s.Networks[0].Subnets = nil; s.Networks[0].Gateways = nil }, "primary network without subnets"},
		{"gateway outside", func(s *State) { s.Networks[0].Gateways[0] = netip.MustParseAddr("10.9.9.1") }, `gateway "10.9.9.1" outside subnet`},
		{"unmasked subnet", func(s *State) { s.Networks[0].Subnets[0] = netip.MustParsePrefix("10.1.1.5/24") }, "not a valid network prefix"},
		{"unknown port network", func(s *State) { s.Ports[0].Network = "zz" }, `unknown network "zz"`},
		{"long port name", func(s *State) { s.Ports[0].HostIfName = "0123456789abcdef" }, "must be 1-15 characters"},
		{"reserved port name", func(s *State) { s.Ports[0].HostIfName = "kvbr9" }, "kvnet-reserved prefix"},
		{"multicast MAC", func(s *State) { s.Ports[0].MAC = net.HardwareAddr{1, 0, 0, 0, 0, 1} }, "not a unicast"},
		{"bad VTEP", func(s *State) { s.RemoteMACs[0].VTEP = netip.Addr{} }, "VTEP"},
		{"vlan without physical", func(s *State) { s.Networks[1].VLAN = 5 }, `network "l2": vlan 5 without a physical bridge`},
		{"mtu on tunnelled", func(s *State) { s.Networks[1].MTU = 9000 }, `network "l2": mtu 9000 on a tunnelled network`},
		{"vlan out of range", func(s *State) { s.Networks[2].VLAN = 4095 }, `network "ln": vlan 4095 out of range 1-4094`},
		{"physical name too long", func(s *State) { s.Networks[2].Physical = "0123456789abcdef" }, `physical bridge "0123456789abcdef" is not an interface name`},
		{"physical is ours", func(s *State) { s.Networks[2].Physical = "kvbr7" }, `physical bridge "kvbr7" is a kvnet link`},
		{"physical primary", func(s *State) {
			s.Networks[2].Primary = true
			s.Networks[2].Subnets = []netip.Prefix{netip.MustParsePrefix("10.3.0.0/24")}
			s.Networks[2].Gateways = []netip.Addr{netip.MustParseAddr("10.3.0.1")}
		}, `cannot be primary`},
		{"physical remotes", func(s *State) { s.Networks[2].Remotes = []netip.Addr{netip.MustParseAddr("192.168.0.9")} }, `remotes on a localnet network`},
		{"physical remote MAC", func(s *State) { s.RemoteMACs[0].Network = "ln" }, `network "ln" is a localnet network`},
		{"physical mtu", func(s *State) { s.Networks[2].MTU = 100 }, `mtu 100 out of range 576-65535`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := good()
			tt.mutate(&s)
			_, err := s.validate()
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("validate() = %v, want an error containing %q", err, tt.want)
			}
			if !errors.Is(err, ErrInvalidState) {
				t.Errorf("error does not match ErrInvalidState: %v", err)
			}
		})
	}
}
