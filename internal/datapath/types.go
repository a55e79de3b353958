package datapath

import (
	"errors"
	"net"
	"net/netip"
	"slices"
	"time"
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
	// VXLANPort is the UDP port of the node's VXLAN devices, the same on
	// every node; 0 is DefaultVXLANPort. Set it where the cluster default
	// network's own VXLAN uses 4789 (Calico's VXLAN mode does; Flannel and
	// Cilium use 8472).
	VXLANPort int
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
	// networks are pure L2, but for their router when they have one
	// (HasRouter).
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
	// DefaultNetworkSubnets, on a primary network, are the pod subnets of
	// the cluster default network: its router never sends a new
	// connection into them out through the node, whose masquerade would
	// otherwise lead the network's pods to the default network's (a pod
	// whose eth0 has no route to them, as under a /32 layout, sends them
	// to its default route, the network's router). Connections the
	// router translated itself (Service.ViaNode: the cluster DNS, the API
	// server) still go.
	DefaultNetworkSubnets []netip.Prefix
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

// HasRouter reports whether n gets a router namespace: primary networks
// (gateway, egress), Layer3 networks (routing between nodes), and Layer2
// secondary networks with an IPv6 subnet, whose router only serves router
// advertisements and DHCPv6 to guests (GuestServiceOnly). A localnet
// network never has one: its physical network may have routers of its own.
func (n *Network) HasRouter() bool {
	return n.Primary || n.Layer3 != nil || n.Physical == "" && hasV6(networkFamilies(*n))
}

// GuestServiceOnly reports whether n's router only serves IPv6 to guests
// (router advertisements without a default router, and DHCPv6) from its
// gateway interface: it holds no address but its link-local one, forwards
// nothing and has no egress. A Layer2 secondary network has no gateway.
func (n *Network) GuestServiceOnly() bool { return n.HasRouter() && !n.Primary && n.Layer3 == nil }

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
	// Departed marks a Migrating port whose guest left: the migration's
	// source pod once the API names the target node, until the migration
	// ends. Nothing it sends passes: its own stack still holds the
	// guest's MAC and addresses, and would answer for them (a TCP reset
	// to the guest's peers) and teach the bridges the old place.
	Departed bool
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
	// Affinity, when not 0, keeps each client on one endpoint, as
	// sessionAffinity: ClientIP does: a client's new connections go to
	// the endpoint its last one went to while less than Affinity has
	// passed since (whole seconds, at most MaxServiceAffinity). The
	// client is the connection's source address as the router sees it.
	Affinity time.Duration
	// ExternalLocal (externalTrafficPolicy: Local) sends the connections
	// to NodePort and External to LocalEndpoints only, without
	// masquerading their source, so that the endpoint sees the client's
	// address; without local endpoints they are dropped, as kube-proxy
	// drops them. Connections to VIP are not affected.
	ExternalLocal bool
	// LocalEndpoints are those of Endpoints on this node (ExternalLocal
	// only).
	LocalEndpoints []netip.AddrPort
}

// MaxServiceAffinity bounds Service.Affinity, as Kubernetes bounds
// sessionAffinityConfig.clientIP.timeoutSeconds (one day).
const MaxServiceAffinity = 24 * time.Hour

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
	// Policies are the network policies of local ports (see PortPolicy),
	// at most one per port.
	Policies []PortPolicy
	// EndpointPolicies are the ingress policies of the endpoints of the
	// networks' Services, local or not, which each network's router
	// checks on the Service connections it translates (see
	// EndpointPolicy).
	EndpointPolicies []EndpointPolicy
}

// Route is a route in a pod: to Dst via Via; an invalid Via makes Dst
// on-link.
type Route struct {
	Dst netip.Prefix
	Via netip.Addr
}

// ErrInvalidState matches (errors.Is) every validation error of Apply.
var ErrInvalidState = errors.New("invalid datapath state")

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
