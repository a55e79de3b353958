package datapath

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"kvnet.io/kvnet/internal/nl"
)

// A primary network's router is a namespace of its own (VRF devices are
// not available everywhere kvnet runs), wired like this:
//
//	pods ── kvbr<ID> ── kvgw<ID> ══ gw       [router ns]  transit ══ kvtr<ID> ── node ── UnderlayDev
//	                              gateway IPs,              169.254.0.(10+2ID-1)  169.254.0.(10+2ID)
//	                              GatewayMAC(ID)
//
// The router SNATs everything it sends to the node to its transit address,
// and the node SNATs that again to its underlay address, so tenant subnets
// never appear in the node namespace and may overlap between tenants.

// ensureRouter creates or repairs network n's router namespace, its two
// veths, addresses, routes, sysctls and rules. If it created the namespace
// and then fails, it removes it again.
func (d *Datapath) ensureRouter(n Network, services []Service, rp *routerPolicy) (err error) {
	name := RouterNSName(d.cfg, n.ID)
	existed := nl.NamedNSExists(name)
	path, err := nl.CreateNamedNS(name)
	if err != nil {
		return fmt.Errorf("network %q: %w", n.Name, err)
	}
	defer func() {
		if err != nil && !existed {
			_ = nl.DeleteNamedNS(name)
		}
	}()
	if err := withNS(path, func(fd int) error { return d.wireRouter(n, services, rp, path, fd) }); err != nil {
		return fmt.Errorf("network %q: router %q: %w", n.Name, name, err)
	}
	return nil
}

// wireRouter does ensureRouter's work inside the router namespace at path
// (open as fd). rp is what it checks on Service connections.
func (d *Datapath) wireRouter(n Network, services []Service, rp *routerPolicy, path string, fd int) error {
	// Rules and sysctls first: a fresh namespace forwards everything, and
	// the rules only name interfaces, so they can precede them.
	conn, err := nftConn(fd)
	if err != nil {
		return err
	}
	if err := syncTables(conn, routerRules(n, services, rp)); err != nil {
		return err
	}
	if err := d.cutRouterDenied(n, rp, path); err != nil {
		return err
	}
	fams := networkFamilies(n)
	sysctls := [][2]string{
		{"net/ipv4/ip_forward", "1"},
		// Pods of several subnets share one bridge; redirects between
		// them would only confuse guests.
		{"net/ipv4/conf/all/send_redirects", "0"},
		{"net/ipv4/conf/default/send_redirects", "0"}, // inherited by gw, created below
		// gw and svc share the network's L2: each answers ARP only for
		// its own addresses, so that pods resolve the gateway to the
		// gateway MAC and other routers this router's service address to
		// its service MAC.
		{"net/ipv4/conf/all/arp_ignore", "1"},
		{"net/ipv4/conf/all/arp_announce", "2"},
	}
	if hasV6(fams) {
		sysctls = append(sysctls, [2]string{"net/ipv6/conf/all/forwarding", "1"})
	}
	if n.GuestServiceOnly() {
		// It forwards nothing, and takes no advertisement from a guest
		// (a router that does not forward would accept them).
		sysctls = [][2]string{
			{"net/ipv6/conf/all/accept_ra", "0"},
			{"net/ipv6/conf/default/accept_ra", "0"}, // inherited by gw, created below
		}
	}
	for _, kv := range sysctls {
		if err := nl.SetSysctl(path, kv[0], kv[1]); err != nil {
			return err
		}
	}
	if hasV6(fams) && !n.GuestServiceOnly() {
		if err := nl.SetSysctl(d.nsPath, "net/ipv6/conf/all/forwarding", "1"); err != nil {
			return err
		}
	}

	rh, err := nl.NewHandle(path)
	if err != nil {
		return err
	}
	defer rh.Close()

	gwPort, gwIf, err := d.ensureVethPair(rh, fd, gwPortName(n.ID), routerGwIf, GatewayMAC(n.ID), true)
	if err != nil {
		return err
	}
	if n.Primary { // a secondary Layer3 network has no egress
		if err := d.ensureTransit(n, rh, fd, fams); err != nil {
			return err
		}
	}

	// Bridge side: the gateway port, with the gateway MAC pinned to it.
	br, err := d.h.LinkByName(BridgeName(n.ID))
	if err != nil {
		return err
	}
	if err := d.ensurePort(gwPort, br, false); err != nil {
		return err
	}
	if err := d.syncPortFDB(gwPort, GatewayMAC(n.ID)); err != nil {
		return err
	}

	// Gateway addresses: the same on every node.
	var gwAddrs []netip.Prefix
	for i, gw := range n.Gateways {
		gwAddrs = append(gwAddrs, netip.PrefixFrom(gw, n.Subnets[i].Bits()))
	}
	if err := syncAddrs(rh, gwIf, gwAddrs); err != nil {
		return err
	}

	if err := d.ensureServicePort(n, rh, fd, br); err != nil {
		return err
	}
	if n.Layer3 != nil {
		if err := d.ensureOverlay(n, rh, fd); err != nil {
			return err
		}
	}
	return nil
}

