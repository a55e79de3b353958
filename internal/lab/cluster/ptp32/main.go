// Command ptp32 is the real-cluster lab's chained CNI plugin of the ptp32
// default network (docs/cluster.md, "The /32 layout"): after the reference
// ptp plugin (with host-local IPAM and a link-local gateway) it lays the
// pod out the way Calico does, which ptp alone cannot:
//
//   - the pod's eth0 holds its address as a /32 (ptp keeps the IPAM's
//     prefix length, and host-local allocates from nothing smaller than a
//     /30), with one route, "default via <gateway> dev eth0 onlink" (ptp
//     adds its IPAM routes before its route to the gateway, so a gateway
//     outside the pod's subnet cannot carry the default route);
//   - the node's end of the veth holds no address (ptp gives it the
//     gateway's) and answers ARP for the gateway by proxy ARP; the node's
//     host route to the pod's /32 through it (ptp's) stays. So the node
//     reaches the pod, and probes it, from its own address, as a Calico
//     node does.
//
// It acts on ADD only; DEL and CHECK are ptp's and host-local's (ptp
// removes the veth, host-local the address).
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"kvnet.io/kvnet/internal/nl"
)

func main() {
	skel.PluginMainFuncs(skel.CNIFuncs{Add: add, Del: noop, Check: noop},
		version.PluginSupports("0.4.0", "1.0.0"), "ptp32: pods with a /32 and a link-local gateway after ptp (kvnet-lab)")
}

func noop(*skel.CmdArgs) error { return nil }

func add(args *skel.CmdArgs) error {
	conf := types.NetConf{}
	if err := json.Unmarshal(args.StdinData, &conf); err != nil {
		return fmt.Errorf("ptp32: parse configuration: %w", err)
	}
	if conf.RawPrevResult == nil {
		return errors.New("ptp32: no prevResult: chain it after ptp")
	}
	if err := version.ParsePrevResult(&conf); err != nil {
		return fmt.Errorf("ptp32: prevResult: %w", err)
	}
	res, err := current.NewResultFromResult(conf.PrevResult)
	if err != nil {
		return fmt.Errorf("ptp32: prevResult: %w", err)
	}
	hostIf, podIf := -1, -1
	for i, itf := range res.Interfaces {
		switch {
		case itf.Sandbox == "":
			hostIf = i
		case itf.Name == args.IfName:
			podIf = i
		}
	}
	if hostIf < 0 || podIf < 0 {
		return fmt.Errorf("ptp32: prevResult interfaces %+v: want the node's end of the veth and %s (ptp's)", res.Interfaces, args.IfName)
	}
	hostName := res.Interfaces[hostIf].Name
	var routes []*types.Route
	for _, ipc := range res.IPs {
		if ipc.Address.IP.To4() == nil || ipc.Gateway == nil {
			continue // the lab's pods are IPv4
		}
		if err := layPod(args.Netns, args.IfName, ipc.Address, ipc.Gateway); err != nil {
			return err
		}
		if err := layNode(hostName, ipc.Address.IP, ipc.Gateway); err != nil {
			return err
		}
		ipc.Address = net.IPNet{IP: ipc.Address.IP, Mask: net.CIDRMask(32, 32)}
		routes = append(routes, &types.Route{Dst: net.IPNet{IP: net.IPv4zero, Mask: net.CIDRMask(0, 32)}, GW: ipc.Gateway})
	}
	res.Routes = routes
	return types.PrintResult(res, conf.CNIVersion)
}

// layPod gives the pod's ifName addr as a /32 (instead of ptp's prefix)
// and one route: default via gw, onlink.
func layPod(netnsPath, ifName string, addr net.IPNet, gw net.IP) error {
	h, err := nl.NewHandle(netnsPath)
	if err != nil {
		return fmt.Errorf("ptp32: %w", err)
	}
	defer h.Close()
	l, err := h.LinkByName(ifName)
	if err != nil {
		return fmt.Errorf("ptp32: %w", err)
	}
	// Deleting ptp's address takes its routes (they name it as source).
	if err := h.AddrDel(l, &netlink.Addr{IPNet: &addr}); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
		return fmt.Errorf("ptp32: delete %s from %s: %w", addr.String(), ifName, err)
	}
	host := &net.IPNet{IP: addr.IP, Mask: net.CIDRMask(32, 32)}
	if err := h.AddrReplace(l, &netlink.Addr{IPNet: host}); err != nil {
		return fmt.Errorf("ptp32: add %s to %s: %w", host, ifName, err)
	}
	rs, err := h.RouteListFiltered(unix.AF_INET, &netlink.Route{LinkIndex: l.Attrs().Index}, netlink.RT_FILTER_OIF)
	if err != nil {
		return fmt.Errorf("ptp32: routes of %s: %w", ifName, err)
	}
	for _, r := range rs {
		if r.Protocol == unix.RTPROT_KERNEL {
			continue
		}
		if err := h.RouteDel(&r); err != nil {
			return fmt.Errorf("ptp32: delete route %s: %w", r, err)
		}
	}
	def := &netlink.Route{LinkIndex: l.Attrs().Index, Dst: &net.IPNet{IP: net.IPv4zero, Mask: net.CIDRMask(0, 32)}, Gw: gw, Flags: int(netlink.FLAG_ONLINK)}
	if err := h.RouteReplace(def); err != nil {
		return fmt.Errorf("ptp32: default via %s dev %s onlink: %w", gw, ifName, err)
	}
	return nil
}

// layNode takes the gateway's address off the node's end of the veth,
// turns proxy ARP on there (without delay) and routes the pod's /32 to it.
func layNode(hostIfName string, podIP, gw net.IP) error {
	h, err := nl.NewHandle("")
	if err != nil {
		return fmt.Errorf("ptp32: %w", err)
	}
	defer h.Close()
	l, err := h.LinkByName(hostIfName)
	if err != nil {
		return fmt.Errorf("ptp32: %w", err)
	}
	gwAddr := &net.IPNet{IP: gw, Mask: net.CIDRMask(32, 32)}
	if err := h.AddrDel(l, &netlink.Addr{IPNet: gwAddr}); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
		return fmt.Errorf("ptp32: delete %s from %s: %w", gwAddr, hostIfName, err)
	}
	for key, v := range map[string]string{
		"net/ipv4/conf/" + hostIfName + "/proxy_arp":    "1",
		"net/ipv4/neigh/" + hostIfName + "/proxy_delay": "0",
	} {
		if err := nl.SetSysctl("", key, v); err != nil {
			return fmt.Errorf("ptp32: %w", err)
		}
	}
	r := &netlink.Route{LinkIndex: l.Attrs().Index, Dst: &net.IPNet{IP: podIP, Mask: net.CIDRMask(32, 32)}, Scope: netlink.SCOPE_LINK}
	if err := h.RouteReplace(r); err != nil {
		return fmt.Errorf("ptp32: route %s dev %s: %w", podIP, hostIfName, err)
	}
	return nil
}
