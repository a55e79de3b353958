package datapath

import (
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"kvnet.io/kvnet/internal/nl"
)

// This file holds the policy of Service connections. A network's router
// translates a connection to one of the network's Services into one to an
// endpoint and masquerades it to the router's service address, so the
// endpoint's port on the bridge never sees the client, and the client's
// port sees the service address, not the endpoint. So the router checks
// them, after translation and before the masquerade: the client's egress
// (when the client is a local port) against the endpoint, and the
// endpoint's ingress (EndpointPolicy) against the client, as Kubernetes
// defines policies on Services; the bridge lets frames to the network's
// Service addresses and from the routers' service addresses pass
// (policyRules), and the router cuts the connections a changed policy no
// longer allows (cutRouterDenied).

// EndpointPolicy is the ingress policy of an endpoint of a Service of a
// primary network, on this node or another: the network's router on this
// node checks it on the Service connections (cluster IPs, node ports,
// load balancer addresses) it sends to the endpoint.
type EndpointPolicy struct {
	Network string
	// Name names the endpoint in rule comments, e.g. "ns/pod".
	Name string
	// Addrs are its addresses on the network.
	Addrs []netip.Addr
	// Ingress is the endpoint's isolated ingress.
	Ingress *PolicyDirection
}

// routerPolicyChain is the regular chain of a router's forward chain that
// checks new translated connections.
const routerPolicyChain = "policy"

// validateEndpointPolicies checks s.EndpointPolicies; rules holds the
// rules of the ports' policies by network and name (validatePolicies).
func validateEndpointPolicies(eps []EndpointPolicy, nets map[string]*Network, rules map[string]*PolicyRule, bad badFunc) {
	for i, ep := range eps {
		where := fmt.Sprintf("endpointPolicies[%d] (%q)", i, ep.Name)
		n := nets[ep.Network]
		switch {
		case n == nil:
			bad("%s: network %q: no such network", where, ep.Network)
			continue
		case !n.Primary:
			bad("%s: network %q is not a primary network: only those have Services", where, ep.Network)
		}
		if ep.Name == "" {
			bad("%s: empty name", where)
		}
		if len(ep.Addrs) == 0 {
			bad("%s: no addresses", where)
		}
		for _, a := range ep.Addrs {
			if !a.IsValid() || a.Zone() != "" || a.Is4In6() || !slices.ContainsFunc(endpointSubnets(n), func(p netip.Prefix) bool { return p.Contains(a) }) {
				bad("%s: address %q is not in network %q's subnets %v", where, a, ep.Network, endpointSubnets(n))
			}
		}
		if ep.Ingress == nil {
			bad("%s: no ingress policy", where)
			continue
		}
		for j := range ep.Ingress.Rules {
			r := &ep.Ingress.Rules[j]
			validatePolicyRule(fmt.Sprintf("%s: ingress rule %q", where, r.Name), ep.Network, r, rules, bad)
		}
	}
}

// addrPolicy is one isolated direction of a client or an endpoint of a
// router's network.
type addrPolicy struct {
	name  string // the port's host interface or the endpoint's name
	addrs []netip.Addr
	d     *PolicyDirection
}

// routerPolicy is what a network's router checks on the Service
// connections it translates: the egress of the network's isolated local
// ports (its clients) and the ingress of its isolated Service endpoints.
type routerPolicy struct {
	egress, ingress []addrPolicy
}

