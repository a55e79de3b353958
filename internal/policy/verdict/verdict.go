// Package verdict is the one answer to "does this isolated direction let
// this connection through": the compiled rule model (Port, Rule) and the
// function that matches a connection against it (Match). The policy
// compiler (package policy) produces these rules, kvnet-node programs
// them (package datapath turns them into nftables rules and cuts the
// tracked connections they no longer allow with Match), and "kvnet why"
// explains a connection with Match too: one function, so an operator's
// answer can never disagree with what the datapath enforces.
//
// It is pure logic with no dependency beyond the standard library, so
// that the datapath can import it.
package verdict

import (
	"fmt"
	"net/netip"
	"slices"
)

// Protocols a rule's port may name.
const (
	TCP  = "TCP"
	UDP  = "UDP"
	SCTP = "SCTP"
)

// Port is a protocol and a destination port range: Port 0 is every port
// of Protocol, EndPort 0 is Port alone.
type Port struct {
	Protocol      string
	Port, EndPort uint16
}

// Contains reports whether p allows port port of protocol proto.
func (p Port) Contains(proto string, port uint16) bool {
	if p.Protocol != proto {
		return false
	}
	if p.Port == 0 {
		return true
	}
	return port == p.Port || (p.EndPort != 0 && port >= p.Port && port <= p.EndPort)
}

// String renders p as "TCP/80", "TCP/80-90" or "TCP".
func (p Port) String() string {
	switch {
	case p.Port == 0:
		return p.Protocol
	case p.EndPort != 0:
		return fmt.Sprintf("%s/%d-%d", p.Protocol, p.Port, p.EndPort)
	}
	return fmt.Sprintf("%s/%d", p.Protocol, p.Port)
}

// Rule allows traffic between an endpoint and a set of peers: from them
// (ingress) or to them (egress).
type Rule struct {
	// Name identifies the rule's peer set on its network: "<ns>/<policy>
	// ingress[i]" or "... egress[i]", and for the peers of an egress rule
	// that name a container port, "... egress[i] port <port>" (each peer
	// resolves the name itself). Two rules of a network with the same
	// Name have the same Peers, whatever endpoint they are compiled for.
	Name string
	// Policy is the policy granting it, "<ns>/<name>".
	Policy string
	// AnyPeer allows every address (a rule without from/to); Peers are
	// then empty.
	AnyPeer bool
	// Peers are the allowed peer prefixes (sources for ingress,
	// destinations for egress), sorted, none inside another.
	Peers []netip.Prefix
	// Ports allowed; empty is every protocol and port.
	Ports []Port
}

// Allows reports whether r lets peer speak protocol proto on port port.
func (r *Rule) Allows(peer netip.Addr, proto string, port uint16) bool {
	if !r.AnyPeer && !slices.ContainsFunc(r.Peers, func(p netip.Prefix) bool { return p.Contains(peer) }) {
		return false
	}
	return len(r.Ports) == 0 || slices.ContainsFunc(r.Ports, func(p Port) bool { return p.Contains(proto, port) })
}

// Match returns the first of rules, the rules of an isolated direction,
// that lets peer open a connection with protocol proto to port, and
// whether there is one: what passes an isolated direction is exactly
// what one of its rules allows.
func Match(rules []Rule, peer netip.Addr, proto string, port uint16) (rule string, ok bool) {
	peer = peer.Unmap()
	for i := range rules {
		if rules[i].Allows(peer, proto, port) {
			return rules[i].Name, true
		}
	}
	return "", false
}
