package datapath

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"github.com/google/nftables"
)

// This file holds the rules of the node namespace's own tables (nodeRules).

// nodeRules returns the desired kvnet tables of the node namespace: a
// bridge table (gateway kept off the overlay, per-port anti-spoofing), an
// inet table (node stack kept off tenant bridges, transit isolation,
// egress masquerade) and an arp table (no ARP between the node and tenant
// bridges). There are none when s has no network.
func nodeRules(s State) []nftTable { return nodeRulesPort(s, DefaultVXLANPort) }

// nodeRulesPort is nodeRules with the node's VXLAN port.
func nodeRulesPort(s State, vxlanPort uint16) []nftTable {
	if len(s.Networks) == 0 {
		return nil
	}
	nets := slices.Clone(s.Networks)
	slices.SortFunc(nets, func(a, b Network) int { return cmp.Compare(a.ID, b.ID) })
	ports := slices.Clone(s.Ports)
	slices.SortFunc(ports, func(a, b Port) int { return strings.Compare(a.HostIfName, b.HostIfName) })

	// Port checks run at prerouting, before the bridge learns the source
	// MAC: checked at forward, a spoofed frame would already have moved the
	// victim's FDB entry to the attacker's port.
	var pre, fwd []nftRule
	for _, n := range nets {
		if !n.Primary && !n.GuestServiceOnly() {
			continue
		}
		// Every node answers for the gateway with the same MAC; if frames
		// from it crossed the tunnel, bridges would learn the gateway on
		// the VXLAN port and send gateway traffic to another node.
		gw := GatewayMAC(n.ID)
		pre = append(pre, newRule().iifname(VXLANName(n.ID)).etherSaddr(gw, false).counter().
			drop(fmt.Sprintf("network %s: gateway MAC never enters from the overlay", n.Name)))
		fwd = append(fwd, newRule().oifname(VXLANName(n.ID)).etherSaddr(gw, false).counter().
			drop(fmt.Sprintf("network %s: gateway MAC never leaves on the overlay", n.Name)))
	}
	portChains := make([]nftChain, 0, len(ports))
	for _, p := range ports {
		pre = append(pre, newRule().iifname(p.HostIfName).jump(portChainName(p.HostIfName), "port "+p.HostIfName))
		portChains = append(portChains, nftChain{name: portChainName(p.HostIfName), rules: portRules(p)})
	}
	bridge := nftTable{family: nftables.TableFamilyBridge, chains: append([]nftChain{
		filterChain("prerouting", nftables.ChainHookPrerouting, bridgePriorityFilter, nftables.ChainPolicyAccept, pre),
		filterChain("forward", nftables.ChainHookForward, bridgePriorityFilter, nftables.ChainPolicyAccept, fwd),
	}, portChains...)}

	np := nodePortRules(nets, s.Services, s.NodeAddrs)
	pol := policyRules(s)
	var input []nftRule
	for _, n := range nets {
		if !n.Primary {
			continue
		}
		for _, v6 := range networkFamilies(n) {
			_, node, _ := TransitAddrs(n.ID, v6)
			b := newRule().iifname(transitName(n.ID)).nfproto(v6)
			if v6 {
				b.ip6Daddr(transitPrefix6, false).ip6Daddr(hostPrefix(node), true)
			} else {
				b.ipDaddr(transitPrefix4, false).ipDaddr(hostPrefix(node), true)
			}
			input = append(input, b.counter().drop(fmt.Sprintf("network %s: no other network's %s transit address", n.Name, familyName(v6))))
		}
	}
	// VXLAN carries no authentication: a tenant that could send UDP 4789
	// to any VTEP (through its router and the node's masquerade) could
	// inject frames into every network on that node.
	input = append(input, newRule().iifname(transitPrefix+"*").l4protoUDP().udpDport(vxlanPort).counter().
		drop("tenants never reach a VXLAN port"))
	// The node has no address on tenant bridges and must not take part in
	// their L2 or L3: otherwise it answers ARP for its own addresses, and a
	// pod could route through the node around its tenant router. (Matching
	// the bridge itself, meta ibrname, needs nft_meta_bridge, which not
	// every kernel has; the bridge device as iif/oif in the inet and arp
	// families works everywhere.)
	input = append([]nftRule{newRule().iifname(bridgePrefix + "*").counter().
		drop("tenant networks never reach the node stack")}, input...)
	arp := nftTable{family: nftables.TableFamilyARP, chains: []nftChain{
		filterChain("input", arpHookIn, *nftables.ChainPriorityFilter, nftables.ChainPolicyAccept, []nftRule{
			newRule().iifname(bridgePrefix + "*").counter().drop("tenant ARP never reaches the node stack"),
		}),
		filterChain("output", arpHookOut, *nftables.ChainPriorityFilter, nftables.ChainPolicyAccept, []nftRule{
			newRule().oifname(bridgePrefix + "*").counter().drop("the node never ARPs into tenant networks"),
		}),
	}}
	inet := nftTable{family: nftables.TableFamilyINet, chains: []nftChain{
		// Tenants reuse addresses; with br_netfilter, bridged frames would
		// otherwise share the node's conntrack table and collide.
		// Networks with policies are tracked, each in its own zone.
		filterChain("prerouting", nftables.ChainHookPrerouting, *nftables.ChainPriorityRaw, nftables.ChainPolicyAccept, append(pol.zones,
			newRule().iifname(bridgePrefix+"*").notrack("bridged tenant frames stay out of the node's conntrack"),
		)),
		filterChain("input", nftables.ChainHookInput, *nftables.ChainPriorityFilter, nftables.ChainPolicyAccept, input),
		filterChain("output", nftables.ChainHookOutput, *nftables.ChainPriorityFilter, nftables.ChainPolicyAccept, []nftRule{
			newRule().oifname(bridgePrefix + "*").counter().drop("the node stack never sends into tenant networks"),
		}),
		filterChain("forward", nftables.ChainHookForward, *nftables.ChainPriorityFilter, nftables.ChainPolicyAccept, slices.Concat(pol.forward, []nftRule{
			newRule().iifname(transitPrefix + "*").oifname(transitPrefix + "*").counter().
				drop("no forwarding between tenant routers"),
		}, np.forward, []nftRule{
			newRule().oifname(transitPrefix + "*").ctEstRel(true).counter().
				drop("only replies enter tenant routers"),
			newRule().iifname(transitPrefix + "*").l4protoUDP().udpDport(vxlanPort).counter().
				drop("tenants never speak VXLAN to the underlay"),
		})),
		{name: "postrouting", base: &baseChain{typ: nftables.ChainTypeNAT, hook: *nftables.ChainHookPostrouting,
			priority: *nftables.ChainPriorityNATSource, policy: nftables.ChainPolicyAccept}, rules: []nftRule{
			newRule().iifname(transitPrefix + "*").
				masquerade("tenant egress leaves with the node's address"),
		}},
	}}
	if len(pol.pin) > 0 {
		// Tracked bridged frames pass the node's NAT hooks too (the
		// bridge hands them to its inet hooks): a Service proxy of the
		// cluster's default network (kube-proxy) would translate a
		// cluster IP there, in the middle of the tenant's bridge, before
		// the policy sees it and the tenant's router balances it. A
		// binding that changes nothing, made first, keeps them whole.
		inet.chains = append(inet.chains, nftChain{name: "policy-nat-pin", base: &baseChain{typ: nftables.ChainTypeNAT,
			hook: *nftables.ChainHookPrerouting, priority: *policyPinPriority, policy: nftables.ChainPolicyAccept}, rules: pol.pin})
	}
	inet.chains = slices.Concat(inet.chains, np.chains, pol.chains)
	inet.vmaps = np.maps
	inet.sets = pol.sets
	return []nftTable{bridge, inet, arp}
}
