package datapath

import (
	"fmt"
	"net/netip"
	"slices"

	"golang.org/x/sys/unix"
)

// This file holds each pod port's anti-spoofing chain (portRules) and a
// live migration target's standby rules (standbyRules).

// Addresses a port may use besides its own: the unspecified address for
// DHCP, ARP probes (RFC 5227) and IPv6 DAD, and IPv6 link-local sources,
// which every IPv6 host uses for neighbour discovery.
var (
	unspecified4 = netip.IPv4Unspecified()
	linkLocal6   = netip.MustParsePrefix("fe80::/10")
)

// portRules returns the anti-spoofing chain of port p. Matching frames
// "return" to the prerouting chain, which accepts them; everything else the
// port sends is dropped by a counted rule saying why.
func portRules(p Port) []nftRule {
	c := func(what string) string { return fmt.Sprintf("port %s: %s", p.HostIfName, what) }
	rules := []nftRule{newRule().etherSaddr(p.MAC, true).counter().drop(c("spoofed source MAC"))}
	v4, v6 := portAddrs(p)
	if p.Departed {
		return append(rules, newRule().counter().drop(c("departed: the guest left for its migration's target")))
	}
	if p.Standby {
		return append(rules, standbyRules(p, v4, v6, c)...)
	}
	if len(p.IPs) == 0 {
		return rules // pure L2 port: the MAC is all it was given
	}

	for _, a := range v4 {
		rules = append(rules, newRule().etherType(unix.ETH_P_IP, false).ipSaddr(hostPrefix(a), false).ret(c("IPv4 source "+a.String())))
	}
	rules = append(rules,
		newRule().etherType(unix.ETH_P_IP, false).ipSaddr(hostPrefix(unspecified4), false).ipProtoUDP().
			udpSport(68).udpDport(67).ret(c("DHCP client")),
		newRule().etherType(unix.ETH_P_IP, false).counter().drop(c("spoofed IPv4 source")),
		newRule().etherType(unix.ETH_P_ARP, false).arpSha(p.MAC, true).counter().drop(c("spoofed ARP sender MAC")))
	for _, a := range v4 {
		rules = append(rules, newRule().etherType(unix.ETH_P_ARP, false).arpSpa(a).ret(c("ARP sender "+a.String())))
	}
	rules = append(rules,
		newRule().etherType(unix.ETH_P_ARP, false).arpSpa(unspecified4).ret(c("ARP probe")),
		newRule().etherType(unix.ETH_P_ARP, false).counter().drop(c("spoofed ARP sender IP")),
		newRule().etherType(unix.ETH_P_IPV6, false).ip6Saddr(hostPrefix(netip.IPv6Unspecified()), false).ret(c("IPv6 DAD")),
		newRule().etherType(unix.ETH_P_IPV6, false).ip6Saddr(linkLocal6, false).ret(c("IPv6 link-local")))
	for _, a := range v6 {
		rules = append(rules, newRule().etherType(unix.ETH_P_IPV6, false).ip6Saddr(hostPrefix(a), false).ret(c("IPv6 source "+a.String())))
	}
	// Anything else (802.1Q-tagged frames in particular) would carry IP
	// past the checks above.
	return append(rules,
		newRule().etherType(unix.ETH_P_IPV6, false).counter().drop(c("spoofed IPv6 source")),
		newRule().etherType(unix.ETH_P_IP, true).etherType(unix.ETH_P_ARP, true).etherType(unix.ETH_P_IPV6, true).
			counter().drop(c("non-IP ethertype")))
}

// portAddrs returns p's IPv4 and IPv6 addresses, sorted, without
// duplicates.
func portAddrs(p Port) (v4, v6 []netip.Addr) {
	for _, ip := range p.IPs {
		if a := ip.Addr().Unmap(); a.Is4() {
			v4 = append(v4, a)
		} else {
			v6 = append(v6, a)
		}
	}
	slices.SortFunc(v4, netip.Addr.Compare)
	slices.SortFunc(v6, netip.Addr.Compare)
	return slices.Compact(v4), slices.Compact(v6)
}

// Multicast ranges and the limited broadcast address: what the launcher
// pod's own stack may send from the guest's address before plumbing.
var (
	multicast4 = netip.MustParsePrefix("224.0.0.0/4")
	broadcast4 = netip.MustParsePrefix("255.255.255.255/32")
	multicast6 = netip.MustParsePrefix("ff00::/8")
)

// The standby probe kvnet-node sends into a migration target's standby
// port (package node): an ICMP echo request with identifier
// StandbyProbeID, which a guest behind NAT in its pod answers once it
// runs there. The pod's own stack answers with TTL PodTTL (Linux's); an
// answer it forwards from the guest has one less.
const (
	StandbyProbeID = 0x6b76
	PodTTL         = 64
)

// standbyRules is the rest of the chain of a migration target's port
// before its guest runs there. What passes is what only the running guest
// sends, so that its very first frame on the target reaches its peer and
// teaches every bridge and VXLAN device on the way the guest's new place
// (the same frames kvnet-node's watcher takes as the guest's arrival):
// QEMU's announce (RARP), and unicast IP from one of the guest's
// addresses. Everything else is dropped: the pod's own stack holds the
// guest's MAC and addresses until the launcher plumbs them to the guest,
// and answers ARP and neighbour discovery for them or reports multicast
// groups (IGMP, MLD) with them; taken for the guest's, those would draw
// its traffic away from the source while it still runs there.
func standbyRules(p Port, v4, v6 []netip.Addr, c func(string) string) []nftRule {
	rules := []nftRule{newRule().etherType(ethPRARP, false).ret(c("RARP announce"))}
	if len(v4) > 0 {
		// kvnet-node's standby probe (StandbyProbeID) answered by the pod's
		// own stack, not forwarded from the guest (its TTL unchanged).
		rules = append(rules, newRule().etherType(unix.ETH_P_IP, false).ipProto(unix.IPPROTO_ICMP, false).ipTTL(PodTTL).
			icmpEchoReplyID(StandbyProbeID).counter().drop(c("standby: the pod's own answer to kvnet-node's probe")))
	}
	for _, a := range v4 {
		rules = append(rules, newRule().etherType(unix.ETH_P_IP, false).ipSaddr(hostPrefix(a), false).
			ipDaddr(multicast4, true).ipDaddr(broadcast4, true).ipProto(unix.IPPROTO_IGMP, true).
			ret(c("the guest's unicast IPv4 from "+a.String())))
	}
	if len(v6) > 0 {
		rules = append(rules, newRule().etherType(unix.ETH_P_IPV6, false).l4proto(unix.IPPROTO_ICMPV6).icmpv6TypeRange(133, 137).
			counter().drop(c("standby: neighbour discovery is the pod's own stack")))
	}
	for _, a := range v6 {
		rules = append(rules, newRule().etherType(unix.ETH_P_IPV6, false).ip6Saddr(hostPrefix(a), false).
			ip6Daddr(multicast6, true).ret(c("the guest's unicast IPv6 from "+a.String())))
	}
	return append(rules, newRule().counter().drop(c("standby until the guest announces itself")))
}
