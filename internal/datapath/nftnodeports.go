package datapath

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"
)

// This file holds the node namespace's rules for node ports and external
// addresses (nodePortRules) and those keeping tenants off other nodes'
// node ports (tenantNodePortRules).

// nodePortPriority runs kvnet's node port translation just before the
// usual destination NAT priority, where kube-proxy's is: the first NAT
// mapping of a connection wins, so a UDN Service's node port goes to the
// UDN even where kube-proxy also programs it (for the pods' cluster
// default network addresses).
var nodePortPriority = nftables.ChainPriorityRef(*nftables.ChainPriorityNATDest - 10)

// policyPinPriority runs the identity translation of tracked bridged
// tenant frames (policy-nat-pin) before every other NAT chain of the
// hook, kvnet's node ports and a Service proxy's included.
var policyPinPriority = nftables.ChainPriorityRef(*nftables.ChainPriorityNATDest - 20)

// nodePortTables holds the node namespace's part of node ports and
// external addresses.
type nodePortTables struct {
	chains  []nftChain
	maps    []nftVMap
	forward []nftRule
}

// nodePortRules returns the node's rules for the node ports and external
// addresses of services (on nets, sorted by ID): connections to a node
// port on any of the node's addresses (fib daddr type local), and to an
// external address and service port, get their destination translated to
// the service network's router (its transit address, and the node port),
// where the router balances them as it does the cluster IP. A verdict map
// `node-ports` (protocol . port) jumps to the network's chain
// `router-<ID>`, which translates the address only; maps `external-ips4`
// and `external-ips6` (address . protocol . port) jump to one chain per
// external address and port. The same lookups run for connections the
// node opens itself (output), loopback addresses excepted.
func nodePortRules(nets []Network, services []Service, nodeAddrs []netip.Addr) nodePortTables {
	var np nodePortTables
	byName := map[string]Network{}
	for _, n := range nets {
		byName[n.Name] = n
	}
	ports := nftVMap{name: "node-ports", keyType: nodePortKeyType}
	ext := [2]nftVMap{{name: "external-ips4", keyType: serviceKeyType(false)}, {name: "external-ips6", keyType: serviceKeyType(true)}}
	routers := map[int]bool{}
	seen := map[string]bool{}
	for _, sv := range services {
		n, ok := byName[sv.Network]
		if !ok || sv.NodePort == 0 {
			continue
		}
		proto := serviceProto(sv)
		v6 := sv.VIP.Addr().Is6()
		router, _, err := TransitAddrs(n.ID, v6)
		if err != nil {
			continue // Validate refused it
		}
		chain := fmt.Sprintf("router-%d", n.ID)
		if key := fmt.Sprintf("%d/%d", proto, sv.NodePort); !seen[key] {
			seen[key] = true
			ports.elems = append(ports.elems, nftVMapElem{key: portKey(proto, sv.NodePort), chain: chain,
				comment: cutComment("service " + sv.Name), text: fmt.Sprintf("%s . %d", protoNames[proto], sv.NodePort)})
		}
		routers[n.ID] = true
		m := &ext[0]
		if v6 {
			m = &ext[1]
		}
		to := netip.AddrPortFrom(router, sv.NodePort)
		for _, a := range sv.External {
			at := netip.AddrPortFrom(a, sv.VIP.Port())
			name := hashedChainName("ext-", sv.Protocol+" "+at.String(), sv.Name)
			m.elems = append(m.elems, nftVMapElem{key: slices.Concat(a.AsSlice(), portKey(proto, sv.VIP.Port())), chain: name,
				comment: cutComment("service " + sv.Name), text: fmt.Sprintf("%s . %s . %d", a, protoNames[proto], sv.VIP.Port())})
			np.chains = append(np.chains, nftChain{name: name, rules: []nftRule{
				newRule().dnat(to, fmt.Sprintf("service %s: %s %s to network %s's router", sv.Name, sv.Protocol, at, n.Name)),
			}})
		}
	}
	if len(ports.elems) == 0 {
		return np
	}
	for _, n := range nets {
		if !routers[n.ID] {
			continue
		}
		var rules []nftRule
		for _, v6 := range networkFamilies(n) {
			router, _, _ := TransitAddrs(n.ID, v6)
			rules = append(rules, newRule().nfproto(v6).dnatAddr(router, fmt.Sprintf("network %s: to its router", n.Name)))
		}
		np.chains = append(np.chains, nftChain{name: fmt.Sprintf("router-%d", n.ID), rules: rules})
	}
	np.maps = append(np.maps, ports)
	in := []nftRule{newRule().fibDaddrLocal().portLookup(ports.name).done("node ports of UDN services")}
	out := []nftRule{
		newRule().nfproto(false).ipDaddr(loopback4, true).fibDaddrLocal().portLookup(ports.name).done("node ports of UDN services, from the node"),
		newRule().nfproto(true).ip6Daddr(hostPrefix(netip.IPv6Loopback()), true).fibDaddrLocal().portLookup(ports.name).done("node ports of UDN services, from the node"),
	}
	for i := range ext {
		if len(ext[i].elems) == 0 {
			continue
		}
		v6 := i == 1
		np.maps = append(np.maps, ext[i])
		r := newRule().nfproto(v6).serviceLookup(v6, ext[i].name).done(fmt.Sprintf("%s external addresses of UDN services", familyName(v6)))
		in, out = append(in, r), append(out, r)
	}
	np.chains = append([]nftChain{
		{name: "node-ports-in", base: &baseChain{typ: nftables.ChainTypeNAT, hook: *nftables.ChainHookPrerouting,
			priority: *nodePortPriority, policy: nftables.ChainPolicyAccept}, rules: in},
		{name: "node-ports-local", base: &baseChain{typ: nftables.ChainTypeNAT, hook: *nftables.ChainHookOutput,
			priority: *nodePortPriority, policy: nftables.ChainPolicyAccept}, rules: out},
	}, np.chains...)
	np.forward = append(tenantNodePortRules(&np, ports, nodeAddrs),
		newRule().oifname(transitPrefix+"*").ctStatusDNAT().accept("node port and load balancer connections to tenant routers"))
	return np
}

