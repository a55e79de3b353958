package datapath

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
)

// NodeConfig describes the node a Datapath runs on. It does not change over
// the Datapath's life.
type NodeConfig struct {
	// Name is the node's name, used in errors only.
	Name string
	// NetNS is the path of the namespace the node's datapath lives in; ""
	// is the namespace of the thread calling New (the host, on a real
	// node). Tests and the lab give each simulated node its own.
	NetNS string
	// UnderlayIP is the node's VTEP address: the VXLAN source address and
	// what other nodes list in Network.Remotes and RemoteMAC.VTEP.
	UnderlayIP netip.Addr
	// UnderlayDev carries the underlay and the egress traffic; egress from
	// tenant routers is masqueraded to its address.
	UnderlayDev string
	// MTU overrides the pod MTU; 0 = UnderlayDev's MTU minus the VXLAN
	// overhead (50 for an IPv4 underlay, 70 for IPv6).
	MTU int
	// RouterNSPrefix overrides the prefix of router namespace names
	// (RouterNSName); "" = "kvnet-r" in the host namespace, or
	// "kvnet-<base name of NetNS>-r" for a node in its own namespace.
	RouterNSPrefix string
}

// Network is one network present on the node.
type Network struct {
	// Name is the network's name, e.g. "tenant-a_udn"; used in rule
	// comments and errors.
	Name string
	// ID is the cluster-wide network ID, 1..4095. It is the VXLAN VNI and
	// names the bridge, VXLAN device, router namespace and transit
	// addresses, so it must be the same on every node.
	ID int
	// Primary networks get a router (gateway, egress SNAT); secondary
	// networks are pure L2.
	Primary bool
	// Subnets of the network; empty for a secondary network without IPAM.
	Subnets []netip.Prefix
	// Gateways holds, for a primary network, one gateway IP per subnet
	// (the subnet's first address unless the UDN sets defaultGatewayIPs).
	Gateways []netip.Addr
	// Remotes are the underlay IPs of the other nodes hosting this network;
	// broadcast and unknown unicast frames are replicated to each.
	Remotes []netip.Addr
	// ServiceAddrs and ServiceMAC, on a primary network with Services, are
	// this node's router's own addresses (one per family, in the
	// network's transit subnet) and MAC on the network: unique per node,
	// so that endpoints on other nodes answer this router.
	ServiceAddrs []netip.Prefix
	ServiceMAC   net.HardwareAddr
	// ServiceCIDRs, on a primary network, are the cluster's Service
	// ranges: its router never sends a connection into them out through
	// the node, so that of the cluster's Services only the network's own
	// and those reached through the node (Service.ViaNode) can be reached
	// from it; the node's own service proxy would lead to the rest, other
	// tenants' included.
	ServiceCIDRs []netip.Prefix
	// Physical, when set, makes this a localnet network: its bridge is
	// patched into the node's Linux bridge of that name (the bridge mapping
	// of the network's physical network) instead of a VXLAN tunnel, so its
	// pods share the physical network's L2 segment. Such a network has no
	// Remotes and no router.
	Physical string
	// VLAN, on a localnet network, is the 802.1Q access VLAN its frames
	// carry on the physical bridge; 0 is untagged.
	VLAN int
	// MTU of a localnet network's bridge and patch; 0 is the pod MTU.
	// Tunnelled networks always use the pod MTU.
	MTU int
	// Layer3, when set, makes this a Layer3 network: Subnets are this
	// node's host subnets and Gateways its router's address in each; the
	// bridge holds local pods only, and the network's router routes to
	// the other nodes' host subnets over an overlay between routers (see
	// doc). Its router exists for a secondary network too (without
	// egress). It has no Remotes.
	Layer3 *Layer3
}

// hasRouter reports whether n gets a router namespace: primary networks
// (gateway, egress) and Layer3 networks (routing between nodes).
func (n *Network) hasRouter() bool { return n.Primary || n.Layer3 != nil }

// Layer3 is what a Layer3 network's router needs to reach the other
// nodes: its own overlay address and MAC, and every peer router.
type Layer3 struct {
	// ClusterSubnets are the network's subnets (all nodes' host subnets).
	ClusterSubnets []netip.Prefix
	// Addrs (one per family, with the overlay's prefix length) and MAC
	// are this node's router's on the overlay; unique per node.
	Addrs []netip.Prefix
	MAC   net.HardwareAddr
	// Peers are the other nodes' routers on this network.
	Peers []Layer3Peer
}

// Layer3Peer is another node's router on a Layer3 network.
type Layer3Peer struct {
	VTEP    netip.Addr       // the node's UnderlayIP
	Addrs   []netip.Addr     // its router's overlay addresses
	MAC     net.HardwareAddr // its router's overlay MAC
	Subnets []netip.Prefix   // its host subnets, routed via Addrs
}

