package datapath

import (
	"cmp"
	"crypto/sha256"
	"encoding/base32"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// This file turns a State into nftables rules as plain data (tables of
// chains of rules), with no kernel access, so the rule set is unit-tested
// against golden files (testdata/*.nft). Each rule carries both its
// netlink expressions and an nft-syntax rendering built from the same
// builder calls, so the golden text cannot drift from what is programmed.

// tableName is the name of every nftables table kvnet owns, in every
// family and namespace: Apply deletes a table of that name when the state
// needs none, and never touches other tables.
const tableName = "kvnet"

// vxlanPort is the IANA VXLAN UDP port, used for every VXLAN device.
const vxlanPort = 4789

// nftTable is one desired nftables table.
type nftTable struct {
	family nftables.TableFamily
	chains []nftChain
	vmaps  []nftVMap
}

// nftVMap is a named verdict map whose elements jump to chains of the
// same table. Its name stands for its key type: syncTables cannot read a
// map's key type back (google/nftables v0.3.0 loses it), so a map whose
// key type changes must be renamed.
type nftVMap struct {
	name    string
	keyType nftables.SetDatatype // a concatenation
	elems   []nftVMapElem
}

// nftVMapElem is one element: key (in the kernel's encoding, each field
// padded to 4 bytes) -> jump chain, with its nft-syntax key and a comment.
type nftVMapElem struct {
	key     []byte
	text    string
	chain   string
	comment string
}

// nftChain is one chain; base is nil for a regular (jump target) chain.
type nftChain struct {
	name  string
	base  *baseChain
	rules []nftRule
}

// baseChain holds the hook attachment of a base chain.
type baseChain struct {
	typ      nftables.ChainType
	hook     nftables.ChainHook
	priority nftables.ChainPriority
	policy   nftables.ChainPolicy
}

// nftRule is one rule: its expressions, its nft-syntax text and comment.
type nftRule struct {
	exprs   []expr.Any
	text    []string
	comment string
}

// counted reports whether the rule has a counter.
func (r nftRule) counted() bool {
	return slices.ContainsFunc(r.exprs, func(e expr.Any) bool { _, ok := e.(*expr.Counter); return ok })
}

// ruleBuilder builds an nftRule; every method appends matching
// expressions and text. Register 1 is the only scratch register needed.
type ruleBuilder struct{ r nftRule }

func newRule() *ruleBuilder { return &ruleBuilder{} }

func (b *ruleBuilder) add(text string, exprs ...expr.Any) *ruleBuilder {
	b.r.text = append(b.r.text, text)
	b.r.exprs = append(b.r.exprs, exprs...)
	return b
}

// ifnameData returns the cmp data for an interface name: the name padded
// to IFNAMSIZ for an exact match, or the bytes before a trailing "*" for
// a prefix match (how nft encodes `iifname "kvtr*"`).
func ifnameData(name string) []byte {
	if prefix, ok := strings.CutSuffix(name, "*"); ok {
		return []byte(prefix)
	}
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, name)
	return b
}

func (b *ruleBuilder) metaName(key expr.MetaKey, keyword, name string) *ruleBuilder {
	return b.add(fmt.Sprintf("%s %q", keyword, name),
		&expr.Meta{Key: key, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifnameData(name)})
}

func (b *ruleBuilder) iifname(n string) *ruleBuilder {
	return b.metaName(expr.MetaKeyIIFNAME, "iifname", n)
}
func (b *ruleBuilder) oifname(n string) *ruleBuilder {
	return b.metaName(expr.MetaKeyOIFNAME, "oifname", n)
}

// match loads len bytes at off from base and compares them with data,
// optionally under a mask (prefix matches).
func (b *ruleBuilder) match(text string, base expr.PayloadBase, off uint32, data, mask []byte, neq bool) *ruleBuilder {
	op := expr.CmpOpEq
	if neq {
		op = expr.CmpOpNeq
	}
	exprs := []expr.Any{&expr.Payload{DestRegister: 1, Base: base, Offset: off, Len: uint32(len(data))}}
	if mask != nil {
		exprs = append(exprs, &expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: uint32(len(data)),
			Mask: mask, Xor: make([]byte, len(data))})
	}
	exprs = append(exprs, &expr.Cmp{Op: op, Register: 1, Data: data})
	return b.add(text, exprs...)
}

func neqText(neq bool) string {
	if neq {
		return "!= "
	}
	return ""
}

// Ethernet header offsets (link-layer base).
const (
	ethSaddrOff = 6
	ethTypeOff  = 12
)

func (b *ruleBuilder) etherSaddr(mac net.HardwareAddr, neq bool) *ruleBuilder {
	return b.match("ether saddr "+neqText(neq)+mac.String(), expr.PayloadBaseLLHeader, ethSaddrOff, []byte(mac), nil, neq)
}

// etherTypeNames renders ether types the way nft does.
var etherTypeNames = map[uint16]string{unix.ETH_P_IP: "ip", unix.ETH_P_ARP: "arp", unix.ETH_P_IPV6: "ip6", ethPRARP: "0x8035"}

// ethPRARP is RARP's ether type: QEMU announces a migrated guest with it.
const ethPRARP = 0x8035

func (b *ruleBuilder) etherType(t uint16, neq bool) *ruleBuilder {
	return b.match("ether type "+neqText(neq)+etherTypeNames[t], expr.PayloadBaseLLHeader, ethTypeOff,
		binary.BigEndian.AppendUint16(nil, t), nil, neq)
}

// prefixMatch matches len(p.Addr()) bytes at off against prefix p.
func (b *ruleBuilder) prefixMatch(keyword string, off uint32, p netip.Prefix, neq bool) *ruleBuilder {
	addr := p.Masked().Addr().AsSlice()
	text := keyword + " " + neqText(neq) + p.Addr().String()
	var mask []byte
	if p.Bits() != len(addr)*8 {
		mask = net.CIDRMask(p.Bits(), len(addr)*8)
		text = keyword + " " + neqText(neq) + p.Masked().String()
	}
	return b.match(text, expr.PayloadBaseNetworkHeader, off, addr, mask, neq)
}

// IPv4/IPv6/ARP header offsets (network base). ARP offsets assume
// Ethernet/IPv4 ARP (hlen 6, plen 4), the only kind Linux and guests
// accept on an Ethernet link.
const (
	ip4ProtoOff = 9
	ip4SaddrOff = 12
	ip4DaddrOff = 16
	ip6SaddrOff = 8
	arpShaOff   = 8
	arpSpaOff   = 14
)

