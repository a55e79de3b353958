package policy

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// NamedPort is a named container port of an endpoint, which a policy may
// name instead of a number.
type NamedPort struct {
	Name     string
	Protocol string // TCP, UDP or SCTP
	Port     uint16
}

// Endpoint is a pod, or a VM's launcher pod, with addresses on the
// network.
type Endpoint struct {
	Namespace, Name string
	Labels          map[string]string
	// Addrs are the endpoint's addresses on this network.
	Addrs []netip.Addr
	// Ports are its named container ports.
	Ports []NamedPort
	// Local marks an endpoint with a port on this node; Backend one that
	// backs a Service of the network, wherever it runs, whose ingress the
	// node's router checks on the Service connections it translates. Only
	// these get a PortPolicy.
	Local, Backend bool
}

// Key returns "namespace/name".
func (e *Endpoint) Key() string { return e.Namespace + "/" + e.Name }

// Input is everything Compile needs about one network.
type Input struct {
	// Network names the network in errors.
	Network string
	// Namespaces are the network's namespaces (one for a UDN, those a
	// CUDN selects) with their labels. Policies in other namespaces are
	// ignored, and namespace selectors match these only.
	Namespaces map[string]map[string]string
	// Policies are the NetworkPolicies of those namespaces.
	Policies []*networkingv1.NetworkPolicy
	// Endpoints are every endpoint of the network, on every node.
	Endpoints []Endpoint
}

// Protocols a policy port may name.
const (
	TCP  = "TCP"
	UDP  = "UDP"
	SCTP = "SCTP"
)

// Port is a protocol and a port range: Port 0 is every port of Protocol,
// EndPort 0 is Port alone.
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
	// Name identifies the rule's peer set cluster-wide: "<ns>/<policy>
	// ingress[i]" or "... egress[i]", and for the peers of an egress rule
	// that name a container port, "... egress[i] port <name>" (each peer
	// resolves the name itself). Two rules with the same Name have the
	// same Peers, whatever endpoint they are compiled for.
	Name string
	// Policy is the NetworkPolicy granting it, "<ns>/<name>".
	Policy string
	// AnyPeer allows every address (a rule without from/to); Peers are
	// then empty.
	AnyPeer bool
	// Peers are the allowed peer prefixes, sorted, none inside another.
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

// Direction is an endpoint's policy in one direction.
type Direction struct {
	// Isolated is true when a policy of this direction selects the
	// endpoint: only what Rules allow passes (and replies).
	Isolated bool
	// Policies name the policies that isolate it, sorted.
	Policies []string
	// Rules allow traffic, sorted by Name then ports.
	Rules []Rule
}

// Allows reports whether d lets peer speak proto on port, and names the
// rule that allows it ("" when d is not isolated).
func (d *Direction) Allows(peer netip.Addr, proto string, port uint16) (rule string, ok bool) {
	if !d.Isolated {
		return "", true
	}
	for i := range d.Rules {
		if d.Rules[i].Allows(peer, proto, port) {
			return d.Rules[i].Name, true
		}
	}
	return "", false
}

// PortPolicy is the policy of one local endpoint selected by at least one
// policy.
type PortPolicy struct {
	Namespace, Name string
	Addrs           []netip.Addr
	Ingress, Egress Direction
}

// Key returns "namespace/name".
func (p *PortPolicy) Key() string { return p.Namespace + "/" + p.Name }

// Compiled is the policy of a network's local endpoints.
type Compiled struct {
	// Ports holds one entry per local endpoint that a policy selects,
	// sorted by Key; endpoints no policy selects are not isolated.
	Ports []PortPolicy
}

// Port returns the policy of endpoint namespace/name, or nil.
func (c *Compiled) Port(namespace, name string) *PortPolicy {
	i, ok := slices.BinarySearchFunc(c.Ports, namespace+"/"+name, func(p PortPolicy, k string) int { return strings.Compare(p.Key(), k) })
	if !ok {
		return nil
	}
	return &c.Ports[i]
}