// routerPolicies returns the router policy of each network of s
// (validated) that has one, by network name: one pass over the policies
// for every router of an Apply.
func routerPolicies(s State) map[string]*routerPolicy {
	if len(s.Policies) == 0 && len(s.EndpointPolicies) == 0 {
		return nil
	}
	ports := map[string]*Port{} // host interface -> port
	for i := range s.Ports {
		ports[s.Ports[i].HostIfName] = &s.Ports[i]
	}
	out := map[string]*routerPolicy{}
	of := func(network string) *routerPolicy {
		if out[network] == nil {
			out[network] = &routerPolicy{}
		}
		return out[network]
	}
	for _, pp := range s.Policies {
		if p := ports[pp.Port]; p != nil && pp.Egress != nil {
			v4, v6 := portAddrs(*p)
			rp := of(p.Network)
			rp.egress = append(rp.egress, addrPolicy{name: p.HostIfName, addrs: append(v4, v6...), d: pp.Egress})
		}
	}
	for _, ep := range s.EndpointPolicies {
		if ep.Ingress != nil {
			rp := of(ep.Network)
			rp.ingress = append(rp.ingress, addrPolicy{name: ep.Name, addrs: ep.Addrs, d: ep.Ingress})
		}
	}
	for _, rp := range out {
		for _, l := range [][]addrPolicy{rp.egress, rp.ingress} {
			slices.SortFunc(l, func(a, b addrPolicy) int { return strings.Compare(a.name, b.name) })
		}
	}
	return out
}

// routerPolicyRules returns what rp adds to network n's router table:
// check, for the forward chain after the accept of connections leaving
// through the node (the cluster's Services reached through it keep the
// bridge's check), sends new translated connections to the policy chain;
// there a connection from an isolated client jumps to its egress chain
// (sout-<port>), one to an isolated endpoint to its ingress chain
// (sin-<hash>-<endpoint>), built as the ports' chains on the bridge
// (directionRules), with peer sets of their own in the router's table.
// An address of several endpoints (a VM's two launcher pods during a
// migration) is checked against the first.
func routerPolicyRules(n Network, rp *routerPolicy) (check []nftRule, chains []nftChain, sets []nftSet) {
	if rp == nil {
		return nil, nil, nil
	}
	setMap := map[string]*nftSet{}
	var dispatch []nftRule
	for _, dir := range []struct {
		l      []addrPolicy
		egress bool
	}{{rp.egress, true}, {rp.ingress, false}} {
		seen := map[netip.Addr]bool{}
		for _, ap := range dir.l {
			who, chain, what := "endpoint "+ap.name, hashedChainName("sin-", ap.name, ap.name), "ingress"
			if dir.egress {
				who, chain, what = "port "+ap.name, "sout-"+ap.name, "egress"
			}
			var fams []bool
			for _, v6 := range []bool{false, true} {
				if slices.ContainsFunc(ap.addrs, func(a netip.Addr) bool { return a.Is6() == v6 }) {
					fams = append(fams, v6)
				}
			}
			used := false
			for _, a := range ap.addrs {
				if seen[a] {
					continue
				}
				seen[a], used = true, true
				dispatch = append(dispatch, newRule().nfproto(a.Is6()).addrMatch(a.Is6(), dir.egress, hostPrefix(a)).
					jump(chain, fmt.Sprintf("%s: %s policy of %s on Service connections", who, what, a)))
			}
			if used {
				chains = append(chains, nftChain{name: chain, rules: directionRules(who, n.Name, what, dir.egress, ap.d, fams, setMap)})
			}
		}
	}
	for _, st := range setMap {
		sets = append(sets, *st)
	}
	slices.SortFunc(sets, func(a, b nftSet) int { return strings.Compare(a.name, b.name) })
	check = []nftRule{newRule().ctStatusDNAT().jump(routerPolicyChain,
		fmt.Sprintf("network %s: Service connections: policies of their clients and endpoints", n.Name))}
	return check, append([]nftChain{{name: routerPolicyChain, rules: dispatch}}, chains...), sets
}

