package node

import (
	"slices"
	"strings"

	networkingv1 "k8s.io/api/networking/v1"

	mnpv1beta1 "kvnet.io/kvnet/api/k8scni/v1beta1"
	"kvnet.io/kvnet/internal/datapath"
	"kvnet.io/kvnet/internal/policy"
)

// multiPolicies is policies for a secondary network: the
// MultiNetworkPolicies whose k8s.v1.cni.cncf.io/policy-for annotation
// names one of the network's NADs, compiled as NetworkPolicies (they have
// the same spec and meaning) over the network's holders. The network's
// namespaces, those a namespace selector may match, are the namespaces of
// the NADs its pods are attached through (one for a UDN, those a CUDN
// spans); a policy in another namespace selects no pod here.
func (p *planner) multiPolicies(dn datapath.Network, hs []*holder, ports []datapath.Port) {
	if len(p.in.MultiNetworkPolicies) == 0 {
		return
	}
	nads := map[string]bool{}       // the network's NADs, namespace/name
	namespaces := map[string]bool{} // their namespaces
	for _, h := range hs {
		nads[h.nadKey] = true
		ns, _, _ := strings.Cut(h.nadKey, "/")
		namespaces[ns] = true
	}
	var pols []*networkingv1.NetworkPolicy
	for i := range p.in.MultiNetworkPolicies {
		mnp := &p.in.MultiNetworkPolicies[i]
		if !namespaces[mnp.Namespace] || !policyFor(mnp, nads) {
			continue
		}
		pols = append(pols, &networkingv1.NetworkPolicy{ObjectMeta: mnp.ObjectMeta, Spec: mnp.Spec})
	}
	p.enforce(dn, namespaces, pols, hs, ports)
}

// policyFor reports whether mnp's policy-for annotation names one of nads
// ("namespace/name").
func policyFor(mnp *mnpv1beta1.MultiNetworkPolicy, nads map[string]bool) bool {
	return slices.ContainsFunc(policy.PolicyFor(mnp.Namespace, mnp.Annotations[mnpv1beta1.PolicyForAnnotation]),
		func(nad string) bool { return nads[nad] })
}
