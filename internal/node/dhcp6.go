package node

import (
	"context"
	"net/netip"
	"slices"

	"github.com/go-logr/logr"

	"kvnet.io/kvnet/internal/datapath"
	"kvnet.io/kvnet/internal/dhcp"
)

// ipv6Prefixes returns the IPv6 subnets among subnets: those a network's
// router advertises on-link and serves DHCPv6 in.
func ipv6Prefixes(subnets []netip.Prefix) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range subnets {
		if p.Addr().Is6() && !p.Addr().Is4In6() {
			out = append(out, p.Masked())
		}
	}
	return out
}

// guestDNS returns the DNS servers of a guest's lease, per family: the
// cluster DNS Service's cluster IPs of that family where it has some, else
// the node's servers of that family. DHCPv4 sends the IPv4 ones, DHCPv6
// the IPv6 ones.
func guestDNS(cluster, node []netip.Addr) []netip.Addr {
	var out []netip.Addr
	for _, v6 := range []bool{false, true} {
		of := func(a netip.Addr) bool { return a.Unmap().Is4() != v6 }
		fam := slices.DeleteFunc(slices.Clone(cluster), func(a netip.Addr) bool { return !of(a) })
		if len(fam) == 0 {
			fam = slices.DeleteFunc(slices.Clone(node), func(a netip.Addr) bool { return !of(a) })
		}
		out = append(out, fam...)
	}
	return out
}

// startDHCPv6 opens network w's router advertisement and DHCPv6 server in
// its router namespace at nsPath, on the gateway interface, and runs it
// under s until ctx ends. The server's DUID is the gateway MAC's, the
// same on every node, so a migrated guest's renewals are answered on its
// new node.
func startDHCPv6(ctx context.Context, s *dhcpServer, w DHCPNetwork, nsPath string, logger logr.Logger) error {
	srv, err := dhcp.New6(dhcp.Config6{
		NetNS: nsPath, Interface: datapath.RouterGatewayInterface, Leases: s.leases,
		Prefixes: w.Prefixes6, MTU: w.MTU, DefaultRouter: w.DefaultRouter,
		Log: logger.WithValues("network", w.Network),
	})
	if err != nil {
		return err
	}
	s.done.Go(func() {
		if err := srv.Serve(ctx); err != nil && ctx.Err() == nil {
			logger.Error(err, "DHCPv6 server stopped", "network", w.Network)
		}
	})
	logger.Info("DHCPv6 server and router advertisements started", "network", w.Network, "prefixes", w.Prefixes6)
	return nil
}
