package datapath

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"kvnet.io/kvnet/internal/nl"
)

// ErrNoVLAN matches (errors.Is) the error of a localnet network with a
// VLAN on a kernel that cannot make 802.1Q VLAN links.
var ErrNoVLAN = errors.New("this kernel cannot make 802.1Q VLAN links (Linux module 8021q)")

// physPortName, patchPortName and vlanPortName name the links of network
// id's patch into its physical bridge.
func physPortName(id int) string  { return physPortPrefix + strconv.Itoa(id) }
func patchPortName(id int) string { return patchPortPrefix + strconv.Itoa(id) }
func vlanPortName(id int) string  { return vlanPortPrefix + strconv.Itoa(id) }

// ensurePhysicalPatch connects localnet network n's bridge br to the
// node's bridge n.Physical with a veth pair: kvlp<id> is a port of the
// physical bridge, kvln<id> a port of br; with a VLAN, the VLAN device
// kvlv<id> on kvln<id> is br's port instead, so that frames leave tagged.
// Learning stays on at both ends: the physical network's MACs are learned
// there, as a switch port does.
func (d *Datapath) ensurePhysicalPatch(n Network, br netlink.Link, mtu int) error {
	phys, err := d.h.LinkByName(n.Physical)
	switch {
	case errors.Is(err, nl.ErrNotFound):
		err = fmt.Errorf("physical bridge %q (the node's bridge mapping of the network's physical network) does not exist", n.Physical)
	case err == nil && phys.Type() != "bridge":
		err = fmt.Errorf("physical bridge %q is a %s link, not a Linux bridge: map the physical network to a bridge that holds the node's interface on that network", n.Physical, phys.Type())
	}
	if err != nil {
		// Off any bridge it was patched into before (a changed mapping).
		return errors.Join(err, d.h.LinkDelByName(physPortName(n.ID)))
	}
	// The physical end must not lower the physical bridge's MTU (Linux
	// gives a bridge its smallest port's); the network's end and the
	// pods keep the network's.
	physMTU := max(mtu, phys.Attrs().MTU)
	physEnd, patch, err := d.ensureLocalVeth(physPortName(n.ID), patchPortName(n.ID), mtu)
	if err != nil {
		return err
	}
	if err := d.ensurePort(physEnd, phys, true); err != nil {
		return err
	}
	if err := d.ensureMTUUp(physEnd, physMTU); err != nil {
		return err
	}
	port := patch
	vlanName := vlanPortName(n.ID)
	if n.VLAN == 0 {
		if err := d.h.LinkDelByName(vlanName); err != nil {
			return err
		}
	} else {
		if patch.Attrs().MasterIndex != 0 {
			// It was br's port while the network had no VLAN; detached
			// first, so that a failure below never leaves it untagged.
			if err := d.h.LinkSetNoMaster(patch); err != nil {
				return fmt.Errorf("detach %q from its bridge: %w", patch.Attrs().Name, err)
			}
		}
		if port, err = d.ensureVLAN(vlanName, patch, n.VLAN, mtu); err != nil {
			return err
		}
		if err := d.ensureMTUUp(patch, mtu); err != nil {
			return err
		}
	}
	if err := d.ensurePort(port, br, true); err != nil {
		return err
	}
	return d.ensureMTUUp(port, mtu)
}

// ensureLocalVeth creates or repairs a veth pair a <-> b in the node
// namespace, without IPv6 addresses: the node's own stack stays off the
// networks they patch together.
func (d *Datapath) ensureLocalVeth(a, b string, mtu int) (netlink.Link, netlink.Link, error) {
	la, aerr := d.h.LinkByName(a)
	lb, berr := d.h.LinkByName(b)
	for _, err := range []error{aerr, berr} {
		if err != nil && !errors.Is(err, nl.ErrNotFound) {
			return nil, nil, err
		}
	}
	if aerr == nil && berr == nil && la.Type() == "veth" && lb.Type() == "veth" &&
		la.Attrs().ParentIndex == lb.Attrs().Index && lb.Attrs().ParentIndex == la.Attrs().Index {
		return la, lb, nil
	}
	for _, name := range []string{a, b} {
		if err := d.h.LinkDelByName(name); err != nil {
			return nil, nil, err
		}
	}
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: a, MTU: mtu}, PeerName: b, PeerMTU: uint32(mtu)}
	if err := d.h.LinkAdd(veth); err != nil {
		return nil, nil, fmt.Errorf("create veth %q <-> %q: %w", a, b, err)
	}
	var links [2]netlink.Link
	for i, name := range []string{a, b} {
		l, err := d.h.LinkByName(name)
		if err != nil {
			return nil, nil, err
		}
		if err := d.h.LinkSetIP6AddrGenMode(l, in6AddrGenModeNone); err != nil {
			return nil, nil, fmt.Errorf("disable IPv6 addresses on %q: %w", name, err)
		}
		links[i] = l
	}
	return links[0], links[1], nil
}

// ensureVLAN creates or repairs VLAN device name with id vid on parent.
func (d *Datapath) ensureVLAN(name string, parent netlink.Link, vid, mtu int) (netlink.Link, error) {
	l, err := d.h.LinkByName(name)
	if err == nil {
		if v, ok := l.(*netlink.Vlan); ok && v.VlanId == vid && v.ParentIndex == parent.Attrs().Index {
			return l, nil
		}
		if err := d.h.LinkDelByName(name); err != nil {
			return nil, err
		}
	} else if !errors.Is(err, nl.ErrNotFound) {
		return nil, err
	}
	want := &netlink.Vlan{LinkAttrs: netlink.LinkAttrs{Name: name, ParentIndex: parent.Attrs().Index, MTU: mtu}, VlanId: vid}
	if err := d.h.LinkAdd(want); err != nil {
		if errors.Is(err, unix.EOPNOTSUPP) {
			return nil, fmt.Errorf("vlan %d: %w", vid, ErrNoVLAN)
		}
		return nil, fmt.Errorf("create VLAN %d device %q on %q: %w", vid, name, parent.Attrs().Name, err)
	}
	if l, err = d.h.LinkByName(name); err != nil {
		return nil, err
	}
	if err := d.h.LinkSetIP6AddrGenMode(l, in6AddrGenModeNone); err != nil {
		return nil, fmt.Errorf("disable IPv6 addresses on %q: %w", name, err)
	}
	return l, nil
}

// ProbeVLAN reports whether the kernel can make 802.1Q VLAN links in the
// network namespace at nsPath ("" is the caller's): it makes a throwaway
// veth with a VLAN on it and removes both. A nil error with false means
// the kernel lacks 8021q; an error means the probe itself failed.
func ProbeVLAN(nsPath string) (bool, error) {
	h, err := nl.NewHandle(nsPath)
	if err != nil {
		return false, err
	}
	defer h.Close()
	const a, b = "kvprobe0", "kvprobe1"
	_ = h.LinkDelByName(a)
	if err := h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: a}, PeerName: b}); err != nil {
		return false, fmt.Errorf("probe VLAN support: create veth: %w", err)
	}
	defer func() { _ = h.LinkDelByName(a) }()
	parent, err := h.LinkByName(a)
	if err != nil {
		return false, fmt.Errorf("probe VLAN support: %w", err)
	}
	err = h.LinkAdd(&netlink.Vlan{LinkAttrs: netlink.LinkAttrs{Name: "kvprobe0.1", ParentIndex: parent.Attrs().Index}, VlanId: 1})
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, unix.EOPNOTSUPP):
		return false, nil
	default:
		return false, fmt.Errorf("probe VLAN support: create VLAN link: %w", err)
	}
}
