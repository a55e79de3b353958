package node

import (
	"cmp"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"

	nadv1 "kvnet.io/kvnet/api/k8scni/v1"
	kubevirtv1 "kvnet.io/kvnet/api/kubevirt/v1"
	"kvnet.io/kvnet/internal/cni"
	"kvnet.io/kvnet/internal/datapath"
	"kvnet.io/kvnet/internal/dhcp"
	"kvnet.io/kvnet/internal/hostsubnet"
	"kvnet.io/kvnet/internal/ipam"
	"kvnet.io/kvnet/internal/ipam/allocator"
	"kvnet.io/kvnet/internal/netconf"
	"kvnet.io/kvnet/internal/nodeid"
	"kvnet.io/kvnet/internal/physnet"
	"kvnet.io/kvnet/internal/podnetworks"
	"kvnet.io/kvnet/internal/udn"
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
	// Migrating holds the VirtualMachineInstances in live migration: their
	// status.migrationState names a target and is neither completed nor
	// failed.
	Migrating map[types.NamespacedName]bool
	// Announced holds the MACs whose migrated guest announced itself on
	// this node's Standby port (RARP): that port is activated at once.
	Announced map[string]bool
	// Links maps the alias of each local link (cni.PortAlias) to its name.
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
	// ServiceCIDRs are the cluster's Service ranges: a primary network's
	// router reaches only its own Services and the cluster DNS and API
	// server there.
	ServiceCIDRs []netip.Prefix
	// EndpointSlices are those of the cluster DNS and API server Services
	// (others are ignored): primary networks reach them through the node.
	EndpointSlices []discoveryv1.EndpointSlice
	// Gateways returns the gateway per subnet of a primary network; nil
	// uses GatewaysOf. The Agent passes a memoised one.
	Gateways func(*netconf.NetConf) ([]netip.Addr, error)
	// Annotations, if set, memoises parsed pod annotations across calls
	// (parsing dominates the cost of a plan in a large cluster).
	Annotations *AnnotationCache
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
	// DHCP holds, per local primary network, what its DHCP servers hand
	// out: DHCPv4 where it has an IPv4 subnet, router advertisements and
	// DHCPv6 where it has an IPv6 one.
	DHCP []DHCPNetwork
	// Exhausted lists networks whose NAD says the pool is exhausted.
	Exhausted []string
	// Waiting counts local attachments whose host interface kvnet-cni has
	// not made yet.
	Waiting int
	// Problems are inputs that could not be used, each naming the object
	// and field; the rest of the plan is still right.
	Problems []string
	// Unserved maps each network this node cannot attach (a localnet
	// network without a bridge mapping here, or with a VLAN the kernel
	// cannot tag) to why; kvnet-cni refuses its pods with that reason.
	Unserved map[string]string
}

// DHCPNetwork is one primary network's DHCP service on this node.
type DHCPNetwork struct {
	Network  string
	ID       int
	ServerIP netip.Addr // the network's IPv4 gateway; invalid: no DHCPv4
	// Prefixes6 are the network's IPv6 subnets on this node, advertised
	// on-link; none: no router advertisements or DHCPv6. MTU is the
	// advertised MTU.
	Prefixes6 []netip.Prefix
	MTU       int
	Leases    map[string]dhcp.Lease
}

// network is a kvnet network as the NADs describe it.
type network struct {
	conf     *netconf.NetConf
	id       int
	physical string // localnet: this node's bridge on its physical network
	// layer3 is set for a Layer3 network; subnets are then this node's
	// host subnets and gateways its router's addresses in them.
	layer3    *hostsubnet.Network
	subnets   []netip.Prefix
	gateways  []netip.Addr
	exhausted bool
}

// holder is one pod attachment of a network.
type holder struct {
	pod    *corev1.Pod
	nadKey string
	node   string
	a      podnetworks.Attachment
	mac    net.HardwareAddr
	active bool // where the MAC lives now (see activeHolders)
	// migrating: one of the two holders of a VM's MAC in live migration;
	// both ports are attached, and the bridges follow the guest's frames.
	migrating bool
}

