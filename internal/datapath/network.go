package datapath

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"kvnet.io/kvnet/internal/nl"
)

// zeroMAC keys the VXLAN "default destination" FDB entries: frames whose
// destination has no entry of its own (broadcast, multicast, unknown
// unicast) go to every VTEP listed under it, i.e. head-end replication.
var zeroMAC = net.HardwareAddr{0, 0, 0, 0, 0, 0}

// in6AddrGenModeNone stops the kernel from giving a link an IPv6
// link-local address: kvnet's bridges and bridge ports must not let the
// node's own stack speak (MLD, router solicitations) into tenant networks.
const in6AddrGenModeNone = 1

// ensureNetwork creates or repairs network n's bridge and VXLAN device and
// makes the VXLAN FDB match n.Remotes and the network's remote MACs.
func (d *Datapath) ensureNetwork(n Network, remotes []RemoteMAC) error {
	mtu := d.mtu
	if n.Physical != "" && n.MTU != 0 {
		mtu = n.MTU
	}
	br, err := d.ensureBridge(n.ID, mtu)
	if err != nil {
		return fmt.Errorf("network %q: %w", n.Name, err)
	}
	if n.Physical != "" {
		if err := d.ensurePhysicalPatch(n, br, mtu); err != nil {
			return fmt.Errorf("network %q: %w", n.Name, err)
		}
		return nil
	}
	if n.Layer3 != nil {
		return nil // local pods only; its router holds the overlay
	}
	vx, err := d.ensureVXLAN(n.ID, br)
	if err != nil {
		return fmt.Errorf("network %q: %w", n.Name, err)
	}
	var macs []RemoteMAC
	for _, m := range remotes {
		if m.Network == n.Name {
			macs = append(macs, m)
		}
	}
	// This node never floods to itself, even if a stale peer holds its
	// address.
	peers := slices.DeleteFunc(slices.Clone(n.Remotes), func(a netip.Addr) bool { return a == d.cfg.UnderlayIP })
	if err := d.syncVXLANFDB(vx, peers, macs); err != nil {
		return fmt.Errorf("network %q: %w", n.Name, err)
	}
	return nil
}

// ensureBridge creates or repairs bridge kvbr<id>, up, with MTU mtu.
func (d *Datapath) ensureBridge(id, mtu int) (netlink.Link, error) {
	name := BridgeName(id)
	l, err := d.h.LinkByName(name)
	if err == nil && l.Type() != "bridge" {
		// A kvnet name on something else (a crash mid-rename, a human):
		// the name is ours, so replace it.
		if err := d.h.LinkDelByName(name); err != nil {
			return nil, err
		}
		err = fmt.Errorf("link %q is a %s: %w", name, l.Type(), nl.ErrNotFound)
	}
	if errors.Is(err, nl.ErrNotFound) {
		// No multicast snooping: with head-end replication every
		// multicast frame is flooded anyway, and snooping without a
		// querier only makes IPv6 neighbour discovery flaky.
		snoop := false
		br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: name, MTU: mtu}, MulticastSnooping: &snoop}
		if l, err = d.createLink("bridge", br); err != nil {
			return nil, err
		}
	} else if err != nil {
		return nil, err
	}
	if err := d.ensureMTUUp(l, mtu); err != nil {
		return nil, err
	}
	return l, nil
}

// createLink creates want, a link of kind what, reads it back and turns
// off IPv6 address generation on it: kvnet's bridges and VXLAN devices
// carry no addresses.
func (d *Datapath) createLink(what string, want netlink.Link) (netlink.Link, error) {
	name := want.Attrs().Name
	if err := d.h.LinkAdd(want); err != nil {
		return nil, fmt.Errorf("create %s %q: %w", what, name, err)
	}
	l, err := d.h.LinkByName(name)
	if err != nil {
		return nil, err
	}
	if err := d.h.LinkSetIP6AddrGenMode(l, in6AddrGenModeNone); err != nil {
		return nil, fmt.Errorf("disable IPv6 addresses on %q: %w", name, err)
	}
	return l, nil
}

// ensureMTUUp sets l's MTU to mtu and brings it up.
func (d *Datapath) ensureMTUUp(l netlink.Link, mtu int) error {
	if l.Attrs().MTU != mtu {
		if err := d.h.LinkSetMTU(l, mtu); err != nil {
			return fmt.Errorf("set MTU of %q to %d: %w", l.Attrs().Name, mtu, err)
		}
	}
	if l.Attrs().Flags&net.FlagUp == 0 {
		if err := d.h.LinkSetUp(l); err != nil {
			return fmt.Errorf("set link %q up: %w", l.Attrs().Name, err)
		}
	}
	return nil
}

