package datapath

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"
)

// This file validates a State: validate runs one function per type
// (network, port, remote MAC, node address, service), each reporting
// every problem it finds through a badFunc, naming the offending field and
// value.

// badFunc reports one problem of a State.
type badFunc func(format string, args ...any)

// validate checks s and returns the networks by name. It reports every
// problem, each naming the offending field and value.
func (s *State) validate() (map[string]*Network, error) {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalidState}, args...)...))
	}
	byName := validateNetworks(s.Networks, bad)
	ifNames := map[string]bool{} // host interface name -> seen
	for i, p := range s.Ports {
		validatePort(i, p, byName, ifNames, bad)
	}
	for i, m := range s.RemoteMACs {
		validateRemoteMAC(i, m, byName, bad)
	}
	for i, a := range s.NodeAddrs {
		if !a.IsValid() || a.IsUnspecified() || a.Zone() != "" {
			bad("nodeAddrs[%d]: %q is not a node address", i, a)
		}
	}
	rules := validatePolicies(s.Policies, s.Ports, bad)
	validateEndpointPolicies(s.EndpointPolicies, byName, rules, bad)
	sc := serviceClaims{vips: map[string]string{}, nodePorts: map[string]string{}, nodePortNets: map[string]string{}, externals: map[string]string{}}
	for i, sv := range s.Services {
		validateService(i, sv, byName, &sc, bad)
	}
	return byName, errors.Join(errs...)
}

// validateNetworks checks each network (validateNetwork) and that names
// and IDs are unique, and returns them by name.
func validateNetworks(nets []Network, bad badFunc) map[string]*Network {
	byName := map[string]*Network{} // network name -> network
	byID := map[int]string{}        // network ID -> network name
	for i := range nets {
		n := &nets[i]
		switch {
		case n.Name == "":
			bad("networks[%d]: empty name", i)
		case byName[n.Name] != nil:
			bad("network %q: listed twice", n.Name)
		}
		byName[n.Name] = n
		if n.ID < 1 || n.ID > MaxNetworkID {
			bad("network %q: id %d out of range 1-%d", n.Name, n.ID, MaxNetworkID)
		} else if other, dup := byID[n.ID]; dup {
			bad("network %q: id %d already used by network %q", n.Name, n.ID, other)
		}
		byID[n.ID] = n.Name
		validateNetwork(n, bad)
	}
	return byName
}

// validateNetwork checks one network's fields: subnets and gateways, its
// topology's (validateLayer3, validateLocalnet, or a tunnelled network's
// remotes), service CIDRs and service addresses.
func validateNetwork(n *Network, bad badFunc) {
	for _, p := range n.Subnets {
		if !p.IsValid() || p != p.Masked() {
			bad("network %q: subnet %q is not a valid network prefix", n.Name, p)
		}
	}
	if n.Layer3 != nil {
		validateLayer3(n, bad)
	}
	validateGateways(n, bad)
	for _, r := range n.Remotes {
		if !r.IsValid() || r.IsUnspecified() {
			bad("network %q: remote %q is not a valid address", n.Name, r)
		}
	}
	for _, p := range n.ServiceCIDRs {
		if !n.Primary {
			bad("network %q: service CIDRs on a secondary network", n.Name)
			break
		}
		if !p.IsValid() || p.Addr().Zone() != "" || p != p.Masked() {
			bad("network %q: service CIDR %q is not a network prefix", n.Name, p)
		}
	}
	for _, p := range n.DefaultNetworkSubnets {
		if !n.Primary {
			bad("network %q: default network subnets on a secondary network", n.Name)
			break
		}
		if !p.IsValid() || p.Addr().Zone() != "" || p != p.Masked() {
			bad("network %q: default network subnet %q is not a network prefix", n.Name, p)
		}
	}
	if len(n.ServiceAddrs) > 0 {
		validateServiceAddrs(n, bad)
	}
	if n.Physical == "" {
		if n.VLAN != 0 {
			bad("network %q: vlan %d without a physical bridge", n.Name, n.VLAN)
		}
		if n.MTU != 0 {
			bad("network %q: mtu %d on a tunnelled network (it uses the pod MTU)", n.Name, n.MTU)
		}
		return
	}
	validateLocalnet(n, bad)
}