// Desired computes the node's plan from the API's view. It never fails:
// what cannot be used is skipped and reported in Plan.Problems.
func Desired(in Input) Plan {
	var plan Plan
	problem := func(format string, args ...any) { plan.Problems = append(plan.Problems, fmt.Sprintf(format, args...)) }
	gateways := in.Gateways
	if gateways == nil {
		gateways = GatewaysOf
	}

	self := nodeNamed(in.Nodes, in.Node)
	var mappings map[string]string // physical network -> this node's bridge
	var mappingsErr error
	lacksVLAN := false
	if self != nil {
		if mappings, mappingsErr = physnet.ParseBridgeMappings(self.Annotations[physnet.BridgeMappingsAnnotation]); mappingsErr != nil {
			problem("node %s: annotation %s: %v", in.Node, physnet.BridgeMappingsAnnotation, mappingsErr)
		}
		lacksVLAN = physnet.LacksVLAN(self)
	}
	hostSubnets := nodeHostSubnets(self, problem)
	claims := newNodeAddrClaims()
	clusterSvcs := clusterServices(in)
	dnsServers := clusterDNSServers(clusterSvcs, clusterDNSOf(in))
	unserved := func(name, format string, args ...any) {
		if plan.Unserved == nil {
			plan.Unserved = map[string]string{}
		}
		plan.Unserved[name] = fmt.Sprintf(format, args...)
	}

	nets := map[string]*network{}             // network name -> network
	primaryNS := map[string]map[string]bool{} // primary network name -> its namespaces
	for i := range in.NADs {
		nad := &in.NADs[i]
		key := nad.Namespace + "/" + nad.Name
		conf, err := netconf.Parse(nad.Spec.Config)
		if err != nil {
			problem("NAD %s: %v", key, err)
			continue
		}
		if conf == nil {
			continue // another plugin
		}
		if conf.IsPrimary() {
			if primaryNS[conf.Name] == nil {
				primaryNS[conf.Name] = map[string]bool{}
			}
			primaryNS[conf.Name][nad.Namespace] = true
		}
		if n := nets[conf.Name]; n != nil {
			n.exhausted = n.exhausted || nad.Annotations[udn.PoolExhaustedAnnotation] == "true"
			continue // another namespace's NAD of a CUDN: same network
		}
		if _, ok := plan.Unserved[conf.Name]; ok {
			continue
		}
		var l3 *hostsubnet.Network
		switch conf.Topology {
		case netconf.TopologyLayer2, netconf.TopologyLocalnet:
		case netconf.TopologyLayer3:
			nw, err := hostsubnet.FromConf(conf)
			if err != nil {
				problem("NAD %s: %v", key, err)
				continue
			}
			l3 = &nw
		default:
			problem("NAD %s: topology %q: kvnet-node programs layer2, layer3 and localnet networks only", key, conf.Topology)
			continue
		}
		var physical string
		if conf.Topology == netconf.TopologyLocalnet {
			physical = mappings[conf.PhysicalNetworkName]
			switch {
			case conf.IsPrimary():
				problem("NAD %s: a localnet network cannot be primary (\"role\": %q)", key, conf.Role)
				continue
			case mappingsErr != nil:
				unserved(conf.Name, "node %s: its annotation %s is invalid: %v", in.Node, physnet.BridgeMappingsAnnotation, mappingsErr)
				continue
			case physical == "":
				unserved(conf.Name, "node %s has no bridge for physical network %q: add %q to its annotation %s", in.Node, conf.PhysicalNetworkName, conf.PhysicalNetworkName+":<bridge>", physnet.BridgeMappingsAnnotation)
				continue
			case in.Bridges != nil && !in.Bridges[physical]:
				unserved(conf.Name, "node %s maps physical network %q to %q, which is not a Linux bridge there (annotation %s)", in.Node, conf.PhysicalNetworkName, physical, physnet.BridgeMappingsAnnotation)
				continue
			case conf.VLANID != 0 && lacksVLAN:
				unserved(conf.Name, "%s", physnet.NoVLANReason(in.Node, conf.VLANID))
				continue
			}
		}
		id, err := strconv.Atoi(nad.Annotations[udn.NetworkIDAnnotation])
		if err != nil || id < 1 || id > datapath.MaxNetworkID {
			problem("NAD %s: annotation %s=%q is not a network ID 1-%d", key, udn.NetworkIDAnnotation, nad.Annotations[udn.NetworkIDAnnotation], datapath.MaxNetworkID)
			continue
		}
		n := &network{conf: conf, id: id, physical: physical, layer3: l3, exhausted: nad.Annotations[udn.PoolExhaustedAnnotation] == "true"}
		if l3 != nil {
			// This node's host subnets, with its router in each.
			if n.subnets = hostSubnets[conf.Name]; len(n.subnets) == 0 {
				unserved(conf.Name, "node %s has no host subnet of layer3 network %q yet (annotation %s, which kvnet-controller writes)", in.Node, conf.Name, hostsubnet.Annotation)
				continue
			}
			for _, p := range n.subnets {
				n.gateways = append(n.gateways, hostsubnet.Gateway(p))
			}
			nets[conf.Name] = n
			continue
		}
		if n.subnets, err = netconf.ParsePrefixes("subnets", conf.Subnets); err != nil {
			problem("NAD %s: %v", key, err)
			continue
		}
		if conf.IsPrimary() {
			if n.gateways, err = gateways(conf); err != nil {
				problem("NAD %s: %v", key, err)
				continue
			}
		}
		nets[conf.Name] = n
	}
	for name, n := range nets {
		if n.exhausted {
			plan.Exhausted = append(plan.Exhausted, name)
		}
	}
	slices.Sort(plan.Exhausted)

	vteps := map[string]netip.Addr{} // node name -> VTEP
	for i := range in.Nodes {
		nd := &in.Nodes[i]
		v, ok := nd.Annotations[VTEPAnnotation]
		if !ok {
			continue
		}
		ip, err := netip.ParseAddr(v)
		if err != nil || ip.IsUnspecified() {
			problem("node %s: annotation %s=%q is not an IP address", nd.Name, VTEPAnnotation, v)
			continue
		}
		vteps[nd.Name] = ip
	}

	// Every attachment to a known network of a pod that may be running on
	// a node with a VTEP (or on this node).
	holders := map[string][]*holder{} // network name -> holders
	parsed := map[types.UID]parsedAnnotation{}
	if in.Annotations != nil {
		defer func() { in.Annotations.m = parsed }() // drops pods that are gone
	}
	for i := range in.Pods {
		pod := &in.Pods[i]
		value, ok := pod.Annotations[podnetworks.Annotation]
		if !ok || pod.Spec.NodeName == "" || podnetworks.Completed(pod) {
			continue
		}
		if _, hasVTEP := vteps[pod.Spec.NodeName]; !hasVTEP && pod.Spec.NodeName != in.Node {
			continue
		}
		attachments, err := in.Annotations.parse(pod, value, parsed)
		if err != nil {
			problem("pod %s/%s: %v", pod.Namespace, pod.Name, err)
			continue
		}
		for _, nadKey := range slices.Sorted(maps.Keys(attachments)) {
			a := attachments[nadKey]
			if nets[a.Network] == nil {
				continue // not a kvnet-cni network (kvnet-ipam), or unknown
			}
			holders[a.Network] = append(holders[a.Network], &holder{pod: pod, nadKey: nadKey, node: pod.Spec.NodeName, a: a, mac: a.MAC()})
		}
	}

	nodePortNets := nodePortNetworks(nets, primaryNS, in.Services)
	if len(nodePortNets) > 0 {
		plan.State.NodeAddrs = allNodeAddrs(in.Nodes, vteps)
	}
	var nodeSubnets map[string]hostsubnet.Subnets // node -> its host subnets, once a Layer3 network needs them
	for _, name := range slices.Sorted(maps.Keys(holders)) {
		n, hs := nets[name], holders[name]
		activeHolders(hs, in.VMINodes)
		markMigrating(hs, in.Migrating)
		local := slices.ContainsFunc(hs, func(h *holder) bool { return h.node == in.Node })
		// The nodes that hold the network besides this one: those with
		// its pods, or every node if it has node ports (they are open on
		// every node).
		members := remoteNodes(hs, in.Node)
		if nodePortNets[name] {
			for nodeName, v := range vteps {
				// A node with this node's VTEP is this machine under an
				// old name: never a peer.
				if nodeName != in.Node && v != vteps[in.Node] {
					members[nodeName] = true
				}
			}
		} else if !local {
			continue // the network has no pod here: nothing of it on this node
		}
		dn := datapath.Network{Name: name, ID: n.id, Primary: n.conf.IsPrimary(), Subnets: n.subnets}
		if dn.Primary {
			dn.Gateways = n.gateways
			dn.ServiceCIDRs = familiesOf(in.ServiceCIDRs, n.subnets)
		}
		switch {
		case n.layer3 != nil:
			dn.Gateways = n.gateways
			var err error
			if nodeSubnets == nil {
				// Parsed once per plan, for every Layer3 network.
				nodeSubnets = map[string]hostsubnet.Subnets{}
				for i := range in.Nodes {
					nodeSubnets[in.Nodes[i].Name] = nodeHostSubnets(&in.Nodes[i], func(string, ...any) {})
				}
			}
			if dn.Layer3, err = layer3Of(n, members, in, self, vteps, nodeSubnets); err != nil {
				problem("network %s: %v", name, err)
				continue
			}
		case n.physical != "":
			// Localnet: the physical network carries it between nodes.
			dn.Physical, dn.VLAN, dn.MTU = n.physical, n.conf.VLANID, cmp.Or(n.conf.MTU, udn.LocalnetDefaultMTU)
		default:
			remotes := map[netip.Addr]bool{}
			for nodeName := range members {
				if v, ok := vteps[nodeName]; ok {
					remotes[v] = true
				}
			}
			dn.Remotes = slices.SortedFunc(maps.Keys(remotes), netip.Addr.Compare)
		}
		var services, viaNode []datapath.Service
		if dn.Primary {
			subnets := n.subnets
			if dn.Layer3 != nil {
				subnets = dn.Layer3.ClusterSubnets // endpoints on every node
			}
			services = servicesOf(serviceInput{name: name, conf: n.conf, subnets: subnets, namespaces: primaryNS[name], holders: hs, problem: problem}, in.Services)
			if len(primaryNS[name]) > 0 {
				viaNode = viaNodeServices(name, subnets, primaryNS[name], clusterSvcs, in.EndpointSlices, problem)
			}
		}
		if len(services) > 0 {
			var err error
			id, ok := nodeID(self)
			switch {
			case !ok:
				problem("network %s: this node has no node ID yet (annotation %s, which kvnet-controller writes): %d service ports wait", name, nodeid.Annotation, len(services))
			default:
				if n.layer3 != nil {
					// Only this router's own pods answer its service
					// port (other nodes' pods answer over the overlay),
					// so the join subnet serves, the overlay keeping
					// the transit subnet.
					dn.ServiceAddrs, dn.ServiceMAC, err = joinAddrs(n.conf.JoinSubnet, id)
				} else {
					dn.ServiceAddrs, dn.ServiceMAC, err = serviceAddrs(n.conf.TransitSubnet, id)
				}
				if err != nil {
					problem("network %s: services: %v", name, err)
				}
			}
			if dn.ServiceAddrs == nil {
				services = nil
			}
		}
		services = append(services, viaNode...)
		undo := claims.admit(services, problem)
		// One network the datapath would refuse must not stop the others:
		// Apply refuses a whole state with an invalid network in it.
		if err := datapath.Validate(datapath.State{Networks: []datapath.Network{dn}, Services: services}); err != nil {
			undo() // its claims go to others
			problem("network %s: %v", name, err)
			continue
		}
		plan.State.Networks = append(plan.State.Networks, dn)
		plan.State.Services = append(plan.State.Services, services...)
		if len(services) > 0 && n.layer3 == nil {
			// The other nodes' routers on this network, which endpoints
			// here answer: their service MACs, pinned to their VTEPs.
			for _, nodeName := range slices.Sorted(maps.Keys(members)) {
				other := nodeNamed(in.Nodes, nodeName)
				oid, ok := nodeID(other)
				if !ok || !vteps[nodeName].IsValid() {
					continue
				}
				if _, mac, err := serviceAddrs(n.conf.TransitSubnet, oid); err == nil {
					plan.State.RemoteMACs = append(plan.State.RemoteMACs, datapath.RemoteMAC{Network: name, MAC: mac, VTEP: vteps[nodeName]})
				}
			}
		}

		var leases map[string]dhcp.Lease
		serverIP := firstIPv4(n.gateways)
		prefixes6 := ipv6Prefixes(n.subnets)
		if dn.Primary && (serverIP.IsValid() || len(prefixes6) > 0) {
			leases = map[string]dhcp.Lease{}
		}
		localMAC := map[string]bool{} // MACs with a port on this node
		for _, h := range hs {
			if h.node == in.Node && (h.active || h.migrating) && h.mac != nil {
				localMAC[h.mac.String()] = true
			}
		}
		for _, h := range hs {
			switch {
			case !h.active && !(h.migrating && h.node == in.Node):
				// The other copy of a migrating VM's MAC: nothing here,
				// unless it is the migration's port on this node.
			case h.node != in.Node:
				if n.physical != "" || n.layer3 != nil || (h.migrating && localMAC[h.mac.String()]) {
					// The physical network learns where a MAC is; the
					// bridge learns whether a migrating guest is here.
					continue
				}
				plan.State.RemoteMACs = append(plan.State.RemoteMACs, datapath.RemoteMAC{Network: name, MAC: h.mac, VTEP: vteps[h.node], Migrating: h.migrating})
			default:
				alias := cni.PortAlias(h.pod.Namespace+"/"+h.pod.Name, h.nadKey)
				ifName, ok := in.Links[alias]
				if !ok {
					plan.Waiting++
					continue
				}
				port := datapath.Port{Network: name, HostIfName: ifName, MAC: h.mac, Migrating: h.migrating,
					// A migration target waits for its guest's announce.
					Standby: h.migrating && !h.active && !in.Announced[h.mac.String()]}
				for _, s := range h.a.IPAddresses {
					if p, err := netip.ParsePrefix(s); err == nil {
						port.IPs = append(port.IPs, p)
					}
				}
				plan.State.Ports = append(plan.State.Ports, port)
				if leases != nil && h.active {
					if l, ok := lease(h, serverIP, n.conf.MTU, dnsServers, in); ok {
						leases[h.mac.String()] = l
					}
				}
			}
		}
		if leases != nil {
			plan.DHCP = append(plan.DHCP, DHCPNetwork{Network: name, ID: n.id, ServerIP: serverIP, Leases: leases,
				Prefixes6: prefixes6, MTU: cmp.Or(n.conf.MTU, in.MTU)})
		}
	}
	return plan
}

