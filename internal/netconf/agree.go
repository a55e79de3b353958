package netconf

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// Diff returns how b's network configuration differs from a's, one
// `"key": a vs b` entry per field, or nothing when two NADs naming the
// same network agree on it, as OVN-Kubernetes requires of them: topology,
// role, MTU, VLAN, physical network, persistent IPs and every subnet list
// (compared as sets). netAttachDefName and cniVersion may differ.
func Diff(a, b *NetConf) []string {
	var out []string
	field := func(key, x, y string) {
		if x != y {
			out = append(out, fmt.Sprintf("%q: %s vs %s", key, quoteOrNone(x), quoteOrNone(y)))
		}
	}
	field("topology", a.Topology, b.Topology)
	field("role", orDefault(a.Role, RoleSecondary), orDefault(b.Role, RoleSecondary))
	field("mtu", mtuString(a), mtuString(b))
	field("vlanID", intOrNone(a.VLANID), intOrNone(b.VLANID))
	field("physicalNetworkName", a.PhysicalNetworkName, b.PhysicalNetworkName)
	field("allowPersistentIPs", strconv.FormatBool(a.AllowPersistentIPs), strconv.FormatBool(b.AllowPersistentIPs))
	for _, f := range []struct{ key, x, y string }{
		{"subnets", a.Subnets, b.Subnets},
		{"excludeSubnets", a.ExcludeSubnets, b.ExcludeSubnets},
		{"reservedSubnets", a.ReservedSubnets, b.ReservedSubnets},
		{"infrastructureSubnets", a.InfrastructureSubnets, b.InfrastructureSubnets},
		{"defaultGatewayIPs", a.DefaultGatewayIPs, b.DefaultGatewayIPs},
		{"joinSubnet", a.JoinSubnet, b.JoinSubnet},
		{"transitSubnet", a.TransitSubnet, b.TransitSubnet},
	} {
		field(f.key, normalList(f.x), normalList(f.y))
	}
	return out
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func quoteOrNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return strconv.Quote(s)
}

func intOrNone(i int) string {
	if i == 0 {
		return ""
	}
	return strconv.Itoa(i)
}

// mtuString is the MTU the network gets: a localnet network that sets
// none gets LocalnetDefaultMTU; an overlay network's unset MTU is the
// node's.
func mtuString(c *NetConf) string {
	if c.MTU == 0 && c.Topology == TopologyLocalnet {
		return strconv.Itoa(LocalnetDefaultMTU)
	}
	return intOrNone(c.MTU)
}

// normalList sorts a comma-joined list of prefixes or addresses (masked
// prefixes, canonical text) so that order and spelling do not count.
func normalList(list string) string {
	if list == "" {
		return ""
	}
	var out []string
	for s := range strings.SplitSeq(list, ",") {
		s = strings.TrimSpace(s)
		if p, err := netip.ParsePrefix(s); err == nil {
			s = p.Masked().String()
		} else if a, err := netip.ParseAddr(s); err == nil {
			s = a.String()
		}
		out = append(out, s)
	}
	slices.Sort(out)
	return strings.Join(out, ",")
}
