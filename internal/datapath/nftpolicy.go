package datapath

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// This file holds the node's network policy rules (policyRules): tenant
// frames are bridged, and the bridge hands them to the node's inet hooks
// (br_netfilter, net.bridge.bridge-nf-call-ip{,6}tables), where the
// policy is enforced with connection tracking, each network in its own
// conntrack zone (its ID) since tenants reuse addresses. There the input
// and output devices are the network's bridge, so a port is recognised by
// its addresses, which its anti-spoofing chain guarantees.

// nftSet is a named set of addresses (IPv4 or IPv6, no intervals). With
// a timeout it is dynamic: rules add its elements (dynsetUpdate), each
// expiring timeout after its last update, and it has no elems.
type nftSet struct {
	name    string
	keyType nftables.SetDatatype
	elems   []netip.Addr // sorted
	comment string
	timeout time.Duration
}

// policyChain is the regular chain the inet forward chain sends bridged
// frames of networks with policies to.
const policyChain = "policy"

// policyTables is what the policies add to the node's inet table.
type policyTables struct {
	zones   []nftRule // raw prerouting: conntrack zones, before the notrack rule
	pin     []nftRule // nat prerouting, first: tracked bridged frames keep their destination
	forward []nftRule // forward: to the policy chain
	chains  []nftChain
	sets    []nftSet
}