// Compile computes the policy of in's local endpoints. A policy it cannot
// compile (a bad selector, CIDR, protocol or port) is left out and
// reported in the returned errors, one per policy, naming the field and
// value; the rest is compiled.
func Compile(in Input) (Compiled, []error) {
	c := compiler{in: in, byNS: map[string][]*Endpoint{}, localByNS: map[string][]*Endpoint{}}
	for i := range in.Endpoints {
		e := &in.Endpoints[i]
		if _, ok := in.Namespaces[e.Namespace]; !ok {
			continue
		}
		c.byNS[e.Namespace] = append(c.byNS[e.Namespace], e)
		if e.Local || e.Backend {
			c.localByNS[e.Namespace] = append(c.localByNS[e.Namespace], e)
		}
	}
	ports := map[string]*PortPolicy{}
	var errs []error
	for _, np := range in.Policies {
		if np == nil {
			continue
		}
		if _, ok := in.Namespaces[np.Namespace]; !ok {
			continue
		}
		if err := c.policy(np, ports); err != nil {
			errs = append(errs, fmt.Errorf("compile NetworkPolicy %q on network %q: %w", np.Namespace+"/"+np.Name, in.Network, err))
		}
	}
	out := Compiled{Ports: make([]PortPolicy, 0, len(ports))}
	for _, p := range ports {
		for _, d := range []*Direction{&p.Ingress, &p.Egress} {
			slices.Sort(d.Policies)
			d.Policies = slices.Compact(d.Policies)
			slices.SortStableFunc(d.Rules, func(a, b Rule) int { return strings.Compare(a.Name, b.Name) })
		}
		out.Ports = append(out.Ports, *p)
	}
	slices.SortFunc(out.Ports, func(a, b PortPolicy) int { return strings.Compare(a.Key(), b.Key()) })
	return out, errs
}

type compiler struct {
	in        Input
	byNS      map[string][]*Endpoint // namespace -> endpoints
	localByNS map[string][]*Endpoint // namespace -> local and Backend endpoints
}

// peerSet is one rule's peers: prefixes of ipBlocks and endpoints
// selected by pod and namespace selectors.
type peerSet struct {
	any       bool
	blocks    []netip.Prefix
	endpoints []*Endpoint
}

// compiledPort is a policy port before named ports are resolved.
type compiledPort struct {
	Port
	named string // the container port's name; Port.Port is then 0
}