// ensureVXLAN creates or repairs kvvx<id>: VNI id, local UnderlayIP, UDP
// 4789, enslaved to br. Learning is on so that the entry of a migrating
// MAC (a dynamic one; every other remote MAC has a permanent entry from
// the state, which learning never changes) follows the guest to its new
// node with its first frame.
func (d *Datapath) ensureVXLAN(id int, br netlink.Link) (netlink.Link, error) {
	name := VXLANName(id)
	underlay, err := d.h.LinkByName(d.cfg.UnderlayDev)
	if err != nil {
		return nil, fmt.Errorf("underlay device: %w", err)
	}
	want := &netlink.Vxlan{
		LinkAttrs:    netlink.LinkAttrs{Name: name, MTU: d.mtu},
		VxlanId:      id,
		VtepDevIndex: underlay.Attrs().Index,
		SrcAddr:      net.IP(d.cfg.UnderlayIP.AsSlice()),
		Port:         int(d.cfg.vxlanPort()),
		Learning:     true,
		UDPCSum:      true,
	}
	l, err := d.h.LinkByName(name)
	if err == nil {
		if vx, ok := l.(*netlink.Vxlan); !ok || !sameVXLAN(vx, want) {
			// VXLAN parameters cannot be changed in place.
			if err := d.h.LinkDelByName(name); err != nil {
				return nil, err
			}
			err = fmt.Errorf("vxlan %q changed: %w", name, nl.ErrNotFound)
		}
	}
	if errors.Is(err, nl.ErrNotFound) {
		if l, err = d.createLink("vxlan", want); err != nil {
			return nil, err
		}
	} else if err != nil {
		return nil, err
	}
	// Learning on the VXLAN port lets a migrating MAC (no static entry)
	// move to the tunnel when the guest speaks from another node; every
	// other MAC has a static entry, which learning never moves.
	if err := d.ensurePort(l, br, true); err != nil {
		return nil, err
	}
	if err := d.ensureMTUUp(l, d.mtu); err != nil {
		return nil, err
	}
	return l, nil
}

// sameVXLAN reports whether have is configured as want.
func sameVXLAN(have, want *netlink.Vxlan) bool {
	return have.VxlanId == want.VxlanId && have.SrcAddr.Equal(want.SrcAddr) &&
		have.Port == want.Port && have.Learning == want.Learning && have.VtepDevIndex == want.VtepDevIndex
}

// ensurePort enslaves l to bridge br, with learning as given. Every MAC on
// a kvnet bridge is known from the state and has a static entry (pods on
// their port, remote pods on the VXLAN port, the gateway on the router
// port), which learning never moves; only a migrating VM's MAC has none,
// and learning is on only where it may appear: its two ports and the
// VXLAN port.
func (d *Datapath) ensurePort(l, br netlink.Link, learning bool) error {
	if l.Attrs().MasterIndex != br.Attrs().Index {
		if err := d.h.LinkSetMaster(l, br); err != nil {
			return fmt.Errorf("attach %q to bridge %q: %w", l.Attrs().Name, br.Attrs().Name, err)
		}
	}
	// Set only when it differs: every write notifies link watchers
	// (kvnet-node's own among them) even when nothing changes.
	if d.learning == nil {
		have, err := d.h.BridgePortLearning()
		if err != nil {
			return err
		}
		d.learning = have
	}
	if have, ok := d.learning[l.Attrs().Index]; ok && have == learning {
		return nil
	}
	if err := d.h.LinkSetLearning(l, learning); err != nil {
		return fmt.Errorf("set learning on bridge port %q: %w", l.Attrs().Name, err)
	}
	d.learning[l.Attrs().Index] = learning
	return nil
}

// isSelf and isMaster tell FDB entries apart: the VXLAN device's own table
// ("self": MAC -> remote VTEP) and the bridge's table ("master": MAC ->
// port).
func isSelf(n netlink.Neigh) bool   { return n.Flags&netlink.NTF_SELF != 0 }
func isMaster(n netlink.Neigh) bool { return n.Flags&netlink.NTF_MASTER != 0 }

// isStatic reports whether a bridge FDB entry was added as static by a user
// (kvnet). Entries the bridge owns (a port's own MAC) are permanent, learned
// ones are reachable/stale; neither is ours to delete.
func isStatic(n netlink.Neigh) bool {
	return n.State&netlink.NUD_NOARP != 0 && n.State&netlink.NUD_PERMANENT == 0
}

