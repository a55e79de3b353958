package datapath

import (
	"crypto/sha256"
	"encoding/base32"
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// This file holds a router's Service load-balancing: dispatch verdict
// maps and one chain per Service (serviceRules).

// serviceRules returns the rules of services, as kube-proxy's nftables
// mode has them: dispatch, for the router's NAT prerouting chain, one rule
// per IP family that looks the packet's destination address, protocol and
// port up in maps (the family's verdict map, an element per service with
// endpoints, which jumps to the service's own chain, serviceChainName);
// chains, one per service with endpoints, spreading connections over them
// at random (numgen, one draw per rule: rule i of k takes 1/(k-i) of what
// reaches it, so each endpoint gets 1/k) with DNAT; and refuse, for the
// forward chain, one counted reject per service without endpoints.
//
// A change of one service's endpoints thus changes only that service's
// chain, and adding or removing a service one map element and one chain:
// syncTables rewrites only those.
//
// A service with client affinity (Service.Affinity) has, in sets, a
// dynamic set per endpoint of the clients that endpoint served last,
// each address expiring Affinity after that: its chain first sends a
// client found in an endpoint's set to that endpoint, and every rule that
// picks an endpoint records the client in the endpoint's set, as
// kube-proxy's nftables mode does. An endpoint's set goes with it, so
// its clients are spread afresh.
func serviceRules(services []Service) (dispatch []nftRule, maps []nftVMap, chains []nftChain, sets []nftSet, refuse []nftRule) {
	var v4, v6, np4, np6 nftVMap
	for _, sv := range services {
		if len(sv.Endpoints) == 0 {
			// A node port without endpoints needs no rule: nothing
			// translates it, so the router's own stack refuses it.
			refuse = append(refuse, serviceMatch(sv).counter().reject(sv.Protocol, fmt.Sprintf("service %s: no endpoints", sv.Name)))
			continue
		}
		name := serviceChainName(sv)
		m, np := &v4, &np4
		if sv.VIP.Addr().Is6() {
			m, np = &v6, &np6
		}
		m.elems = append(m.elems, serviceElem(sv, name))
		if sv.NodePort != 0 && sv.ExternalLocal {
			local := localChainName(sv)
			np.elems = append(np.elems, nodePortElem(sv, local))
			chains = append(chains, nftChain{name: local, rules: localRules(sv)})
		} else if sv.NodePort != 0 {
			np.elems = append(np.elems, nodePortElem(sv, name))
		}
		v6 := sv.VIP.Addr().Is6()
		var affinity []string // set name per endpoint
		rules := make([]nftRule, 0, 2*len(sv.Endpoints))
		if sv.Affinity > 0 {
			for _, ep := range sv.Endpoints {
				set := affinitySetName(name, ep, sv.Affinity)
				affinity = append(affinity, set)
				sets = append(sets, nftSet{name: set, keyType: addrType(v6), timeout: sv.Affinity,
					comment: cutComment(fmt.Sprintf("service %s: clients of endpoint %s", sv.Name, ep))})
				b := newRule().nfproto(v6).addrLookup(v6, true, set).srcUpdate(v6, set, sv.Affinity)
				if !sv.ViaNode {
					b.markService()
				}
				rules = append(rules, b.dnat(ep, fmt.Sprintf("service %s: endpoint %s, its client's", sv.Name, ep)))
			}
		}
		for i, ep := range sv.Endpoints {
			b := newRule()
			if affinity != nil {
				// Names the family for the source address (nft lists
				// the rule as `ip saddr`, not as a raw payload).
				b.nfproto(v6)
			}
			if left := len(sv.Endpoints) - i; left > 1 {
				b.numgenZero(uint32(left))
			}
			if affinity != nil {
				b.srcUpdate(v6, affinity[i], sv.Affinity)
			}
			if !sv.ViaNode { // leaves through the service port
				b.markService()
			}
			rules = append(rules, b.dnat(ep, fmt.Sprintf("service %s: endpoint %s", sv.Name, ep)))
		}
		chains = append(chains, nftChain{name: name, rules: rules})
	}
	for _, f := range []struct {
		m   *nftVMap
		v6  bool
		fam string
	}{{&v4, false, "IPv4"}, {&v6, true, "IPv6"}} {
		if len(f.m.elems) == 0 {
			continue
		}
		f.m.name, f.m.keyType = serviceMapName(f.v6), serviceKeyType(f.v6)
		maps = append(maps, *f.m)
		dispatch = append(dispatch, newRule().iifname(routerGwIf).nfproto(f.v6).serviceLookup(f.v6, f.m.name).
			done(fmt.Sprintf("%s services: to the service's chain", f.fam)))
	}
	for _, f := range []struct {
		m  *nftVMap
		v6 bool
	}{{&np4, false}, {&np6, true}} {
		if len(f.m.elems) == 0 {
			continue
		}
		f.m.name, f.m.keyType = nodePortMapName(f.v6), nodePortKeyType
		maps = append(maps, *f.m)
		// Connections the node sent to the router's transit address
		// (the node's and external addresses' ports, translated there).
		dispatch = append(dispatch, newRule().iifname(routerTransitIf).nfproto(f.v6).portLookup(f.m.name).
			done(fmt.Sprintf("%s node ports: to the service's chain", familyName(f.v6))))
	}
	return dispatch, maps, chains, sets, refuse
}

// localChainPrefix starts the name of the chain of a service's node
// port connections under externalTrafficPolicy Local (localRules).
const localChainPrefix = "svcl-"

// localChainName returns the name of sv's chain of node port connections
// under externalTrafficPolicy Local.
func localChainName(sv Service) string {
	return hashedChainName(localChainPrefix, sv.Protocol+" "+sv.VIP.String(), sv.Name)
}

// localRules spreads the node port (and external address) connections of
// sv, whose externalTrafficPolicy is Local, over its endpoints on this
// node at random, without the service mark: they go to the endpoint
// straight through the gateway port, unmasqueraded, so it sees the
// client's address and answers through this router. Without local
// endpoints they are dropped, counted, as kube-proxy drops them.
func localRules(sv Service) []nftRule {
	if len(sv.LocalEndpoints) == 0 {
		return []nftRule{newRule().counter().drop(fmt.Sprintf("service %s: no local endpoints (externalTrafficPolicy Local)", sv.Name))}
	}
	rules := make([]nftRule, 0, len(sv.LocalEndpoints))
	for i, ep := range sv.LocalEndpoints {
		b := newRule()
		if left := len(sv.LocalEndpoints) - i; left > 1 {
			b.numgenZero(uint32(left))
		}
		rules = append(rules, b.dnat(ep, fmt.Sprintf("service %s: local endpoint %s", sv.Name, ep)))
	}
	return rules
}

// affinitySetPrefix starts the name of every client affinity set.
const affinitySetPrefix = "aff-"

// affinitySetName names the client affinity set of endpoint ep of the
// service whose chain is chain, with timeout: a hash of the three, unique
// in a router. A new timeout makes new sets: the kernel cannot change a
// set's timeout, and refuses to delete a set while rules refer to it, so
// the old sets go once the rewritten chain no longer does.
func affinitySetName(chain string, ep netip.AddrPort, timeout time.Duration) string {
	sum := sha256.Sum256([]byte(fmt.Sprintf("%s %s %d", chain, ep, int64(timeout/time.Second))))
	return affinitySetPrefix + strings.ToLower(base32.StdEncoding.EncodeToString(sum[:10]))
}

// serviceMapName names the verdict map of the router's services of one IP
// family (its key: address . protocol . port).
func serviceMapName(v6 bool) string {
	if v6 {
		return "service-ips6"
	}
	return "service-ips4"
}

// serviceKeyType is the key type of serviceMapName(v6).
func serviceKeyType(v6 bool) nftables.SetDatatype {
	return nftables.MustConcatSetType(addrType(v6), nftables.TypeInetProto, nftables.TypeInetService)
}

// serviceElem returns sv's element of its family's service map: its
// address, protocol and port, each padded to 4 bytes as in registers,
// jumping to chain.
func serviceElem(sv Service, chain string) nftVMapElem {
	proto := serviceProto(sv)
	key := slices.Concat(sv.VIP.Addr().AsSlice(), portKey(proto, sv.VIP.Port()))
	return nftVMapElem{key: key, chain: chain, comment: cutComment("service " + sv.Name),
		text: fmt.Sprintf("%s . %s . %d", sv.VIP.Addr(), protoNames[proto], sv.VIP.Port())}
}

// serviceChainPrefix starts the name of every service chain.
const serviceChainPrefix = "svc-"

// maxServiceChainName bounds service chain names: the kernel allows 255
// bytes (NFT_CHAIN_MAXNAMELEN), kept well below for `nft list`.
const maxServiceChainName = 64

// serviceChainName returns the name of service sv's chain in its router:
// "svc-", a hash of its protocol and address (unique in a router, as
// Validate checks), and its name with every byte nft would not take in a
// bare chain name replaced by "_", cut to maxServiceChainName bytes. The
// hash keeps names unique when cut; the name is there for people.
func serviceChainName(sv Service) string {
	return hashedChainName(serviceChainPrefix, sv.Protocol+" "+sv.VIP.String(), sv.Name)
}

// hashedChainName returns prefix, a hash of key and name with every byte
// nft would not take in a bare chain name replaced by "_", cut to
// maxServiceChainName bytes.
func hashedChainName(prefix, key, name string) string {
	sum := sha256.Sum256([]byte(key))
	out := prefix + strings.ToLower(base32.StdEncoding.EncodeToString(sum[:5])) + "-" +
		strings.Map(func(r rune) rune {
			if r < utf8.RuneSelf && (r == '_' || r == '.' || r == '/' || r == '-' ||
				'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9') {
				return r
			}
			return '_'
		}, name)
	if len(out) > maxServiceChainName {
		out = out[:maxServiceChainName]
	}
	return out
}

// serviceMatch starts a rule matching connections from the network's pods
// to service sv's address.
func serviceMatch(sv Service) *ruleBuilder {
	b := newRule().iifname(routerGwIf)
	addr := sv.VIP.Addr()
	if addr.Is4() {
		b.nfproto(false).ipDaddr(hostPrefix(addr), false)
	} else {
		b.nfproto(true).ip6Daddr(hostPrefix(addr), false)
	}
	proto := serviceProto(sv)
	return b.l4proto(proto).match(fmt.Sprintf("%s dport %d", protoNames[proto], sv.VIP.Port()),
		expr.PayloadBaseTransportHeader, 2, binary.BigEndian.AppendUint16(nil, sv.VIP.Port()), nil, false)
}

// serviceProto returns sv's IP protocol number.
func serviceProto(sv Service) byte {
	if sv.Protocol == "UDP" {
		return unix.IPPROTO_UDP
	}
	return unix.IPPROTO_TCP
}