// policy compiles np into ports (keyed by endpoint), or reports why it
// cannot, changing nothing.
func (c *compiler) policy(np *networkingv1.NetworkPolicy, ports map[string]*PortPolicy) error {
	sel, err := selector(&np.Spec.PodSelector, "spec.podSelector")
	if err != nil {
		return err
	}
	var selected []*Endpoint
	for _, e := range c.localByNS[np.Namespace] {
		if sel.Matches(labels.Set(e.Labels)) {
			selected = append(selected, e)
		}
	}
	ingress, egress := false, len(np.Spec.Egress) > 0
	if len(np.Spec.PolicyTypes) == 0 {
		ingress = true
	} else {
		egress = false
		for i, t := range np.Spec.PolicyTypes {
			switch t {
			case networkingv1.PolicyTypeIngress:
				ingress = true
			case networkingv1.PolicyTypeEgress:
				egress = true
			default:
				return fmt.Errorf("spec.policyTypes[%d] %q: want Ingress or Egress", i, t)
			}
		}
	}
	name := np.Namespace + "/" + np.Name

	// Compile every rule first, so that a bad one leaves the policy out
	// entirely rather than half applied.
	type rule struct {
		peers peerSet
		ports []compiledPort
	}
	compileRules := func(dir string, n int, peersOf func(int) []networkingv1.NetworkPolicyPeer, portsOf func(int) []networkingv1.NetworkPolicyPort) ([]rule, error) {
		rules := make([]rule, 0, n)
		for i := range n {
			field := fmt.Sprintf("spec.%s[%d]", dir, i)
			ps, err := c.peers(np.Namespace, peersOf(i), field, len(selected) > 0)
			if err != nil {
				return nil, err
			}
			pp, err := policyPorts(portsOf(i), field+".ports")
			if err != nil {
				return nil, err
			}
			rules = append(rules, rule{ps, pp})
		}
		return rules, nil
	}
	var in, eg []rule
	if ingress {
		if in, err = compileRules("ingress", len(np.Spec.Ingress),
			func(i int) []networkingv1.NetworkPolicyPeer { return np.Spec.Ingress[i].From },
			func(i int) []networkingv1.NetworkPolicyPort { return np.Spec.Ingress[i].Ports }); err != nil {
			return err
		}
	}
	if egress {
		if eg, err = compileRules("egress", len(np.Spec.Egress),
			func(i int) []networkingv1.NetworkPolicyPeer { return np.Spec.Egress[i].To },
			func(i int) []networkingv1.NetworkPolicyPort { return np.Spec.Egress[i].Ports }); err != nil {
			return err
		}
	}

	// Egress rules do not depend on the selected endpoint: compile once.
	var egRules []Rule
	for i, r := range eg {
		egRules = append(egRules, egressRules(name, i, r.peers, r.ports)...)
	}
	// Ingress peers do not either; only named ports do.
	inPeers := make([]Rule, len(in))
	for i, r := range in {
		inPeers[i] = Rule{Name: fmt.Sprintf("%s ingress[%d]", name, i), Policy: name, AnyPeer: r.peers.any,
			Peers: r.peers.prefixes(nil)}
	}
	for _, e := range selected {
		pp := ports[e.Key()]
		if pp == nil {
			pp = &PortPolicy{Namespace: e.Namespace, Name: e.Name, Addrs: e.Addrs}
			ports[e.Key()] = pp
		}
		if ingress {
			pp.Ingress.Isolated = true
			pp.Ingress.Policies = append(pp.Ingress.Policies, name)
			for i, r := range in {
				ports, ok := resolveOn(e, r.ports)
				if !ok {
					continue // every port it names is missing on e
				}
				rr := inPeers[i]
				rr.Ports = ports
				pp.Ingress.Rules = append(pp.Ingress.Rules, rr)
			}
		}
		if egress {
			pp.Egress.Isolated = true
			pp.Egress.Policies = append(pp.Egress.Policies, name)
			pp.Egress.Rules = append(pp.Egress.Rules, egRules...)
		}
	}
	return nil
}

// egressRules compiles egress rule i of policy name: one Rule for its
// numbered ports (or all ports) with every peer, and one per named port
// and number it resolves to, with the endpoints that resolve it so.
func egressRules(name string, i int, ps peerSet, ports []compiledPort) []Rule {
	base := fmt.Sprintf("%s egress[%d]", name, i)
	var numbered []Port
	named := map[string]bool{} // name/protocol -> present
	for _, p := range ports {
		if p.named == "" {
			numbered = append(numbered, p.Port)
		} else {
			named[p.named+"/"+p.Protocol] = true
		}
	}
	var out []Rule
	if len(ports) == 0 || len(numbered) > 0 {
		out = append(out, Rule{Name: base, Policy: name, AnyPeer: ps.any, Peers: ps.prefixes(nil), Ports: numbered})
	}
	if len(named) == 0 {
		return out
	}
	// Named ports resolve on each peer endpoint; ipBlock peers and "any
	// peer" have no container ports to resolve them with.
	if ps.any {
		return out // a named port to "anywhere" has no endpoint to resolve it with
	}
	groups := map[Port][]*Endpoint{}
	for _, e := range ps.endpoints {
		for _, np := range e.Ports {
			if named[np.Name+"/"+np.Protocol] {
				k := Port{Protocol: np.Protocol, Port: np.Port}
				groups[k] = append(groups[k], e)
			}
		}
	}
	keys := make([]Port, 0, len(groups))
	for k := range groups {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b Port) int {
		return cmp.Or(strings.Compare(a.Protocol, b.Protocol), cmp.Compare(a.Port, b.Port))
	})
	for _, k := range keys {
		sub := peerSet{endpoints: groups[k]}
		out = append(out, Rule{Name: fmt.Sprintf("%s port %s", base, k), Policy: name,
			Peers: sub.prefixes(nil), Ports: []Port{k}})
	}
	return out
}

