package datapath

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"kvnet.io/kvnet/internal/nl"
)

// A Layer3 network's routers meet on an overlay of their own:
//
//	pods ── kvbr<ID> ── kvgw<ID> ══ gw  [router ns]  ovl ~~ VXLAN VNI <ID> ~~ ovl [router ns of another node]
//	        (local pods only)          host subnet's     overlay address,
//	                                   first address     unique per node
//
// ovl is a VXLAN device made in the node namespace (so its UDP socket is
// the node's, on the underlay) and moved into the router. Everything on
// it is static: a permanent neighbour entry and FDB entry per peer router
// and a route per peer host subnet via that router, so nothing is flooded
// or learned between nodes. Tenants are kept apart as on Layer2: each
// network has its own VNI and router namespace.

// ensureOverlay creates or repairs network n's overlay device in its
// router (handle rh, namespace fd) and makes its neighbours, FDB and
// routes match n.Layer3.Peers.
func (d *Datapath) ensureOverlay(n Network, rh *nl.Handle, fd int) error {
	l3 := n.Layer3
	underlay, err := d.h.LinkByName(d.cfg.UnderlayDev)
	if err != nil {
		return fmt.Errorf("underlay device: %w", err)
	}
	want := &netlink.Vxlan{
		LinkAttrs:    netlink.LinkAttrs{Name: VXLANName(n.ID), MTU: d.mtu, HardwareAddr: l3.MAC},
		VxlanId:      n.ID,
		VtepDevIndex: underlay.Attrs().Index,
		SrcAddr:      net.IP(d.cfg.UnderlayIP.AsSlice()),
		Port:         int(d.cfg.vxlanPort()),
		Learning:     false,
		UDPCSum:      true,
	}
	ovl, err := rh.LinkByName(routerOverlayIf)
	if err == nil {
		if vx, ok := ovl.(*netlink.Vxlan); !ok || !sameVXLAN(vx, want) {
			if err := rh.LinkDelByName(routerOverlayIf); err != nil {
				return err
			}
			err = fmt.Errorf("overlay changed: %w", nl.ErrNotFound)
		}
	}
	if errors.Is(err, nl.ErrNotFound) {
		if ovl, err = d.createOverlay(want, rh, fd); err != nil {
			return err
		}
	} else if err != nil {
		return err
	}
	if ovl.Attrs().HardwareAddr.String() != l3.MAC.String() {
		if err := rh.LinkSetHardwareAddr(ovl, l3.MAC); err != nil {
			return fmt.Errorf("set MAC of %q to %q: %w", routerOverlayIf, l3.MAC, err)
		}
	}
	if ovl.Attrs().MTU != d.mtu {
		if err := rh.LinkSetMTU(ovl, d.mtu); err != nil {
			return fmt.Errorf("set MTU of %q: %w", routerOverlayIf, err)
		}
	}
	if ovl.Attrs().Flags&net.FlagUp == 0 {
		if err := rh.LinkSetUp(ovl); err != nil {
			return fmt.Errorf("set %q up: %w", routerOverlayIf, err)
		}
	}
	if err := syncAddrs(rh, ovl, l3.Addrs); err != nil {
		return err
	}
	return errors.Join(syncOverlayFDB(rh, ovl, l3.Peers), syncOverlayNeighbours(rh, ovl, l3.Peers), syncOverlayRoutes(rh, ovl, l3.Peers))
}

// createOverlay makes the VXLAN device want in the node namespace, moves
// it into the router (fd) and names it routerOverlayIf there.
func (d *Datapath) createOverlay(want *netlink.Vxlan, rh *nl.Handle, fd int) (netlink.Link, error) {
	if err := d.h.LinkDelByName(want.Name); err != nil { // a leftover of an interrupted create
		return nil, err
	}
	l, err := d.createLink("vxlan", want)
	if err != nil {
		return nil, err
	}
	if err := d.h.LinkSetNsFd(l, fd); err != nil {
		_ = d.h.LinkDelByName(want.Name)
		return nil, fmt.Errorf("move %q into the router: %w", want.Name, err)
	}
	moved, err := rh.LinkByName(want.Name)
	if err != nil {
		return nil, err
	}
	if err := rh.LinkSetName(moved, routerOverlayIf); err != nil {
		_ = rh.LinkDelByName(want.Name)
		return nil, fmt.Errorf("rename %q to %q: %w", want.Name, routerOverlayIf, err)
	}
	return rh.LinkByName(routerOverlayIf)
}