// validateGateways checks that a primary or Layer3 network has one
// gateway in each subnet, and that others have none.
func validateGateways(n *Network, bad badFunc) {
	if !n.Primary && n.Layer3 == nil {
		if len(n.Gateways) != 0 {
			bad("network %q: gateways on a secondary network", n.Name)
		}
		return
	}
	if len(n.Subnets) == 0 {
		bad("network %q: primary network without subnets", n.Name)
	}
	if len(n.Gateways) != len(n.Subnets) {
		bad("network %q: %d gateways for %d subnets", n.Name, len(n.Gateways), len(n.Subnets))
	}
	for j, gw := range n.Gateways {
		if j < len(n.Subnets) && !n.Subnets[j].Contains(gw) {
			bad("network %q: gateway %q outside subnet %q", n.Name, gw, n.Subnets[j])
		}
	}
}

// validateServiceAddrs checks a network's service addresses and MAC.
func validateServiceAddrs(n *Network, bad badFunc) {
	if !n.Primary {
		bad("network %q: service addresses on a secondary network", n.Name)
	}
	if !isUnicastMAC(n.ServiceMAC) {
		bad("network %q: service MAC %q is not a unicast Ethernet address", n.Name, n.ServiceMAC)
	}
	for _, a := range n.ServiceAddrs {
		if !a.IsValid() || a.Addr() == a.Masked().Addr() {
			bad("network %q: service address %q is not an address in a prefix", n.Name, a)
		}
		for _, sub := range n.Subnets {
			if sub.Overlaps(a.Masked()) {
				bad("network %q: service address %q overlaps subnet %q", n.Name, a, sub)
			}
		}
	}
}

// validateLocalnet checks a localnet network's (one with a physical
// bridge) own fields.
func validateLocalnet(n *Network, bad badFunc) {
	if len(n.Physical) > 15 || strings.ContainsAny(n.Physical, "/ \x00") {
		bad("network %q: physical bridge %q is not an interface name", n.Name, n.Physical)
	} else if _, _, owned := parseOwnedLink(n.Physical); owned {
		bad("network %q: physical bridge %q is a kvnet link", n.Name, n.Physical)
	}
	if n.Primary {
		bad("network %q: a localnet network (physical bridge %q) cannot be primary", n.Name, n.Physical)
	}
	if len(n.Remotes) != 0 {
		bad("network %q: remotes on a localnet network (physical bridge %q)", n.Name, n.Physical)
	}
	if n.VLAN < 0 || n.VLAN > 4094 {
		bad("network %q: vlan %d out of range 1-4094", n.Name, n.VLAN)
	}
	if n.MTU < 0 || n.MTU > 65535 || (n.MTU > 0 && n.MTU < 576) {
		bad("network %q: mtu %d out of range 576-65535", n.Name, n.MTU)
	}
}

// validateLayer3 checks a Layer3 network's own fields.
func validateLayer3(n *Network, bad badFunc) {
	l := n.Layer3
	if n.Physical != "" || len(n.Remotes) != 0 {
		bad("network %q: a layer3 network has no physical bridge and no remotes", n.Name)
	}
	for _, sub := range n.Subnets {
		if !slices.ContainsFunc(l.ClusterSubnets, func(c netip.Prefix) bool { return c.Bits() <= sub.Bits() && c.Contains(sub.Addr()) }) {
			bad("network %q: host subnet %q outside the cluster subnets %v", n.Name, sub, l.ClusterSubnets)
		}
	}
	if !isUnicastMAC(l.MAC) {
		bad("network %q: overlay MAC %q is not a unicast Ethernet address", n.Name, l.MAC)
	}
	if len(l.Addrs) == 0 {
		bad("network %q: no overlay address", n.Name)
	}
	for _, a := range l.Addrs {
		if !a.IsValid() || a.Addr() == a.Masked().Addr() {
			bad("network %q: overlay address %q is not an address in a prefix", n.Name, a)
		}
		for _, c := range l.ClusterSubnets {
			if c.Overlaps(a.Masked()) {
				bad("network %q: overlay address %q overlaps subnet %q", n.Name, a, c)
			}
		}
	}
	for i, p := range l.Peers {
		if !p.VTEP.IsValid() || p.VTEP.IsUnspecified() {
			bad("network %q: peers[%d]: VTEP %q is not a valid address", n.Name, i, p.VTEP)
		}
		if !isUnicastMAC(p.MAC) {
			bad("network %q: peer %s: MAC %q is not a unicast Ethernet address", n.Name, p.VTEP, p.MAC)
		}
		for _, a := range p.Addrs {
			if !slices.ContainsFunc(l.Addrs, func(o netip.Prefix) bool { return o.Contains(a) }) || slices.ContainsFunc(l.Addrs, func(o netip.Prefix) bool { return o.Addr() == a }) {
				bad("network %q: peer %s: address %q is not another address of the overlay %v", n.Name, p.VTEP, a, l.Addrs)
			}
		}
		for _, sub := range p.Subnets {
			if !sub.IsValid() || sub != sub.Masked() || slices.ContainsFunc(n.Subnets, sub.Overlaps) {
				bad("network %q: peer %s: host subnet %q is invalid or overlaps this node's", n.Name, p.VTEP, sub)
			}
		}
	}
}

