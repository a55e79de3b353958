package node

import (
	"net/netip"
	"slices"

	networkingv1 "k8s.io/api/networking/v1"

	"kvnet.io/kvnet/internal/datapath"
	"kvnet.io/kvnet/internal/policy"
	"kvnet.io/kvnet/internal/portalias"
)

// policies is the last phase of a primary network's plan: the
// NetworkPolicies of the namespaces whose primary network it is (the
// namespaces a CUDN spans), compiled (package policy) over the network's
// holders, every node's, with their labels, addresses on the network
// and named container ports, into a datapath.PortPolicy for each local
// port a policy selects. A VM is selected through its launcher pod's
// labels; during a live migration the target's launcher pod has the same
// labels and addresses, so its port is isolated like the source's before
// the switch-over. ports are the network's ports in the plan.
func (p *planner) policies(dn datapath.Network, namespaces map[string]bool, hs []*holder, ports []datapath.Port) {
	if !dn.Primary || len(p.in.NetworkPolicies) == 0 {
		return
	}
	var pols []*networkingv1.NetworkPolicy
	for i := range p.in.NetworkPolicies {
		if np := &p.in.NetworkPolicies[i]; namespaces[np.Namespace] {
			pols = append(pols, np)
		}
	}
	p.enforce(dn, namespaces, pols, hs, ports)
}

// enforce compiles policies nps, in the network's namespaces, over the
// network's holders hs (every node's) into the plan's port policies of
// its local ports (ports), and into the ingress policies of the
// network's Service endpoints, every node's, which the network's router
// here checks on the Service connections it translates (the plan's
// Services come first).
func (p *planner) enforce(dn datapath.Network, namespaces map[string]bool, nps []*networkingv1.NetworkPolicy, hs []*holder, ports []datapath.Port) {
	if len(nps) == 0 {
		return
	}
	in := policy.Input{Network: dn.Name, Namespaces: map[string]map[string]string{}, Policies: nps}
	for ns := range namespaces {
		in.Namespaces[ns] = p.namespaceLabels(ns)
	}
	portOf := map[string]*datapath.Port{} // host interface -> planned port
	for i := range ports {
		portOf[ports[i].HostIfName] = &ports[i]
	}
	backends := map[netip.Addr]bool{} // addresses of the network's Service endpoints
	for _, sv := range p.plan.State.Services {
		if sv.Network == dn.Name && !sv.ViaNode {
			for _, ep := range sv.Endpoints {
				backends[ep.Addr()] = true
			}
		}
	}
	ifNames := map[string][]string{} // pod namespace/name -> local host interfaces
	for _, h := range hs {
		e := policy.Endpoint{Namespace: h.pod.Namespace, Name: h.pod.Name, Labels: h.pod.Labels, Ports: policy.NamedPortsOf(h.pod)}
		for _, s := range h.a.IPAddresses {
			if pfx, err := netip.ParsePrefix(s); err == nil {
				e.Addrs = append(e.Addrs, pfx.Addr())
				e.Backend = e.Backend || backends[pfx.Addr()]
			}
		}
		if h.node == p.in.Node {
			if ifName, ok := p.in.Links[portalias.Format(h.pod.Namespace+"/"+h.pod.Name, h.nadKey)]; ok && portOf[ifName] != nil && len(portOf[ifName].IPs) > 0 {
				e.Local = true
				ifNames[e.Key()] = append(ifNames[e.Key()], ifName)
			}
		}
		in.Endpoints = append(in.Endpoints, e)
	}
	compiled, errs := policy.Compile(in)
	for _, err := range errs {
		p.problem("%v", err)
	}
	var pols []datapath.PortPolicy
	var eps []datapath.EndpointPolicy
	for _, pp := range compiled.Ports {
		for _, ifName := range ifNames[pp.Key()] {
			pols = append(pols, datapath.PortPolicy{Port: ifName, Ingress: direction(pp.Ingress), Egress: direction(pp.Egress)})
		}
		if pp.Ingress.Isolated && slices.ContainsFunc(pp.Addrs, func(a netip.Addr) bool { return backends[a] }) {
			eps = append(eps, datapath.EndpointPolicy{Network: dn.Name, Name: pp.Key(), Addrs: pp.Addrs, Ingress: direction(pp.Ingress)})
		}
	}
	// What the datapath would refuse fails closed, and must not stop the
	// network's other policies: Apply refuses a whole state with an
	// invalid policy in it.
	pols, eps = p.failClosed(dn, ports, pols, eps)
	p.plan.State.Policies = append(p.plan.State.Policies, pols...)
	p.plan.State.EndpointPolicies = append(p.plan.State.EndpointPolicies, eps...)
}