// Port is a pod interface on this node: the host end of its veth, made by
// SetupPodInterface.
type Port struct {
	Network    string           // Network.Name
	HostIfName string           // host end of the pod's veth
	MAC        net.HardwareAddr // the only source MAC the port may use
	IPs        []netip.Prefix   // the only source IPs it may use; empty: MAC check only
	// Migrating marks one of the two ports of a VM in live migration (the
	// source, or the target waiting for the guest). It has no static FDB
	// entry and learning on: the bridge delivers the MAC to whichever
	// port the guest last spoke from, so the target takes over with the
	// guest's first frame (QEMU's announce), before the API says so.
	Migrating bool
	// Standby marks a Migrating port whose guest has not announced itself
	// yet (the migration target): it passes only what the running guest
	// alone sends (QEMU's RARP announce, unicast IP from the guest's
	// addresses), until the node makes it an ordinary Migrating port.
	Standby bool
}

// RemoteMAC is a pod on another node: a unicast FDB entry.
type RemoteMAC struct {
	Network string // Network.Name
	MAC     net.HardwareAddr
	VTEP    netip.Addr // UnderlayIP of the node hosting the MAC
	// Migrating marks the MAC of a VM in live migration: its VXLAN entry
	// is a learned (dynamic) one, first pointing at VTEP, which the VXLAN
	// device moves to the target node when the guest's first frame from
	// there arrives; Apply keeps whichever VTEP it points at.
	Migrating bool
}

// Service is one port of a Kubernetes Service on a primary network: its
// virtual address (the ClusterIP and port), load-balanced by the network's
// router to pods of the network. Pods reach it through their gateway, as
// OVN-Kubernetes' per-network load balancers do.
type Service struct {
	Network string // Network.Name: a primary network
	// Name identifies it in rule comments, e.g. "ns/web:http".
	Name string
	// Protocol is "TCP" or "UDP".
	Protocol string
	VIP      netip.AddrPort
	// Endpoints are pod addresses on the network with the target port;
	// none: connections are refused (TCP reset / ICMP port unreachable),
	// as kube-proxy does.
	Endpoints []netip.AddrPort
	// ViaNode marks a service of the cluster default network that the
	// network's pods may reach (the cluster DNS, the API server): its
	// Endpoints are outside the network, and the router sends connections
	// to them out through the node, masqueraded as egress is. Such a
	// service has no node port nor external addresses.
	ViaNode bool
	// NodePort, when not 0, makes the service reachable at this port on
	// every address of the node (NodePort and LoadBalancer Services): the
	// node translates the destination to the network's router, which
	// balances it over Endpoints as it does VIP. The entries of one
	// Kubernetes Service port (one per IP family) share it.
	NodePort uint16
	// External are addresses from outside the cluster (a LoadBalancer's
	// ingress IPs, spec.externalIPs), of VIP's family, at which the node
	// takes the service at VIP's port and handles it as NodePort (which
	// they need).
	External []netip.Addr
}

// State is what the node's datapath should look like. Apply makes the node
// match it exactly within what kvnet owns.
type State struct {
	Networks   []Network
	Ports      []Port
	RemoteMACs []RemoteMAC
	Services   []Service
	// NodeAddrs are the addresses of every node of the cluster: tenants
	// never reach a node port of Services (of any network) at any of
	// them, their own node's included.
	NodeAddrs []netip.Addr
}

// Route is a route in a pod: to Dst via Via; an invalid Via makes Dst
// on-link.
type Route struct {
	Dst netip.Prefix
	Via netip.Addr
}

// ErrInvalidState matches (errors.Is) every validation error of Apply.
var ErrInvalidState = errors.New("invalid datapath state")

