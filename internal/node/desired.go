package node

import (
	"fmt"
	"maps"
	"net"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/types"

	nadv1 "kvnet.io/kvnet/api/k8scni/v1"
	mnpv1beta1 "kvnet.io/kvnet/api/k8scni/v1beta1"
	"kvnet.io/kvnet/internal/datapath"
	"kvnet.io/kvnet/internal/dhcp"
	"kvnet.io/kvnet/internal/dnsproxy"
	"kvnet.io/kvnet/internal/hostsubnet"
	"kvnet.io/kvnet/internal/ipam"
	"kvnet.io/kvnet/internal/ipam/allocator"
	"kvnet.io/kvnet/internal/migration"
	"kvnet.io/kvnet/internal/netconf"
	"kvnet.io/kvnet/internal/physnet"
	"kvnet.io/kvnet/internal/podnetworks"
	"kvnet.io/kvnet/internal/reserved"
)

// VTEPAnnotation is the node annotation holding the node's underlay
// address (its VXLAN tunnel endpoint). Each kvnet-node writes it on its own
// node at start; a node without it hosts no kvnet pods as far as the
// others are concerned.
const VTEPAnnotation = "kvnet.io/vtep"

// Input is everything Desired needs. Slices are read only.
type Input struct {
	Node  string // this node's name
	NADs  []nadv1.NetworkAttachmentDefinition
	Pods  []corev1.Pod
	Nodes []corev1.Node
	// VMINodes maps a VirtualMachineInstance to its status.nodeName.
	VMINodes map[types.NamespacedName]string
	// Migrations holds each VirtualMachineInstance's last live migration
	// (migration.Of), by VMI. While one is in progress, its source and
	// target launcher pods hold the VM's MAC and both get a port.
	Migrations map[types.NamespacedName]*migration.Migration
	// LauncherDHCPv4 holds the VirtualMachineInstances whose virt-launcher
	// serves the guest DHCPv4 on the pod network itself (the bridge
	// binding, launcherServesDHCPv4): their launcher pods get no DHCPv4
	// lease from the node.
	LauncherDHCPv4 map[types.NamespacedName]bool
	// Announced holds the MACs whose migrated guest announced itself on
	// this node's Standby port (its first frame there: QEMU's RARP or an
	// IP packet, see announce.go): that port is open although the VMI
	// still names the source node (the switch-over's second place, see
	// package migration).
	Announced map[string]bool
	// GuestArrived holds the migration target launcher pods whose guest's
	// first frame reached their port (migration.GuestArrivedAnnotation,
	// written by the target node's kvnet-node).
	GuestArrived map[types.NamespacedName]bool
	// Links maps the alias of each local link (portalias.Format) to its name.
	Links map[string]string
	// Services are the cluster's Services: those of a primary network's
	// namespaces are load-balanced by the network's router to its pods.
	// Of two Services claiming one external address, the first wins (the
	// Agent lists the oldest first).
	Services []corev1.Service
	// Bridges holds the names of the node's Linux bridges, which a
	// localnet network's bridge mapping must name; nil: not known, not
	// checked.
	Bridges map[string]bool
	// MTU is the node's pod MTU: option 26 for networks that set none.
	// DNS servers are option 6.
	MTU int
	DNS []netip.Addr
	// ClusterDNS names the cluster DNS Service (default kube-system/kube-dns)
	// and ClusterDomain the cluster's DNS domain (default cluster.local).
	// Where the Service exists, DHCP hands its IPv4 cluster IP to guests
	// on primary networks instead of DNS, with the namespace's search
	// list.
	ClusterDNS    types.NamespacedName
	ClusterDomain string
	// DNSProxyPort, when not 0, sends primary networks' DNS queries to
	// kvnet-node's DNS proxy at this port (dnsproxy.go), which rewrites
	// the network's pods' default-network addresses in the answers to
	// their addresses on the network (headless Services, hostnames).
	DNSProxyPort uint16
	// ServiceCIDRs are the cluster's Service ranges: a primary network's
	// router reaches only its own Services and the cluster DNS and API
	// server there.
	ServiceCIDRs []netip.Prefix
	// DefaultNetworkCIDRs are the cluster default network's pod ranges
	// beyond the Nodes' spec.podCIDRs: a primary network's router refuses
	// them as it refuses those.
	DefaultNetworkCIDRs []netip.Prefix
	// Reserved are the cluster's reserved subnets: a primary network whose
	// NAD names no "joinSubnet" or "transitSubnet" (Layer3 NADs, and
	// hand-written ones) uses their join and transit subnets. Zero: the
	// defaults.
	Reserved reserved.Subnets
	// EndpointSlices are those of the cluster DNS and API server Services
	// (others are ignored): primary networks reach them through the node.
	EndpointSlices []discoveryv1.EndpointSlice
	// Gateways returns the gateway per subnet of a primary network; nil
	// uses GatewaysOf. The Agent passes a memoised one.
	Gateways func(*netconf.NetConf) ([]netip.Addr, error)
	// NetworkPolicies are the cluster's NetworkPolicies, and Namespaces
	// its namespaces (their labels): a primary network's policies are
	// those of its namespaces (see policy.go).
	NetworkPolicies []networkingv1.NetworkPolicy
	Namespaces      []corev1.Namespace
	// MultiNetworkPolicies are the cluster's MultiNetworkPolicies: a
	// secondary network's are those whose policy-for annotation names one
	// of its NADs (see mnp.go).
	MultiNetworkPolicies []mnpv1beta1.MultiNetworkPolicy
	// Annotations, if set, memoises parsed pod annotations across calls
	// (parsing dominates the cost of a plan in a large cluster).
	Annotations *AnnotationCache
	// NetConfs, if set, memoises parsed NAD configurations across calls
	// (with 1,000 networks, parsing them was half of a plan).
	NetConfs *NetConfCache
}

