package datapath

import (
	"fmt"
	"slices"

	"github.com/google/nftables"
)

// This file holds the rules of a network's router namespace (routerRules).

// networkFamilies returns the IP families of n's subnets: false for IPv4,
// true for IPv6, IPv4 first.
func networkFamilies(n Network) []bool {
	var v4, v6 bool
	for _, p := range n.Subnets {
		if p.Addr().Is4() {
			v4 = true
		} else {
			v6 = true
		}
	}
	var out []bool
	if v4 {
		out = append(out, false)
	}
	if v6 {
		out = append(out, true)
	}
	return out
}

// routerRules returns the kvnet table of network n's router namespace (one
// that only serves guests, GuestServiceOnly, forwards nothing):
// only connections from the tenant outwards (and between its own subnets)
// are forwarded, and everything leaving through the transit veth is
// masqueraded to the router's transit address, so the node never sees
// tenant addresses and two tenants may use the same subnet.
//
// services are the network's Services: connections from the network's
// pods to a service address are spread over its endpoints at random
// (serviceRules) and masqueraded to the gateway, so that the endpoint, on
// the same subnet as the client, replies through the router; a service
// without endpoints refuses connections.
//
// Service connections leave through routerSvcIf (a routing table chosen
// by the packet mark, restored from the connection's mark for each packet
// of its original direction) and are masqueraded to this node's service
// address there.
//
// rp, when not nil, is the policy the router checks on the Service
// connections it translates (routerPolicyRules).
func routerRules(n Network, services []Service, rp *routerPolicy) []nftTable {
	if n.GuestServiceOnly() {
		return []nftTable{{family: nftables.TableFamilyINet, chains: []nftChain{
			filterChain("forward", nftables.ChainHookForward, *nftables.ChainPriorityFilter, nftables.ChainPolicyDrop, []nftRule{
				newRule().counter().drop(fmt.Sprintf("network %s: its router only serves guests, it forwards nothing", n.Name)),
			}),
		}}}
	}
	forward := []nftRule{newRule().ctEstRel(false).accept(fmt.Sprintf("network %s: replies", n.Name))}
	dnat, svcMaps, svcChains, svcSets, refuse := serviceRules(services)
	forward = append(forward, refuse...)
	for _, p := range n.ServiceCIDRs {
		b := newRule().iifname(routerGwIf).oifname(routerTransitIf).nfproto(p.Addr().Is6())
		if p.Addr().Is6() {
			b.ip6Daddr(p, false)
		} else {
			b.ipDaddr(p, false)
		}
		forward = append(forward, b.counter().rejectProhibited(fmt.Sprintf("network %s: no other Services of the cluster", n.Name)))
	}
	if len(n.DefaultNetworkSubnets) > 0 {
		forward = append(forward, newRule().iifname(routerGwIf).oifname(routerTransitIf).ctStatusDNAT().
			accept(fmt.Sprintf("network %s: the cluster's Services it reaches through the node", n.Name)))
	}
	for _, p := range n.DefaultNetworkSubnets {
		b := newRule().iifname(routerGwIf).oifname(routerTransitIf).nfproto(p.Addr().Is6())
		if p.Addr().Is6() {
			b.ip6Daddr(p, false)
		} else {
			b.ipDaddr(p, false)
		}
		forward = append(forward, b.counter().rejectProhibited(fmt.Sprintf("network %s: never the cluster default network's pods", n.Name)))
	}
	polCheck, polChains, polSets := routerPolicyRules(n, rp)
	forward = append(forward,
		newRule().iifname(routerGwIf).oifname(routerTransitIf).accept(fmt.Sprintf("network %s: new connections go outwards only", n.Name)))
	forward = append(forward, polCheck...)
	forward = append(forward,
		newRule().iifname(routerGwIf).oifname(routerGwIf).accept(fmt.Sprintf("network %s: between its subnets", n.Name)))
	if n.Layer3 != nil {
		forward = append(forward,
			newRule().iifname(routerGwIf).oifname(routerOverlayIf).accept(fmt.Sprintf("network %s: to its pods on other nodes", n.Name)),
			newRule().iifname(routerOverlayIf).oifname(routerGwIf).accept(fmt.Sprintf("network %s: from its pods on other nodes", n.Name)))
	}
	if len(n.ServiceAddrs) > 0 {
		forward = append(forward, newRule().iifname(routerGwIf).oifname(routerSvcIf).accept(
			fmt.Sprintf("network %s: service connections, and replies to other nodes' routers", n.Name)))
	}
	nodePorts := slices.ContainsFunc(services, func(sv Service) bool { return sv.NodePort != 0 })
	if slices.ContainsFunc(services, func(sv Service) bool { return sv.NodePort != 0 && sv.ExternalLocal }) {
		forward = append(forward, newRule().iifname(routerTransitIf).oifname(routerGwIf).ctStatusDNAT().accept(
			fmt.Sprintf("network %s: node port connections to local endpoints (externalTrafficPolicy Local)", n.Name)))
	}
	if nodePorts {
		forward = append(forward, newRule().iifname(routerTransitIf).oifname(routerSvcIf).ctStatusDNAT().accept(
			fmt.Sprintf("network %s: node port and load balancer connections", n.Name)))
		if n.Layer3 != nil {
			forward = append(forward, newRule().iifname(routerTransitIf).oifname(routerOverlayIf).ctStatusDNAT().accept(
				fmt.Sprintf("network %s: node port and load balancer connections to other nodes' pods", n.Name)))
		}
	}
	forward = append(forward, newRule().counter().drop(fmt.Sprintf("network %s: nothing else is forwarded", n.Name)))
	postrouting := []nftRule{newRule().oifname(routerTransitIf).masquerade(fmt.Sprintf("network %s: the node sees the transit address only", n.Name))}
	chains := []nftChain{filterChain("forward", nftables.ChainHookForward, *nftables.ChainPriorityFilter, nftables.ChainPolicyDrop, forward)}
	if len(dnat) > 0 {
		chains = append(chains,
			filterChain("services", nftables.ChainHookPrerouting, *nftables.ChainPriorityMangle, nftables.ChainPolicyAccept, []nftRule{
				newRule().ctDirectionOriginal().ctMark(serviceMark).markPacket().done(fmt.Sprintf("network %s: service connections leave through %s", n.Name, routerSvcIf)),
			}),
			nftChain{name: "prerouting", base: &baseChain{typ: nftables.ChainTypeNAT, hook: *nftables.ChainHookPrerouting,
				priority: *nftables.ChainPriorityNATDest, policy: nftables.ChainPolicyAccept}, rules: dnat})
		chains = append(chains, svcChains...)
		postrouting = append(postrouting, newRule().ctStatusDNAT().oifname(routerSvcIf).masquerade(
			fmt.Sprintf("network %s: service connections come back to this router", n.Name)))
		if nodePorts && n.Layer3 != nil {
			// Other nodes' pods answer a client outside the network
			// through this router's overlay address.
			postrouting = append(postrouting, newRule().ctStatusDNAT().iifname(routerTransitIf).oifname(routerOverlayIf).masquerade(
				fmt.Sprintf("network %s: node port connections come back to this router", n.Name)))
		}
	}
	chains = append(chains, nftChain{name: "postrouting", base: &baseChain{typ: nftables.ChainTypeNAT, hook: *nftables.ChainHookPostrouting,
		priority: *nftables.ChainPriorityNATSource, policy: nftables.ChainPolicyAccept}, rules: postrouting})
	chains = append(chains, polChains...)
	return []nftTable{{family: nftables.TableFamilyINet, chains: chains, vmaps: svcMaps, sets: slices.Concat(svcSets, polSets)}}
}
