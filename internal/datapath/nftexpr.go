package datapath

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// This file is the vocabulary the rule files (nftports.go, nftnode.go,
// nftnodeports.go, nftrouter.go, nftservices.go) build kvnet's nftables
// rules with: tables, chains, verdict maps and rules as plain data, with
// no kernel access, so the rule set is unit-tested against golden files
// (testdata/*.nft), and the ruleBuilder whose every method appends both
// netlink expressions and their nft-syntax rendering from the same call,
// so the golden text cannot drift from what is programmed.

// tableName is the name of every nftables table kvnet owns, in every
// family and namespace: Apply deletes a table of that name when the state
// needs none, and never touches other tables.
const tableName = "kvnet"

// DefaultVXLANPort is the IANA VXLAN UDP port, the VXLAN devices' port
// unless NodeConfig.VXLANPort says otherwise.
const DefaultVXLANPort = 4789

// vxlanPort returns the port of the node's VXLAN devices.
func (c NodeConfig) vxlanPort() uint16 {
	if c.VXLANPort == 0 {
		return DefaultVXLANPort
	}
	return uint16(c.VXLANPort)
}

// nftTable is one desired nftables table.
type nftTable struct {
	family nftables.TableFamily
	chains []nftChain
	vmaps  []nftVMap
	sets   []nftSet
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

// ipTTL matches the IPv4 TTL (bridge family, the frame known to be
// IPv4).
func (b *ruleBuilder) ipTTL(ttl byte) *ruleBuilder {
	return b.match(fmt.Sprintf("ip ttl %d", ttl), expr.PayloadBaseNetworkHeader, 8, []byte{ttl}, nil, false)
}

// icmpEchoReplyID matches an ICMP echo reply with identifier id (after
// ipProto ICMP).
func (b *ruleBuilder) icmpEchoReplyID(id uint16) *ruleBuilder {
	b.match("icmp type echo-reply", expr.PayloadBaseTransportHeader, 0, []byte{0}, nil, false)
	return b.match(fmt.Sprintf("icmp id %d", id), expr.PayloadBaseTransportHeader, 4, binary.BigEndian.AppendUint16(nil, id), nil, false)
}

// protoNames renders IP protocols the way nft does.
var protoNames = map[byte]string{unix.IPPROTO_ICMP: "icmp", unix.IPPROTO_TCP: "tcp", unix.IPPROTO_UDP: "udp", unix.IPPROTO_SCTP: "sctp", unix.IPPROTO_IGMP: "igmp", unix.IPPROTO_ICMPV6: "ipv6-icmp"}

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

// addrProtoLookup looks the packet's destination address and layer 4
// protocol up in verdict map name (`ip daddr . meta l4proto vmap @name`).
func (b *ruleBuilder) addrProtoLookup(v6 bool, name string) *ruleBuilder {
	addr, text := daddrToReg1(v6)
	return b.add(fmt.Sprintf("%s . meta l4proto vmap @%s", text, name),
		addr,
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg32(addr.Len / 4)},
		&expr.Lookup{SourceRegister: 1, SetName: name, DestRegister: 0, IsDestRegSet: true})
}

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

// dnatToDaddr translates the destination address to itself (`dnat ip to
// ip daddr`) and ends the rule: a NAT binding that changes nothing. The
// first NAT chain of a hook that binds a connection is the last one run
// for it, so later chains (a Service proxy's) leave it alone.
func (b *ruleBuilder) dnatToDaddr(v6 bool, comment string) nftRule {
	addr, text := daddrToReg1(v6)
	fam, verb := uint32(unix.NFPROTO_IPV4), "dnat ip to "
	if v6 {
		fam, verb = unix.NFPROTO_IPV6, "dnat ip6 to "
	}
	b.add(verb+text, addr, &expr.NAT{Type: expr.NATTypeDestNAT, Family: fam, RegAddrMin: 1})
	return b.done(comment)
}