// NetConfCache holds NADs' parsed configurations by their text, primary
// ones with the reserved subnets they were filled with (fillReserved). It
// is not safe for concurrent use; an Agent owns one.
type NetConfCache struct {
	reserved reserved.Subnets // what the primary ones were filled with
	m        map[string]parsedConf
}

type parsedConf struct {
	conf *netconf.NetConf // nil: another plugin's; never handed out
	err  error
}

// parse returns netconf.Parse(config), completed by fillReserved with r
// when primary: from c when it has config, and as a copy the caller may
// change. next records the entry for the next plan.
func (c *NetConfCache) parse(config string, r reserved.Subnets, next map[string]parsedConf) (*netconf.NetConf, error) {
	var pc parsedConf
	cached := false
	if c != nil {
		pc, cached = c.m[config]
	}
	if !cached {
		pc.conf, pc.err = netconf.Parse(config)
		if pc.conf != nil && pc.conf.IsPrimary() {
			fillReserved(pc.conf, r)
		}
	}
	if next != nil {
		next[config] = pc
	}
	if pc.conf == nil {
		return nil, pc.err
	}
	conf := *pc.conf // the plan's own: the cached one stays as parsed
	return &conf, pc.err
}

// start begins a plan with reserved subnets r: it forgets every entry
// when they changed, and returns the map the plan fills for the next
// (nil when c is nil).
func (c *NetConfCache) start(r reserved.Subnets) map[string]parsedConf {
	if c == nil {
		return nil
	}
	if !slices.Equal(c.reserved.Join, r.Join) || !slices.Equal(c.reserved.Transit, r.Transit) || !slices.Equal(c.reserved.Masquerade, r.Masquerade) {
		c.reserved, c.m = r, nil
	}
	return make(map[string]parsedConf, len(c.m))
}

// AnnotationCache holds parsed kvnet.io/pod-networks annotations by pod
// UID. It is not safe for concurrent use; an Agent owns one.
type AnnotationCache struct {
	m map[types.UID]parsedAnnotation
}

type parsedAnnotation struct {
	value string
	nets  podnetworks.Networks
	err   error
}

// parse returns the pod's parsed annotation, from the cache when the
// value has not changed, and records it in next.
func (c *AnnotationCache) parse(pod *corev1.Pod, value string, next map[types.UID]parsedAnnotation) (podnetworks.Networks, error) {
	if c == nil {
		return podnetworks.Parse(value)
	}
	p, ok := c.m[pod.UID]
	if !ok || p.value != value || pod.UID == "" {
		p.value = value
		p.nets, p.err = podnetworks.Parse(value)
	}
	next[pod.UID] = p
	return p.nets, p.err
}

