package ipam

import (
	"fmt"
	"net/netip"

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
			return cfg, fmt.Errorf("network %q: layer3 topology: per-node subnets are not allocated by kvnet yet", s.Name)
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