func hostPrefix(a netip.Addr) netip.Prefix { return netip.PrefixFrom(a, a.BitLen()) }

func (b *ruleBuilder) ipSaddr(p netip.Prefix, neq bool) *ruleBuilder {
	return b.prefixMatch("ip saddr", ip4SaddrOff, p, neq)
}
func (b *ruleBuilder) ipDaddr(p netip.Prefix, neq bool) *ruleBuilder {
	return b.prefixMatch("ip daddr", ip4DaddrOff, p, neq)
}
func (b *ruleBuilder) ip6Saddr(p netip.Prefix, neq bool) *ruleBuilder {
	return b.prefixMatch("ip6 saddr", ip6SaddrOff, p, neq)
}
func (b *ruleBuilder) ip6Daddr(p netip.Prefix, neq bool) *ruleBuilder {
	return b.prefixMatch("ip6 daddr", 24, p, neq)
}
func (b *ruleBuilder) arpSpa(a netip.Addr) *ruleBuilder {
	return b.prefixMatch("arp saddr ip", arpSpaOff, hostPrefix(a), false)
}
func (b *ruleBuilder) arpSha(mac net.HardwareAddr, neq bool) *ruleBuilder {
	return b.match("arp saddr ether "+neqText(neq)+mac.String(), expr.PayloadBaseNetworkHeader, arpShaOff, []byte(mac), nil, neq)
}

// ipProtoUDP matches the IPv4 protocol field (bridge family, where the
// frame is already known to be IPv4).
func (b *ruleBuilder) ipProtoUDP() *ruleBuilder { return b.ipProto(unix.IPPROTO_UDP, false) }

// ipProto matches (neq: does not match) the IPv4 protocol field (bridge
// family, where the frame is already known to be IPv4).
func (b *ruleBuilder) ipProto(proto byte, neq bool) *ruleBuilder {
	return b.match(fmt.Sprintf("ip protocol %s%s", neqText(neq), protoNames[proto]), expr.PayloadBaseNetworkHeader, ip4ProtoOff, []byte{proto}, nil, neq)
}

// protoNames renders IP protocols the way nft does.
var protoNames = map[byte]string{unix.IPPROTO_TCP: "tcp", unix.IPPROTO_UDP: "udp", unix.IPPROTO_IGMP: "igmp", unix.IPPROTO_ICMPV6: "ipv6-icmp"}

// l4protoUDP matches UDP in the inet family, either IP version.
func (b *ruleBuilder) l4protoUDP() *ruleBuilder { return b.l4proto(unix.IPPROTO_UDP) }

// l4proto matches the transport protocol (after IPv6 extension headers).
func (b *ruleBuilder) l4proto(proto byte) *ruleBuilder {
	return b.add("meta l4proto "+protoNames[proto],
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}})
}

// icmpv6TypeRange matches ICMPv6 types from..to (after l4proto).
func (b *ruleBuilder) icmpv6TypeRange(from, to byte) *ruleBuilder {
	return b.add(fmt.Sprintf("icmpv6 type %d-%d", from, to),
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 0, Len: 1},
		&expr.Range{Op: expr.CmpOpEq, Register: 1, FromData: []byte{from}, ToData: []byte{to}})
}

func (b *ruleBuilder) udpSport(p uint16) *ruleBuilder {
	return b.match(fmt.Sprintf("udp sport %d", p), expr.PayloadBaseTransportHeader, 0, binary.BigEndian.AppendUint16(nil, p), nil, false)
}
func (b *ruleBuilder) udpDport(p uint16) *ruleBuilder {
	return b.match(fmt.Sprintf("udp dport %d", p), expr.PayloadBaseTransportHeader, 2, binary.BigEndian.AppendUint16(nil, p), nil, false)
}

// nfproto restricts an inet-family rule to IPv4 or IPv6.
func (b *ruleBuilder) nfproto(v6 bool) *ruleBuilder {
	p, name := byte(unix.NFPROTO_IPV4), "ipv4"
	if v6 {
		p, name = unix.NFPROTO_IPV6, "ipv6"
	}
	return b.add("meta nfproto "+name,
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{p}})
}

// ctEstRel matches (neq: does not match) conntrack state established or
// related.
func (b *ruleBuilder) ctEstRel(neq bool) *ruleBuilder {
	op, text := expr.CmpOpNeq, "ct state established,related"
	if neq {
		op, text = expr.CmpOpEq, "ct state ! established,related"
	}
	mask := binary.NativeEndian.AppendUint32(nil, expr.CtStateBitESTABLISHED|expr.CtStateBitRELATED)
	return b.add(text,
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: make([]byte, 4)},
		&expr.Cmp{Op: op, Register: 1, Data: make([]byte, 4)})
}

func (b *ruleBuilder) counter() *ruleBuilder { return b.add("counter", &expr.Counter{}) }

// Terminal statements: each returns the finished rule.
func (b *ruleBuilder) verdict(text string, kind expr.VerdictKind, comment string) nftRule {
	b.add(text, &expr.Verdict{Kind: kind})
	return b.done(comment)
}

// maxCommentLen is nft's limit on rule comments; longer ones (long network
// names) are cut so that the rule set still loads and lists.
const maxCommentLen = 128

func (b *ruleBuilder) done(comment string) nftRule {
	b.r.comment = cutComment(comment)
	return b.r
}
func (b *ruleBuilder) accept(comment string) nftRule {
	return b.verdict("accept", expr.VerdictAccept, comment)
}
func (b *ruleBuilder) drop(comment string) nftRule {
	return b.verdict("drop", expr.VerdictDrop, comment)
}
func (b *ruleBuilder) ret(comment string) nftRule {
	return b.verdict("return", expr.VerdictReturn, comment)
}
func (b *ruleBuilder) jump(chain, comment string) nftRule {
	b.add("jump "+chain, &expr.Verdict{Kind: expr.VerdictJump, Chain: chain})
	return b.done(comment)
}
func (b *ruleBuilder) masquerade(comment string) nftRule {
	b.add("masquerade", &expr.Masq{})
	return b.done(comment)
}
func (b *ruleBuilder) notrack(comment string) nftRule {
	b.add("notrack", &expr.Notrack{})
	return b.done(comment)
}

// The arp family numbers its hooks differently from inet and bridge
// (linux/netfilter_arp.h: NF_ARP_IN 0, NF_ARP_OUT 1).
var (
	arpHookIn  = nftables.ChainHookRef(0)
	arpHookOut = nftables.ChainHookRef(1)
)

// bridgePriorityFilter is the bridge family's "filter" priority.
const bridgePriorityFilter nftables.ChainPriority = -200

