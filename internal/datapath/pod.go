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

// SetupPodInterface wires a pod: a veth pair whose end ifName is created
// directly inside the namespace at podNetNS with MAC mac, addresses ips,
// routes and MTU mtu (0: kernel default), up; and whose other end,
// hostIfName (at most 15 characters), is created in the calling thread's
// namespace (the node's). It is idempotent: an existing, correctly paired
// veth is reconfigured in place; a half pair is replaced.
//
// The host end is left DOWN. Apply attaches it to its network's bridge,
// after installing its anti-spoofing rules, and only then brings it up: a
// pod has no carrier, and cannot send anything anywhere, until the
// datapath knows the port. Callers that run inside nl.Do for a simulated
// node namespace get the host end in that namespace.
func SetupPodInterface(podNetNS, ifName, hostIfName string, mac net.HardwareAddr, ips []netip.Prefix, routes []Route, mtu int) (err error) {
	if err := checkIfName(ifName); err != nil {
		return err
	}
	if err := checkIfName(hostIfName); err != nil {
		return err
	}
	if !isUnicastMAC(mac) {
		return fmt.Errorf("set up pod interface %q: MAC %q is not a unicast Ethernet address", hostIfName, mac)
	}
	if mtu != 0 && (mtu < 68 || mtu > 65535) {
		return fmt.Errorf("set up pod interface %q: MTU %d out of range 68-65535", hostIfName, mtu)
	}
	host, err := nl.NewHandle("")
	if err != nil {
		return err
	}
	defer host.Close()
	podNS, err := nl.OpenNS(podNetNS)
	if err != nil {
		return fmt.Errorf("set up pod interface %q: %w", hostIfName, err)
	}
	defer podNS.Close()
	pod, err := nl.NewHandle(podNetNS)
	if err != nil {
		return fmt.Errorf("set up pod interface %q: %w", hostIfName, err)
	}
	defer pod.Close()

	hl, herr := host.LinkByName(hostIfName)
	pl, perr := pod.LinkByName(ifName)
	for _, e := range []error{herr, perr} {
		if e != nil && !errors.Is(e, nl.ErrNotFound) {
			return fmt.Errorf("set up pod interface %q: %w", hostIfName, e)
		}
	}
	paired := herr == nil && perr == nil && hl.Type() == "veth" && pl.Type() == "veth" &&
		hl.Attrs().ParentIndex == pl.Attrs().Index && pl.Attrs().ParentIndex == hl.Attrs().Index
	if !paired {
		if perr == nil && pl.Type() != "veth" {
			return fmt.Errorf("set up pod interface %q: %q already exists in %q as a %s", hostIfName, ifName, podNetNS, pl.Type())
		}
		// Leftovers of an earlier, interrupted attempt.
		if err := host.LinkDelByName(hostIfName); err != nil {
			return err
		}
		if err := pod.LinkDelByName(ifName); err != nil {
			return err
		}
		veth := &netlink.Veth{
			LinkAttrs:        netlink.LinkAttrs{Name: hostIfName, MTU: mtu},
			PeerName:         ifName,
			PeerNamespace:    netlink.NsFd(int(podNS)),
			PeerMTU:          uint32(mtu),
			PeerHardwareAddr: mac,
		}
		if err := host.LinkAdd(veth); err != nil {
			return fmt.Errorf("create veth %q <-> %q: %w", hostIfName, ifName, err)
		}
		defer func() {
			if err != nil {
				_ = host.LinkDelByName(hostIfName)
			}
		}()
		if hl, err = host.LinkByName(hostIfName); err != nil {
			return err
		}
		// The host end becomes a bridge port: the node's stack must not
		// talk to the pod through it.
		if err := host.LinkSetIP6AddrGenMode(hl, in6AddrGenModeNone); err != nil {
			return fmt.Errorf("disable IPv6 addresses on %q: %w", hostIfName, err)
		}
		if pl, err = pod.LinkByName(ifName); err != nil {
			return err
		}
	}
	if err := configurePodSide(pod, pl, mac, ips, routes, mtu); err != nil {
		return fmt.Errorf("set up pod interface %q: %w", hostIfName, err)
	}
	if mtu != 0 && hl.Attrs().MTU != mtu {
		if err := host.LinkSetMTU(hl, mtu); err != nil {
			return fmt.Errorf("set MTU of %q to %d: %w", hostIfName, mtu, err)
		}
	}
	return nil
}

// configurePodSide sets the pod end's MAC, MTU, addresses and routes and
// brings it up.
func configurePodSide(h *nl.Handle, l netlink.Link, mac net.HardwareAddr, ips []netip.Prefix, routes []Route, mtu int) error {
	name := l.Attrs().Name
	if l.Attrs().HardwareAddr.String() != mac.String() {
		// Changing a running veth's MAC is refused; take it down first.
		if err := h.LinkSetDown(l); err != nil {
			return fmt.Errorf("set link %q down: %w", name, err)
		}
		if err := h.LinkSetHardwareAddr(l, mac); err != nil {
			return fmt.Errorf("set MAC of %q to %q: %w", name, mac, err)
		}
	}
	if mtu != 0 && l.Attrs().MTU != mtu {
		if err := h.LinkSetMTU(l, mtu); err != nil {
			return fmt.Errorf("set MTU of %q to %d: %w", name, mtu, err)
		}
	}
	if err := syncAddrs(h, l, ips); err != nil {
		return err
	}
	if err := h.LinkSetUp(l); err != nil {
		return fmt.Errorf("set link %q up: %w", name, err)
	}
	for _, r := range routes {
		if !r.Dst.IsValid() {
			return fmt.Errorf("add route in pod: invalid destination %q", r.Dst)
		}
		route := &netlink.Route{LinkIndex: l.Attrs().Index, Dst: ipNet(r.Dst.Masked())}
		if r.Via.IsValid() {
			route.Gw = net.IP(r.Via.AsSlice())
		} else {
			route.Scope = netlink.SCOPE_LINK
		}
		if err := h.RouteReplace(route); err != nil {
			return fmt.Errorf("add route %q via %q: %w", r.Dst, r.Via, err)
		}
	}
	return nil
}

// TeardownPodInterface deletes the host end hostIfName from the calling
// thread's namespace (the pod end goes with it). A missing interface is
// not an error.
func TeardownPodInterface(hostIfName string) error {
	if err := checkIfName(hostIfName); err != nil {
		return err
	}
	h, err := nl.NewHandle("")
	if err != nil {
		return err
	}
	defer h.Close()
	return h.LinkDelByName(hostIfName)
}

// checkIfName validates an interface name as the kernel would.
func checkIfName(name string) error {
	if name == "" || len(name) >= unix.IFNAMSIZ || name == "." || name == ".." {
		return fmt.Errorf("interface name %q: must be 1-%d characters", name, unix.IFNAMSIZ-1)
	}
	for _, c := range name {
		if c == '/' || c == ':' || c <= ' ' {
			return fmt.Errorf("interface name %q: must not contain %q", name, c)
		}
	}
	return nil
}