// tenantNodePortRules keeps tenants off node ports at other nodes'
// addresses (at this node's, the forward chain's rule against forwarding
// between routers does): maps `node-addrs4`/`node-addrs6` (address .
// protocol, for every node address and the protocols of ports) jump to
// chain `to-node`, which looks the port up in `tenant-node-ports` (the
// keys of ports) and jumps to `refuse-node-port`. It returns the forward
// rules and adds maps and chains to np.
func tenantNodePortRules(np *nodePortTables, ports nftVMap, nodeAddrs []netip.Addr) []nftRule {
	if len(nodeAddrs) == 0 {
		return nil
	}
	protos := map[byte]bool{}
	refuse := nftVMap{name: "tenant-node-ports", keyType: nodePortKeyType}
	for _, e := range ports.elems {
		protos[e.key[0]] = true
		refuse.elems = append(refuse.elems, nftVMapElem{key: e.key, text: e.text, comment: e.comment, chain: "refuse-node-port"})
	}
	addrs := [2]nftVMap{{name: "node-addrs4", keyType: addrProtoKeyType(false)}, {name: "node-addrs6", keyType: addrProtoKeyType(true)}}
	sorted := slices.Clone(nodeAddrs)
	slices.SortFunc(sorted, netip.Addr.Compare)
	for _, a := range slices.Compact(sorted) {
		a = a.Unmap()
		m := &addrs[0]
		if a.Is6() {
			m = &addrs[1]
		}
		for _, p := range []byte{unix.IPPROTO_TCP, unix.IPPROTO_UDP} {
			if protos[p] {
				m.elems = append(m.elems, nftVMapElem{key: slices.Concat(a.AsSlice(), []byte{p, 0, 0, 0}), chain: "to-node",
					text: fmt.Sprintf("%s . %s", a, protoNames[p]), comment: "a node's address"})
			}
		}
	}
	var rules []nftRule
	for i, m := range addrs {
		if len(m.elems) == 0 {
			continue
		}
		v6 := i == 1
		np.maps = append(np.maps, m)
		rules = append(rules, newRule().iifname(transitPrefix+"*").nfproto(v6).addrProtoLookup(v6, m.name).
			done(fmt.Sprintf("%s: tenants to a node's address", familyName(v6))))
	}
	np.maps = append(np.maps, refuse)
	np.chains = append(np.chains,
		nftChain{name: "to-node", rules: []nftRule{newRule().portLookup(refuse.name).done("node ports of UDN services")}},
		nftChain{name: "refuse-node-port", rules: []nftRule{newRule().counter().rejectProhibited("node ports of UDN services: never from a tenant")}})
	return rules
}

// addrProtoKeyType is the key type of node-addrs4/6: address . protocol.
func addrProtoKeyType(v6 bool) nftables.SetDatatype {
	return nftables.MustConcatSetType(addrType(v6), nftables.TypeInetProto)
}

// loopback4 is IPv4's loopback network.
var loopback4 = netip.MustParsePrefix("127.0.0.0/8")

// nodePortMapName names the verdict map of a router's node ports of one
// IP family (its key: protocol . port).
func nodePortMapName(v6 bool) string {
	if v6 {
		return "node-ports6"
	}
	return "node-ports4"
}

// nodePortKeyType is the key type of node port maps.
var nodePortKeyType = nftables.MustConcatSetType(nftables.TypeInetProto, nftables.TypeInetService)

// portKey returns the key of a protocol . port map element, each field
// padded to 4 bytes as in registers.
func portKey(proto byte, port uint16) []byte {
	return slices.Concat([]byte{proto, 0, 0, 0}, binary.BigEndian.AppendUint16(nil, port), []byte{0, 0})
}

// nodePortElem returns sv's element of its family's node port map,
// jumping to chain.
func nodePortElem(sv Service, chain string) nftVMapElem {
	proto := serviceProto(sv)
	return nftVMapElem{key: portKey(proto, sv.NodePort), chain: chain, comment: cutComment("service " + sv.Name),
		text: fmt.Sprintf("%s . %d", protoNames[proto], sv.NodePort)}
}