func filterChain(name string, hook *nftables.ChainHook, prio nftables.ChainPriority, policy nftables.ChainPolicy, rules []nftRule) nftChain {
	return nftChain{name: name, base: &baseChain{typ: nftables.ChainTypeFilter, hook: *hook, priority: prio, policy: policy}, rules: rules}
}

// nodeRules returns the desired kvnet tables of the node namespace: a
// bridge table (gateway kept off the overlay, per-port anti-spoofing), an
// inet table (node stack kept off tenant bridges, transit isolation,
// egress masquerade) and an arp table (no ARP between the node and tenant
// bridges). There are none when s has no network.
func nodeRules(s State) []nftTable {
	if len(s.Networks) == 0 {
		return nil
	}
	nets := slices.Clone(s.Networks)
	slices.SortFunc(nets, func(a, b Network) int { return cmp.Compare(a.ID, b.ID) })
	ports := slices.Clone(s.Ports)
	slices.SortFunc(ports, func(a, b Port) int { return strings.Compare(a.HostIfName, b.HostIfName) })

	// Port checks run at prerouting, before the bridge learns the source
	// MAC: checked at forward, a spoofed frame would already have moved the
	// victim's FDB entry to the attacker's port.
	var pre, fwd []nftRule
	for _, n := range nets {
		if !n.Primary {
			continue
		}
		// Every node answers for the gateway with the same MAC; if frames
		// from it crossed the tunnel, bridges would learn the gateway on
		// the VXLAN port and send gateway traffic to another node.
		gw := GatewayMAC(n.ID)
		pre = append(pre, newRule().iifname(VXLANName(n.ID)).etherSaddr(gw, false).counter().
			drop(fmt.Sprintf("network %s: gateway MAC never enters from the overlay", n.Name)))
		fwd = append(fwd, newRule().oifname(VXLANName(n.ID)).etherSaddr(gw, false).counter().
			drop(fmt.Sprintf("network %s: gateway MAC never leaves on the overlay", n.Name)))
	}
	portChains := make([]nftChain, 0, len(ports))
	for _, p := range ports {
		pre = append(pre, newRule().iifname(p.HostIfName).jump(portChainName(p.HostIfName), "port "+p.HostIfName))
		portChains = append(portChains, nftChain{name: portChainName(p.HostIfName), rules: portRules(p)})
	}
	bridge := nftTable{family: nftables.TableFamilyBridge, chains: append([]nftChain{
		filterChain("prerouting", nftables.ChainHookPrerouting, bridgePriorityFilter, nftables.ChainPolicyAccept, pre),
		filterChain("forward", nftables.ChainHookForward, bridgePriorityFilter, nftables.ChainPolicyAccept, fwd),
	}, portChains...)}

	np := nodePortRules(nets, s.Services, s.NodeAddrs)
	var input []nftRule
	for _, n := range nets {
		if !n.Primary {
			continue
		}
		for _, v6 := range networkFamilies(n) {
			_, node, _ := TransitAddrs(n.ID, v6)
			b := newRule().iifname(transitName(n.ID)).nfproto(v6)
			if v6 {
				b.ip6Daddr(transitPrefix6, false).ip6Daddr(hostPrefix(node), true)
			} else {
				b.ipDaddr(transitPrefix4, false).ipDaddr(hostPrefix(node), true)
			}
			input = append(input, b.counter().drop(fmt.Sprintf("network %s: no other network's %s transit address", n.Name, familyName(v6))))
		}
	}
	// VXLAN carries no authentication: a tenant that could send UDP 4789
	// to any VTEP (through its router and the node's masquerade) could
	// inject frames into every network on that node.
	input = append(input, newRule().iifname(transitPrefix+"*").l4protoUDP().udpDport(vxlanPort).counter().
		drop("tenants never reach a VXLAN port"))
	// The node has no address on tenant bridges and must not take part in
	// their L2 or L3: otherwise it answers ARP for its own addresses, and a
	// pod could route through the node around its tenant router. (Matching
	// the bridge itself, meta ibrname, needs nft_meta_bridge, which not
	// every kernel has; the bridge device as iif/oif in the inet and arp
	// families works everywhere.)
	input = append([]nftRule{newRule().iifname(bridgePrefix + "*").counter().
		drop("tenant networks never reach the node stack")}, input...)
	arp := nftTable{family: nftables.TableFamilyARP, chains: []nftChain{
		filterChain("input", arpHookIn, *nftables.ChainPriorityFilter, nftables.ChainPolicyAccept, []nftRule{
			newRule().iifname(bridgePrefix + "*").counter().drop("tenant ARP never reaches the node stack"),
		}),
		filterChain("output", arpHookOut, *nftables.ChainPriorityFilter, nftables.ChainPolicyAccept, []nftRule{
			newRule().oifname(bridgePrefix + "*").counter().drop("the node never ARPs into tenant networks"),
		}),
	}}
	inet := nftTable{family: nftables.TableFamilyINet, chains: []nftChain{
		// Tenants reuse addresses; with br_netfilter, bridged frames would
		// otherwise share the node's conntrack table and collide.
		filterChain("prerouting", nftables.ChainHookPrerouting, *nftables.ChainPriorityRaw, nftables.ChainPolicyAccept, []nftRule{
			newRule().iifname(bridgePrefix + "*").notrack("bridged tenant frames stay out of the node's conntrack"),
		}),
		filterChain("input", nftables.ChainHookInput, *nftables.ChainPriorityFilter, nftables.ChainPolicyAccept, input),
		filterChain("output", nftables.ChainHookOutput, *nftables.ChainPriorityFilter, nftables.ChainPolicyAccept, []nftRule{
			newRule().oifname(bridgePrefix + "*").counter().drop("the node stack never sends into tenant networks"),
		}),
		filterChain("forward", nftables.ChainHookForward, *nftables.ChainPriorityFilter, nftables.ChainPolicyAccept, slices.Concat([]nftRule{
			newRule().iifname(transitPrefix + "*").oifname(transitPrefix + "*").counter().
				drop("no forwarding between tenant routers"),
		}, np.forward, []nftRule{
			newRule().oifname(transitPrefix + "*").ctEstRel(true).counter().
				drop("only replies enter tenant routers"),
			newRule().iifname(transitPrefix + "*").l4protoUDP().udpDport(vxlanPort).counter().
				drop("tenants never speak VXLAN to the underlay"),
		})),
		{name: "postrouting", base: &baseChain{typ: nftables.ChainTypeNAT, hook: *nftables.ChainHookPostrouting,
			priority: *nftables.ChainPriorityNATSource, policy: nftables.ChainPolicyAccept}, rules: []nftRule{
			newRule().iifname(transitPrefix + "*").
				masquerade("tenant egress leaves with the node's address"),
		}},
	}}
	inet.chains = append(inet.chains, np.chains...)
	inet.vmaps = np.maps
	return []nftTable{bridge, inet, arp}
}