// activeHolders marks, for each MAC, the one holder that has it now. A MAC
// held twice is a VM in live migration (two launcher pods share the
// claim's MAC): the holder on the VMI's status.nodeName wins, which
// KubeVirt switches when the migration completes; without a VMI, a pod not
// being deleted wins over one that is, then the newest pod.
func activeHolders(hs []*holder, vmiNodes map[types.NamespacedName]string) {
	byMAC := map[string][]*holder{}
	for _, h := range hs {
		if h.mac != nil {
			byMAC[h.mac.String()] = append(byMAC[h.mac.String()], h)
		}
	}
	for _, group := range byMAC {
		best := slices.MaxFunc(group, func(a, b *holder) int {
			return cmp.Or(
				cmpBool(onVMINode(a, vmiNodes), onVMINode(b, vmiNodes)),
				cmpBool(a.pod.DeletionTimestamp == nil, b.pod.DeletionTimestamp == nil),
				a.pod.CreationTimestamp.Compare(b.pod.CreationTimestamp.Time),
				cmp.Compare(a.pod.Name, b.pod.Name),
			)
		})
		best.active = true
	}
}

// markMigrating marks both holders of each MAC held twice by the launcher
// pods of a VMI in live migration.
func markMigrating(hs []*holder, migrating map[types.NamespacedName]bool) {
	byMAC := map[string][]*holder{}
	for _, h := range hs {
		if h.mac != nil {
			byMAC[h.mac.String()] = append(byMAC[h.mac.String()], h)
		}
	}
	for _, group := range byMAC {
		if len(group) != 2 {
			continue
		}
		vmi := group[0].pod.Annotations[kubevirtv1.DomainAnnotation]
		key := types.NamespacedName{Namespace: group[0].pod.Namespace, Name: vmi}
		if vmi == "" || !migrating[key] || group[1].pod.Namespace != key.Namespace ||
			group[1].pod.Annotations[kubevirtv1.DomainAnnotation] != vmi || group[0].node == group[1].node {
			continue
		}
		group[0].migrating, group[1].migrating = true, true
	}
}

