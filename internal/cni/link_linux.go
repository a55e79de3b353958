package cni

import (
	"fmt"
	"net"
	"net/netip"
	"strings"

	"github.com/vishvananda/netlink"

	"kvnet.io/kvnet/internal/nl"
	"kvnet.io/kvnet/internal/podnetworks"
)

// checkInterface verifies ifName in the netns against the allocation.
func checkInterface(netnsPath, ifName string, a podnetworks.Attachment) error {
	return nl.Do(netnsPath, func() error {
		l, err := netlink.LinkByName(ifName)
		if err != nil {
			return fmt.Errorf("interface %q not found in %s: %w", ifName, netnsPath, err)
		}
		if got := l.Attrs().HardwareAddr.String(); got != strings.ToLower(a.MACAddress) {
			return fmt.Errorf("interface %q has MAC %s, allocation says %s", ifName, got, a.MACAddress)
		}
		addrs, err := netlink.AddrList(l, netlink.FAMILY_ALL)
		if err != nil {
			return err
		}
		have := map[string]bool{}
		for _, ad := range addrs {
			have[ad.IPNet.String()] = true
		}
		for _, want := range a.IPAddresses {
			p := netip.MustParsePrefix(want)
			ipn := &net.IPNet{IP: net.IP(p.Addr().AsSlice()), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
			if !have[ipn.String()] {
				return fmt.Errorf("interface %q lacks address %s", ifName, want)
			}
		}
		routes, err := netlink.RouteList(l, netlink.FAMILY_ALL)
		if err != nil {
			return err
		}
		for _, want := range a.Routes {
			found := false
			for _, rt := range routes {
				dst := "0.0.0.0/0"
				if rt.Dst != nil {
					dst = rt.Dst.String()
				} else if rt.Family == netlink.FAMILY_V6 {
					dst = "::/0"
				}
				if dst == want.Dest && (want.NextHop == "" || rt.Gw.String() == want.NextHop) {
					found = true
				}
			}
			if !found {
				return fmt.Errorf("interface %q lacks route %s via %s", ifName, want.Dest, want.NextHop)
			}
		}
		return nil
	})
}

// gcHostInterfaces deletes host links with prefix whose names are not kept.
func gcHostInterfaces(prefix string, keep map[string]bool) error {
	links, err := netlink.LinkList()
	if err != nil {
		return fmt.Errorf("list links: %w", err)
	}
	for _, l := range links {
		name := l.Attrs().Name
		if strings.HasPrefix(name, prefix) && !keep[name] {
			if err := netlink.LinkDel(l); err != nil && !nl.IsNotFound(err) {
				return fmt.Errorf("delete stale interface %q: %w", name, err)
			}
		}
	}
	return nil
}

func setAlias(name, alias string) error {
	l, err := netlink.LinkByName(name)
	if err != nil {
		return fmt.Errorf("find %q: %w", name, err)
	}
	return netlink.LinkSetAlias(l, alias)
}