// nodePortPriority runs kvnet's node port translation just before the
// usual destination NAT priority, where kube-proxy's is: the first NAT
// mapping of a connection wins, so a UDN Service's node port goes to the
// UDN even where kube-proxy also programs it (for the pods' cluster
// default network addresses).
var nodePortPriority = nftables.ChainPriorityRef(*nftables.ChainPriorityNATDest - 10)

// nodePortTables holds the node namespace's part of node ports and
// external addresses.
type nodePortTables struct {
	chains  []nftChain
	maps    []nftVMap
	forward []nftRule
}

// nodePortRules returns the node's rules for the node ports and external
// addresses of services (on nets, sorted by ID): connections to a node
// port on any of the node's addresses (fib daddr type local), and to an
// external address and service port, get their destination translated to
// the service network's router (its transit address, and the node port),
// where the router balances them as it does the cluster IP. A verdict map
// `node-ports` (protocol . port) jumps to the network's chain
// `router-<ID>`, which translates the address only; maps `external-ips4`
// and `external-ips6` (address . protocol . port) jump to one chain per
// external address and port. The same lookups run for connections the
// node opens itself (output), loopback addresses excepted.
func nodePortRules(nets []Network, services []Service, nodeAddrs []netip.Addr) nodePortTables {
	var np nodePortTables
	byName := map[string]Network{}
	for _, n := range nets {
		byName[n.Name] = n
	}
	ports := nftVMap{name: "node-ports", keyType: nodePortKeyType}
	ext := [2]nftVMap{{name: "external-ips4", keyType: serviceKeyType(false)}, {name: "external-ips6", keyType: serviceKeyType(true)}}
	routers := map[int]bool{}
	seen := map[string]bool{}
	for _, sv := range services {
		n, ok := byName[sv.Network]
		if !ok || sv.NodePort == 0 {
			continue
		}
		proto := serviceProto(sv)
		v6 := sv.VIP.Addr().Is6()
		router, _, err := TransitAddrs(n.ID, v6)
		if err != nil {
			continue // Validate refused it
		}
		chain := fmt.Sprintf("router-%d", n.ID)
		if key := fmt.Sprintf("%d/%d", proto, sv.NodePort); !seen[key] {
			seen[key] = true
			ports.elems = append(ports.elems, nftVMapElem{key: portKey(proto, sv.NodePort), chain: chain,
				comment: cutComment("service " + sv.Name), text: fmt.Sprintf("%s . %d", protoNames[proto], sv.NodePort)})
		}
		routers[n.ID] = true
		m := &ext[0]
		if v6 {
			m = &ext[1]
		}
		to := netip.AddrPortFrom(router, sv.NodePort)
		for _, a := range sv.External {
			at := netip.AddrPortFrom(a, sv.VIP.Port())
			name := hashedChainName("ext-", sv.Protocol+" "+at.String(), sv.Name)
			m.elems = append(m.elems, nftVMapElem{key: slices.Concat(a.AsSlice(), portKey(proto, sv.VIP.Port())), chain: name,
				comment: cutComment("service " + sv.Name), text: fmt.Sprintf("%s . %s . %d", a, protoNames[proto], sv.VIP.Port())})
			np.chains = append(np.chains, nftChain{name: name, rules: []nftRule{
				newRule().dnat(to, fmt.Sprintf("service %s: %s %s to network %s's router", sv.Name, sv.Protocol, at, n.Name)),
			}})
		}
	}
	if len(ports.elems) == 0 {
		return np
	}
	for _, n := range nets {
		if !routers[n.ID] {
			continue
		}
		var rules []nftRule
		for _, v6 := range networkFamilies(n) {
			router, _, _ := TransitAddrs(n.ID, v6)
			rules = append(rules, newRule().nfproto(v6).dnatAddr(router, fmt.Sprintf("network %s: to its router", n.Name)))
		}
		np.chains = append(np.chains, nftChain{name: fmt.Sprintf("router-%d", n.ID), rules: rules})
	}
	np.maps = append(np.maps, ports)
	in := []nftRule{newRule().fibDaddrLocal().portLookup(ports.name).done("node ports of UDN services")}
	out := []nftRule{
		newRule().nfproto(false).ipDaddr(loopback4, true).fibDaddrLocal().portLookup(ports.name).done("node ports of UDN services, from the node"),
		newRule().nfproto(true).ip6Daddr(hostPrefix(netip.IPv6Loopback()), true).fibDaddrLocal().portLookup(ports.name).done("node ports of UDN services, from the node"),
	}
	for i := range ext {
		if len(ext[i].elems) == 0 {
			continue
		}
		v6 := i == 1
		np.maps = append(np.maps, ext[i])
		r := newRule().nfproto(v6).serviceLookup(v6, ext[i].name).done(fmt.Sprintf("%s external addresses of UDN services", familyName(v6)))
		in, out = append(in, r), append(out, r)
	}
	np.chains = append([]nftChain{
		{name: "node-ports-in", base: &baseChain{typ: nftables.ChainTypeNAT, hook: *nftables.ChainHookPrerouting,
			priority: *nodePortPriority, policy: nftables.ChainPolicyAccept}, rules: in},
		{name: "node-ports-local", base: &baseChain{typ: nftables.ChainTypeNAT, hook: *nftables.ChainHookOutput,
			priority: *nodePortPriority, policy: nftables.ChainPolicyAccept}, rules: out},
	}, np.chains...)
	np.forward = append(tenantNodePortRules(&np, ports, nodeAddrs),
		newRule().oifname(transitPrefix+"*").ctStatusDNAT().accept("node port and load balancer connections to tenant routers"))
	return np
}