// validatePort checks ports[i] p against the networks and the host
// interface names seen so far (ifNames, which it adds to).
func validatePort(i int, p Port, byName map[string]*Network, ifNames map[string]bool, bad badFunc) {
	if byName[p.Network] == nil {
		bad("ports[%d] %q: unknown network %q", i, p.HostIfName, p.Network)
	}
	if p.HostIfName == "" || len(p.HostIfName) > 15 {
		bad("ports[%d]: host interface name %q must be 1-15 characters", i, p.HostIfName)
	} else if _, _, owned := parseOwnedLink(p.HostIfName); owned {
		bad("port %q: host interface name uses a kvnet-reserved prefix", p.HostIfName)
	}
	if ifNames[p.HostIfName] {
		bad("port %q: listed twice", p.HostIfName)
	}
	ifNames[p.HostIfName] = true
	if !isUnicastMAC(p.MAC) {
		bad("port %q: MAC %q is not a unicast Ethernet address", p.HostIfName, p.MAC)
	}
	for _, ip := range p.IPs {
		if !ip.IsValid() {
			bad("port %q: invalid IP %q", p.HostIfName, ip)
		}
	}
}

// validateRemoteMAC checks remoteMACs[i] m: a unicast MAC at a VTEP, on a
// known network that is not localnet.
func validateRemoteMAC(i int, m RemoteMAC, byName map[string]*Network, bad badFunc) {
	if n := byName[m.Network]; n == nil {
		bad("remoteMACs[%d] %q: unknown network %q", i, m.MAC, m.Network)
	} else if n.Physical != "" {
		bad("remoteMACs[%d] %q: network %q is a localnet network (the physical network learns MACs)", i, m.MAC, m.Network)
	}
	if !isUnicastMAC(m.MAC) {
		bad("remoteMACs[%d]: MAC %q is not a unicast Ethernet address", i, m.MAC)
	}
	if !m.VTEP.IsValid() || m.VTEP.IsUnspecified() {
		bad("remote MAC %q: VTEP %q is not a valid address", m.MAC, m.VTEP)
	}
}

// serviceClaims are what the services validated so far hold, which no
// other may.
type serviceClaims struct {
	vips         map[string]string // network + protocol + VIP -> service
	nodePorts    map[string]string // protocol + node port + family -> service
	nodePortNets map[string]string // protocol + node port -> network
	externals    map[string]string // protocol + external address and port -> service
}