// resolveOn resolves ports on endpoint e (the destination of ingress
// traffic). ok is false when ports named only container ports e lacks:
// the rule then allows nothing on e.
func resolveOn(e *Endpoint, ports []compiledPort) (out []Port, ok bool) {
	if len(ports) == 0 {
		return nil, true
	}
	for _, p := range ports {
		if p.named == "" {
			out = append(out, p.Port)
			continue
		}
		for _, np := range e.Ports {
			if np.Name == p.named && np.Protocol == p.Protocol {
				out = append(out, Port{Protocol: p.Protocol, Port: np.Port})
			}
		}
	}
	return out, len(out) > 0
}

// peers compiles a rule's from/to list; empty is every peer. Without
// match, it only checks the list (the policy selects no local endpoint).
func (c *compiler) peers(ns string, peers []networkingv1.NetworkPolicyPeer, field string, match bool) (peerSet, error) {
	if len(peers) == 0 {
		return peerSet{any: true}, nil
	}
	var ps peerSet
	for i, p := range peers {
		f := fmt.Sprintf("%s peer[%d]", field, i)
		if p.IPBlock != nil {
			if p.PodSelector != nil || p.NamespaceSelector != nil {
				return ps, fmt.Errorf("%s: ipBlock cannot be combined with a selector", f)
			}
			blocks, err := ipBlock(p.IPBlock, f+".ipBlock")
			if err != nil {
				return ps, err
			}
			ps.blocks = append(ps.blocks, blocks...)
			continue
		}
		if p.PodSelector == nil && p.NamespaceSelector == nil {
			return ps, fmt.Errorf("%s: one of podSelector, namespaceSelector or ipBlock is required", f)
		}
		podSel := labels.Everything()
		if p.PodSelector != nil {
			s, err := selector(p.PodSelector, f+".podSelector")
			if err != nil {
				return ps, err
			}
			podSel = s
		}
		namespaces := []string{ns}
		if p.NamespaceSelector != nil {
			nsSel, err := selector(p.NamespaceSelector, f+".namespaceSelector")
			if err != nil {
				return ps, err
			}
			if !match {
				continue
			}
			namespaces = namespaces[:0]
			for n, l := range c.in.Namespaces {
				if nsSel.Matches(labels.Set(l)) {
					namespaces = append(namespaces, n)
				}
			}
		}
		if !match {
			continue
		}
		for _, n := range namespaces {
			for _, e := range c.byNS[n] {
				if podSel.Matches(labels.Set(e.Labels)) {
					ps.endpoints = append(ps.endpoints, e)
				}
			}
		}
	}
	return ps, nil
}

// prefixes returns the peer set's prefixes, normalised (see normalize).
func (ps peerSet) prefixes(out []netip.Prefix) []netip.Prefix {
	if ps.any {
		return nil
	}
	out = append(out, ps.blocks...)
	for _, e := range ps.endpoints {
		for _, a := range e.Addrs {
			a = a.Unmap()
			out = append(out, netip.PrefixFrom(a, a.BitLen()))
		}
	}
	return normalize(out)
}

// normalize sorts prefixes (IPv4 first) and drops those inside another.
func normalize(ps []netip.Prefix) []netip.Prefix {
	slices.SortFunc(ps, func(a, b netip.Prefix) int {
		return cmp.Or(a.Masked().Addr().Compare(b.Masked().Addr()), cmp.Compare(a.Bits(), b.Bits()))
	})
	out := ps[:0]
	for _, p := range ps {
		p = p.Masked()
		if n := len(out); n > 0 && out[n-1].Bits() <= p.Bits() && out[n-1].Contains(p.Addr()) {
			continue
		}
		out = append(out, p)
	}
	if len(out) == 0 {
		return nil
	}
	return slices.Clip(out)
}

// ipBlock returns b's CIDR without its exceptions, as prefixes.
func ipBlock(b *networkingv1.IPBlock, field string) ([]netip.Prefix, error) {
	cidr, err := netip.ParsePrefix(b.CIDR)
	if err != nil {
		return nil, fmt.Errorf("%s.cidr %q: %w", field, b.CIDR, err)
	}
	cidr = cidr.Masked()
	out := []netip.Prefix{cidr}
	for i, s := range b.Except {
		ex, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("%s.except[%d] %q: %w", field, i, s, err)
		}
		ex = ex.Masked()
		if ex.Addr().Is4() != cidr.Addr().Is4() || ex.Bits() < cidr.Bits() || !cidr.Contains(ex.Addr()) {
			return nil, fmt.Errorf("%s.except[%d] %q: not inside cidr %q", field, i, s, b.CIDR)
		}
		var next []netip.Prefix
		for _, p := range out {
			next = append(next, subtract(p, ex)...)
		}
		out = next
	}
	return out, nil
}