// tenantNodePortRules keeps tenants off node ports at other nodes'
// addresses (at this node's, the forward chain's rule against forwarding
// between routers does): maps `node-addrs4`/`node-addrs6` (address .
// protocol, for every node address and the protocols of ports) jump to
// chain `to-node`, which looks the port up in `tenant-node-ports` (the
// keys of ports) and jumps to `refuse-node-port`. It returns the forward
// rules and adds maps and chains to np.
func tenantNodePortRules(np *nodePortTables, ports nftVMap, nodeAddrs []netip.Addr) []nftRule {
	if len(nodeAddrs) == 0 {
		return nil
	}
	protos := map[byte]bool{}
	refuse := nftVMap{name: "tenant-node-ports", keyType: nodePortKeyType}
	for _, e := range ports.elems {
		protos[e.key[0]] = true
		refuse.elems = append(refuse.elems, nftVMapElem{key: e.key, text: e.text, comment: e.comment, chain: "refuse-node-port"})
	}
	addrs := [2]nftVMap{{name: "node-addrs4", keyType: addrProtoKeyType(false)}, {name: "node-addrs6", keyType: addrProtoKeyType(true)}}
	sorted := slices.Clone(nodeAddrs)
	slices.SortFunc(sorted, netip.Addr.Compare)
	for _, a := range slices.Compact(sorted) {
		a = a.Unmap()
		m := &addrs[0]
		if a.Is6() {
			m = &addrs[1]
		}
		for _, p := range []byte{unix.IPPROTO_TCP, unix.IPPROTO_UDP} {
			if protos[p] {
				m.elems = append(m.elems, nftVMapElem{key: slices.Concat(a.AsSlice(), []byte{p, 0, 0, 0}), chain: "to-node",
					text: fmt.Sprintf("%s . %s", a, protoNames[p]), comment: "a node's address"})
			}
		}
	}
	var rules []nftRule
	for i, m := range addrs {
		if len(m.elems) == 0 {
			continue
		}
		v6 := i == 1
		np.maps = append(np.maps, m)
		rules = append(rules, newRule().iifname(transitPrefix+"*").nfproto(v6).addrProtoLookup(v6, m.name).
			done(fmt.Sprintf("%s: tenants to a node's address", familyName(v6))))
	}
	np.maps = append(np.maps, refuse)
	np.chains = append(np.chains,
		nftChain{name: "to-node", rules: []nftRule{newRule().portLookup(refuse.name).done("node ports of UDN services")}},
		nftChain{name: "refuse-node-port", rules: []nftRule{newRule().counter().rejectProhibited("node ports of UDN services: never from a tenant")}})
	return rules
}

// addrProtoKeyType is the key type of node-addrs4/6: address . protocol.
func addrProtoKeyType(v6 bool) nftables.SetDatatype {
	return nftables.MustConcatSetType(addrType(v6), nftables.TypeInetProto)
}

// addrProtoLookup looks the packet's destination address and layer 4
// protocol up in verdict map name (`ip daddr . meta l4proto vmap @name`).
func (b *ruleBuilder) addrProtoLookup(v6 bool, name string) *ruleBuilder {
	addr, text := daddrToReg1(v6)
	return b.add(fmt.Sprintf("%s . meta l4proto vmap @%s", text, name),
		addr,
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg32(addr.Len / 4)},
		&expr.Lookup{SourceRegister: 1, SetName: name, DestRegister: 0, IsDestRegSet: true})
}

// loopback4 is IPv4's loopback network.
var loopback4 = netip.MustParsePrefix("127.0.0.0/8")

// fibDaddrLocal matches packets to one of the node's own addresses.
func (b *ruleBuilder) fibDaddrLocal() *ruleBuilder {
	return b.add("fib daddr type local",
		&expr.Fib{Register: 1, FlagDADDR: true, ResultADDRTYPE: true},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binary.NativeEndian.AppendUint32(nil, unix.RTN_LOCAL)})
}

// dnatAddr translates the destination address to a, keeping the port,
// and ends the rule.
func (b *ruleBuilder) dnatAddr(a netip.Addr, comment string) nftRule {
	fam, text := uint32(unix.NFPROTO_IPV4), fmt.Sprintf("dnat ip to %s", a)
	if a.Is6() {
		fam, text = unix.NFPROTO_IPV6, fmt.Sprintf("dnat ip6 to %s", a)
	}
	b.add(text,
		&expr.Immediate{Register: 1, Data: a.AsSlice()},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: fam, RegAddrMin: 1})
	return b.done(comment)
}

// networkFamilies returns the IP families of n's subnets: false for IPv4,
// true for IPv6, IPv4 first.
func networkFamilies(n Network) []bool {
	var v4, v6 bool
	for _, p := range n.Subnets {
		if p.Addr().Is4() {
			v4 = true
		} else {
			v6 = true
		}
	}
	var out []bool
	if v4 {
		out = append(out, false)
	}
	if v6 {
		out = append(out, true)
	}
	return out
}

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