// syncVXLANFDB makes vx's FDB hold exactly: one all-zero entry per remote
// node (head-end replication), one entry per remote MAC pointing at its
// VTEP, and a static bridge entry per remote MAC on the VXLAN port.
func (d *Datapath) syncVXLANFDB(vx netlink.Link, remotes []netip.Addr, macs []RemoteMAC) error {
	idx := vx.Attrs().Index
	entries, err := d.h.NeighList(idx, unix.AF_BRIDGE)
	if err != nil {
		return err
	}
	wantFlood := map[netip.Addr]bool{} // remote VTEP -> wanted in the flood list
	for _, r := range remotes {
		wantFlood[r.Unmap()] = true
	}
	wantMAC := map[string]netip.Addr{} // MAC -> VTEP
	migrating := map[string]bool{}     // MAC -> its entry is a learned one
	for _, m := range macs {
		wantMAC[m.MAC.String()] = m.VTEP.Unmap()
		migrating[m.MAC.String()] = m.Migrating
	}
	haveFlood := map[netip.Addr]bool{} // remote VTEP -> in the flood list
	haveMAC := map[string]netip.Addr{} // MAC -> VTEP of its self entry
	haveStatic := map[string]bool{}    // MAC -> static bridge entry on the port
	var errs []error
	for _, e := range entries {
		if e.LinkIndex != idx {
			continue
		}
		mac := e.HardwareAddr.String()
		switch {
		case isSelf(e) && e.IP != nil:
			vtep, _ := netip.AddrFromSlice(e.IP)
			vtep = vtep.Unmap()
			if bytes.Equal(e.HardwareAddr, zeroMAC) {
				if wantFlood[vtep] {
					haveFlood[vtep] = true
					continue
				}
			} else if want, ok := wantMAC[mac]; ok && !haveMAC[mac].IsValid() &&
				(migrating[mac] && e.State&netlink.NUD_PERMANENT == 0 || !migrating[mac] && want == vtep && e.State&netlink.NUD_PERMANENT != 0) {
				// A migrating MAC keeps the VTEP learning gave its
				// dynamic entry; any other has a permanent entry to its
				// VTEP.
				haveMAC[mac] = vtep
				continue
			}
			// Not wanted (or a second destination for one MAC, which
			// kvnet never makes): remove this destination only.
			errs = append(errs, d.h.NeighDel(&netlink.Neigh{LinkIndex: idx, Family: unix.AF_BRIDGE,
				Flags: netlink.NTF_SELF, HardwareAddr: e.HardwareAddr, IP: e.IP}))
		case isMaster(e) && isStatic(e):
			if _, ok := wantMAC[mac]; ok {
				haveStatic[mac] = true
				continue
			}
			errs = append(errs, d.h.NeighDel(&netlink.Neigh{LinkIndex: idx, Family: unix.AF_BRIDGE,
				Flags: netlink.NTF_MASTER, HardwareAddr: e.HardwareAddr}))
		}
	}
	for vtep := range wantFlood {
		if haveFlood[vtep] {
			continue
		}
		// Append: the all-zero MAC holds a list of destinations.
		if err := d.h.NeighAppend(&netlink.Neigh{LinkIndex: idx, Family: unix.AF_BRIDGE,
			State: netlink.NUD_PERMANENT | netlink.NUD_NOARP, Flags: netlink.NTF_SELF,
			HardwareAddr: zeroMAC, IP: net.IP(vtep.AsSlice())}); err != nil {
			errs = append(errs, fmt.Errorf("add flood entry for VTEP %q on %q: %w", vtep, vx.Attrs().Name, err))
		}
	}
	for _, m := range macs {
		mac := m.MAC.String()
		if !haveMAC[mac].IsValid() {
			// Replace: a MAC that moved (live migration) gets its new VTEP
			// in one step, with no window where it is flooded instead.
			state := uint16(netlink.NUD_PERMANENT | netlink.NUD_NOARP)
			if m.Migrating {
				state = netlink.NUD_REACHABLE // learning may move it
			}
			if err := d.h.NeighSet(&netlink.Neigh{LinkIndex: idx, Family: unix.AF_BRIDGE,
				State: int(state), Flags: netlink.NTF_SELF,
				HardwareAddr: m.MAC, IP: net.IP(m.VTEP.Unmap().AsSlice())}); err != nil {
				errs = append(errs, fmt.Errorf("set FDB entry %q -> VTEP %q on %q: %w", mac, m.VTEP, vx.Attrs().Name, err))
			}
			haveMAC[mac] = m.VTEP
		}
		if !haveStatic[mac] {
			if err := d.setStaticFDB(vx, m.MAC); err != nil {
				errs = append(errs, err)
			}
			haveStatic[mac] = true
		}
	}
	return errors.Join(errs...)
}