// subtract returns p without ex, as the fewest prefixes.
func subtract(p, ex netip.Prefix) []netip.Prefix {
	if !p.Overlaps(ex) {
		return []netip.Prefix{p}
	}
	if ex.Bits() <= p.Bits() {
		return nil // ex covers p
	}
	lo, hi := halves(p)
	return append(subtract(lo, ex), subtract(hi, ex)...)
}

// halves splits p into its two halves.
func halves(p netip.Prefix) (lo, hi netip.Prefix) {
	bits := p.Bits() + 1
	lo = netip.PrefixFrom(p.Addr(), bits)
	b := p.Addr().AsSlice()
	b[p.Bits()/8] |= 0x80 >> (p.Bits() % 8)
	a, _ := netip.AddrFromSlice(b)
	return lo, netip.PrefixFrom(a, bits)
}

// policyPorts compiles a rule's ports; named ones stay unresolved.
func policyPorts(ports []networkingv1.NetworkPolicyPort, field string) ([]compiledPort, error) {
	out := make([]compiledPort, 0, len(ports))
	for i, p := range ports {
		f := fmt.Sprintf("%s[%d]", field, i)
		proto := TCP
		if p.Protocol != nil {
			proto = string(*p.Protocol)
		}
		switch corev1.Protocol(proto) {
		case corev1.ProtocolTCP, corev1.ProtocolUDP, corev1.ProtocolSCTP:
		default:
			return nil, fmt.Errorf("%s.protocol %q: want TCP, UDP or SCTP", f, proto)
		}
		cp := compiledPort{Port: Port{Protocol: proto}}
		switch {
		case p.Port == nil:
			if p.EndPort != nil {
				return nil, fmt.Errorf("%s.endPort %d: needs a numbered port", f, *p.EndPort)
			}
		case p.Port.Type == intstr.String:
			if p.Port.StrVal == "" {
				return nil, fmt.Errorf("%s.port %q: empty port name", f, p.Port.StrVal)
			}
			if p.EndPort != nil {
				return nil, fmt.Errorf("%s.endPort %d: needs a numbered port, not %q", f, *p.EndPort, p.Port.StrVal)
			}
			cp.named = p.Port.StrVal
		default:
			n := p.Port.IntVal
			if n < 1 || n > 65535 {
				return nil, fmt.Errorf("%s.port %d: want 1..65535", f, n)
			}
			cp.Port.Port = uint16(n)
			if p.EndPort != nil {
				end := *p.EndPort
				if end < n || end > 65535 {
					return nil, fmt.Errorf("%s.endPort %d: want %d..65535", f, end, n)
				}
				if end > n {
					cp.Port.EndPort = uint16(end)
				}
			}
		}
		out = append(out, cp)
	}
	return out, nil
}

// selector converts a label selector, naming field on error.
func selector(s *metav1.LabelSelector, field string) (labels.Selector, error) {
	sel, err := metav1.LabelSelectorAsSelector(s)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", field, err)
	}
	return sel, nil
}

// NamedPortsOf returns pod's named container ports (init containers'
// too), what a policy may name instead of a number; ports without a name
// or out of range are skipped, and no protocol is TCP.
func NamedPortsOf(pod *corev1.Pod) []NamedPort {
	var out []NamedPort
	for _, c := range slices.Concat(pod.Spec.InitContainers, pod.Spec.Containers) {
		for _, cp := range c.Ports {
			if cp.Name == "" || cp.ContainerPort < 1 || cp.ContainerPort > 65535 {
				continue
			}
			proto := string(cp.Protocol)
			if proto == "" {
				proto = TCP
			}
			out = append(out, NamedPort{Name: cp.Name, Protocol: proto, Port: uint16(cp.ContainerPort)})
		}
	}
	return out
}