// validate checks s and returns the networks by name. It reports every
// problem, each naming the offending field and value.
func (s *State) validate() (map[string]*Network, error) {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalidState}, args...)...))
	}
	byName := map[string]*Network{} // network name -> network
	byID := map[int]string{}        // network ID -> network name
	for i := range s.Networks {
		n := &s.Networks[i]
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
		for _, p := range n.Subnets {
			if !p.IsValid() || p != p.Masked() {
				bad("network %q: subnet %q is not a valid network prefix", n.Name, p)
			}
		}
		if n.Layer3 != nil {
			validateLayer3(n, bad)
		}
		if n.Primary || n.Layer3 != nil {
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
		} else if len(n.Gateways) != 0 {
			bad("network %q: gateways on a secondary network", n.Name)
		}
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
		if len(n.ServiceAddrs) > 0 {
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
		if n.Physical == "" {
			if n.VLAN != 0 {
				bad("network %q: vlan %d without a physical bridge", n.Name, n.VLAN)
			}
			if n.MTU != 0 {
				bad("network %q: mtu %d on a tunnelled network (it uses the pod MTU)", n.Name, n.MTU)
			}
			continue
		}
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
	ports := map[string]bool{} // host interface name -> seen
	for i, p := range s.Ports {
		if byName[p.Network] == nil {
			bad("ports[%d] %q: unknown network %q", i, p.HostIfName, p.Network)
		}
		if p.HostIfName == "" || len(p.HostIfName) > 15 {
			bad("ports[%d]: host interface name %q must be 1-15 characters", i, p.HostIfName)
		} else if _, _, owned := parseOwnedLink(p.HostIfName); owned {
			bad("port %q: host interface name uses a kvnet-reserved prefix", p.HostIfName)
		}
		if ports[p.HostIfName] {
			bad("port %q: listed twice", p.HostIfName)
		}
		ports[p.HostIfName] = true
		if !isUnicastMAC(p.MAC) {
			bad("port %q: MAC %q is not a unicast Ethernet address", p.HostIfName, p.MAC)
		}
		for _, ip := range p.IPs {
			if !ip.IsValid() {
				bad("port %q: invalid IP %q", p.HostIfName, ip)
			}
		}
	}
	for i, m := range s.RemoteMACs {
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
	for i, a := range s.NodeAddrs {
		if !a.IsValid() || a.IsUnspecified() || a.Zone() != "" {
			bad("nodeAddrs[%d]: %q is not a node address", i, a)
		}
	}
	vips := map[string]string{}         // network + protocol + VIP -> service
	nodePorts := map[string]string{}    // protocol + node port + family -> service
	nodePortNets := map[string]string{} // protocol + node port -> network
	externals := map[string]string{}    // protocol + external address and port -> service
	for i, sv := range s.Services {
		n := byName[sv.Network]
		switch {
		case n == nil:
			bad("services[%d] %q: unknown network %q", i, sv.Name, sv.Network)
			continue
		case !n.Primary:
			bad("service %q: network %q is not primary (services are load-balanced by its router)", sv.Name, sv.Network)
		case sv.ViaNode && (sv.NodePort != 0 || len(sv.External) > 0):
			bad("service %q: a service reached through the node has no node port nor external addresses", sv.Name)
		case !sv.ViaNode && !slices.ContainsFunc(n.ServiceAddrs, func(p netip.Prefix) bool { return p.Addr().Is4() == sv.VIP.Addr().Is4() }):
			bad("service %q: network %q has no service address of its family", sv.Name, sv.Network)
		}
		if sv.Protocol != "TCP" && sv.Protocol != "UDP" {
			bad("service %q: protocol %q: must be TCP or UDP", sv.Name, sv.Protocol)
		}
		if !sv.VIP.IsValid() || sv.VIP.Port() == 0 || sv.VIP.Addr().Zone() != "" {
			bad("service %q: address %q is not an IP and port", sv.Name, sv.VIP)
			continue
		}
		key := sv.Network + "/" + sv.Protocol + "/" + sv.VIP.String()
		if other, dup := vips[key]; dup {
			bad("service %q: %s %s already used by service %q", sv.Name, sv.Protocol, sv.VIP, other)
		}
		vips[key] = sv.Name
		if sv.NodePort != 0 {
			npKey := fmt.Sprintf("%s/%d", sv.Protocol, sv.NodePort)
			fam := npKey + "/" + familyName(sv.VIP.Addr().Is6())
			if other, dup := nodePorts[fam]; dup {
				bad("service %q: node port %s %d already used by service %q", sv.Name, sv.Protocol, sv.NodePort, other)
			}
			nodePorts[fam] = sv.Name
			if owner, taken := nodePortNets[npKey]; taken && owner != sv.Network {
				bad("service %q: node port %s %d already used on network %q", sv.Name, sv.Protocol, sv.NodePort, owner)
			}
			nodePortNets[npKey] = sv.Network
		}
		for _, a := range sv.External {
			switch {
			case sv.NodePort == 0:
				bad("service %q: external address %q needs a node port", sv.Name, a)
			case !a.IsValid() || a.Zone() != "" || a.Is4() != sv.VIP.Addr().Is4() || a.IsUnspecified() || a.IsLoopback() || a.IsMulticast():
				bad("service %q: external address %q is not a unicast address of the service's family", sv.Name, a)
			default:
				key := sv.Protocol + "/" + netip.AddrPortFrom(a, sv.VIP.Port()).String()
				if other, dup := externals[key]; dup {
					bad("service %q: external %s %s already used by service %q", sv.Name, sv.Protocol, netip.AddrPortFrom(a, sv.VIP.Port()), other)
				}
				externals[key] = sv.Name
			}
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
	return byName, errors.Join(errs...)
}

// endpointSubnets are where n's service endpoints may be: its subnets, or
// on a Layer3 network its cluster subnets (endpoints on other nodes).
func endpointSubnets(n *Network) []netip.Prefix {
	if n.Layer3 != nil {
		return n.Layer3.ClusterSubnets
	}
	return n.Subnets
}

// validateLayer3 checks a Layer3 network's own fields.
func validateLayer3(n *Network, bad func(string, ...any)) {
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

// isUnicastMAC reports whether mac is a 6-byte, non-zero unicast address.
func isUnicastMAC(mac net.HardwareAddr) bool {
	return len(mac) == 6 && mac[0]&1 == 0 && !slices.Equal(mac, make(net.HardwareAddr, 6))
}

// Validate reports, as Apply would, every problem of s (errors match
// ErrInvalidState). It touches nothing.
func Validate(s State) error {
	_, err := s.validate()
	return err
}
