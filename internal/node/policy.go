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
	// One network's policies the datapath would refuse must not stop the
	// rest: Apply refuses a whole state with an invalid policy in it.
	if err := datapath.Validate(datapath.State{Networks: []datapath.Network{dn}, Ports: ports, Policies: pols, EndpointPolicies: eps}); err != nil {
		p.problem("network %s: policies not enforced: %v", dn.Name, err)
		return
	}
	p.plan.State.Policies = append(p.plan.State.Policies, pols...)
	p.plan.State.EndpointPolicies = append(p.plan.State.EndpointPolicies, eps...)
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
	out := &datapath.PolicyDirection{Policies: d.Policies}
	for _, r := range d.Rules {
		dr := datapath.PolicyRule{Name: r.Name, AnyPeer: r.AnyPeer, Peers: r.Peers}
		for _, pp := range r.Ports {
			dr.Ports = append(dr.Ports, datapath.PolicyPort{Protocol: pp.Protocol, Port: pp.Port, EndPort: pp.EndPort})
		}
		out.Rules = append(out.Rules, dr)
	}
	return out
}