// cutRouterDenied deletes, when network n's router policy changed since
// the last Apply, the translated connections of its router (at path) that
// rp no longer allows.
func (d *Datapath) cutRouterDenied(n Network, rp *routerPolicy, path string) error {
	if last, ok := d.lastRouterPolicies[n.ID]; ok && reflect.DeepEqual(last, rp) {
		return nil
	}
	if rp != nil {
		h, err := nl.NewHandle(path)
		if err != nil {
			return err
		}
		defer h.Close()
		f := ctRouterFilter{subnets: endpointSubnets(&n), egress: map[netip.Addr]*PolicyDirection{}, ingress: map[netip.Addr]*PolicyDirection{}}
		for _, dir := range []struct {
			l []addrPolicy
			m map[netip.Addr]*PolicyDirection
		}{{rp.egress, f.egress}, {rp.ingress, f.ingress}} {
			for _, ap := range dir.l {
				for _, a := range ap.addrs {
					if dir.m[a] == nil {
						dir.m[a] = ap.d
					}
				}
			}
		}
		for _, fam := range []netlink.InetFamily{unix.AF_INET, unix.AF_INET6} {
			if _, err := h.ConntrackDeleteFilters(netlink.ConntrackTable, fam, f); err != nil {
				return fmt.Errorf("cut Service connections policies no longer allow: %w", err)
			}
		}
	}
	if d.lastRouterPolicies == nil {
		d.lastRouterPolicies = map[int]*routerPolicy{}
	}
	d.lastRouterPolicies[n.ID] = rp
	return nil
}

// ctRouterFilter matches a router's translated connections to the
// network's endpoints that the client's egress or the endpoint's ingress
// does not allow.
type ctRouterFilter struct {
	subnets         []netip.Prefix
	egress, ingress map[netip.Addr]*PolicyDirection
}

func (f ctRouterFilter) MatchConntrackFlow(flow *netlink.ConntrackFlow) bool {
	client, ok1 := netip.AddrFromSlice(flow.Forward.SrcIP)
	vip, ok2 := netip.AddrFromSlice(flow.Forward.DstIP)
	ep, ok3 := netip.AddrFromSlice(flow.Reverse.SrcIP)
	if !ok1 || !ok2 || !ok3 {
		return false
	}
	client, vip, ep = client.Unmap(), vip.Unmap(), ep.Unmap()
	if vip == ep || !slices.ContainsFunc(f.subnets, func(p netip.Prefix) bool { return p.Contains(ep) }) {
		return false // not translated, or to a Service reached through the node
	}
	proto, port := flow.Forward.Protocol, flow.Reverse.SrcPort
	if d := f.egress[client]; d != nil {
		if _, ok := d.Allows(ep, proto, port); !ok {
			return true
		}
	}
	if d := f.ingress[ep]; d != nil {
		if _, ok := d.Allows(client, proto, port); !ok {
			return true
		}
	}
	return false
}

// policyPassRules returns, for network n with policies, the rules of the
// node's policy chain that let Service connections pass the bridge
// (their router checks them): frames from the routers' service addresses
// (services, the network's Services, are translated and masqueraded to
// them) and to the network's own Services' addresses, in sets
// nsvc4-/nsvc6-<ID>.
func policyPassRules(n *Network, services []Service) (rules []nftRule, sets []nftSet) {
	br := BridgeName(n.ID)
	for _, sa := range n.ServiceAddrs {
		v6 := sa.Addr().Is6()
		rules = append(rules, newRule().iifname(br).nfproto(v6).addrMatch(v6, true, sa.Masked()).
			accept(fmt.Sprintf("network %s: Service connections from its routers, checked there", n.Name)))
	}
	for _, v6 := range []bool{false, true} {
		st := nftSet{name: fmt.Sprintf("nsvc4-%d", n.ID), keyType: addrType(v6), comment: fmt.Sprintf("network %s: its Services", n.Name)}
		if v6 {
			st.name = fmt.Sprintf("nsvc6-%d", n.ID)
		}
		for _, sv := range services {
			if sv.Network == n.Name && !sv.ViaNode && sv.VIP.Addr().Is6() == v6 {
				st.elems = append(st.elems, sv.VIP.Addr())
			}
		}
		if len(st.elems) == 0 {
			continue
		}
		slices.SortFunc(st.elems, netip.Addr.Compare)
		st.elems = slices.Compact(st.elems)
		sets = append(sets, st)
		rules = append(rules, newRule().iifname(br).nfproto(v6).addrLookup(v6, false, st.name).
			accept(fmt.Sprintf("network %s: to its Services, checked by its router after translation", n.Name)))
	}
	return rules, sets
}
