package datapath

import (
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"kvnet.io/kvnet/internal/nl"
)

// This file keeps the kubelet's probes working on a primary-UDN pod
// whatever layout the cluster default network gives eth0. The primary
// network takes the pod's default route, so a probe's reply leaves by
// eth0 only if the probe's source is on eth0's link: so it is on a
// bridge layout (Flannel's cni0: the node probes from the bridge's
// address, in eth0's subnet), but not where the pod gets a /32 and a
// default route via a link-local gateway (Calico's layout: the node
// probes from its own address, reached only through that gateway).

// Gateways are an interface's default routes (DefaultGateways).
type Gateways struct{ routes []netlink.Route }

// DefaultGateways returns the default routes of interface ifName in the
// pod namespace at podNetNS (one per family the default network gave
// it), to be read before the primary network replaces them.
func DefaultGateways(podNetNS, ifName string) (Gateways, error) {
	var out Gateways
	h, err := nl.NewHandle(podNetNS)
	if err != nil {
		return out, err
	}
	defer h.Close()
	l, err := h.LinkByName(ifName)
	if err != nil {
		if nl.IsNotFound(err) {
			return out, nil
		}
		return out, err
	}
	for _, fam := range []int{unix.AF_INET, unix.AF_INET6} {
		rs, err := h.RouteListFiltered(fam, &netlink.Route{LinkIndex: l.Attrs().Index}, netlink.RT_FILTER_OIF)
		if err != nil {
			return out, fmt.Errorf("list routes of %s: %w", ifName, err)
		}
		for _, r := range rs {
			if r.Gw != nil && (r.Dst == nil || isDefaultDst(r.Dst)) {
				out.routes = append(out.routes, r)
			}
		}
	}
	return out, nil
}

func isDefaultDst(d *net.IPNet) bool {
	ones, _ := d.Mask.Size()
	return ones == 0
}

// KeepProbePath makes the replies to the kubelet's probes of the pod at
// podNetNS leave by ifName: for each global address of ifName, the
// source the current namespace (the node's, where kvnet-cni runs) uses
// to reach it is looked up, and unless the pod's replies to that source
// already leave by ifName (on its link, or by a route of the default
// network), a host route to it via the interface's former default
// gateway (from DefaultGateways, with its onlink flag) is added in the
// pod. It returns the routes added.
func KeepProbePath(podNetNS, ifName string, gateways Gateways) ([]Route, error) {
	gws := gateways.routes
	if len(gws) == 0 {
		return nil, nil
	}
	ph, err := nl.NewHandle(podNetNS)
	if err != nil {
		return nil, err
	}
	defer ph.Close()
	l, err := ph.LinkByName(ifName)
	if err != nil {
		if nl.IsNotFound(err) {
			return nil, nil
		}
		return nil, err
	}
	addrs, err := ph.AddrList(l, unix.AF_UNSPEC)
	if err != nil {
		return nil, fmt.Errorf("list addresses of %s: %w", ifName, err)
	}
	hh, err := nl.NewHandle("")
	if err != nil {
		return nil, err
	}
	defer hh.Close()
	var added []Route
	for _, a := range addrs {
		if a.Scope != unix.RT_SCOPE_UNIVERSE {
			continue
		}
		rs, err := hh.RouteGet(a.IP)
		if err != nil || len(rs) == 0 || rs[0].Src == nil {
			continue // the node cannot reach the pod: it will not probe it
		}
		src, ok := netip.AddrFromSlice(rs[0].Src)
		if !ok {
			continue
		}
		src = src.Unmap()
		if back, err := ph.RouteGet(rs[0].Src); err == nil && len(back) > 0 && back[0].LinkIndex == l.Attrs().Index {
			continue // replies already leave by ifName (on its link, or a route of the default network)
		}
		i := slices.IndexFunc(gws, func(r netlink.Route) bool { return (r.Gw.To4() != nil) == src.Is4() })
		if i < 0 {
			continue
		}
		gw := gws[i]
		route := &netlink.Route{LinkIndex: l.Attrs().Index, Dst: ipNet(netip.PrefixFrom(src, src.BitLen())), Gw: gw.Gw, Flags: gw.Flags & int(netlink.FLAG_ONLINK)}
		if err := ph.RouteReplace(route); err != nil {
			return added, fmt.Errorf("route the node's %s (kubelet probes) via %s on %s: %w", src, gw.Gw, ifName, err)
		}
		via, _ := netip.AddrFromSlice(gw.Gw)
		added = append(added, Route{Dst: netip.PrefixFrom(src, src.BitLen()), Via: via.Unmap()})
	}
	return added, nil
}