// setStaticFDB points the bridge's entry for mac at port l, replacing a
// learned entry on another port. Static entries do not age, so a quiet
// pod stays reachable without flooding.
func (d *Datapath) setStaticFDB(l netlink.Link, mac net.HardwareAddr) error {
	if err := d.h.NeighSet(&netlink.Neigh{LinkIndex: l.Attrs().Index, Family: unix.AF_BRIDGE,
		State: netlink.NUD_NOARP, Flags: netlink.NTF_MASTER, HardwareAddr: mac}); err != nil {
		return fmt.Errorf("set bridge FDB entry %q -> %q: %w", mac, l.Attrs().Name, err)
	}
	return nil
}

// syncPortFDB makes the static bridge entries on port l exactly mac (none
// when mac is nil).
func (d *Datapath) syncPortFDB(l netlink.Link, mac net.HardwareAddr) error {
	idx := l.Attrs().Index
	entries, err := d.h.NeighList(idx, unix.AF_BRIDGE)
	if err != nil {
		return err
	}
	have := false
	var errs []error
	for _, e := range entries {
		if e.LinkIndex != idx || !isMaster(e) || !isStatic(e) {
			continue
		}
		if bytes.Equal(e.HardwareAddr, mac) {
			have = true
			continue
		}
		errs = append(errs, d.h.NeighDel(&netlink.Neigh{LinkIndex: idx, Family: unix.AF_BRIDGE,
			Flags: netlink.NTF_MASTER, HardwareAddr: e.HardwareAddr}))
	}
	if !have && mac != nil {
		errs = append(errs, d.setStaticFDB(l, mac))
	}
	return errors.Join(errs...)
}

// attachPorts attaches every port's host interface to its network's
// bridge with a static FDB entry for its MAC and brings it up. Ports whose
// interface does not exist yet are reported with ErrPortNotFound.
func (d *Datapath) attachPorts(ctx context.Context, byName map[string]*Network, ports []Port) error {
	links, err := d.h.LinkList()
	if err != nil {
		return err
	}
	byLinkName := map[string]netlink.Link{} // name -> link
	for _, l := range links {
		byLinkName[l.Attrs().Name] = l
	}
	var errs, missing []error
	var raised []netlink.Link // ports this call brought up
	for _, p := range ports {
		n := byName[p.Network]
		l, ok := byLinkName[p.HostIfName]
		if !ok {
			missing = append(missing, fmt.Errorf("port %q of network %q: %w", p.HostIfName, p.Network, ErrPortNotFound))
			continue
		}
		br, ok := byLinkName[BridgeName(n.ID)]
		if !ok {
			// The bridge step failed; its error is already reported.
			continue
		}
		raisedNow, err := d.attachPort(l, br, p.MAC, p.Migrating)
		if err != nil {
			errs = append(errs, fmt.Errorf("port %q of network %q: %w", p.HostIfName, p.Network, err))
		}
		if raisedNow {
			raised = append(raised, l)
		}
	}
	d.waitForwarding(ctx, raised)
	return errors.Join(append(errs, missing...)...)
}

// portUpTimeout bounds how long Apply waits for ports it brought up. The
// kernel normally needs microseconds; a port whose pod keeps its end down
// never gets there, and that is the pod's business, not an error.
const portUpTimeout = 2 * time.Second

// The polling backoff of waitUp: the first wait, and the longest one.
const (
	portUpFirstPoll = 50 * time.Microsecond
	portUpMaxPoll   = 50 * time.Millisecond
)

// waitForwarding waits until the links Apply just brought up, and their
// veth peers in the pods, are operationally up, so that Apply returns with
// a datapath that forwards: the first packet of a just-migrated VM must
// not be lost. The kernel applies carrier changes asynchronously
// (linkwatch): until it has processed the pod end, the pod's transmit
// queue drops everything, including the ARP request its first reply
// needs, and the pod only retries a second later.
//
// It waits at most portUpTimeout in all, and not after ctx ends.
func (d *Datapath) waitForwarding(ctx context.Context, links []netlink.Link) {
	ctx, cancel := context.WithTimeout(ctx, portUpTimeout)
	defer cancel()
	for _, l := range links {
		idx := l.Attrs().Index
		waitUp(ctx, func() (netlink.Link, error) { return d.h.LinkByIndex(idx) })
		if cur, err := d.h.LinkByIndex(idx); err == nil && cur.Type() == "veth" {
			waitUp(ctx, func() (netlink.Link, error) { return d.h.PeerLink(cur) })
		}
	}
	if len(links) > 0 {
		// The operstate is read without the RTNL lock, so the linkwatch
		// pass that set it may still be activating the queue; any
		// RTNL-locked request waits for it to finish.
		_ = d.h.LinkSetUp(links[0])
	}
}