// syncOverlayFDB makes ovl's FDB hold exactly one permanent entry per peer
// router: its MAC at its VTEP.
func syncOverlayFDB(rh *nl.Handle, ovl netlink.Link, peers []Layer3Peer) error {
	idx := ovl.Attrs().Index
	want := map[string]netip.Addr{} // MAC -> VTEP
	for _, p := range peers {
		want[p.MAC.String()] = p.VTEP.Unmap()
	}
	have, err := rh.NeighList(idx, unix.AF_BRIDGE)
	if err != nil {
		return err
	}
	var errs []error
	present := map[string]bool{}
	for _, e := range have {
		if e.LinkIndex != idx || !isSelf(e) {
			continue
		}
		vtep, _ := netip.AddrFromSlice(e.IP)
		if w, ok := want[e.HardwareAddr.String()]; ok && w == vtep.Unmap() && e.State&netlink.NUD_PERMANENT != 0 && !present[e.HardwareAddr.String()] {
			present[e.HardwareAddr.String()] = true
			continue
		}
		errs = append(errs, rh.NeighDel(&netlink.Neigh{LinkIndex: idx, Family: unix.AF_BRIDGE, Flags: netlink.NTF_SELF, HardwareAddr: e.HardwareAddr, IP: e.IP}))
	}
	for _, p := range peers {
		if present[p.MAC.String()] {
			continue
		}
		if err := rh.NeighSet(&netlink.Neigh{LinkIndex: idx, Family: unix.AF_BRIDGE, Flags: netlink.NTF_SELF,
			State: netlink.NUD_PERMANENT | netlink.NUD_NOARP, HardwareAddr: p.MAC, IP: net.IP(p.VTEP.Unmap().AsSlice())}); err != nil {
			errs = append(errs, fmt.Errorf("set overlay FDB entry %q -> VTEP %q: %w", p.MAC, p.VTEP, err))
		}
	}
	return errors.Join(errs...)
}

// syncOverlayNeighbours makes ovl's permanent ARP/NDP entries exactly the
// peer routers' addresses with their MACs.
func syncOverlayNeighbours(rh *nl.Handle, ovl netlink.Link, peers []Layer3Peer) error {
	idx := ovl.Attrs().Index
	want := map[netip.Addr]string{} // peer address -> MAC
	for _, p := range peers {
		for _, a := range p.Addrs {
			want[a.Unmap()] = p.MAC.String()
		}
	}
	var errs []error
	present := map[netip.Addr]bool{}
	for _, fam := range []int{unix.AF_INET, unix.AF_INET6} {
		have, err := rh.NeighList(idx, fam)
		if err != nil {
			return err
		}
		for _, e := range have {
			if e.State&netlink.NUD_PERMANENT == 0 {
				continue
			}
			a, _ := netip.AddrFromSlice(e.IP)
			if mac, ok := want[a.Unmap()]; ok && mac == e.HardwareAddr.String() {
				present[a.Unmap()] = true
				continue
			}
			errs = append(errs, rh.NeighDel(&e))
		}
	}
	for a, mac := range want {
		if present[a] {
			continue
		}
		hw, _ := net.ParseMAC(mac)
		fam := unix.AF_INET
		if a.Is6() {
			fam = unix.AF_INET6
		}
		if err := rh.NeighSet(&netlink.Neigh{LinkIndex: idx, Family: fam, State: netlink.NUD_PERMANENT, IP: net.IP(a.AsSlice()), HardwareAddr: hw}); err != nil {
			errs = append(errs, fmt.Errorf("set overlay neighbour %s -> %s: %w", a, mac, err))
		}
	}
	return errors.Join(errs...)
}

// syncOverlayRoutes makes the router's routes through ovl exactly one per
// peer host subnet, via the peer router's address of its family.
func syncOverlayRoutes(rh *nl.Handle, ovl netlink.Link, peers []Layer3Peer) error {
	idx := ovl.Attrs().Index
	want := map[netip.Prefix]netip.Addr{} // host subnet -> next hop
	for _, p := range peers {
		for _, sub := range p.Subnets {
			for _, a := range p.Addrs {
				if a.Is4() == sub.Addr().Is4() {
					want[sub] = a
				}
			}
		}
	}
	have, err := rh.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{LinkIndex: idx}, netlink.RT_FILTER_OIF)
	if err != nil {
		return err
	}
	var errs []error
	for _, r := range have {
		if r.Gw == nil || r.Dst == nil {
			continue // the overlay's own connected routes
		}
		dst, _ := netip.AddrFromSlice(r.Dst.IP)
		ones, _ := r.Dst.Mask.Size()
		gw, _ := netip.AddrFromSlice(r.Gw)
		if w, ok := want[netip.PrefixFrom(dst.Unmap(), ones)]; ok && w == gw.Unmap() {
			continue
		}
		errs = append(errs, rh.RouteDel(&r))
	}
	for sub, gw := range want {
		r := &netlink.Route{LinkIndex: idx, Dst: ipNet(sub), Gw: net.IP(gw.AsSlice())}
		if err := rh.RouteReplace(r); err != nil {
			errs = append(errs, fmt.Errorf("set route %s via %s dev %s: %w", sub, gw, routerOverlayIf, err))
		}
	}
	return errors.Join(errs...)
}
