package datapath

import (
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"
	vnl "github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"kvnet.io/kvnet/internal/nl"
)

// This file holds what policies do with TCP connections whose opening
// this node never saw: a live-migrated VM's connections on the target
// node (conntrack does not move with the guest), or any connection after
// its entry was lost. Conntrack picks such a connection up from its next
// segment (nf_conntrack_tcp_loose) as a new one in the direction of that
// segment, which may be the reply direction of the real connection: a
// server pushing data to a VM whose ingress is isolated would be refused
// until the VM spoke. Which side opened such a connection cannot be told
// from its packets, so:
//
//   - the policy chain marks a connection conntrack made from a TCP
//     segment with ACK set and SYN, FIN and RST clear (a mid-stream one)
//     ctMidStream; a SYN, which alone opens a connection, is always judged
//     as new in its own direction;
//   - a port's chain admits such a segment if its rules admit it as new,
//     or if the port's other direction admits the reverse connection (the
//     segment's destination as the peer opening it, to the segment's
//     source port), since either side may have opened it;
//   - cutDenied judges such a connection both ways, and keeps it while
//     either is allowed;
//   - a connection a policy change refuses is not deleted but marked
//     ctCut (a tombstone the policy chain drops), so that its next segment
//     is not picked up mid-stream and admitted the other way round: it
//     stays cut on this node while conntrack keeps the entry (as long as
//     its packets keep coming, and the TCP timeout after the last), and
//     is deleted if a later change allows it again.
//
// A segment admitted this way opens nothing: with no socket of that
// connection the receiver answers it with a reset, which closes the
// entry. What it carries reaches an application only on a connection
// both endpoints already had, which a SYN judged by the policies opened.

// Conntrack marks of bridged tenant connections (the node namespace's
// policy zones): ctMarkBase with flag bits.
const (
	ctMarkBase  = 0x4b500000
	ctMarkFlags = 0x3
	ctMidStream = 0x1 // picked up mid-stream: either side may have opened it
	ctCut       = 0x2 // cut by a policy change: dropped
)

// policyHead returns the first rules of the policy chain: tombstones of
// cut connections drop, replies and established connections pass, and a
// connection conntrack picks up mid-stream is marked for the port chains.
func policyHead() []nftRule {
	return []nftRule{
		newRule().ctMarkMasked(^uint32(ctMidStream), ctMarkBase|ctCut).counter().
			drop("policy: connections a policy change cut"),
		newRule().ctEstRel(false).accept("policy: replies and established connections"),
		newRule().tcpMidStream().ctStateNew().setCtMark(ctMarkBase | ctMidStream).
			done("policy: TCP picked up mid-stream (its opening not seen here, e.g. before a live migration)"),
	}
}

// midStreamRules returns the rules of one isolated direction's chain of
// who (egress: from the port; else to it) that admit a mid-stream TCP
// segment as the reverse of a connection the port's other direction
// (other; nil: not isolated) allows: the segment's peer (destination on
// egress, source on ingress) on the segment's source port.
func midStreamRules(who, network, what string, egress bool, other *PolicyDirection, fams []bool, sets map[string]*nftSet) []nftRule {
	otherWhat := "egress"
	if egress {
		otherWhat = "ingress"
	}
	start := func() *ruleBuilder { return newRule().ctMarkIs(ctMarkBase | ctMidStream) }
	if other == nil {
		return []nftRule{start().l4proto(unix.IPPROTO_TCP).ret(
			fmt.Sprintf("%s: %s: mid-stream TCP, which it may have opened (%s not isolated)", who, what, otherWhat))}
	}
	var rules []nftRule
	for _, r := range other.Rules {
		var ports []PolicyPort
		for _, p := range r.Ports {
			if p.Protocol == "TCP" {
				ports = append(ports, p)
			}
		}
		if len(r.Ports) == 0 {
			ports = []PolicyPort{{Protocol: "TCP"}}
		}
		if len(ports) == 0 {
			continue
		}
		comment := fmt.Sprintf("%s: %s: mid-stream TCP it may have opened, by %s", who, what, r.Name)
		if r.AnyPeer {
			rules = append(rules, sportMatches(ports, start, comment)...)
			continue
		}
		for _, v6 := range fams {
			name := peerSet(network, r, v6, sets)
			rules = append(rules, sportMatches(ports, func() *ruleBuilder {
				return start().nfproto(v6).addrLookup(v6, !egress, name)
			}, comment)...)
			for _, p := range r.Peers {
				if p.Addr().Is6() != v6 || p.IsSingleIP() {
					continue
				}
				rules = append(rules, sportMatches(ports, func() *ruleBuilder {
					return start().nfproto(v6).addrMatch(v6, !egress, p)
				}, comment)...)
			}
		}
	}
	return rules
}

// sportMatches returns one rule per TCP port range of ports (from start)
// on the segment's source port, returning.
func sportMatches(ports []PolicyPort, start func() *ruleBuilder, comment string) []nftRule {
	out := make([]nftRule, 0, len(ports))
	for _, p := range ports {
		b := start().l4proto(unix.IPPROTO_TCP)
		switch {
		case p.Port == 0:
		case p.EndPort == 0:
			b.thSport(p.Port, p.Port)
		default:
			b.thSport(p.Port, p.EndPort)
		}
		out = append(out, b.ret(comment))
	}
	return out
}