// ensureTransit makes network n's egress path: the transit veth between
// its router (at rh, fd) and the node, their addresses and routes.
func (d *Datapath) ensureTransit(n Network, rh *nl.Handle, fd int, fams []bool) error {
	trNode, trRouter, err := d.ensureVethPair(rh, fd, transitName(n.ID), routerTransitIf, nil, false)
	if err != nil {
		return err
	}
	var routerAddrs, nodeAddrs []netip.Prefix
	for _, v6 := range []bool{false, true} {
		router, node, err := TransitAddrs(n.ID, v6)
		if err != nil {
			return err
		}
		if v6 && !hasV6(fams) || !v6 && !hasV4(fams) {
			// Drop a default route of a family the network lost.
			_ = rh.RouteDel(&netlink.Route{Dst: defaultDst(v6), Gw: net.IP(node.AsSlice())})
			continue
		}
		routerAddrs = append(routerAddrs, hostPrefix(router))
		nodeAddrs = append(nodeAddrs, hostPrefix(node))
	}
	if err := syncAddrs(rh, trRouter, routerAddrs); err != nil {
		return err
	}
	if err := syncAddrs(d.h, trNode, nodeAddrs); err != nil {
		return err
	}
	for i := range routerAddrs {
		router, node := routerAddrs[i].Addr(), nodeAddrs[i].Addr()
		v6 := router.Is6()
		// On-link /32 (/128) routes to the peer: each side has a host
		// address only, so neither has a connected route to the other.
		routes := []struct {
			h     *nl.Handle
			route *netlink.Route
		}{
			{rh, &netlink.Route{LinkIndex: trRouter.Attrs().Index, Dst: ipNet(hostPrefix(node)), Scope: netlink.SCOPE_LINK}},
			{rh, &netlink.Route{LinkIndex: trRouter.Attrs().Index, Dst: defaultDst(v6), Gw: net.IP(node.AsSlice())}},
			{d.h, &netlink.Route{LinkIndex: trNode.Attrs().Index, Dst: ipNet(hostPrefix(router)), Scope: netlink.SCOPE_LINK}},
		}
		for _, r := range routes {
			if err := r.h.RouteReplace(r.route); err != nil {
				return fmt.Errorf("set route %q: %w", r.route.Dst, err)
			}
		}
	}
	return nil
}

func hasV4(fams []bool) bool { return len(fams) > 0 && !fams[0] }
func hasV6(fams []bool) bool { return len(fams) > 0 && fams[len(fams)-1] }

// defaultDst returns the default route's destination of a family.
func defaultDst(v6 bool) *net.IPNet {
	if v6 {
		return &net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}
	}
	return &net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}
}

