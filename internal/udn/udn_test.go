package udn

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	udnv1 "kvnet.io/kvnet/api/udn/v1"
	"kvnet.io/kvnet/internal/netconf"
	"kvnet.io/kvnet/internal/reserved"
)

func TestRenderTransitSubnetShift(t *testing.T) {
	tests := []struct {
		name    string
		subnets udnv1.DualStackCIDRs
		join    udnv1.DualStackCIDRs
		want    string
	}{
		{"default", udnv1.DualStackCIDRs{"10.0.0.0/16"}, nil, "100.88.0.0/16,fd97::/64"},
		{"subnet overlaps transit", udnv1.DualStackCIDRs{"100.88.0.0/16"}, nil, "100.89.0.0/16,fd97::/64"},
		{"wide subnet", udnv1.DualStackCIDRs{"100.80.0.0/12"}, nil, "100.96.0.0/16,fd97::/64"},
		{"ipv6 overlaps", udnv1.DualStackCIDRs{"10.0.0.0/16", "fd97::/48"}, nil, "100.88.0.0/16,fd97:0:1::/64"},
		{"join overlaps", udnv1.DualStackCIDRs{"10.0.0.0/16"}, udnv1.DualStackCIDRs{"100.88.0.0/16"}, "100.89.0.0/16,fd97::/64"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Render(Spec{Topology: udnv1.NetworkTopologyLayer2, Layer2: &udnv1.Layer2Config{
				Role: udnv1.NetworkRolePrimary, Subnets: tt.subnets, JoinSubnets: tt.join,
			}}, "ns_n", "ns/n")
			if err != nil {
				t.Fatal(err)
			}
			if c.TransitSubnet != tt.want {
				t.Fatalf("transitSubnet %q, want %q", c.TransitSubnet, tt.want)
			}
		})
	}
}

func TestRenderErrors(t *testing.T) {
	tests := []struct {
		name string
		spec Spec
		want string
	}{
		{"layer2 nil", Spec{Topology: udnv1.NetworkTopologyLayer2}, `render "ns_n": spec.layer2 is required when topology is Layer2`},
		{"primary without subnets", Spec{Topology: udnv1.NetworkTopologyLayer2, Layer2: &udnv1.Layer2Config{Role: udnv1.NetworkRolePrimary}},
			`render "ns_n": the subnet attribute must be defined for layer2 primary user defined networks`},
		{"bad topology", Spec{Topology: "Layer7"}, `render "ns_n": topology "Layer7": must be Layer2, Layer3 or Localnet`},
		{"bad cidr", Spec{Topology: udnv1.NetworkTopologyLayer2, Layer2: &udnv1.Layer2Config{Role: udnv1.NetworkRoleSecondary, Subnets: udnv1.DualStackCIDRs{"10.0.0.0/99"}}},
			`"subnets" value "10.0.0.0/99"`},
		{"two cidrs in one", Spec{Topology: udnv1.NetworkTopologyLayer2, Layer2: &udnv1.Layer2Config{Role: udnv1.NetworkRoleSecondary, Subnets: udnv1.DualStackCIDRs{"10.0.0.0/24,10.1.0.0/24"}}},
			`"subnets" value "10.0.0.0/24,10.1.0.0/24"`},
		{"bad role", Spec{Topology: udnv1.NetworkTopologyLayer2, Layer2: &udnv1.Layer2Config{Role: "PRIMARY", Subnets: udnv1.DualStackCIDRs{"10.0.0.0/24"}}},
			`"role" "PRIMARY": must be Primary or Secondary`},
		{"primary localnet", Spec{Topology: udnv1.NetworkTopologyLocalnet, Localnet: &udnv1.LocalnetConfig{Role: udnv1.NetworkRolePrimary, PhysicalNetworkName: "phys"}},
			`"role" "Primary": must be Secondary`},
		{"bad join subnet", Spec{Topology: udnv1.NetworkTopologyLayer2, Layer2: &udnv1.Layer2Config{Role: udnv1.NetworkRolePrimary, Subnets: udnv1.DualStackCIDRs{"10.0.0.0/24"}, JoinSubnets: udnv1.DualStackCIDRs{"join"}}},
			`"joinSubnets" value "join"`},
		{"bad gateway", Spec{Topology: udnv1.NetworkTopologyLayer2, Layer2: &udnv1.Layer2Config{Role: udnv1.NetworkRolePrimary, Subnets: udnv1.DualStackCIDRs{"10.0.0.0/24"}, DefaultGatewayIPs: udnv1.DualStackIPs{"10.0.0.1/24"}}},
			`"defaultGatewayIPs" value "10.0.0.1/24"`},
		{"layer3 cidr without length", Spec{Topology: udnv1.NetworkTopologyLayer3, Layer3: &udnv1.Layer3Config{Role: udnv1.NetworkRoleSecondary, Subnets: []udnv1.Layer3Subnet{{CIDR: "10.0.0.0", HostSubnet: 24}}}},
			`"subnets" value "10.0.0.0"`},
		{"layer3 negative host subnet", Spec{Topology: udnv1.NetworkTopologyLayer3, Layer3: &udnv1.Layer3Config{Role: udnv1.NetworkRoleSecondary, Subnets: []udnv1.Layer3Subnet{{CIDR: "10.0.0.0/16", HostSubnet: -1}}}},
			`"subnets" value "10.0.0.0/16": hostSubnet -1`},
		{"vlan 0", Spec{Topology: udnv1.NetworkTopologyLocalnet, Localnet: &udnv1.LocalnetConfig{Role: udnv1.NetworkRoleSecondary, PhysicalNetworkName: "phys", VLAN: &udnv1.VLANConfig{Mode: udnv1.VLANModeAccess, Access: &udnv1.AccessVLANConfig{}}}},
			`"vlan.access.id" 0: must be between 1 and 4094`},
		{"no transit subnet", Spec{Topology: udnv1.NetworkTopologyLayer2, Layer2: &udnv1.Layer2Config{Role: udnv1.NetworkRolePrimary, Subnets: udnv1.DualStackCIDRs{"64.0.0.0/2", "::/0"}, JoinSubnets: udnv1.DualStackCIDRs{"128.0.0.0/1"}}},
			`no free transit subnet near 100.88.0.0/16: "subnets" and "joinSubnets" overlap every candidate`},
		{"mtu", Spec{Topology: udnv1.NetworkTopologyLayer3, Layer3: &udnv1.Layer3Config{Role: udnv1.NetworkRoleSecondary, MTU: 70000}},
			`"mtu" 70000`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Render(tt.spec, "ns_n", "ns/n")
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want %q", err, tt.want)
			}
		})
	}
}