// Plan is what the node should look like.
type Plan struct {
	State datapath.State
	// DNS holds, per primary network whose pods reach the cluster DNS
	// through the proxy (Input.DNSProxyPort), what the proxy does for it.
	DNS []dnsproxy.Network
	// DHCP holds, per local network with a router, what its DHCP servers
	// hand out: on a primary network DHCPv4 where it has an IPv4 subnet,
	// and on every one router advertisements and DHCPv6 where it has an
	// IPv6 one.
	DHCP []DHCPNetwork
	// Exhausted lists networks whose NAD says the pool is exhausted.
	Exhausted []string
	// Waiting counts local attachments whose host interface kvnet-cni has
	// not made yet.
	Waiting int
	// Problems are inputs that could not be used, each naming the object
	// and field; the rest of the plan is still right.
	Problems []string
	// Neighbours maps each network with a port on Standby to the
	// addresses its live holders and its gateways have, and their MACs:
	// kvnet-node answers a Standby port's ARP requests from them
	// (announcements), since the requests themselves must not leave the
	// port.
	Neighbours map[string]map[netip.Addr]net.HardwareAddr
	// Unserved maps each network this node cannot attach (a localnet
	// network without a bridge mapping here, or with a VLAN the kernel
	// cannot tag) to why; kvnet-cni refuses its pods with that reason.
	Unserved map[string]string
	// ProbeFrom maps each network with a port on Standby or a migration
	// source's port and an IPv4 gateway to that gateway: kvnet-node's
	// standby and source probes come from it (announce.go, departure.go).
	ProbeFrom map[string]Gateway
	// MigrationTargets are the ports of live migrations' targets on this
	// node while the API still names the source (open at the guest's
	// first frame, or still on Standby): what switchovers follows.
	MigrationTargets []MigrationTarget
	// MigrationSources are the ports of live migrations' sources on this
	// node while the guest still runs here: what departures follows.
	MigrationSources []MigrationSource
	// DepartedSources holds the network/MAC (switchKey) of each local
	// launcher pod that was its VMI's last migration source while the
	// VMI runs on another node: its guest left.
	DepartedSources map[string]bool
	// PodNetworks are the networks whose pods this node needs: those with
	// a pod here and the primary networks whose node ports it opens
	// (under PodScopeNetworks, the networks whose pods it watches).
	PodNetworks map[string]bool
}

// Gateway is a network's gateway address on this node and its MAC.
type Gateway struct {
	IP  netip.Addr
	MAC net.HardwareAddr
}

// DHCPNetwork is one network's DHCP service on this node.
type DHCPNetwork struct {
	Network  string
	ID       int
	ServerIP netip.Addr // the network's IPv4 gateway; invalid: no DHCPv4
	// Prefixes6 are the network's IPv6 subnets on this node, advertised
	// on-link; none: no router advertisements or DHCPv6. MTU is the
	// advertised MTU.
	Prefixes6 []netip.Prefix
	MTU       int
	// DefaultRouter makes the advertisements name the gateway the
	// default router (a primary network); a secondary network's say
	// nothing of routes (router lifetime 0), so the guest keeps its
	// primary network's default route.
	DefaultRouter bool
	Leases        map[string]dhcp.Lease
}