// ipNet converts a prefix, keeping its host bits.
func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: net.IP(p.Addr().AsSlice()), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// ensureVethPair makes sure veth nodeName (node namespace) is paired with
// routerName in the router namespace (fd, handle rh), both with the pod
// MTU and up; routerMAC, if set, is the router end's MAC, and bridgePort
// says the node end will be a bridge port. A half pair or one paired
// elsewhere is replaced.
func (d *Datapath) ensureVethPair(rh *nl.Handle, fd int, nodeName, routerName string, routerMAC net.HardwareAddr, bridgePort bool) (node, router netlink.Link, err error) {
	node, nerr := d.h.LinkByName(nodeName)
	router, rerr := rh.LinkByName(routerName)
	if nerr != nil && !errors.Is(nerr, nl.ErrNotFound) {
		return nil, nil, nerr
	}
	if rerr != nil && !errors.Is(rerr, nl.ErrNotFound) {
		return nil, nil, rerr
	}
	paired := nerr == nil && rerr == nil && node.Type() == "veth" && router.Type() == "veth" &&
		node.Attrs().ParentIndex == router.Attrs().Index && router.Attrs().ParentIndex == node.Attrs().Index
	if !paired {
		if err := d.h.LinkDelByName(nodeName); err != nil {
			return nil, nil, err
		}
		if err := rh.LinkDelByName(routerName); err != nil {
			return nil, nil, err
		}
		veth := &netlink.Veth{
			LinkAttrs:        netlink.LinkAttrs{Name: nodeName, MTU: d.mtu},
			PeerName:         routerName,
			PeerNamespace:    netlink.NsFd(fd),
			PeerMTU:          uint32(d.mtu),
			PeerHardwareAddr: routerMAC,
		}
		if err := d.h.LinkAdd(veth); err != nil {
			return nil, nil, fmt.Errorf("create veth %q <-> %q: %w", nodeName, routerName, err)
		}
		if node, err = d.h.LinkByName(nodeName); err != nil {
			return nil, nil, err
		}
		if router, err = rh.LinkByName(routerName); err != nil {
			return nil, nil, err
		}
		if bridgePort {
			// Keep the node's stack off the tenant network.
			if err := d.h.LinkSetIP6AddrGenMode(node, in6AddrGenModeNone); err != nil {
				return nil, nil, fmt.Errorf("disable IPv6 addresses on %q: %w", nodeName, err)
			}
		}
	}
	if routerMAC != nil && router.Attrs().HardwareAddr.String() != routerMAC.String() {
		if err := rh.LinkSetHardwareAddr(router, routerMAC); err != nil {
			return nil, nil, fmt.Errorf("set MAC of %q to %q: %w", routerName, routerMAC, err)
		}
	}
	if err := d.ensureMTUUp(node, d.mtu); err != nil {
		return nil, nil, err
	}
	if router.Attrs().MTU != d.mtu {
		if err := rh.LinkSetMTU(router, d.mtu); err != nil {
			return nil, nil, fmt.Errorf("set MTU of %q to %d: %w", routerName, d.mtu, err)
		}
	}
	if router.Attrs().Flags&net.FlagUp == 0 {
		if err := rh.LinkSetUp(router); err != nil {
			return nil, nil, fmt.Errorf("set link %q up: %w", routerName, err)
		}
	}
	return node, router, nil
}