func TestIDAllocator(t *testing.T) {
	a := NewIDAllocator()
	if err := a.Reserve("restored", 2); err != nil {
		t.Fatal(err)
	}
	id1, _ := a.Allocate("a")
	id2, _ := a.Allocate("b")
	if id1 != 1 || id2 != 3 {
		t.Fatalf("got %d, %d; want 1, 3 (2 is reserved)", id1, id2)
	}
	if again, _ := a.Allocate("a"); again != id1 {
		t.Fatalf("allocate is not idempotent: %d then %d", id1, again)
	}
	if err := a.Reserve("other", 1); err == nil {
		t.Fatal("reserving a held ID succeeded")
	}
	if err := a.Reserve("x", MaxNetworkID+1); err == nil {
		t.Fatal("reserving an out-of-range ID succeeded")
	}
	a.Release("a")
	if _, ok := a.ID("a"); ok {
		t.Fatal("released network still has an ID")
	}
	// Round robin: the freed ID is not reused at once, but is reused once
	// the range wraps.
	if id, _ := a.Allocate("c"); id != 4 {
		t.Fatalf("after release got %d, want 4", id)
	}
	full := NewIDAllocator()
	for i := range MaxNetworkID {
		if _, err := full.Allocate(string(rune('A'+i%26)) + string(rune(i))); err != nil {
			t.Fatalf("allocation %d: %v", i, err)
		}
	}
	if _, err := full.Allocate("one-too-many"); !errors.Is(err, ErrNoNetworkIDs) {
		t.Fatalf("err = %v, want ErrNoNetworkIDs", err)
	}
	// The cursor has wrapped: a freed ID is the next one handed out.
	freed, _ := full.ID("B" + string(rune(1)))
	full.Release("B" + string(rune(1)))
	if id, err := full.Allocate("late"); err != nil || id != freed {
		t.Fatalf("after freeing %d got %d, %v", freed, id, err)
	}
}

