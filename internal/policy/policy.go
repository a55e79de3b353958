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

	"kvnet.io/kvnet/internal/policy/verdict"
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
	TCP  = verdict.TCP
	UDP  = verdict.UDP
	SCTP = verdict.SCTP
)

// Port is a protocol and a port range (package verdict).
type Port = verdict.Port

// Rule allows traffic between an endpoint and a set of peers (package
// verdict, where the one function that matches connections lives).
type Rule = verdict.Rule

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
	return verdict.Match(d.Rules, peer, proto, port)
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

// Error is a part of a policy the compiler cannot use, and what it does
// instead. Compile fails closed: what it cannot understand never opens a
// pod, so the pods the policy selects stay isolated in its directions and
// an unusable rule admits nothing.
type Error struct {
	// Policy is "<ns>/<name>", Network the network compiled.
	Policy, Network string
	// Err names the field and value.
	Err error
	// Effect says what kvnet enforces instead, e.g. "rule spec.ingress[0]
	// admits nothing".
	Effect string
}

func (e *Error) Error() string {
	return fmt.Sprintf("policy %q on network %q: %v: %s (kvnet fails closed)", e.Policy, e.Network, e.Err, e.Effect)
}

func (e *Error) Unwrap() error { return e.Err }

// Compile computes the policy of in's local endpoints. It fails closed:
// a part of a policy it cannot use (a bad selector, CIDR, protocol, port
// or policy type) is reported in the returned errors (*Error), one per
// part, naming the field and value and what is enforced instead; the
// policy still isolates the pods it selects, its unusable rules admit
// nothing, and its other rules and the other policies apply as written.
// A pod selector that does not parse selects every pod of its namespace;
// an unknown policy type isolates both directions.
func Compile(in Input) (Compiled, []error) {
	c := compiler{in: in, byNS: map[string][]*Endpoint{}, localByNS: map[string][]*Endpoint{}}
	for i := range in.Endpoints {
		e := &in.Endpoints[i]
		if _, ok := in.Namespaces[e.Namespace]; !ok {
			continue
		}
		c.all = append(c.all, e)
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
		errs = append(errs, c.policy(np, ports)...)
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
	all       []*Endpoint            // the endpoints of the network's namespaces
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

// policy compiles np into ports (keyed by endpoint), failing closed on
// what it cannot use, which the returned errors name.
func (c *compiler) policy(np *networkingv1.NetworkPolicy, ports map[string]*PortPolicy) []error {
	name := np.Namespace + "/" + np.Name
	var errs []error
	fail := func(err error, effect string) {
		errs = append(errs, &Error{Policy: name, Network: c.in.Network, Err: err, Effect: effect})
	}
	sel, err := selector(&np.Spec.PodSelector, "spec.podSelector")
	if err != nil {
		fail(err, fmt.Sprintf("the policy isolates every pod of namespace %q", np.Namespace))
		sel = labels.Everything()
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
				fail(fmt.Errorf("spec.policyTypes[%d] %q: want Ingress or Egress", i, t), "the policy isolates its pods in both directions")
				ingress, egress = true, true
			}
		}
	}

	// A rule that cannot be compiled admits nothing: leaving out one bad
	// peer or port instead could widen it (no peers is every peer, no
	// ports every port).
	type rule struct {
		i     int
		peers peerSet
		ports []compiledPort
	}
	compileRules := func(dir string, n int, peersOf func(int) []networkingv1.NetworkPolicyPeer, portsOf func(int) []networkingv1.NetworkPolicyPort) []rule {
		rules := make([]rule, 0, n)
		for i := range n {
			field := fmt.Sprintf("spec.%s[%d]", dir, i)
			ps, err := c.peers(np.Namespace, peersOf(i), field, len(selected) > 0)
			var pp []compiledPort
			if err == nil {
				pp, err = policyPorts(portsOf(i), field+".ports")
			}
			if err != nil {
				fail(err, fmt.Sprintf("rule %s admits nothing", field))
				continue
			}
			rules = append(rules, rule{i, ps, pp})
		}
		return rules
	}
	var in, eg []rule
	if ingress {
		in = compileRules("ingress", len(np.Spec.Ingress),
			func(i int) []networkingv1.NetworkPolicyPeer { return np.Spec.Ingress[i].From },
			func(i int) []networkingv1.NetworkPolicyPort { return np.Spec.Ingress[i].Ports })
	}
	if egress {
		eg = compileRules("egress", len(np.Spec.Egress),
			func(i int) []networkingv1.NetworkPolicyPeer { return np.Spec.Egress[i].To },
			func(i int) []networkingv1.NetworkPolicyPort { return np.Spec.Egress[i].Ports })
	}

	// Egress rules do not depend on the selected endpoint: compile once.
	var egRules []Rule
	for _, r := range eg {
		egRules = append(egRules, c.egressRules(name, r.i, r.peers, r.ports)...)
	}
	// Ingress peers do not either; only named ports do.
	inPeers := make([]Rule, len(in))
	for i, r := range in {
		inPeers[i] = Rule{Name: fmt.Sprintf("%s ingress[%d]", name, r.i), Policy: name, AnyPeer: r.peers.any,
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
	return errs
}

// egressRules compiles egress rule i of policy name: one Rule for its
// numbered ports (or all ports) with every peer, and one per named port
// and number it resolves to, with the destination endpoints that resolve
// it so. A named port is a container port of a pod: it resolves on the
// network's endpoints the rule's peers cover (those its selectors pick,
// those with an address in its ipBlocks, every one when it has no "to"),
// and matches no other destination (an address outside the network, or
// one no pod holds).
func (c *compiler) egressRules(name string, i int, ps peerSet, ports []compiledPort) []Rule {
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
	candidates := slices.Clone(ps.endpoints)
	switch {
	case ps.any:
		candidates = c.all
	case len(ps.blocks) > 0:
		for _, e := range c.all {
			if slices.ContainsFunc(e.Addrs, func(a netip.Addr) bool {
				return slices.ContainsFunc(ps.blocks, func(b netip.Prefix) bool { return b.Contains(a.Unmap()) })
			}) {
				candidates = append(candidates, e)
			}
		}
	}
	groups := map[Port][]*Endpoint{}
	for _, e := range candidates {
		for _, np := range e.Ports {
			if named[np.Name+"/"+np.Protocol] {
				k := Port{Protocol: np.Protocol, Port: np.Port}
				if !slices.Contains(groups[k], e) {
					groups[k] = append(groups[k], e)
				}
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
	cidr, err := parseCIDR(b.CIDR)
	if err != nil {
		return nil, fmt.Errorf("%s.cidr %q: %w", field, b.CIDR, err)
	}
	cidr = cidr.Masked()
	out := []netip.Prefix{cidr}
	for i, s := range b.Except {
		ex, err := parseCIDR(s)
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

// parseCIDR parses an ipBlock CIDR: an IPv4 or IPv6 prefix, not an
// IPv4-mapped IPv6 one (which the datapath, matching IPv4 packets as
// IPv4, could never match).
func parseCIDR(s string) (netip.Prefix, error) {
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return p, err
	}
	if p.Addr().Is4In6() {
		return p, fmt.Errorf("an IPv4-mapped IPv6 prefix: write the IPv4 prefix")
	}
	return p, nil
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