// routerRules returns the kvnet table of network n's router namespace:
// only connections from the tenant outwards (and between its own subnets)
// are forwarded, and everything leaving through the transit veth is
// masqueraded to the router's transit address, so the node never sees
// tenant addresses and two tenants may use the same subnet.
//
// services are the network's Services: connections from the network's
// pods to a service address are spread over its endpoints at random
// (serviceRules) and masqueraded to the gateway, so that the endpoint, on
// the same subnet as the client, replies through the router; a service
// without endpoints refuses connections.
//
// Service connections leave through routerSvcIf (a routing table chosen
// by the packet mark, restored from the connection's mark for each packet
// of its original direction) and are masqueraded to this node's service
// address there.
func routerRules(n Network, services []Service) []nftTable {
	forward := []nftRule{newRule().ctEstRel(false).accept(fmt.Sprintf("network %s: replies", n.Name))}
	dnat, svcMaps, svcChains, refuse := serviceRules(services)
	forward = append(forward, refuse...)
	for _, p := range n.ServiceCIDRs {
		b := newRule().iifname(routerGwIf).oifname(routerTransitIf).nfproto(p.Addr().Is6())
		if p.Addr().Is6() {
			b.ip6Daddr(p, false)
		} else {
			b.ipDaddr(p, false)
		}
		forward = append(forward, b.counter().rejectProhibited(fmt.Sprintf("network %s: no other Services of the cluster", n.Name)))
	}
	forward = append(forward,
		newRule().iifname(routerGwIf).oifname(routerTransitIf).accept(fmt.Sprintf("network %s: new connections go outwards only", n.Name)),
		newRule().iifname(routerGwIf).oifname(routerGwIf).accept(fmt.Sprintf("network %s: between its subnets", n.Name)))
	if n.Layer3 != nil {
		forward = append(forward,
			newRule().iifname(routerGwIf).oifname(routerOverlayIf).accept(fmt.Sprintf("network %s: to its pods on other nodes", n.Name)),
			newRule().iifname(routerOverlayIf).oifname(routerGwIf).accept(fmt.Sprintf("network %s: from its pods on other nodes", n.Name)))
	}
	if len(n.ServiceAddrs) > 0 {
		forward = append(forward, newRule().iifname(routerGwIf).oifname(routerSvcIf).accept(
			fmt.Sprintf("network %s: service connections, and replies to other nodes' routers", n.Name)))
	}
	nodePorts := slices.ContainsFunc(services, func(sv Service) bool { return sv.NodePort != 0 })
	if nodePorts {
		forward = append(forward, newRule().iifname(routerTransitIf).oifname(routerSvcIf).ctStatusDNAT().accept(
			fmt.Sprintf("network %s: node port and load balancer connections", n.Name)))
		if n.Layer3 != nil {
			forward = append(forward, newRule().iifname(routerTransitIf).oifname(routerOverlayIf).ctStatusDNAT().accept(
				fmt.Sprintf("network %s: node port and load balancer connections to other nodes' pods", n.Name)))
		}
	}
	forward = append(forward, newRule().counter().drop(fmt.Sprintf("network %s: nothing else is forwarded", n.Name)))
	postrouting := []nftRule{newRule().oifname(routerTransitIf).masquerade(fmt.Sprintf("network %s: the node sees the transit address only", n.Name))}
	chains := []nftChain{filterChain("forward", nftables.ChainHookForward, *nftables.ChainPriorityFilter, nftables.ChainPolicyDrop, forward)}
	if len(dnat) > 0 {
		chains = append(chains,
			filterChain("services", nftables.ChainHookPrerouting, *nftables.ChainPriorityMangle, nftables.ChainPolicyAccept, []nftRule{
				newRule().ctDirectionOriginal().ctMark(serviceMark).markPacket().done(fmt.Sprintf("network %s: service connections leave through %s", n.Name, routerSvcIf)),
			}),
			nftChain{name: "prerouting", base: &baseChain{typ: nftables.ChainTypeNAT, hook: *nftables.ChainHookPrerouting,
				priority: *nftables.ChainPriorityNATDest, policy: nftables.ChainPolicyAccept}, rules: dnat})
		chains = append(chains, svcChains...)
		postrouting = append(postrouting, newRule().ctStatusDNAT().oifname(routerSvcIf).masquerade(
			fmt.Sprintf("network %s: service connections come back to this router", n.Name)))
		if nodePorts && n.Layer3 != nil {
			// Other nodes' pods answer a client outside the network
			// through this router's overlay address.
			postrouting = append(postrouting, newRule().ctStatusDNAT().iifname(routerTransitIf).oifname(routerOverlayIf).masquerade(
				fmt.Sprintf("network %s: node port connections come back to this router", n.Name)))
		}
	}
	chains = append(chains, nftChain{name: "postrouting", base: &baseChain{typ: nftables.ChainTypeNAT, hook: *nftables.ChainHookPostrouting,
		priority: *nftables.ChainPriorityNATSource, policy: nftables.ChainPolicyAccept}, rules: postrouting})
	return []nftTable{{family: nftables.TableFamilyINet, chains: chains, vmaps: svcMaps}}
}

// serviceRules returns the rules of services, as kube-proxy's nftables
// mode has them: dispatch, for the router's NAT prerouting chain, one rule
// per IP family that looks the packet's destination address, protocol and
// port up in maps (the family's verdict map, an element per service with
// endpoints, which jumps to the service's own chain, serviceChainName);
// chains, one per service with endpoints, spreading connections over them
// at random (numgen, one draw per rule: rule i of k takes 1/(k-i) of what
// reaches it, so each endpoint gets 1/k) with DNAT; and refuse, for the
// forward chain, one counted reject per service without endpoints.
//
// A change of one service's endpoints thus changes only that service's
// chain, and adding or removing a service one map element and one chain:
// syncTables rewrites only those.
func serviceRules(services []Service) (dispatch []nftRule, maps []nftVMap, chains []nftChain, refuse []nftRule) {
	var v4, v6, np4, np6 nftVMap
	for _, sv := range services {
		if len(sv.Endpoints) == 0 {
			// A node port without endpoints needs no rule: nothing
			// translates it, so the router's own stack refuses it.
			refuse = append(refuse, serviceMatch(sv).counter().reject(sv.Protocol, fmt.Sprintf("service %s: no endpoints", sv.Name)))
			continue
		}
		name := serviceChainName(sv)
		m, np := &v4, &np4
		if sv.VIP.Addr().Is6() {
			m, np = &v6, &np6
		}
		m.elems = append(m.elems, serviceElem(sv, name))
		if sv.NodePort != 0 {
			np.elems = append(np.elems, nodePortElem(sv, name))
		}
		rules := make([]nftRule, 0, len(sv.Endpoints))
		for i, ep := range sv.Endpoints {
			b := newRule()
			if left := len(sv.Endpoints) - i; left > 1 {
				b.numgenZero(uint32(left))
			}
			if !sv.ViaNode { // leaves through the service port
				b.markService()
			}
			rules = append(rules, b.dnat(ep, fmt.Sprintf("service %s: endpoint %s", sv.Name, ep)))
		}
		chains = append(chains, nftChain{name: name, rules: rules})
	}
	for _, f := range []struct {
		m   *nftVMap
		v6  bool
		fam string
	}{{&v4, false, "IPv4"}, {&v6, true, "IPv6"}} {
		if len(f.m.elems) == 0 {
			continue
		}
		f.m.name, f.m.keyType = serviceMapName(f.v6), serviceKeyType(f.v6)
		maps = append(maps, *f.m)
		dispatch = append(dispatch, newRule().iifname(routerGwIf).nfproto(f.v6).serviceLookup(f.v6, f.m.name).
			done(fmt.Sprintf("%s services: to the service's chain", f.fam)))
	}
	for _, f := range []struct {
		m  *nftVMap
		v6 bool
	}{{&np4, false}, {&np6, true}} {
		if len(f.m.elems) == 0 {
			continue
		}
		f.m.name, f.m.keyType = nodePortMapName(f.v6), nodePortKeyType
		maps = append(maps, *f.m)
		// Connections the node sent to the router's transit address
		// (the node's and external addresses' ports, translated there).
		dispatch = append(dispatch, newRule().iifname(routerTransitIf).nfproto(f.v6).portLookup(f.m.name).
			done(fmt.Sprintf("%s node ports: to the service's chain", familyName(f.v6))))
	}
	return dispatch, maps, chains, refuse
}

// familyName names an IP family in comments.
func familyName(v6 bool) string {
	if v6 {
		return "IPv6"
	}
	return "IPv4"
}

// nodePortMapName names the verdict map of a router's node ports of one
// IP family (its key: protocol . port).
func nodePortMapName(v6 bool) string {
	if v6 {
		return "node-ports6"
	}
	return "node-ports4"
}