func TestPodsUsing(t *testing.T) {
	mk := func(name string, ann string, phase corev1.PodPhase, hostNet bool) corev1.Pod {
		p := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name}}
		if ann != "" {
			p.Annotations = map[string]string{"k8s.v1.cni.cncf.io/networks": ann}
		}
		p.Status.Phase = phase
		p.Spec.HostNetwork = hostNet
		return p
	}
	pods := []corev1.Pod{
		mk("short", "net", "", false),
		mk("json", `[{"name":"net","namespace":"ns"}]`, "", false),
		mk("other-ns", "elsewhere/net", "", false),
		mk("iface", "ns/net@eth3", "", false),
		mk("done", "net", corev1.PodSucceeded, false),
		mk("broken", "[{", "", false),
		mk("plain", "", "", false),
		mk("host", "", "", true),
	}
	if got, want := PodsUsing("ns", "net", false, false, pods), []string{"ns/short", "ns/json", "ns/iface", "ns/broken"}; !slices.Equal(got, want) {
		t.Errorf("secondary: %v, want %v", got, want)
	}
	if got, want := PodsUsing("ns", "net", true, true, pods), []string{"ns/short", "ns/json", "ns/other-ns", "ns/iface", "ns/broken", "ns/plain"}; !slices.Equal(got, want) {
		t.Errorf("primary in labelled namespace: %v, want %v", got, want)
	}
}

// specFields are the names Render's errors may use for a spec's fields
// (spec paths, or the CNI configuration keys they render to).
var specFields = []string{
	"spec.layer2", "spec.layer3", "spec.localnet", "topology", `"role"`, `"mtu"`,
	`"subnets"`, "the subnet attribute", `"reservedSubnets"`, `"infrastructureSubnets"`,
	`"defaultGatewayIPs"`, `"joinSubnets"`, `"excludeSubnets"`, `"vlan.access.id"`,
	`"allowPersistentIPs" needs "subnets"`,
}

// splitList turns a fuzzed string into a list field: "|" separates
// elements, so elements may hold commas and spaces; "" is no list.
func splitList(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, "|")
}

func cidrs(s string) []udnv1.CIDR {
	var out []udnv1.CIDR
	for _, e := range splitList(s) {
		out = append(out, udnv1.CIDR(e))
	}
	return out
}

