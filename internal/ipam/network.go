package ipam

import (
	"fmt"
	"net/netip"
	"strings"

	"kvnet.io/kvnet/internal/ipam/allocator"
	"kvnet.io/kvnet/internal/netconf"
)

// NetworkConfig returns the allocator configuration of a served network.
// ok is false for networks without IPAM (no subnets): they still get MACs.
func NetworkConfig(s *netconf.Served) (allocator.Config, error) {
	cfg := allocator.Config{Name: s.Name}
	var err error
	parse := func(key, v string) []netip.Prefix {
		if err != nil {
			return nil
		}
		var out []netip.Prefix
		out, err = netconf.ParsePrefixes(key, v)
		return out
	}
	switch {
	case s.Conf != nil:
		c := s.Conf
		if c.Topology == netconf.TopologyLayer3 {
			return cfg, fmt.Errorf("network %q: layer3 topology: addresses come from each node's host subnet (HostSubnetConfig)", s.Name)
		}
		cfg.Subnets = parse("subnets", c.Subnets)
		cfg.Exclude = parse("excludeSubnets", c.ExcludeSubnets)
		cfg.Reserved = parse("reservedSubnets", c.ReservedSubnets)
		cfg.Infrastructure = parse("infrastructureSubnets", c.InfrastructureSubnets)
		if err == nil {
			cfg.Gateways, err = netconf.ParseAddrs("defaultGatewayIPs", c.DefaultGatewayIPs)
		}
		cfg.Primary = c.IsPrimary()
	case s.IPAM != nil:
		cfg.Subnets = parse("ipam.subnets", s.IPAM.Subnets)
		cfg.Exclude = parse("ipam.excludeSubnets", s.IPAM.ExcludeSubnets)
		if err == nil {
			var gws []netip.Addr
			gws, err = netconf.ParseAddrs("ipam.gatewayIPs", s.IPAM.GatewayIPs)
			// Gateways of a secondary network are excluded, not routed through.
			for _, g := range gws {
				cfg.Exclude = append(cfg.Exclude, netip.PrefixFrom(g, g.BitLen()))
			}
		}
	default:
		return cfg, fmt.Errorf("network %q: nothing to allocate", s.Name)
	}
	return cfg, err
}

// HostSubnetConfig returns the allocator configuration of one node's host
// subnets of a Layer3 network (see package hostsubnet): the node router
// (first address) and the next one are kept from allocation on every
// Layer3 network, primary or secondary, as upstream keeps its gateway and
// management port addresses; Allocation.Gateways holds the router.
func HostSubnetConfig(s *netconf.Served, hostSubnets []netip.Prefix) (allocator.Config, error) {
	if s.Conf == nil || s.Conf.Topology != netconf.TopologyLayer3 {
		return allocator.Config{}, fmt.Errorf("network %q: not a layer3 network", s.Name)
	}
	if len(hostSubnets) == 0 {
		return allocator.Config{}, fmt.Errorf("network %q: no host subnets", s.Name)
	}
	cfg := allocator.Config{Name: HostSubnetKey(s.Name, hostSubnets), Subnets: hostSubnets, Primary: true}
	var err error
	if cfg.Exclude, err = netconf.ParsePrefixes("excludeSubnets", s.Conf.ExcludeSubnets); err != nil {
		return cfg, err
	}
	return cfg, nil
}

// HostSubnetKey names the allocator of one node's host subnets of a
// Layer3 network: the network name and the host subnets, e.g.
// "tenant_l3|10.100.1.0/24". Pods' addresses on a Layer3 network tell
// which host subnets (and so which allocator) they came from.
func HostSubnetKey(network string, hostSubnets []netip.Prefix) string {
	parts := make([]string, len(hostSubnets))
	for i, p := range hostSubnets {
		parts[i] = p.String()
	}
	return network + "|" + strings.Join(parts, ",")
}
