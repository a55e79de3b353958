package datapath

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"kvnet.io/kvnet/internal/policy/verdict"
)

// This file holds the network policy of local ports (PortPolicy, in
// State.Policies): its types, validation and evaluation (Allows), which
// the conntrack clean-up after a policy change uses (cutDenied).

// PortPolicy is the network policy enforced on one local port: traffic to
// (ingress) and from (egress) the port's addresses on its network. A
// direction that is nil is not isolated: everything passes. An isolated
// direction lets through only what one of its rules allows, plus replies
// to allowed connections (conntrack), DHCP and IPv6 neighbour discovery.
// It is compiled per port (internal/policy for NetworkPolicies), so other
// policy kinds can feed the same model.
type PortPolicy struct {
	Port    string // Port.HostIfName: a port of State.Ports with IPs
	Ingress *PolicyDirection
	Egress  *PolicyDirection
}

// PolicyDirection is one isolated direction of a port.
type PolicyDirection struct {
	// Policies name the policies isolating the port, e.g. "ns/name"; the
	// port's drop rule names them.
	Policies []string
	// Rules allow traffic; each becomes a rule named after it.
	Rules []PolicyRule
}

// PolicyRule allows traffic with a set of peers (package verdict: the
// rule model the policy compiler produces and kvnet why explains). Its
// Name identifies the rule and its peer set on the node, e.g.
// "ns/policy ingress[0]": rules of several ports of one network with the
// same Name share one set per IP family and must have the same peers; on
// another network the name is another set. Peers are the allowed peer
// prefixes (sources for ingress, destinations for egress); Ports empty is
// every protocol and port. Policy is not used here.
type PolicyRule = verdict.Rule

// PolicyPort is a protocol ("TCP", "UDP" or "SCTP") and destination port
// range: Port 0 is every port, EndPort 0 is Port alone.
type PolicyPort = verdict.Port

// policyProtos maps PolicyPort protocols to IP protocol numbers.
var policyProtos = map[string]byte{verdict.TCP: 6, verdict.UDP: 17, verdict.SCTP: 132}

// policyProtoNames maps IP protocol numbers to PolicyPort protocols.
var policyProtoNames = map[byte]string{6: verdict.TCP, 17: verdict.UDP, 132: verdict.SCTP}

// Allows reports whether d lets peer open a connection with protocol
// proto (an IP protocol number) to port, and names the rule; a nil d (not
// isolated) allows everything. It is verdict.Match, the one verdict kvnet
// why gives too.
func (d *PolicyDirection) Allows(peer netip.Addr, proto byte, port uint16) (rule string, ok bool) {
	if d == nil {
		return "", true
	}
	name, known := policyProtoNames[proto]
	if !known {
		return "", false // no rule names another protocol
	}
	return verdict.Match(d.Rules, peer, name, port)
}

// validatePolicies checks s.Policies against the ports (by host
// interface name) and each other, and returns the first rule of each
// name by network (validatePolicyRule's map).
func validatePolicies(pols []PortPolicy, ports []Port, bad badFunc) map[string]*PolicyRule {
	byIf := map[string]*Port{} // host interface -> port
	for i := range ports {
		byIf[ports[i].HostIfName] = &ports[i]
	}
	seen := map[string]bool{}         // port -> has a policy
	rules := map[string]*PolicyRule{} // network, rule name -> first rule of that name
	for i, pp := range pols {
		where := fmt.Sprintf("policies[%d] (port %q)", i, pp.Port)
		p := byIf[pp.Port]
		switch {
		case p == nil:
			bad("%s: no such port", where)
			continue
		case seen[pp.Port]:
			bad("%s: port has two policies", where)
		case len(p.IPs) == 0:
			bad("%s: port has no IPs to enforce a policy on", where)
		}
		seen[pp.Port] = true
		for _, dir := range []struct {
			name string
			d    *PolicyDirection
		}{{"ingress", pp.Ingress}, {"egress", pp.Egress}} {
			if dir.d == nil {
				continue
			}
			for j := range dir.d.Rules {
				r := &dir.d.Rules[j]
				validatePolicyRule(fmt.Sprintf("%s: %s rule %q", where, dir.name, r.Name), p.Network, r, rules, bad)
			}
		}
	}
	return rules
}