// policyRules returns the rules of s.Policies (validated) on the ports
// and networks of s. For each network with a policy: its bridged frames
// are tracked in conntrack zone <ID>; in the policy chain, established and
// related traffic passes, and a frame from (to) an isolated port's
// address jumps to the port's egress (ingress) chain, pout-<if> (pin-<if>),
// which returns what a rule allows and drops the rest with a counted rule
// naming the isolating policies. Peer addresses are in one set per rule
// name and IP family on a network (np4-/np6-<hash>-<name>), shared by
// every port of the network with that rule, so that pods coming and going change set elements only;
// peers that are wider prefixes (ipBlocks) get a rule each.
func policyRules(s State) policyTables {
	var pt policyTables
	if len(s.Policies) == 0 {
		return pt
	}
	byName := map[string]*Network{} // network name -> network
	for i := range s.Networks {
		byName[s.Networks[i].Name] = &s.Networks[i]
	}
	ports := map[string]*Port{} // host interface -> port
	for i := range s.Ports {
		ports[s.Ports[i].HostIfName] = &s.Ports[i]
	}
	pols := slices.Clone(s.Policies)
	slices.SortFunc(pols, func(a, b PortPolicy) int { return strings.Compare(a.Port, b.Port) })

	zoned := map[int]bool{} // network ID -> zone rule made
	sets := map[string]*nftSet{}
	dispatch := policyHead()
	var chains []nftChain
	for _, pp := range pols {
		p := ports[pp.Port]
		n := byName[p.Network]
		br := BridgeName(n.ID)
		zoned[n.ID] = true
		v4, v6 := portAddrs(*p)
		fams := []bool{}
		if len(v4) > 0 {
			fams = append(fams, false)
		}
		if len(v6) > 0 {
			fams = append(fams, true)
		}
		for _, dir := range []struct {
			d      *PolicyDirection
			egress bool
		}{{pp.Egress, true}, {pp.Ingress, false}} {
			if dir.d == nil {
				continue
			}
			chain, what := "pin-"+p.HostIfName, "ingress"
			if dir.egress {
				chain, what = "pout-"+p.HostIfName, "egress"
			}
			for _, a := range append(slices.Clone(v4), v6...) {
				b := newRule().iifname(br).nfproto(a.Is6())
				if dir.egress {
					b.addrMatch(a.Is6(), true, hostPrefix(a))
				} else {
					b.addrMatch(a.Is6(), false, hostPrefix(a))
				}
				dispatch = append(dispatch, b.jump(chain, fmt.Sprintf("port %s: %s policy of %s", p.HostIfName, what, a)))
			}
			other := pp.Ingress
			if !dir.egress {
				other = pp.Egress
			}
			rules := directionRules("port "+p.HostIfName, n.Name, what, dir.egress, dir.d, fams, sets)
			// Before the drop: mid-stream TCP the port may have opened.
			rules = slices.Insert(rules, len(rules)-1, midStreamRules("port "+p.HostIfName, n.Name, what, dir.egress, other, fams, sets)...)
			chains = append(chains, nftChain{name: chain, rules: rules})
		}
	}
	ids := make([]int, 0, len(zoned))
	for id := range zoned {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	var pass []nftRule
	for _, id := range ids {
		i := slices.IndexFunc(s.Networks, func(n Network) bool { return n.ID == id })
		if i >= 0 {
			untracked, replies := serviceRangeRules(&s.Networks[i])
			pt.zones = append(pt.zones, untracked...)
			pass = append(pass, replies...)
		}
		pt.zones = append(pt.zones, newRule().iifname(BridgeName(id)).ctZoneSet(uint16(id)).
			accept(fmt.Sprintf("network %d: bridged frames tracked in conntrack zone %d for policies", id, id)))
		for _, v6 := range []bool{false, true} {
			pt.pin = append(pt.pin, newRule().iifname(BridgeName(id)).nfproto(v6).
				dnatToDaddr(v6, fmt.Sprintf("network %d: tracked bridged frames keep their %s destination, whatever a Service proxy of the node translates", id, familyName(v6))))
		}
		if i >= 0 && s.Networks[i].Primary {
			rules, svcSets := policyPassRules(&s.Networks[i], s.Services)
			pass = append(pass, rules...)
			pt.sets = append(pt.sets, svcSets...)
		}
	}
	// Service connections pass the bridge: their routers check them.
	dispatch = slices.Insert(dispatch, len(policyHead()), pass...)
	pt.forward = []nftRule{newRule().iifname(bridgePrefix+"*").jump(policyChain, "bridged tenant frames: network policies")}
	pt.chains = append([]nftChain{{name: policyChain, rules: dispatch}}, chains...)
	for _, st := range sets {
		pt.sets = append(pt.sets, *st)
	}
	slices.SortFunc(pt.sets, func(a, b nftSet) int { return strings.Compare(a.name, b.name) })
	return pt
}

// serviceRangeRules returns, for network n with policies, the raw
// prerouting rules that keep its bridged frames to and from the cluster's
// Service ranges out of the node's conntrack, and the policy chain's rules
// that let the replies pass. Tracked, such a frame meets the node's
// Service proxy of the cluster default network (kube-proxy): its NAT
// would translate the cluster IP in the middle of the tenant's bridge,
// and its filter rejects a new connection to a cluster IP it did not
// translate. Untracked, it is the network's router that tracks and
// translates them, as for networks without policies: the policy checks
// a frame to a cluster IP against the sender's egress, frame by frame,
// and lets frames from a cluster IP pass, which only the router's
// translation of a reply makes (ports cannot send from addresses not
// theirs).
func serviceRangeRules(n *Network) (untracked, replies []nftRule) {
	br := BridgeName(n.ID)
	for _, p := range n.ServiceCIDRs {
		v6 := p.Addr().Is6()
		fam := familyName(v6)
		for _, src := range []bool{false, true} {
			way := "to"
			if src {
				way = "from"
			}
			b := newRule().iifname(br).nfproto(v6).addrMatch(v6, src, p.Masked())
			b.add("notrack", &expr.Notrack{})
			untracked = append(untracked, b.accept(fmt.Sprintf("network %s: bridged frames %s the cluster's %s Service range stay untracked", n.Name, way, fam)))
		}
		replies = append(replies, newRule().iifname(br).nfproto(v6).addrMatch(v6, true, p.Masked()).
			accept(fmt.Sprintf("network %s: replies from the cluster's %s Services, which its router tracks", n.Name, fam)))
	}
	return untracked, replies
}

// Traffic every isolated port keeps: DHCP with the router's servers and
// IPv6 neighbour discovery (types 133-137), never subject to policy.
func alwaysAllowed(who, what string, egress bool) []nftRule {
	c := func(s string) string { return fmt.Sprintf("%s: %s: %s", who, what, s) }
	client4, server4, client6, server6 := uint16(68), uint16(67), uint16(546), uint16(547)
	if !egress {
		client4, server4, client6, server6 = server4, client4, server6, client6
	}
	return []nftRule{
		newRule().nfproto(false).l4protoUDP().udpSport(client4).udpDport(server4).ret(c("DHCP")),
		newRule().nfproto(true).l4protoUDP().udpSport(client6).udpDport(server6).ret(c("DHCPv6")),
		newRule().nfproto(true).l4proto(unix.IPPROTO_ICMPV6).icmpv6TypeRange(133, 137).ret(c("neighbour discovery")),
	}
}

// directionRules returns the chain of one isolated direction of who (a
// port, "port <host interface>", or a Service endpoint).
func directionRules(who, network, what string, egress bool, d *PolicyDirection, fams []bool, sets map[string]*nftSet) []nftRule {
	rules := alwaysAllowed(who, what, egress)
	for _, r := range d.Rules {
		comment := fmt.Sprintf("%s: %s allowed by %s", who, what, r.Name)
		if r.AnyPeer {
			rules = append(rules, portMatches(r.Ports, func() *ruleBuilder { return newRule() }, comment)...)
			continue
		}
		for _, v6 := range fams {
			name := peerSet(network, r, v6, sets)
			rules = append(rules, portMatches(r.Ports, func() *ruleBuilder {
				return newRule().nfproto(v6).addrLookup(v6, !egress, name)
			}, comment)...)
			for _, p := range r.Peers {
				if p.Addr().Is6() != v6 || p.IsSingleIP() {
					continue
				}
				rules = append(rules, portMatches(r.Ports, func() *ruleBuilder {
					return newRule().nfproto(v6).addrMatch(v6, !egress, p)
				}, comment)...)
			}
		}
	}
	return append(rules, newRule().counter().drop(fmt.Sprintf("%s: %s refused by policy %s", who, what, policyNames(d))))
}

// peerSet returns the name of the set of rule r's single-address peers of
// one family on network, and adds it to sets the first time.
func peerSet(network string, r PolicyRule, v6 bool, sets map[string]*nftSet) string {
	name := policySetName(network, r.Name, v6)
	if sets[name] == nil {
		st := &nftSet{name: name, keyType: addrType(v6), comment: cutComment(r.Name)}
		for _, p := range r.Peers {
			if a := p.Addr(); a.Is6() == v6 && p.IsSingleIP() {
				st.elems = append(st.elems, a)
			}
		}
		slices.SortFunc(st.elems, netip.Addr.Compare)
		st.elems = slices.Compact(st.elems)
		sets[name] = st
	}
	return name
}

// portMatches returns one rule per port range (from start), returning.
func portMatches(ports []PolicyPort, start func() *ruleBuilder, comment string) []nftRule {
	if len(ports) == 0 {
		return []nftRule{start().ret(comment)}
	}
	ps := slices.Clone(ports)
	slices.SortFunc(ps, func(a, b PolicyPort) int {
		return cmp.Or(strings.Compare(a.Protocol, b.Protocol), cmp.Compare(a.Port, b.Port), cmp.Compare(a.EndPort, b.EndPort))
	})
	ps = slices.Compact(ps)
	out := make([]nftRule, 0, len(ps))
	for _, p := range ps {
		b := start().l4proto(policyProtos[p.Protocol])
		switch {
		case p.Port == 0:
		case p.EndPort == 0:
			b.thDport(p.Port, p.Port)
		default:
			b.thDport(p.Port, p.EndPort)
		}
		out = append(out, b.ret(comment))
	}
	return out
}

// policySetName names the set of the peers of one family of rule name on
// network: a policy may apply to several networks (a MultiNetworkPolicy
// for NADs of two networks), each with its own peers.
func policySetName(network, name string, v6 bool) string {
	if v6 {
		return hashedChainName("np6-", network+"\x00"+name, name)
	}
	return hashedChainName("np4-", network+"\x00"+name, name)
}

// addrMatch matches the source (src) or destination address against p.
func (b *ruleBuilder) addrMatch(v6, src bool, p netip.Prefix) *ruleBuilder {
	switch {
	case v6 && src:
		return b.ip6Saddr(p, false)
	case v6:
		return b.ip6Daddr(p, false)
	case src:
		return b.ipSaddr(p, false)
	}
	return b.ipDaddr(p, false)
}

// addrLookup matches the source (src) or destination address against the
// addresses in set name.
func (b *ruleBuilder) addrLookup(v6, src bool, name string) *ruleBuilder {
	off, l, kw := uint32(ip4DaddrOff), uint32(4), "ip daddr"
	switch {
	case v6 && src:
		off, l, kw = ip6SaddrOff, 16, "ip6 saddr"
	case v6:
		off, l, kw = 24, 16, "ip6 daddr"
	case src:
		off, kw = ip4SaddrOff, "ip saddr"
	}
	return b.add(fmt.Sprintf("%s @%s", kw, name),
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: l},
		&expr.Lookup{SourceRegister: 1, SetName: name})
}

// thDport matches the transport destination port in from..to (after
// l4proto).
func (b *ruleBuilder) thDport(from, to uint16) *ruleBuilder { return b.thPort("dport", 2, from, to) }

// ctZoneSet puts the packet's connection in conntrack zone id.
func (b *ruleBuilder) ctZoneSet(id uint16) *ruleBuilder {
	return b.add(fmt.Sprintf("ct zone set %d", id),
		&expr.Immediate{Register: 1, Data: binary.NativeEndian.AppendUint16(nil, id)},
		&expr.Ct{Key: expr.CtKeyZONE, Register: 1, SourceRegister: true})
}