// nodePortKeyType is the key type of node port maps.
var nodePortKeyType = nftables.MustConcatSetType(nftables.TypeInetProto, nftables.TypeInetService)

// portKey returns the key of a protocol . port map element, each field
// padded to 4 bytes as in registers.
func portKey(proto byte, port uint16) []byte {
	return slices.Concat([]byte{proto, 0, 0, 0}, binary.BigEndian.AppendUint16(nil, port), []byte{0, 0})
}

// nodePortElem returns sv's element of its family's node port map,
// jumping to chain.
func nodePortElem(sv Service, chain string) nftVMapElem {
	proto := serviceProto(sv)
	return nftVMapElem{key: portKey(proto, sv.NodePort), chain: chain, comment: cutComment("service " + sv.Name),
		text: fmt.Sprintf("%s . %d", protoNames[proto], sv.NodePort)}
}

// portLookup looks the packet's layer 4 protocol and destination port up
// in verdict map name (`meta l4proto . th dport vmap @name`).
func (b *ruleBuilder) portLookup(name string) *ruleBuilder {
	return b.add(fmt.Sprintf("meta l4proto . th dport vmap @%s", name),
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Payload{DestRegister: reg32(1), Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Lookup{SourceRegister: 1, SetName: name, DestRegister: 0, IsDestRegSet: true})
}

// cutComment cuts a comment to nft's limit.
func cutComment(c string) string {
	if len(c) > maxCommentLen {
		return c[:maxCommentLen]
	}
	return c
}

// serviceMapName names the verdict map of the router's services of one IP
// family (its key: address . protocol . port).
func serviceMapName(v6 bool) string {
	if v6 {
		return "service-ips6"
	}
	return "service-ips4"
}

// serviceKeyType is the key type of serviceMapName(v6).
func serviceKeyType(v6 bool) nftables.SetDatatype {
	return nftables.MustConcatSetType(addrType(v6), nftables.TypeInetProto, nftables.TypeInetService)
}

// serviceElem returns sv's element of its family's service map: its
// address, protocol and port, each padded to 4 bytes as in registers,
// jumping to chain.
func serviceElem(sv Service, chain string) nftVMapElem {
	proto := serviceProto(sv)
	key := slices.Concat(sv.VIP.Addr().AsSlice(), portKey(proto, sv.VIP.Port()))
	return nftVMapElem{key: key, chain: chain, comment: cutComment("service " + sv.Name),
		text: fmt.Sprintf("%s . %s . %d", sv.VIP.Addr(), protoNames[proto], sv.VIP.Port())}
}

// serviceLookup looks the packet's destination address, layer 4 protocol
// and destination port up in verdict map name, as the concatenation
// `ip daddr . meta l4proto . th dport` does: each field in the next free
// 32-bit register from register 1 on (NFT_REG_1 is NFT_REG32_00..03).
func (b *ruleBuilder) serviceLookup(v6 bool, name string) *ruleBuilder {
	addr, text := daddrToReg1(v6)
	next := reg32(addr.Len / 4) // the register after the address
	return b.add(fmt.Sprintf("%s . meta l4proto . th dport vmap @%s", text, name),
		addr,
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: next},
		&expr.Payload{DestRegister: next + 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Lookup{SourceRegister: 1, SetName: name, DestRegister: 0, IsDestRegSet: true})
}

// daddrToReg1 loads the destination address (IPv4, or IPv6 if v6) into
// register 1, the first field of a concatenated lookup key, and names it.
func daddrToReg1(v6 bool) (*expr.Payload, string) {
	if v6 {
		return &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 24, Len: 16}, "ip6 daddr"
	}
	return &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: ip4DaddrOff, Len: 4}, "ip daddr"
}

// addrType is the address data type of a family.
func addrType(v6 bool) nftables.SetDatatype {
	if v6 {
		return nftables.TypeIP6Addr
	}
	return nftables.TypeIPAddr
}

// reg32 returns the number of the i-th 32-bit register (NFT_REG32_00 + i).
func reg32(i uint32) uint32 { return unix.NFT_REG32_00 + i }

// serviceChainPrefix starts the name of every service chain.
const serviceChainPrefix = "svc-"

// maxServiceChainName bounds service chain names: the kernel allows 255
// bytes (NFT_CHAIN_MAXNAMELEN), kept well below for `nft list`.
const maxServiceChainName = 64

// serviceChainName returns the name of service sv's chain in its router:
// "svc-", a hash of its protocol and address (unique in a router, as
// Validate checks), and its name with every byte nft would not take in a
// bare chain name replaced by "_", cut to maxServiceChainName bytes. The
// hash keeps names unique when cut; the name is there for people.
func serviceChainName(sv Service) string {
	return hashedChainName(serviceChainPrefix, sv.Protocol+" "+sv.VIP.String(), sv.Name)
}

// hashedChainName returns prefix, a hash of key and name with every byte
// nft would not take in a bare chain name replaced by "_", cut to
// maxServiceChainName bytes.
func hashedChainName(prefix, key, name string) string {
	sum := sha256.Sum256([]byte(key))
	out := prefix + strings.ToLower(base32.StdEncoding.EncodeToString(sum[:5])) + "-" +
		strings.Map(func(r rune) rune {
			if r < utf8.RuneSelf && (r == '_' || r == '.' || r == '/' || r == '-' ||
				'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9') {
				return r
			}
			return '_'
		}, name)
	if len(out) > maxServiceChainName {
		out = out[:maxServiceChainName]
	}
	return out
}

// serviceMatch starts a rule matching connections from the network's pods
// to service sv's address.
func serviceMatch(sv Service) *ruleBuilder {
	b := newRule().iifname(routerGwIf)
	addr := sv.VIP.Addr()
	if addr.Is4() {
		b.nfproto(false).ipDaddr(hostPrefix(addr), false)
	} else {
		b.nfproto(true).ip6Daddr(hostPrefix(addr), false)
	}
	proto := serviceProto(sv)
	return b.l4proto(proto).match(fmt.Sprintf("%s dport %d", protoNames[proto], sv.VIP.Port()),
		expr.PayloadBaseTransportHeader, 2, binary.BigEndian.AppendUint16(nil, sv.VIP.Port()), nil, false)
}

// serviceProto returns sv's IP protocol number.
func serviceProto(sv Service) byte {
	if sv.Protocol == "UDP" {
		return unix.IPPROTO_UDP
	}
	return unix.IPPROTO_TCP
}

