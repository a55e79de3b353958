package nl

import (
	"errors"
	"fmt"

	"github.com/vishvananda/netlink"
	vnl "github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// ErrNotFound matches (errors.Is) every error this package returns for a
// link, address, route, neighbour or namespace that does not exist.
var ErrNotFound = errors.New("not found")

// maxAttempts bounds retries of an interrupted dump. An interruption means
// the table changed during the walk; five in a row only happen when
// something rewrites the table in a loop, and then retrying forever would
// hang the caller.
const maxAttempts = 5

// Retry runs a dump until it is not interrupted, at most maxAttempts times,
// and returns its last error.
func Retry(dump func() error) error {
	var err error
	for range maxAttempts {
		err = dump()
		if !errors.Is(err, netlink.ErrDumpInterrupted) {
			return err
		}
	}
	return fmt.Errorf("netlink dump interrupted %d times: %w", maxAttempts, err)
}

// IsNotFound reports whether err says that the kernel object is missing.
func IsNotFound(err error) bool {
	if err == nil {
		return false
	}
	var lnf netlink.LinkNotFoundError
	return errors.Is(err, ErrNotFound) || errors.As(err, &lnf) ||
		errors.Is(err, unix.ENODEV) || errors.Is(err, unix.ENOENT) ||
		errors.Is(err, unix.ESRCH) || errors.Is(err, unix.EADDRNOTAVAIL)
}

// notFound wraps err so that it matches ErrNotFound while keeping the
// kernel's own error for errors.Is/As.
func notFound(err error) error {
	if err == nil || errors.Is(err, ErrNotFound) || !IsNotFound(err) {
		return err
	}
	return fmt.Errorf("%w: %w", ErrNotFound, err)
}

// Handle is a netlink handle bound to one network namespace. It embeds
// *netlink.Handle for the calls that need no care and shadows the dump and
// lookup methods with retrying, ErrNotFound-mapping versions. It is safe
// for concurrent use to the same extent as netlink.Handle (one request at a
// time per socket; the library serialises).
type Handle struct {
	*netlink.Handle
	nsPath string // the handle's namespace, for requests the library lacks
}

// NewHandle opens a handle in the namespace at nsPath; "" means the
// namespace of the calling thread (lock the thread first if the caller may
// have switched it, see the package doc).
func NewHandle(nsPath string) (*Handle, error) {
	if nsPath == "" {
		h, err := netlink.NewHandle()
		if err != nil {
			return nil, fmt.Errorf("open netlink handle: %w", err)
		}
		return &Handle{Handle: h}, nil
	}
	nsh, err := netns.GetFromPath(nsPath)
	if err != nil {
		return nil, notFound(fmt.Errorf("open netns %q: %w", nsPath, err))
	}
	defer nsh.Close()
	h, err := netlink.NewHandleAt(nsh)
	if err != nil {
		return nil, fmt.Errorf("open netlink handle in %q: %w", nsPath, err)
	}
	return &Handle{Handle: h, nsPath: nsPath}, nil
}

// Close releases the handle's sockets.
func (h *Handle) Close() {
	if h != nil && h.Handle != nil {
		h.Handle.Close()
	}
}

// LinkByName returns the link called name, or an error matching ErrNotFound.
func (h *Handle) LinkByName(name string) (netlink.Link, error) {
	l, err := h.Handle.LinkByName(name)
	if err != nil {
		return nil, notFound(fmt.Errorf("get link %q: %w", name, err))
	}
	return l, nil
}

// LinkByIndex returns the link with ifindex index, or an error matching
// ErrNotFound.
func (h *Handle) LinkByIndex(index int) (netlink.Link, error) {
	l, err := h.Handle.LinkByIndex(index)
	if err != nil {
		return nil, notFound(fmt.Errorf("get link %d: %w", index, err))
	}
	return l, nil
}

// PeerLink returns the other end of veth l as the kernel sees it now,
// even when it lives in another namespace (which this handle's namespace
// knows by the netns ID in l's IFLA_LINK_NETNSID). The library has no
// request for that, so this sends RTM_GETLINK with IFLA_TARGET_NETNSID
// (Linux 4.20+) itself.
func (h *Handle) PeerLink(l netlink.Link) (netlink.Link, error) {
	peer := l.Attrs().ParentIndex
	if l.Attrs().NetNsID < 0 {
		return h.LinkByIndex(peer)
	}
	var link netlink.Link
	err := Do(h.nsPath, func() error {
		req := vnl.NewNetlinkRequest(unix.RTM_GETLINK, unix.NLM_F_ACK)
		msg := vnl.NewIfInfomsg(unix.AF_UNSPEC)
		msg.Index = int32(peer)
		req.AddData(msg)
		req.AddData(vnl.NewRtAttr(unix.IFLA_TARGET_NETNSID, vnl.Uint32Attr(uint32(l.Attrs().NetNsID))))
		msgs, err := req.Execute(unix.NETLINK_ROUTE, unix.RTM_NEWLINK)
		if err != nil {
			return err
		}
		if len(msgs) == 0 {
			return unix.ENODEV
		}
		link, err = netlink.LinkDeserialize(nil, msgs[0])
		return err
	})
	if err != nil {
		return nil, notFound(fmt.Errorf("get peer %d of link %q: %w", peer, l.Attrs().Name, err))
	}
	return link, nil
}

// LinkList lists all links, retrying interrupted dumps.
func (h *Handle) LinkList() ([]netlink.Link, error) {
	var out []netlink.Link
	err := Retry(func() (err error) {
		out, err = h.Handle.LinkList()
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("list links: %w", err)
	}
	return out, nil
}

// LinkDelByName deletes the link called name; a missing link is not an error.
func (h *Handle) LinkDelByName(name string) error {
	l, err := h.LinkByName(name)
	if errors.Is(err, ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if err := h.Handle.LinkDel(l); err != nil && !IsNotFound(err) {
		return fmt.Errorf("delete link %q: %w", name, err)
	}
	return nil
}

// AddrList lists the addresses of link (nil: all links) in family,
// retrying interrupted dumps.
func (h *Handle) AddrList(link netlink.Link, family int) ([]netlink.Addr, error) {
	var out []netlink.Addr
	err := Retry(func() (err error) {
		out, err = h.Handle.AddrList(link, family)
		return err
	})
	if err != nil {
		return nil, notFound(fmt.Errorf("list addresses: %w", err))
	}
	return out, nil
}

// AddrDel deletes addr from link; a missing address is not an error.
func (h *Handle) AddrDel(link netlink.Link, addr *netlink.Addr) error {
	if err := h.Handle.AddrDel(link, addr); err != nil && !IsNotFound(err) {
		return fmt.Errorf("delete address %q from %q: %w", addr.IPNet, link.Attrs().Name, err)
	}
	return nil
}

// RouteListFiltered lists routes matching filter/mask (see
// netlink.RouteListFiltered), retrying interrupted dumps.
func (h *Handle) RouteListFiltered(family int, filter *netlink.Route, mask uint64) ([]netlink.Route, error) {
	var out []netlink.Route
	err := Retry(func() (err error) {
		out, err = h.Handle.RouteListFiltered(family, filter, mask)
		return err
	})
	if err != nil {
		return nil, notFound(fmt.Errorf("list routes: %w", err))
	}
	return out, nil
}

// RouteDel deletes route; a missing route is not an error.
func (h *Handle) RouteDel(route *netlink.Route) error {
	if err := h.Handle.RouteDel(route); err != nil && !IsNotFound(err) {
		return fmt.Errorf("delete route %q: %w", route.Dst, err)
	}
	return nil
}

// NeighList lists neighbour (family AF_INET/AF_INET6) or FDB (AF_BRIDGE)
// entries of the link with ifindex linkIndex (0: all), retrying
// interrupted dumps.
func (h *Handle) NeighList(linkIndex, family int) ([]netlink.Neigh, error) {
	var out []netlink.Neigh
	err := Retry(func() (err error) {
		out, err = h.Handle.NeighList(linkIndex, family)
		return err
	})
	if err != nil {
		return nil, notFound(fmt.Errorf("list neighbours of link %d: %w", linkIndex, err))
	}
	return out, nil
}

// NeighDel deletes a neighbour or FDB entry; a missing entry is not an error.
func (h *Handle) NeighDel(n *netlink.Neigh) error {
	if err := h.Handle.NeighDel(n); err != nil && !IsNotFound(err) {
		return fmt.Errorf("delete neighbour %q on link %d: %w", n.HardwareAddr, n.LinkIndex, err)
	}
	return nil
}

// BridgePortLearning reports, by interface index, whether learning is on
// for every bridge port in the handle's namespace, from one dump of the
// AF_BRIDGE link table (the library reads one port per dump).
func (h *Handle) BridgePortLearning() (map[int]bool, error) {
	out := map[int]bool{}
	err := Retry(func() error {
		clear(out)
		return Do(h.nsPath, func() error {
			req := vnl.NewNetlinkRequest(unix.RTM_GETLINK, unix.NLM_F_DUMP)
			req.AddData(vnl.NewIfInfomsg(unix.AF_BRIDGE))
			msgs, err := req.Execute(unix.NETLINK_ROUTE, unix.RTM_NEWLINK)
			if err != nil {
				return err
			}
			for _, m := range msgs {
				info := vnl.DeserializeIfInfomsg(m)
				attrs, err := vnl.ParseRouteAttr(m[info.Len():])
				if err != nil {
					return fmt.Errorf("parse bridge port %d: %w", info.Index, err)
				}
				for _, a := range attrs {
					if a.Attr.Type&^unix.NLA_F_NESTED != unix.IFLA_PROTINFO {
						continue
					}
					port, err := vnl.ParseRouteAttr(a.Value)
					if err != nil {
						return fmt.Errorf("parse bridge port %d: %w", info.Index, err)
					}
					for _, p := range port {
						if p.Attr.Type == vnl.IFLA_BRPORT_LEARNING && len(p.Value) > 0 {
							out[int(info.Index)] = p.Value[0] != 0
						}
					}
				}
			}
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("list bridge ports: %w", err)
	}
	return out, nil
}