// ctAction is what cutDenied does with a tracked connection.
type ctAction int

const (
	ctKeep      ctAction = iota
	ctDelete             // not allowed (not TCP), or a tombstone allowed again
	ctTombstone          // a TCP connection no longer allowed: mark it ctCut
)

// action judges a tracked connection under the policies: by its original
// direction, or either way if it was picked up mid-stream.
func (f ctPolicyFilter) action(flow *netlink.ConntrackFlow) ctAction {
	v := f.zones[flow.Zone]
	if v == nil {
		return ctKeep
	}
	src, ok1 := netip.AddrFromSlice(flow.Forward.SrcIP)
	dst, ok2 := netip.AddrFromSlice(flow.Forward.DstIP)
	if !ok1 || !ok2 {
		return ctKeep
	}
	src, dst = src.Unmap(), dst.Unmap()
	ours := flow.Mark&^uint32(ctMarkFlags) == ctMarkBase
	allowed := v.allows(src, dst, flow.Forward.Protocol, flow.Forward.DstPort)
	if !allowed && ours && flow.Mark&ctMidStream != 0 {
		allowed = v.allows(dst, src, flow.Forward.Protocol, flow.Forward.SrcPort)
	}
	cut := ours && flow.Mark&ctCut != 0
	switch {
	case cut && allowed:
		return ctDelete
	case cut || allowed:
		return ctKeep
	case flow.Forward.Protocol == unix.IPPROTO_TCP:
		return ctTombstone
	}
	return ctDelete
}

// tombstone marks the TCP connections of family fam that the policies
// (f) no longer allow ctCut.
func (d *Datapath) tombstone(fam netlink.InetFamily, f ctPolicyFilter) error {
	var flows []*netlink.ConntrackFlow
	if err := nl.Retry(func() (err error) {
		flows, err = d.h.ConntrackTableList(netlink.ConntrackTable, fam)
		return err
	}); err != nil {
		return fmt.Errorf("list connections: %w", err)
	}
	var todo []*netlink.ConntrackFlow
	for _, fl := range flows {
		if f.action(fl) == ctTombstone {
			todo = append(todo, fl)
		}
	}
	if len(todo) == 0 {
		return nil
	}
	return nl.Do(d.nsPath, func() error {
		for _, fl := range todo {
			mark := uint32(ctMarkBase | ctCut)
			if fl.Mark&^uint32(ctMarkFlags) == ctMarkBase {
				mark |= fl.Mark & ctMidStream
			}
			if err := setConntrackMark(uint8(fam), fl, mark); err != nil && !nl.IsNotFound(err) {
				return fmt.Errorf("mark connection %s cut: %w", fl, err)
			}
		}
		return nil
	})
}

// setConntrackMark sets the mark of flow (family fam, in its zone) in the
// calling thread's network namespace. The netlink library's update sends
// no zone, so it finds no connection outside zone 0.
func setConntrackMark(fam uint8, flow *netlink.ConntrackFlow, mark uint32) error {
	req := vnl.NewNetlinkRequest(int(netlink.ConntrackTable)<<8|vnl.IPCTNL_MSG_CT_NEW, unix.NLM_F_ACK)
	req.AddData(&vnl.Nfgenmsg{NfgenFamily: fam, Version: vnl.NFNETLINK_V0})
	srcAttr, dstAttr := vnl.CTA_IP_V4_SRC, vnl.CTA_IP_V4_DST
	src, dst := flow.Forward.SrcIP.To4(), flow.Forward.DstIP.To4()
	if fam == unix.AF_INET6 {
		srcAttr, dstAttr = vnl.CTA_IP_V6_SRC, vnl.CTA_IP_V6_DST
		src, dst = flow.Forward.SrcIP.To16(), flow.Forward.DstIP.To16()
	}
	if src == nil || dst == nil {
		return fmt.Errorf("connection %s: addresses not of family %d", flow, fam)
	}
	tuple := vnl.NewRtAttr(unix.NLA_F_NESTED|vnl.CTA_TUPLE_ORIG, nil)
	ip := vnl.NewRtAttr(unix.NLA_F_NESTED|vnl.CTA_TUPLE_IP, nil)
	ip.AddChild(vnl.NewRtAttr(srcAttr, src))
	ip.AddChild(vnl.NewRtAttr(dstAttr, dst))
	tuple.AddChild(ip)
	proto := vnl.NewRtAttr(unix.NLA_F_NESTED|vnl.CTA_TUPLE_PROTO, nil)
	proto.AddChild(vnl.NewRtAttr(vnl.CTA_PROTO_NUM, []byte{flow.Forward.Protocol}))
	proto.AddChild(vnl.NewRtAttr(vnl.CTA_PROTO_SRC_PORT, vnl.BEUint16Attr(flow.Forward.SrcPort)))
	proto.AddChild(vnl.NewRtAttr(vnl.CTA_PROTO_DST_PORT, vnl.BEUint16Attr(flow.Forward.DstPort)))
	tuple.AddChild(proto)
	req.AddData(tuple)
	req.AddData(vnl.NewRtAttr(vnl.CTA_ZONE, vnl.BEUint16Attr(flow.Zone)))
	req.AddData(vnl.NewRtAttr(vnl.CTA_MARK, vnl.BEUint32Attr(mark)))
	_, err := req.Execute(unix.NETLINK_NETFILTER, 0)
	return err
}