// validatePolicyRule checks one rule, and that it has the peers of the
// rule of the same name on its network seen first.
func validatePolicyRule(where, network string, r *PolicyRule, rules map[string]*PolicyRule, bad badFunc) {
	if r.Name == "" {
		bad("%s: empty name", where)
	}
	if r.AnyPeer && len(r.Peers) > 0 {
		bad("%s: anyPeer with peers %v", where, r.Peers)
	}
	for _, p := range r.Peers {
		if !p.IsValid() || p.Addr().Zone() != "" || p.Addr().Is4In6() {
			bad("%s: peer %q is not an IP prefix", where, p)
		}
	}
	for _, pp := range r.Ports {
		if _, ok := policyProtos[pp.Protocol]; !ok {
			bad("%s: protocol %q: want TCP, UDP or SCTP", where, pp.Protocol)
		}
		if pp.EndPort != 0 && (pp.Port == 0 || pp.EndPort < pp.Port) {
			bad("%s: port range %d-%d", where, pp.Port, pp.EndPort)
		}
	}
	key := network + "\x00" + r.Name
	if first := rules[key]; first == nil {
		rules[key] = r
	} else if first.AnyPeer != r.AnyPeer || !slices.Equal(first.Peers, r.Peers) {
		bad("%s: peers %v differ from another rule of that name's %v", where, r.Peers, first.Peers)
	}
}

// policyNames joins a direction's policy names for a comment.
func policyNames(d *PolicyDirection) string {
	if len(d.Policies) == 0 {
		return "(unnamed)"
	}
	return strings.Join(d.Policies, ", ")
}

// policyVerdicts holds, for one network, the isolated directions of its
// local ports by address, and what its routers check instead of the
// bridge: connections from their service addresses (svcNets) and to the
// network's Service addresses (vips).
type policyVerdicts struct {
	ingress, egress map[netip.Addr]*PolicyDirection
	svcNets         []netip.Prefix
	vips            map[netip.Addr]bool
}

// allows reports whether a connection from src to dst, protocol proto,
// destination port port, may exist under v on the bridge.
func (v *policyVerdicts) allows(src, dst netip.Addr, proto byte, port uint16) bool {
	if v.vips[dst] || slices.ContainsFunc(v.svcNets, func(p netip.Prefix) bool { return p.Contains(src) }) {
		return true // a Service connection: its router decides (cutRouterDenied)
	}
	if d := v.egress[src]; d != nil {
		if _, ok := d.Allows(dst, proto, port); !ok {
			return false
		}
	}
	if d := v.ingress[dst]; d != nil {
		if _, ok := d.Allows(src, proto, port); !ok {
			return false
		}
	}
	return true
}

// policyZones returns the verdicts of s.Policies (validated) by network
// ID, which is also the network's conntrack zone.
func policyZones(s State) map[uint16]*policyVerdicts {
	nets := map[string]int{} // network name -> ID
	byName := map[string]*Network{}
	for i, n := range s.Networks {
		nets[n.Name] = n.ID
		byName[n.Name] = &s.Networks[i]
	}
	ports := map[string]Port{} // host interface -> port
	for _, p := range s.Ports {
		ports[p.HostIfName] = p
	}
	out := map[uint16]*policyVerdicts{}
	for _, pp := range s.Policies {
		p := ports[pp.Port]
		id := uint16(nets[p.Network])
		v := out[id]
		if v == nil {
			v = &policyVerdicts{ingress: map[netip.Addr]*PolicyDirection{}, egress: map[netip.Addr]*PolicyDirection{}, vips: map[netip.Addr]bool{}}
			if n := byName[p.Network]; n != nil && n.Primary {
				for _, sa := range n.ServiceAddrs {
					v.svcNets = append(v.svcNets, sa.Masked())
				}
				for _, sv := range s.Services {
					if sv.Network == n.Name && !sv.ViaNode {
						v.vips[sv.VIP.Addr()] = true
					}
				}
			}
			out[id] = v
		}
		for _, ip := range p.IPs {
			a := ip.Addr().Unmap()
			if pp.Ingress != nil {
				v.ingress[a] = pp.Ingress
			}
			if pp.Egress != nil {
				v.egress[a] = pp.Egress
			}
		}
	}
	return out
}