func onVMINode(h *holder, vmiNodes map[types.NamespacedName]string) bool {
	vmi := h.pod.Annotations[kubevirtv1.DomainAnnotation]
	if vmi == "" {
		return false
	}
	node, ok := vmiNodes[types.NamespacedName{Namespace: h.pod.Namespace, Name: vmi}]
	return ok && node == h.node
}

func cmpBool(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return 1
	default:
		return -1
	}
}

// lease is what the DHCP servers give h: its IPv4 address with the
// subnet's mask and its IPv6 address (DHCPv6), the gateway as router, the
// pod interface's MTU (the network's, else the node's pod MTU, as
// kvnet-cni sets it), and the VM's name as hostname.
func lease(h *holder, router netip.Addr, mtu int, clusterDNS []netip.Addr, in Input) (dhcp.Lease, bool) {
	if mtu == 0 {
		mtu = in.MTU
	}
	host := h.pod.Annotations[kubevirtv1.DomainAnnotation]
	if host == "" {
		host = h.pod.Name
	}
	l := dhcp.Lease{Router: router, DNS: guestDNS(clusterDNS, in.DNS), MTU: mtu, Hostname: host}
	if len(clusterDNS) > 0 {
		l.Search = clusterSearch(h.pod.Namespace, in.ClusterDomain)
	}
	for _, s := range h.a.IPAddresses {
		p, err := netip.ParsePrefix(s)
		switch {
		case err != nil:
		case p.Addr().Is4() && !l.IP.IsValid():
			l.IP = p
		case p.Addr().Is6() && !l.IP6.IsValid():
			l.IP6 = p.Addr()
		}
	}
	return l, l.IP.IsValid() || l.IP6.IsValid()
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

// nodeNamed returns the node called name in nodes, or nil.
func nodeNamed(nodes []corev1.Node, name string) *corev1.Node {
	for i := range nodes {
		if nodes[i].Name == name {
			return &nodes[i]
		}
	}
	return nil
}

// remoteNodes returns the nodes other than self that hold an attachment of
// a network.
func remoteNodes(hs []*holder, self string) map[string]bool {
	out := map[string]bool{}
	for _, h := range hs {
		if h.node != self {
			out[h.node] = true
		}
	}
	return out
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

// layer3Of returns what the router of Layer3 network n on this node needs:
// its overlay address and MAC (from the node ID, in the network's transit
// subnet) and the routers of the other nodes with pods of it.
func layer3Of(n *network, members map[string]bool, in Input, self *corev1.Node, vteps map[string]netip.Addr, nodeSubnets map[string]hostsubnet.Subnets) (*datapath.Layer3, error) {
	id, ok := nodeID(self)
	if !ok {
		return nil, fmt.Errorf("this node has no node ID yet (annotation %s, which kvnet-controller writes)", nodeid.Annotation)
	}
	l3 := &datapath.Layer3{}
	for _, s := range n.layer3.Subnets {
		l3.ClusterSubnets = append(l3.ClusterSubnets, s.CIDR)
	}
	var err error
	if l3.Addrs, l3.MAC, err = serviceAddrs(n.conf.TransitSubnet, id); err != nil {
		return nil, err
	}
	for _, nodeName := range slices.Sorted(maps.Keys(members)) {
		other := nodeNamed(in.Nodes, nodeName)
		oid, ok := nodeID(other)
		vtep, hasVTEP := vteps[nodeName]
		subnets := nodeSubnets[nodeName][n.conf.Name]
		if !ok || !hasVTEP || len(subnets) == 0 {
			continue // not ready: its pods are unreachable until it is
		}
		addrs, mac, err := serviceAddrs(n.conf.TransitSubnet, oid)
		if err != nil {
			continue
		}
		p := datapath.Layer3Peer{VTEP: vtep, MAC: mac, Subnets: subnets}
		for _, a := range addrs {
			p.Addrs = append(p.Addrs, a.Addr())
		}
		l3.Peers = append(l3.Peers, p)
	}
	return l3, nil
}