// waitUp returns once the link get returns is operationally up, is gone,
// or ctx ends.
//
// It polls, with a backoff: portUpFirstPoll, then doubling up to
// portUpMaxPoll. A netlink subscription would be the event-driven way,
// but the pod end of a veth lives in the pod's namespace, which the node
// namespace knows only by a netns ID; the netlink library can subscribe in
// a namespace it has a handle to, not by ID (no NETLINK_LISTEN_ALL_NSID),
// and a subscription per Apply would cost a socket and a namespace switch
// each time. The kernel's linkwatch normally marks a veth up within
// microseconds, so the first or second poll answers; a port whose pod
// keeps its end down costs some fifty requests until the deadline, where
// the former fixed 1 ms poll made two thousand.
func waitUp(ctx context.Context, get func() (netlink.Link, error)) {
	delay := portUpFirstPoll
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		l, err := get()
		if err != nil || l.Attrs().OperState == netlink.OperUp {
			return
		}
		t.Reset(delay)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		delay = min(2*delay, portUpMaxPoll)
	}
}

// isolateStrayPorts detaches and downs every interface on a kvnet bridge
// that is not kvnet's own link and not a port of that bridge's network in
// ports (a pod the state dropped, a port that moved to another network,
// anything a human plugged in).
func (d *Datapath) isolateStrayPorts(nets []Network, ports []Port) error {
	links, err := d.h.LinkList()
	if err != nil {
		return err
	}
	idByName := map[string]int{} // network name -> ID
	for _, n := range nets {
		idByName[n.Name] = n.ID
	}
	keep := map[int]map[string]bool{} // bridge network ID -> host interface names
	for _, p := range ports {
		id := idByName[p.Network]
		if keep[id] == nil {
			keep[id] = map[string]bool{}
		}
		keep[id][p.HostIfName] = true
	}
	var errs []error
	for _, l := range links {
		if prefix, id, ok := parseOwnedLink(l.Attrs().Name); ok && prefix == bridgePrefix {
			errs = append(errs, d.isolatePorts(links, l.Attrs().Index, keep[id]))
		}
	}
	return errors.Join(errs...)
}

// attachPort enslaves pod port l to br and only then brings it up,
// reporting whether it did: SetupPodInterface leaves the host end down so
// that a pod has no link until its anti-spoofing rules and bridge are in
// place.
func (d *Datapath) attachPort(l, br netlink.Link, mac net.HardwareAddr, migrating bool) (raised bool, err error) {
	if err := d.ensurePort(l, br, migrating); err != nil {
		return false, err
	}
	if migrating {
		mac = nil // the bridge learns where the guest is
	}
	if err := d.syncPortFDB(l, mac); err != nil {
		return false, err
	}
	if l.Attrs().Flags&net.FlagUp != 0 {
		return false, nil
	}
	if err := d.h.LinkSetUp(l); err != nil {
		return false, fmt.Errorf("set link %q up: %w", l.Attrs().Name, err)
	}
	return true, nil
}

// isolatePorts detaches from the bridge with ifindex brIndex, and sets
// down, every port that is neither kvnet's own link nor in keep: a pod
// interface the state no longer lists must not keep talking on the
// network, nor reach the node's stack as a plain up interface. It is not
// deleted: its pod (and the CNI DEL) own it.
func (d *Datapath) isolatePorts(links []netlink.Link, brIndex int, keep map[string]bool) error {
	var errs []error
	for _, l := range links {
		name := l.Attrs().Name
		if l.Attrs().MasterIndex != brIndex || keep[name] {
			continue
		}
		if _, _, owned := parseOwnedLink(name); owned {
			continue
		}
		if err := d.h.LinkSetDown(l); err != nil && !nl.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("set link %q down: %w", name, err))
		}
		if err := d.h.LinkSetNoMaster(l); err != nil && !nl.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("detach %q from its bridge: %w", name, err))
		}
	}
	return errors.Join(errs...)
}