// Desired computes the node's plan from the API's view. It never fails:
// what cannot be used is skipped and reported in Plan.Problems.
//
// It runs in phases, each in its own file:
//  1. networks (networks.go): the NADs become networks, each of one
//     topology (topology.go) with what this node needs of it;
//  2. peers (peers.go): the nodes' VTEPs;
//  3. holders (holders.go): the pods' attachments to those networks, and
//     which holder of a MAC is live (live migration);
//  4. per network with holders, its topology's planner (layer2.go,
//     layer3.go, localnet.go) makes the datapath.Network, then its
//     services (services.go), its ports and DHCP leases (ports.go), and
//     on a primary network its NetworkPolicies (policy.go).
func Desired(in Input) Plan {
	p := newPlanner(in)
	nets, primaryNS := p.networks()
	p.vteps = p.peers()
	holders := p.holders(nets)
	nodePortNets := nodePortNetworks(nets, primaryNS, in.Services)
	if len(nodePortNets) > 0 {
		p.plan.State.NodeAddrs = allNodeAddrs(in.Nodes, p.vteps)
	}
	p.plan.PodNetworks = maps.Clone(nodePortNets)
	for _, name := range slices.Sorted(maps.Keys(holders)) {
		if slices.ContainsFunc(holders[name], func(h *holder) bool { return h.node == in.Node }) {
			p.plan.PodNetworks[name] = true
		}
		p.planNetwork(name, nets[name], holders[name], primaryNS[name], nodePortNets[name])
	}
	return p.plan
}

// planner is one call of Desired: its input, the plan it builds and what
// its phases share.
type planner struct {
	in   Input
	plan Plan
	self *corev1.Node // this node; nil while the API does not list it
	// defaultNetworkSubnets are the nodes' pod CIDRs (nodePodCIDRs) and
	// Input.DefaultNetworkCIDRs.
	defaultNetworkSubnets []netip.Prefix
	// mappings are this node's bridge mappings (physical network ->
	// bridge, for localnet networks); mappingsErr why they are unusable.
	mappings    map[string]string
	mappingsErr error
	lacksVLAN   bool               // this node's kernel cannot tag VLANs
	hostSubnets hostsubnet.Subnets // this node's host subnets (Layer3), by network
	gateways    func(*netconf.NetConf) ([]netip.Addr, error)
	claims      *nodeAddrClaims
	clusterSvcs []*corev1.Service
	dnsServers  []netip.Addr          // the cluster DNS Service's IPv4 address, if any
	vteps       map[string]netip.Addr // node name -> VTEP (phase 2)
	// nodeSubnets are every node's host subnets, parsed once per plan on
	// a Layer3 network's first need.
	nodeSubnets map[string]hostsubnet.Subnets
}

func newPlanner(in Input) *planner {
	p := &planner{in: in, gateways: in.Gateways, claims: newNodeAddrClaims()}
	if p.gateways == nil {
		p.gateways = GatewaysOf
	}
	p.self = nodeNamed(in.Nodes, in.Node)
	p.defaultNetworkSubnets = append(nodePodCIDRs(in.Nodes), in.DefaultNetworkCIDRs...)
	if p.self != nil {
		if p.mappings, p.mappingsErr = physnet.ParseBridgeMappings(p.self.Annotations[physnet.BridgeMappingsAnnotation]); p.mappingsErr != nil {
			p.problem("node %s: annotation %s: %v", in.Node, physnet.BridgeMappingsAnnotation, p.mappingsErr)
		}
		p.lacksVLAN = physnet.LacksVLAN(p.self)
	}
	p.hostSubnets = nodeHostSubnets(p.self, p.problem)
	p.clusterSvcs = clusterServices(in)
	p.dnsServers = clusterDNSServers(p.clusterSvcs, clusterDNSOf(in))
	return p
}

// problem reports an input that could not be used.
func (p *planner) problem(format string, args ...any) {
	p.plan.Problems = append(p.plan.Problems, fmt.Sprintf(format, args...))
}

// unserved records why this node cannot attach network name.
func (p *planner) unserved(name, format string, args ...any) {
	if p.plan.Unserved == nil {
		p.plan.Unserved = map[string]string{}
	}
	p.plan.Unserved[name] = fmt.Sprintf(format, args...)
}