// FuzzRender builds UDN/CUDN specs from fuzzed fields and renders them
// into NADs. Rendering either fails with an error naming the field and
// value, or gives a NAD whose configuration parses back to exactly what
// was rendered, with the spec's lists element for element.
func FuzzRender(f *testing.F) {
	type seed struct {
		topology, role                 string
		mtu                            int32
		subnets                        string
		hostSubnet                     int32
		reserved, infra, gateways      string
		join, exclude, lifecycle, phys string
		vlanID                         int32
		configs                        uint8 // bit 0: layer2, 1: layer3, 2: localnet, 3: vlan
	}
	for _, s := range []seed{
		{topology: "Layer2", role: "Primary", mtu: 1400, subnets: "10.0.0.0/24|fd00::/64", reserved: "10.0.0.16/28", infra: "10.0.0.0/30", gateways: "10.0.0.1", lifecycle: "Persistent", configs: 1},
		{topology: "Layer2", role: "Secondary", subnets: "10.1.0.0/16", configs: 1},
		{topology: "Layer2", role: "Primary", subnets: "100.88.0.0/16", join: "100.89.0.0/16|fd99::/64", configs: 1},
		{topology: "Layer2", role: "Primary", subnets: "64.0.0.0/2", join: "128.0.0.0/1", configs: 1},
		{topology: "Layer3", role: "Primary", subnets: "10.100.0.0/16|fd00::/48", hostSubnet: 24, join: "100.66.0.0/16", configs: 2},
		{topology: "Layer3", role: "Secondary", subnets: "10.0.0.0", hostSubnet: 24, configs: 2},
		{topology: "Layer3", role: "Secondary", subnets: "10.0.0.0/16|fd00::/48", mtu: 9000, configs: 2},
		{topology: "Localnet", role: "Secondary", subnets: "192.168.0.0/24", exclude: "192.168.0.1/32", phys: "physnet", vlanID: 10, lifecycle: "Persistent", configs: 4 | 8},
		{topology: "Localnet", role: "Secondary", phys: "physnet", vlanID: 5000, configs: 4 | 8},
		{topology: "Layer2", role: "Primary", configs: 1},
		{topology: "Layer2", role: "PRIMARY", subnets: "10.0.0.0/24,10.1.0.0/24", configs: 1},
		{topology: "Layer2", role: "Secondary", subnets: " 10.0.0.0/24", mtu: -1, configs: 1},
		{topology: "Layer3", role: "Secondary", subnets: "10.0.0.0/16", hostSubnet: 200, configs: 2},
		{topology: "Layer2", role: "Secondary", lifecycle: "Persistent", configs: 1},
		{topology: "Layer7", configs: 7},
		{topology: "Localnet", role: "Secondary", configs: 1},
	} {
		f.Add(s.topology, s.role, s.mtu, s.subnets, s.hostSubnet, s.reserved, s.infra, s.gateways, s.join, s.exclude, s.lifecycle, s.phys, s.vlanID, s.configs)
	}
	f.Fuzz(func(t *testing.T, topology, role string, mtu int32, subnets string, hostSubnet int32,
		reserved, infra, gateways, join, exclude, lifecycle, phys string, vlanID int32, configs uint8) {
		// Specs come from the API server, as JSON: strings are UTF-8.
		phys = strings.ToValidUTF8(phys, "\uFFFD")
		ipam := &udnv1.IPAMConfig{Lifecycle: udnv1.NetworkIPAMLifecycle(lifecycle)}
		spec := Spec{Topology: udnv1.NetworkTopology(topology)}
		if configs&1 != 0 {
			l2 := &udnv1.Layer2Config{Role: udnv1.NetworkRole(role), MTU: mtu, Subnets: cidrs(subnets),
				ReservedSubnets: cidrs(reserved), InfrastructureSubnets: cidrs(infra), JoinSubnets: cidrs(join), IPAM: ipam}
			for _, g := range splitList(gateways) {
				l2.DefaultGatewayIPs = append(l2.DefaultGatewayIPs, udnv1.IP(g))
			}
			spec.Layer2 = l2
		}
		if configs&2 != 0 {
			l3 := &udnv1.Layer3Config{Role: udnv1.NetworkRole(role), MTU: mtu, JoinSubnets: cidrs(join)}
			for _, c := range cidrs(subnets) {
				l3.Subnets = append(l3.Subnets, udnv1.Layer3Subnet{CIDR: c, HostSubnet: hostSubnet})
			}
			spec.Layer3 = l3
		}
		if configs&4 != 0 {
			ln := &udnv1.LocalnetConfig{Role: udnv1.NetworkRole(role), PhysicalNetworkName: phys, MTU: mtu,
				Subnets: cidrs(subnets), ExcludeSubnets: cidrs(exclude), IPAM: ipam}
			if configs&8 != 0 {
				ln.VLAN = &udnv1.VLANConfig{Mode: udnv1.VLANModeAccess, Access: &udnv1.AccessVLANConfig{ID: vlanID}}
			}
			spec.Localnet = ln
		}

		c, err := Render(spec, "ns_n", "ns/n")
		if err != nil {
			msg := err.Error()
			if !strings.HasPrefix(msg, `render "ns_n": `) {
				t.Fatalf("error does not name the network: %v", err)
			}
			named := false
			for _, f := range specFields {
				named = named || strings.Contains(msg, f)
			}
			if !named {
				t.Fatalf("error names no field: %v", err)
			}
			// A bad list element is quoted with its field.
			for key, list := range map[string]string{"subnets": subnets, "reservedSubnets": reserved,
				"infrastructureSubnets": infra, "defaultGatewayIPs": gateways, "joinSubnets": join, "excludeSubnets": exclude} {
				prefix := fmt.Sprintf("%q value ", key)
				if !strings.Contains(msg, prefix) {
					continue
				}
				found := false
				for _, e := range splitList(list) {
					found = found || strings.Contains(msg, prefix+strconv.Quote(e)) ||
						// Layer3 renders "cidr/hostSubnet".
						strings.Contains(msg, prefix+strconv.Quote(e+"/"+strconv.Itoa(int(hostSubnet))))
				}
				if !found {
					t.Fatalf("error quotes no element of %s %q: %v", key, list, err)
				}
			}
			return
		}

		// The NAD's configuration parses back to what was rendered.
		owner := &udnv1.UserDefinedNetwork{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "n", UID: "u"}}
		nad, err := DesiredNAD(Owner{Object: owner, GVK: udnv1.GroupVersion.WithKind("UserDefinedNetwork")}, "ns", c, 7, nil)
		if err != nil {
			t.Fatalf("rendered %+v but the NAD fails: %v", c, err)
		}
		back, err := netconf.Parse(nad.Spec.Config)
		if err != nil || back == nil || *back != *c {
			t.Fatalf("NAD config %s parses to %+v, %v; rendered %+v", nad.Spec.Config, back, err, c)
		}
		served, err := netconf.ParseServed(nad.Spec.Config)
		if err != nil || served == nil || served.Conf == nil || *served.Conf != *c || served.Name != "ns_n" {
			t.Fatalf("NAD config %s served as %+v, %v", nad.Spec.Config, served, err)
		}
		if c.Role != strings.ToLower(role) {
			t.Fatalf("role %q rendered as %q", role, c.Role)
		}

		// The spec's lists are rendered element for element.
		same := func(key, rendered string, spec []string) {
			t.Helper()
			got, err := netconf.ParsePrefixes(key, rendered)
			if err != nil || len(got) != len(spec) {
				t.Fatalf("%s %q rendered as %q (%v)", key, spec, rendered, err)
			}
			for i, p := range got {
				if p.String() != netip.MustParsePrefix(spec[i]).String() {
					t.Fatalf("%s %q rendered as %q", key, spec, rendered)
				}
			}
		}
		switch c.Topology {
		case netconf.TopologyLayer2:
			same("subnets", c.Subnets, splitList(subnets))
			same("reservedSubnets", c.ReservedSubnets, splitList(reserved))
			same("infrastructureSubnets", c.InfrastructureSubnets, splitList(infra))
			if c.MTU != int(mtu) || c.AllowPersistentIPs != (lifecycle == "Persistent") {
				t.Fatalf("rendered %+v from mtu %d lifecycle %q", c, mtu, lifecycle)
			}
			if c.IsPrimary() {
				checkTransit(t, c, splitList(subnets), splitList(join))
			} else if c.JoinSubnet != "" || c.TransitSubnet != "" {
				t.Fatalf("secondary network with join/transit subnets: %+v", c)
			}
		case netconf.TopologyLayer3:
			l3, err := netconf.ParseLayer3Subnets(c.Subnets)
			if err != nil || len(l3) != len(splitList(subnets)) {
				t.Fatalf("subnets %q rendered as %q (%v)", subnets, c.Subnets, err)
			}
			for i, sn := range l3 {
				if sn.CIDR.String() != netip.MustParsePrefix(splitList(subnets)[i]).String() || sn.HostSubnet != int(max(hostSubnet, 0)) {
					t.Fatalf("subnets %q hostSubnet %d rendered as %q", subnets, hostSubnet, c.Subnets)
				}
			}
		case netconf.TopologyLocalnet:
			same("subnets", c.Subnets, splitList(subnets))
			same("excludeSubnets", c.ExcludeSubnets, splitList(exclude))
			if c.PhysicalNetworkName != phys || (mtu != 0 && c.MTU != int(mtu)) || (mtu == 0 && c.MTU != LocalnetDefaultMTU) {
				t.Fatalf("rendered %+v from mtu %d physicalNetworkName %q", c, mtu, phys)
			}
			if configs&8 != 0 && c.VLANID != int(vlanID) {
				t.Fatalf("vlan %d rendered as %d", vlanID, c.VLANID)
			}
		}
	})
}

// checkTransit asserts that a primary Layer2 network's transit subnets
// overlap none of its subnets and join subnets.
func checkTransit(t *testing.T, c *netconf.NetConf, subnets, join []string) {
	t.Helper()
	transit, err := netconf.ParsePrefixes("transitSubnet", c.TransitSubnet)
	if err != nil || len(transit) != len(reserved.Default().Transit) {
		t.Fatalf("transitSubnet %q (%v)", c.TransitSubnet, err)
	}
	taken := append(append([]string{}, subnets...), join...)
	if len(join) == 0 {
		taken = append(taken, strings.Split(reserved.DefaultJoin, ",")...)
	}
	for _, tr := range transit {
		for _, s := range taken {
			if tr.Overlaps(netip.MustParsePrefix(s)) {
				t.Fatalf("transit subnet %s overlaps %s (subnets %q, join %q)", tr, s, subnets, join)
			}
		}
	}
}