// validateService checks services[i] sv: its network, protocol and
// address, its node port and external addresses (against sc, which it
// adds to), and its endpoints.
func validateService(i int, sv Service, byName map[string]*Network, sc *serviceClaims, bad badFunc) {
	n := byName[sv.Network]
	switch {
	case n == nil:
		bad("services[%d] %q: unknown network %q", i, sv.Name, sv.Network)
		return
	case !n.Primary:
		bad("service %q: network %q is not primary (services are load-balanced by its router)", sv.Name, sv.Network)
	case sv.ViaNode && (sv.NodePort != 0 || len(sv.External) > 0):
		bad("service %q: a service reached through the node has no node port nor external addresses", sv.Name)
	case !sv.ViaNode && !slices.ContainsFunc(n.ServiceAddrs, func(p netip.Prefix) bool { return p.Addr().Is4() == sv.VIP.Addr().Is4() }):
		bad("service %q: network %q has no service address of its family", sv.Name, sv.Network)
	}
	if sv.Affinity < 0 || sv.Affinity > MaxServiceAffinity || sv.Affinity%time.Second != 0 {
		bad("service %q: affinity %s: must be whole seconds from 0 to %s", sv.Name, sv.Affinity, MaxServiceAffinity)
	}
	if len(sv.LocalEndpoints) > 0 && !sv.ExternalLocal {
		bad("service %q: local endpoints %v without externalTrafficPolicy Local", sv.Name, sv.LocalEndpoints)
	}
	for _, ep := range sv.LocalEndpoints {
		if !slices.Contains(sv.Endpoints, ep) {
			bad("service %q: local endpoint %q is not one of its endpoints", sv.Name, ep)
		}
	}
	if sv.ExternalLocal && sv.ViaNode {
		bad("service %q: a service reached through the node has no externalTrafficPolicy Local", sv.Name)
	}
	if sv.Protocol != "TCP" && sv.Protocol != "UDP" {
		bad("service %q: protocol %q: must be TCP or UDP", sv.Name, sv.Protocol)
	}
	if !sv.VIP.IsValid() || sv.VIP.Port() == 0 || sv.VIP.Addr().Zone() != "" {
		bad("service %q: address %q is not an IP and port", sv.Name, sv.VIP)
		return
	}
	key := sv.Network + "/" + sv.Protocol + "/" + sv.VIP.String()
	if other, dup := sc.vips[key]; dup {
		bad("service %q: %s %s already used by service %q", sv.Name, sv.Protocol, sv.VIP, other)
	}
	sc.vips[key] = sv.Name
	if sv.NodePort != 0 {
		sc.nodePort(sv, bad)
	}
	for _, a := range sv.External {
		sc.external(sv, a, bad)
	}
	for _, ep := range sv.Endpoints {
		if !ep.IsValid() || ep.Port() == 0 || ep.Addr().Is4() != sv.VIP.Addr().Is4() {
			bad("service %q: endpoint %q is not an address of the service's family with a port", sv.Name, ep)
		} else if inside := slices.ContainsFunc(endpointSubnets(n), func(p netip.Prefix) bool { return p.Contains(ep.Addr()) }); !inside && !sv.ViaNode {
			bad("service %q: endpoint %q outside network %q's subnets", sv.Name, ep, sv.Network)
		} else if inside && sv.ViaNode {
			bad("service %q: endpoint %q, reached through the node, is inside network %q's subnets", sv.Name, ep, sv.Network)
		}
	}
}

// nodePort claims sv's node port: once per protocol and family, and on
// one network only.
func (sc *serviceClaims) nodePort(sv Service, bad badFunc) {
	npKey := fmt.Sprintf("%s/%d", sv.Protocol, sv.NodePort)
	fam := npKey + "/" + familyName(sv.VIP.Addr().Is6())
	if other, dup := sc.nodePorts[fam]; dup {
		bad("service %q: node port %s %d already used by service %q", sv.Name, sv.Protocol, sv.NodePort, other)
	}
	sc.nodePorts[fam] = sv.Name
	if owner, taken := sc.nodePortNets[npKey]; taken && owner != sv.Network {
		bad("service %q: node port %s %d already used on network %q", sv.Name, sv.Protocol, sv.NodePort, owner)
	}
	sc.nodePortNets[npKey] = sv.Network
}

// external checks and claims sv's external address a (at the service's
// port).
func (sc *serviceClaims) external(sv Service, a netip.Addr, bad badFunc) {
	switch {
	case sv.NodePort == 0:
		bad("service %q: external address %q needs a node port", sv.Name, a)
	case !a.IsValid() || a.Zone() != "" || a.Is4() != sv.VIP.Addr().Is4() || a.IsUnspecified() || a.IsLoopback() || a.IsMulticast():
		bad("service %q: external address %q is not a unicast address of the service's family", sv.Name, a)
	default:
		key := sv.Protocol + "/" + netip.AddrPortFrom(a, sv.VIP.Port()).String()
		if other, dup := sc.externals[key]; dup {
			bad("service %q: external %s %s already used by service %q", sv.Name, sv.Protocol, netip.AddrPortFrom(a, sv.VIP.Port()), other)
		}
		sc.externals[key] = sv.Name
	}
}

// endpointSubnets are where n's service endpoints may be: its subnets, or
// on a Layer3 network its cluster subnets (endpoints on other nodes).
func endpointSubnets(n *Network) []netip.Prefix {
	if n.Layer3 != nil {
		return n.Layer3.ClusterSubnets
	}
	return n.Subnets
}