// numgenZero matches one time in mod: a fresh random number modulo mod
// is 0.
func (b *ruleBuilder) numgenZero(mod uint32) *ruleBuilder {
	return b.add(fmt.Sprintf("numgen random mod %d 0", mod),
		&expr.Numgen{Register: 1, Modulus: mod, Type: unix.NFT_NG_RANDOM},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: make([]byte, 4)})
}

// ctStatusDNAT matches connections whose destination was translated.
func (b *ruleBuilder) ctStatusDNAT() *ruleBuilder {
	mask := binary.NativeEndian.AppendUint32(nil, ctStatusDstNAT)
	return b.add("ct status dnat",
		&expr.Ct{Register: 1, Key: expr.CtKeySTATUS},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: make([]byte, 4)})
}

// ctDirectionOriginal matches packets of a connection's original
// direction.
func (b *ruleBuilder) ctDirectionOriginal() *ruleBuilder {
	return b.add("ct direction original",
		&expr.Ct{Register: 1, Key: expr.CtKeyDIRECTION},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{0}})
}

// ctMark matches connections marked mark.
func (b *ruleBuilder) ctMark(mark uint32) *ruleBuilder {
	return b.add(fmt.Sprintf("ct mark %d", mark),
		&expr.Ct{Register: 1, Key: expr.CtKeyMARK},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binary.NativeEndian.AppendUint32(nil, mark)})
}

// markPacket sets the packet's mark to serviceMark.
func (b *ruleBuilder) markPacket() *ruleBuilder {
	return b.add(fmt.Sprintf("meta mark set %d", serviceMark),
		&expr.Immediate{Register: 1, Data: binary.NativeEndian.AppendUint32(nil, serviceMark)},
		&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: 1})
}

// markService sets the packet's and its connection's mark to serviceMark.
func (b *ruleBuilder) markService() *ruleBuilder {
	return b.add(fmt.Sprintf("meta mark set %d ct mark set %d", serviceMark, serviceMark),
		&expr.Immediate{Register: 1, Data: binary.NativeEndian.AppendUint32(nil, serviceMark)},
		&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: 1},
		&expr.Ct{Key: expr.CtKeyMARK, SourceRegister: true, Register: 1})
}

// ctStatusDstNAT is IPS_DST_NAT (linux/netfilter/nf_conntrack_common.h).
const ctStatusDstNAT = 1 << 5

// dnat translates the destination to ep and ends the rule.
func (b *ruleBuilder) dnat(ep netip.AddrPort, comment string) nftRule {
	fam, text := uint32(unix.NFPROTO_IPV4), fmt.Sprintf("dnat ip to %s", ep)
	if ep.Addr().Is6() {
		fam, text = unix.NFPROTO_IPV6, fmt.Sprintf("dnat ip6 to %s", ep)
	}
	b.add(text,
		&expr.Immediate{Register: 1, Data: ep.Addr().AsSlice()},
		&expr.Immediate{Register: 2, Data: binary.BigEndian.AppendUint16(nil, ep.Port())},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: fam, RegAddrMin: 1, RegProtoMin: 2, Specified: true})
	return b.done(comment)
}

// reject refuses a connection as kube-proxy does: a TCP reset, or ICMP
// port unreachable for UDP.
func (b *ruleBuilder) reject(protocol, comment string) nftRule {
	if protocol == "TCP" {
		b.add("reject with tcp reset", &expr.Reject{Type: unix.NFT_REJECT_TCP_RST})
	} else {
		b.add("reject with icmpx port-unreachable", &expr.Reject{Type: unix.NFT_REJECT_ICMPX_UNREACH, Code: unix.NFT_REJECT_ICMPX_PORT_UNREACH})
	}
	return b.done(comment)
}

// rejectProhibited refuses a packet with ICMP(v6) "administratively
// prohibited", and ends the rule.
func (b *ruleBuilder) rejectProhibited(comment string) nftRule {
	b.add("reject with icmpx admin-prohibited", &expr.Reject{Type: unix.NFT_REJECT_ICMPX_UNREACH, Code: unix.NFT_REJECT_ICMPX_ADMIN_PROHIBITED})
	return b.done(comment)
}

// familyNames renders table families the way nft does.
var familyNames = map[nftables.TableFamily]string{
	nftables.TableFamilyBridge: "bridge", nftables.TableFamilyINet: "inet",
	nftables.TableFamilyIPv4: "ip", nftables.TableFamilyIPv6: "ip6",
	nftables.TableFamilyARP: "arp",
}

// hookNames renders hooks the way nft does (bridge and inet numbers agree).
var hookNames = map[nftables.ChainHook]string{
	*nftables.ChainHookPrerouting: "prerouting", *nftables.ChainHookInput: "input",
	*nftables.ChainHookForward: "forward", *nftables.ChainHookOutput: "output",
	*nftables.ChainHookPostrouting: "postrouting",
}

// renderTables renders tables in nft syntax (close to `nft list table`),
// for golden files and debugging.
func renderTables(tables []nftTable) string {
	var sb strings.Builder
	for i, t := range tables {
		if i > 0 {
			sb.WriteString("\n")
		}
		fmt.Fprintf(&sb, "table %s %s {\n", familyNames[t.family], tableName)
		for _, m := range t.vmaps {
			fmt.Fprintf(&sb, "\tmap %s {\n\t\ttype %s : verdict\n\t\telements = {\n", m.name, m.keyType.Name)
			for _, e := range m.elems {
				fmt.Fprintf(&sb, "\t\t\t%s comment %q : jump %s,\n", e.text, e.comment, e.chain)
			}
			sb.WriteString("\t\t}\n\t}\n\n")
		}
		for j, c := range t.chains {
			if j > 0 {
				sb.WriteString("\n")
			}
			fmt.Fprintf(&sb, "\tchain %s {\n", c.name)
			if c.base != nil {
				policy := "accept"
				if c.base.policy == nftables.ChainPolicyDrop {
					policy = "drop"
				}
				hook := hookNames[c.base.hook]
				if t.family == nftables.TableFamilyARP {
					hook = map[nftables.ChainHook]string{*arpHookIn: "input", *arpHookOut: "output"}[c.base.hook]
				}
				fmt.Fprintf(&sb, "\t\ttype %s hook %s priority %d; policy %s;\n",
					c.base.typ, hook, c.base.priority, policy)
			}
			for _, r := range c.rules {
				sb.WriteString("\t\t" + strings.Join(r.text, " "))
				if r.comment != "" {
					fmt.Fprintf(&sb, " comment %q", r.comment)
				}
				sb.WriteString("\n")
			}
			sb.WriteString("\t}\n")
		}
		sb.WriteString("}\n")
	}
	return sb.String()
}