// syncAddrs makes l's addresses exactly want, leaving IPv6 link-local
// addresses alone. IPv6 addresses skip DAD: kvnet assigns
// them and owns the link, and DAD would delay them by seconds.
func syncAddrs(h *nl.Handle, l netlink.Link, want []netip.Prefix) error {
	have, err := h.AddrList(l, unix.AF_UNSPEC)
	if err != nil {
		return err
	}
	wanted := map[netip.Prefix]bool{} // address with prefix length -> wanted
	for _, p := range want {
		wanted[p] = true
	}
	present := map[netip.Prefix]bool{} // address with prefix length -> on the link
	var errs []error
	for _, a := range have {
		addr, ok := netip.AddrFromSlice(a.IP)
		if !ok || addr.Unmap().Is6() && addr.IsLinkLocalUnicast() {
			continue
		}
		ones, _ := a.Mask.Size()
		p := netip.PrefixFrom(addr.Unmap(), ones)
		if wanted[p] {
			present[p] = true
			continue
		}
		errs = append(errs, h.AddrDel(l, &a))
	}
	for _, p := range want {
		if present[p] {
			continue
		}
		a := &netlink.Addr{IPNet: ipNet(p)}
		if p.Addr().Is6() {
			a.Flags = unix.IFA_F_NODAD
		}
		if err := h.AddrAdd(l, a); err != nil && !errors.Is(err, unix.EEXIST) {
			errs = append(errs, fmt.Errorf("add address %q to %q: %w", p, l.Attrs().Name, err))
		}
	}
	return errors.Join(errs...)
}

// ensureServicePort gives the router of network n its service port: the
// veth svc <-> kvsv<ID> (a port of the network's bridge br, its MAC
// pinned there) holding n.ServiceAddrs, and the routing table, chosen by
// serviceMark, that sends service connections to the network's subnets
// out of it. Without service addresses, all of it goes.
func (d *Datapath) ensureServicePort(n Network, rh *nl.Handle, fd int, br netlink.Link) error {
	if len(n.ServiceAddrs) == 0 {
		if err := d.h.LinkDelByName(svcPortName(n.ID)); err != nil {
			return err
		}
		return syncServiceRules(rh, nil)
	}
	port, svc, err := d.ensureVethPair(rh, fd, svcPortName(n.ID), routerSvcIf, n.ServiceMAC, true)
	if err != nil {
		return err
	}
	if err := d.ensurePort(port, br, false); err != nil {
		return err
	}
	if err := d.syncPortFDB(port, n.ServiceMAC); err != nil {
		return err
	}
	if err := syncAddrs(rh, svc, n.ServiceAddrs); err != nil {
		return err
	}
	var fams []int
	for _, a := range n.ServiceAddrs {
		fam := netlink.FAMILY_V4
		if a.Addr().Is6() {
			fam = netlink.FAMILY_V6
		}
		fams = append(fams, fam)
		for _, sub := range n.Subnets {
			if sub.Addr().Is6() != a.Addr().Is6() {
				continue
			}
			r := &netlink.Route{LinkIndex: svc.Attrs().Index, Dst: ipNet(sub), Scope: netlink.SCOPE_LINK, Table: serviceMark}
			if err := rh.RouteReplace(r); err != nil {
				return fmt.Errorf("set route %s dev %s table %d: %w", sub, routerSvcIf, serviceMark, err)
			}
		}
	}
	return syncServiceRules(rh, fams)
}

// syncServiceRules makes the router's policy rules "fwmark serviceMark
// lookup serviceMark" exist for exactly the families fams.
func syncServiceRules(rh *nl.Handle, fams []int) error {
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		rules, err := rh.RuleList(fam)
		if err != nil {
			return fmt.Errorf("list policy rules: %w", err)
		}
		want := slices.Contains(fams, fam)
		have := false
		for _, r := range rules {
			if r.Mark != serviceMark || r.Table != serviceMark {
				continue
			}
			if want && !have {
				have = true
				continue
			}
			if err := rh.RuleDel(&r); err != nil {
				return fmt.Errorf("delete policy rule fwmark %d: %w", serviceMark, err)
			}
		}
		if want && !have {
			r := netlink.NewRule()
			r.Family, r.Mark, r.Table, r.Priority = fam, serviceMark, serviceMark, 1000
			if err := rh.RuleAdd(r); err != nil {
				return fmt.Errorf("add policy rule fwmark %d lookup %d: %w", serviceMark, serviceMark, err)
			}
		}
	}
	return nil
}
