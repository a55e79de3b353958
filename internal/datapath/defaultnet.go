package datapath

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"kvnet.io/kvnet/internal/nl"
)

// DefaultNetworkIfName is the pod interface Multus gives the cluster
// default network.
const DefaultNetworkIfName = "eth0"

// defaultNetworkRules returns the pod namespace's table restricting the
// cluster-default-network interface of a pod on a primary user-defined
// network to what upstream keeps it for: the kubelet's probes from the
// node (allow: the node's addresses). Every other packet arriving on
// ifName, from any pod of the default network (another tenant's
// included), is dropped; and the pod opens no connection over it, not
// even to the node: its traffic to pods, the node, the cluster DNS and
// the API server goes by its primary network (whose router sends the
// cluster DNS and the API server through the node), though routes of the
// default network plugin (a route to the cluster's pod range, or, under a
// /32 layout, KeepProbePath's route to the node) lead by ifName. A
// connection to the node over ifName would reach the node's ports as the
// cluster default network does, other tenants' node ports included (seen
// on the real cluster under the /32 layout: a pod of another tenant
// fetched a UDN Service's node port at its own node's address).
// IPv6 neighbour discovery stays allowed, so that the interface keeps
// working for the traffic that is allowed.
func defaultNetworkRules(ifName string, allow []netip.Addr) []nftTable {
	rules := []nftRule{
		newRule().iifname(ifName).ctEstRel(false).accept("replies to the pod's own connections"),
	}
	for _, t := range []byte{133, 134, 135, 136, 137} { // RS, RA, NS, NA, redirect
		rules = append(rules, newRule().iifname(ifName).nfproto(true).l4protoICMPv6().icmp6Type(t).accept("IPv6 neighbour discovery"))
	}
	for _, a := range allow {
		a = a.Unmap()
		b := newRule().iifname(ifName).nfproto(a.Is6())
		if a.Is6() {
			b.ip6Saddr(hostPrefix(a), false)
		} else {
			b.ipSaddr(hostPrefix(a), false)
		}
		rules = append(rules, b.accept("the node: kubelet probes"))
	}
	rules = append(rules, newRule().iifname(ifName).counter().drop("only the node reaches a primary-UDN pod over the cluster default network"))
	out := []nftRule{
		newRule().oifname(ifName).ctEstRel(false).accept("replies: kubelet probes"),
	}
	for _, t := range []byte{133, 134, 135, 136, 137} {
		out = append(out, newRule().oifname(ifName).nfproto(true).l4protoICMPv6().icmp6Type(t).accept("IPv6 neighbour discovery"))
	}
	out = append(out, newRule().oifname(ifName).counter().drop("a primary-UDN pod opens no connection over the cluster default network"))
	return []nftTable{{family: nftables.TableFamilyINet, chains: []nftChain{
		filterChain("default-net-in", nftables.ChainHookInput, *nftables.ChainPriorityFilter, nftables.ChainPolicyAccept, rules),
		filterChain("default-net-out", nftables.ChainHookOutput, *nftables.ChainPriorityFilter, nftables.ChainPolicyAccept, out),
	}}}
}

func (b *ruleBuilder) l4protoICMPv6() *ruleBuilder {
	return b.add("meta l4proto ipv6-icmp",
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_ICMPV6}})
}

func (b *ruleBuilder) icmp6Type(t byte) *ruleBuilder {
	return b.match(fmt.Sprintf("icmpv6 type %d", t), expr.PayloadBaseTransportHeader, 0, []byte{t}, nil, false)
}

// ErrNoDefaultInterface is returned by RestrictDefaultNetwork when the pod
// has no cluster-default-network interface (the cluster's default network
// plugin attached the primary network itself, or there is no Multus).
var ErrNoDefaultInterface = errors.New("pod has no cluster default network interface")

// RestrictDefaultNetwork programs defaultNetworkRules into the pod
// namespace at podNetNS for interface ifName, replacing an earlier
// version. allow are the node's addresses.
func RestrictDefaultNetwork(podNetNS, ifName string, allow []netip.Addr) error {
	h, err := nl.NewHandle(podNetNS)
	if err != nil {
		return err
	}
	defer h.Close()
	if _, err := h.LinkByName(ifName); err != nil {
		if nl.IsNotFound(err) {
			return fmt.Errorf("%w: no %s in %s", ErrNoDefaultInterface, ifName, podNetNS)
		}
		return err
	}
	ns, err := nl.OpenNS(podNetNS)
	if err != nil {
		return err
	}
	defer ns.Close()
	conn, err := nftConn(int(ns))
	if err != nil {
		return err
	}
	return syncTables(conn, defaultNetworkRules(ifName, allow))
}

// HostAddresses returns the global-scope addresses of the current network
// namespace (the node's, when kvnet-cni runs): the sources of kubelet
// probes.
func HostAddresses() ([]netip.Addr, error) {
	h, err := nl.NewHandle("")
	if err != nil {
		return nil, err
	}
	defer h.Close()
	addrs, err := h.AddrList(nil, unix.AF_UNSPEC)
	if err != nil {
		return nil, fmt.Errorf("list node addresses: %w", err)
	}
	var out []netip.Addr
	for _, a := range addrs {
		if a.Scope != unix.RT_SCOPE_UNIVERSE {
			continue
		}
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			out = append(out, ip.Unmap())
		}
	}
	return out, nil
}