// validatePolicies is datapath.Validate, the check failClosed runs
// (tests replace it to inject a refusal).
var validatePolicies = datapath.Validate

// failClosed returns network dn's port and endpoint policies as the
// datapath accepts them: each rule the datapath refuses is left out (it
// admits nothing) and reported, and when the rest is still refused (rules
// that conflict with each other) every policy of the network keeps its
// isolation with no rule at all. A port a policy selects is never left
// open because its policy cannot be programmed.
func (p *planner) failClosed(dn datapath.Network, ports []datapath.Port, pols []datapath.PortPolicy, eps []datapath.EndpointPolicy) ([]datapath.PortPolicy, []datapath.EndpointPolicy) {
	valid := func(pols []datapath.PortPolicy, eps []datapath.EndpointPolicy) error {
		return validatePolicies(datapath.State{Networks: []datapath.Network{dn}, Ports: ports, Policies: pols, EndpointPolicies: eps})
	}
	if valid(pols, eps) == nil {
		return pols, eps
	}
	// usable keeps the rules of d the datapath accepts alone, given check
	// (which validates a direction with one rule).
	usable := func(d *datapath.PolicyDirection, where string, check func(*datapath.PolicyDirection) error) *datapath.PolicyDirection {
		if d == nil {
			return nil
		}
		out := &datapath.PolicyDirection{Policies: d.Policies}
		for _, r := range d.Rules {
			if err := check(&datapath.PolicyDirection{Policies: d.Policies, Rules: []datapath.PolicyRule{r}}); err != nil {
				p.problem("network %s: %s rule %q admits nothing (kvnet fails closed; policy %s): the datapath refuses it: %v", dn.Name, where, r.Name, r.Policy, err)
				continue
			}
			out.Rules = append(out.Rules, r)
		}
		return out
	}
	var kept []datapath.PortPolicy
	for _, pp := range pols {
		one := func(in, eg *datapath.PolicyDirection) error {
			return valid([]datapath.PortPolicy{{Port: pp.Port, Ingress: in, Egress: eg}}, nil)
		}
		kept = append(kept, datapath.PortPolicy{Port: pp.Port,
			Ingress: usable(pp.Ingress, "port "+pp.Port+" ingress", func(d *datapath.PolicyDirection) error { return one(d, nil) }),
			Egress:  usable(pp.Egress, "port "+pp.Port+" egress", func(d *datapath.PolicyDirection) error { return one(nil, d) }),
		})
	}
	var keptEps []datapath.EndpointPolicy
	for _, ep := range eps {
		ep.Ingress = usable(ep.Ingress, "Service endpoint "+ep.Name+" ingress", func(d *datapath.PolicyDirection) error {
			e := ep
			e.Ingress = d
			return valid(nil, []datapath.EndpointPolicy{e})
		})
		keptEps = append(keptEps, ep)
	}
	err := valid(kept, keptEps)
	if err == nil {
		return kept, keptEps
	}
	p.problem("network %s: policies refused by the datapath even rule by rule (%v): every port they select stays isolated with no rule (kvnet fails closed)", dn.Name, err)
	for i := range kept {
		kept[i].Ingress, kept[i].Egress = isolatedOnly(kept[i].Ingress), isolatedOnly(kept[i].Egress)
	}
	for i := range keptEps {
		keptEps[i].Ingress = isolatedOnly(keptEps[i].Ingress)
	}
	return kept, keptEps
}

// isolatedOnly returns d without its rules: isolated, admitting nothing
// (nil, not isolated, stays nil).
func isolatedOnly(d *datapath.PolicyDirection) *datapath.PolicyDirection {
	if d == nil {
		return nil
	}
	return &datapath.PolicyDirection{Policies: d.Policies}
}

// namespaceLabels returns the labels of namespace ns (none if unknown).
func (p *planner) namespaceLabels(ns string) map[string]string {
	for i := range p.in.Namespaces {
		if p.in.Namespaces[i].Name == ns {
			return p.in.Namespaces[i].Labels
		}
	}
	return nil
}

// direction converts a compiled direction; nil when not isolated.
func direction(d policy.Direction) *datapath.PolicyDirection {
	if !d.Isolated {
		return nil
	}
	return &datapath.PolicyDirection{Policies: d.Policies, Rules: slices.Clone(d.Rules)}
}