// planNetwork plans one network with holders hs: nothing if it has no pod
// here and needs no node port; else its datapath.Network (by its
// topology's planner), services, remote MACs, ports and DHCP leases.
// namespaces are those whose primary network it is.
func (p *planner) planNetwork(name string, n *network, hs []*holder, namespaces map[string]bool, nodePorts bool) {
	p.switchOver(hs)
	members, ok := p.members(hs, nodePorts)
	if !ok {
		return // the network has no pod here: nothing of it on this node
	}
	var dn datapath.Network
	var err error
	switch n.topology {
	case layer2:
		dn = p.planLayer2(n, members)
	case layer3:
		dn, err = p.planLayer3(n, members)
	case localnet:
		dn = p.planLocalnet(n)
	}
	if err != nil {
		p.problem("network %s: %v", name, err)
		return
	}
	services, dns := p.services(&dn, n, hs, namespaces)
	undo := p.claims.admit(services, p.problem)
	// One network the datapath would refuse must not stop the others:
	// Apply refuses a whole state with an invalid network in it.
	if err := datapath.Validate(datapath.State{Networks: []datapath.Network{dn}, Services: services}); err != nil {
		undo() // its claims go to others
		p.problem("network %s: %v", name, err)
		return
	}
	p.plan.State.Networks = append(p.plan.State.Networks, dn)
	p.plan.State.Services = append(p.plan.State.Services, services...)
	if dns != nil {
		p.plan.DNS = append(p.plan.DNS, *dns)
	}
	if len(services) > 0 && n.topology == layer2 {
		p.remoteServiceMACs(n, members)
	}
	first := len(p.plan.State.Ports)
	p.ports(n, dn, hs)
	if dn.Primary {
		p.policies(dn, namespaces, hs, p.plan.State.Ports[first:])
	} else {
		p.multiPolicies(dn, hs, p.plan.State.Ports[first:])
	}
}

// baseNetwork is what every topology's datapath.Network has of n.
func (p *planner) baseNetwork(n *network) datapath.Network {
	dn := datapath.Network{Name: n.conf.Name, ID: n.id, Primary: n.conf.IsPrimary(), Subnets: n.subnets}
	if dn.Primary {
		dn.Gateways = n.gateways
		dn.ServiceCIDRs = familiesOf(p.in.ServiceCIDRs, n.subnets)
		dn.DefaultNetworkSubnets = familiesOf(p.defaultNetworkSubnets, n.subnets)
	}
	return dn
}

// nodePodCIDRs returns the pod subnets of every node's spec.podCIDRs: the
// cluster default network's pods, which tenants never reach (as
// kube-controller-manager assigns them, and Flannel and most default
// networks use them). Invalid entries are skipped.
func nodePodCIDRs(nodes []corev1.Node) []netip.Prefix {
	var out []netip.Prefix
	for _, n := range nodes {
		cidrs := n.Spec.PodCIDRs
		if len(cidrs) == 0 && n.Spec.PodCIDR != "" {
			cidrs = []string{n.Spec.PodCIDR}
		}
		for _, c := range cidrs {
			if p, err := netip.ParsePrefix(c); err == nil {
				out = append(out, p.Masked())
			}
		}
	}
	return out
}

// GatewaysOf returns the gateway of each subnet of a primary network, as
// kvnet-controller's allocator picks them (the first host, or from
// defaultGatewayIPs / infrastructureSubnets).
func GatewaysOf(conf *netconf.NetConf) ([]netip.Addr, error) {
	cfg, err := ipam.NetworkConfig(&netconf.Served{Name: conf.Name, Conf: conf})
	if err != nil {
		return nil, err
	}
	n, err := allocator.NewNetwork(cfg)
	if err != nil {
		return nil, err
	}
	return n.Gateways(), nil
}

func firstIPv4(addrs []netip.Addr) netip.Addr {
	for _, a := range addrs {
		if a.Is4() {
			return a
		}
	}
	return netip.Addr{}
}

// nodeHostSubnets returns the host subnets node holds (see package
// hostsubnet), by network.
func nodeHostSubnets(node *corev1.Node, problem func(string, ...any)) hostsubnet.Subnets {
	if node == nil {
		return nil
	}
	v, ok := node.Annotations[hostsubnet.Annotation]
	if !ok {
		return nil
	}
	s, err := hostsubnet.Parse(v)
	if err != nil {
		problem("node %s: %v", node.Name, err)
		return nil
	}
	return s
}

// nodeNamed returns the node called name in nodes, or nil.
func nodeNamed(nodes []corev1.Node, name string) *corev1.Node {
	for i := range nodes {
		if nodes[i].Name == name {
			return &nodes[i]
		}
	}
	return nil
}