// familyName names an IP family in comments.
func familyName(v6 bool) string {
	if v6 {
		return "IPv6"
	}
	return "IPv4"
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

// srcUpdate adds the source address to dynamic set name, or refreshes
// it there: it expires timeout after (update @name { ip saddr }).
func (b *ruleBuilder) srcUpdate(v6 bool, name string, timeout time.Duration) *ruleBuilder {
	off, l, kw := uint32(ip4SaddrOff), uint32(4), "ip saddr"
	if v6 {
		off, l, kw = ip6SaddrOff, 16, "ip6 saddr"
	}
	return b.add(fmt.Sprintf("update @%s { %s timeout %ds }", name, kw, int64(timeout/time.Second)),
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: l},
		&expr.Dynset{SrcRegKey: 1, SetName: name, Operation: unix.NFT_DYNSET_OP_UPDATE, Timeout: timeout})
}

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
		for _, s := range t.sets {
			sb.WriteString(setText(s))
		}
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

// ctStateNew matches packets whose connection conntrack has just made
// (not confirmed yet).
func (b *ruleBuilder) ctStateNew() *ruleBuilder {
	mask := binary.NativeEndian.AppendUint32(nil, expr.CtStateBitNEW)
	return b.add("ct state new",
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: make([]byte, 4)})
}

// ctMarkMasked matches connections whose mark, under mask, is value.
func (b *ruleBuilder) ctMarkMasked(mask, value uint32) *ruleBuilder {
	return b.add(fmt.Sprintf("ct mark & 0x%08x == 0x%08x", mask, value),
		&expr.Ct{Register: 1, Key: expr.CtKeyMARK},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binary.NativeEndian.AppendUint32(nil, mask), Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binary.NativeEndian.AppendUint32(nil, value)})
}

// setCtMark sets the packet's connection's mark.
func (b *ruleBuilder) setCtMark(mark uint32) *ruleBuilder {
	return b.add(fmt.Sprintf("ct mark set 0x%08x", mark),
		&expr.Immediate{Register: 1, Data: binary.NativeEndian.AppendUint32(nil, mark)},
		&expr.Ct{Key: expr.CtKeyMARK, SourceRegister: true, Register: 1})
}

// TCP header flags (RFC 9293).
const (
	tcpFIN = 0x01
	tcpSYN = 0x02
	tcpRST = 0x04
	tcpACK = 0x10
)

// tcpMidStream matches TCP segments that open nothing: ACK set, SYN, FIN
// and RST clear (a connection's data and acknowledgements).
func (b *ruleBuilder) tcpMidStream() *ruleBuilder {
	b.l4proto(unix.IPPROTO_TCP)
	return b.add("tcp flags & (fin | syn | rst | ack) == ack",
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 13, Len: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 1, Mask: []byte{tcpFIN | tcpSYN | tcpRST | tcpACK}, Xor: []byte{0}},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{tcpACK}})
}

// thSport matches the transport source port in from..to (after l4proto).
func (b *ruleBuilder) thSport(from, to uint16) *ruleBuilder { return b.thPort("sport", 0, from, to) }

// thPort matches the transport port at offset (0: source, 2:
// destination; nft's name for it: sport, dport) in from..to.
func (b *ruleBuilder) thPort(name string, offset uint32, from, to uint16) *ruleBuilder {
	load := &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: offset, Len: 2}
	if from == to {
		return b.add(fmt.Sprintf("th %s %d", name, from), load,
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binary.BigEndian.AppendUint16(nil, from)})
	}
	return b.add(fmt.Sprintf("th %s %d-%d", name, from, to), load,
		&expr.Range{Op: expr.CmpOpEq, Register: 1, FromData: binary.BigEndian.AppendUint16(nil, from),
			ToData: binary.BigEndian.AppendUint16(nil, to)})
}

// ctMarkIs matches connections marked mark, rendered in hex.
func (b *ruleBuilder) ctMarkIs(mark uint32) *ruleBuilder {
	return b.add(fmt.Sprintf("ct mark 0x%08x", mark),
		&expr.Ct{Register: 1, Key: expr.CtKeyMARK},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binary.NativeEndian.AppendUint32(nil, mark)})
}
