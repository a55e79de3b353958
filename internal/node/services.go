package node

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"

	"kvnet.io/kvnet/internal/datapath"
	"kvnet.io/kvnet/internal/dnsproxy"
	"kvnet.io/kvnet/internal/netconf"
	"kvnet.io/kvnet/internal/nodeid"
	"kvnet.io/kvnet/internal/reserved"
)

// serviceAddrs returns a node's service addresses on a primary network
// whose transit subnets are transit (the NAD's "transitSubnet", which
// Desired fills with the cluster's reserved transit subnets when a NAD
// has none): the node ID-th address of each, and the MAC
// derived from the first, 0a:58 and its last four bytes (as OVN derives
// MACs from IPs). The transit subnet never overlaps the network's
// subnets, so neither address nor MAC can be a pod's.
func serviceAddrs(transit string, nodeID int) ([]netip.Prefix, net.HardwareAddr, error) {
	return nodeAddrs("transitSubnet", transit, strings.Split(reserved.DefaultTransit, ","), nodeID)
}

// joinAddrs is serviceAddrs in a network's join subnets (the NAD's
// "joinSubnet", or OVN-Kubernetes' default for UDNs).
func joinAddrs(join string, nodeID int) ([]netip.Prefix, net.HardwareAddr, error) {
	return nodeAddrs("joinSubnet", join, strings.Split(reserved.DefaultJoin, ","), nodeID)
}

// nodeAddrs returns the node ID-th address of each subnet of the
// comma-separated NAD field key (value v, or def if empty) and the MAC
// derived from the first.
func nodeAddrs(key, v string, def []string, nodeID int) ([]netip.Prefix, net.HardwareAddr, error) {
	list := def
	if v != "" {
		list = strings.Split(v, ",")
	}
	var out []netip.Prefix
	for _, s := range list {
		p, err := netip.ParsePrefix(strings.TrimSpace(s))
		if err != nil {
			return nil, nil, fmt.Errorf("%q %q: %w", key, s, err)
		}
		p = p.Masked()
		host := p.Addr().BitLen() - p.Bits()
		if host < 64 && uint64(nodeID) >= uint64(1)<<host-1 {
			return nil, nil, fmt.Errorf("%q %s has no address for node ID %d", key, p, nodeID)
		}
		b := p.Addr().AsSlice()
		low := binary.BigEndian.Uint32(b[len(b)-4:]) + uint32(nodeID)
		binary.BigEndian.PutUint32(b[len(b)-4:], low)
		a, _ := netip.AddrFromSlice(b)
		out = append(out, netip.PrefixFrom(a, p.Bits()))
	}
	if len(out) == 0 {
		return nil, nil, fmt.Errorf("%q %q: no subnet", key, v)
	}
	b := out[0].Addr().AsSlice()
	mac := net.HardwareAddr{0x0a, 0x58, b[len(b)-4], b[len(b)-3], b[len(b)-2], b[len(b)-1]}
	return out, mac, nil
}

// serviceInput is what servicesOf needs of one primary network.
type serviceInput struct {
	node       string // this node's name
	name       string
	conf       *netconf.NetConf
	subnets    []netip.Prefix
	namespaces map[string]bool // namespaces whose primary network it is
	holders    []*holder
	problem    func(format string, args ...any)
}

// subnetOf returns the subnet of subnets holding a, if any.
func subnetOf(subnets []netip.Prefix, a netip.Addr) (netip.Prefix, bool) {
	for _, p := range subnets {
		if p.Contains(a) {
			return p, true
		}
	}
	return netip.Prefix{}, false
}

// servicesOf returns the datapath services of a primary network: each
// port of each Service with a selector and a cluster IP in one of the
// network's namespaces, load-balanced to the running pods the selector
// picks on the network. Services of a family the network has no subnet
// of are left out.
func servicesOf(n serviceInput, services []corev1.Service) []datapath.Service {
	var out []datapath.Service
	for i := range services {
		svc := &services[i]
		if !n.namespaces[svc.Namespace] || len(svc.Spec.Selector) == 0 || svc.Spec.Type == corev1.ServiceTypeExternalName {
			continue
		}
		sel := labels.SelectorFromSet(svc.Spec.Selector)
		affinity := clientAffinity(svc, n.problem) // once: a problem is the Service's, not each port's
		var picked []*holder
		for _, h := range n.holders {
			if h.pod.Namespace == svc.Namespace && h.active && servesTraffic(h.pod) && sel.Matches(labels.Set(h.pod.Labels)) {
				picked = append(picked, h)
			}
		}
		for _, vip := range clusterIPs(svc) {
			if sub, inside := subnetOf(n.subnets, vip); inside {
				// Pods would reach it on-link, never through the router.
				n.problem("Service %s/%s: cluster IP %s is inside network %s's subnet %s: the cluster's service CIDR must not overlap UDN subnets", svc.Namespace, svc.Name, vip, n.name, sub)
				continue
			}
			external := externalAddrs(svc, vip.Is4())
			for _, port := range svc.Spec.Ports {
				proto, ok := balancedProtocol(port)
				if !ok {
					continue
				}
				ds := datapath.Service{Network: n.name, Protocol: proto, VIP: netip.AddrPortFrom(vip, uint16(port.Port)), Name: portName(svc, port),
					Affinity: affinity}
				if (svc.Spec.Type == corev1.ServiceTypeNodePort || svc.Spec.Type == corev1.ServiceTypeLoadBalancer) &&
					port.NodePort > 0 && port.NodePort < 65536 {
					ds.NodePort = uint16(port.NodePort)
				}
				if len(external) > 0 {
					if ds.NodePort == 0 {
						n.problem("Service %s/%s port %s: external addresses %v need a node port (allocateLoadBalancerNodePorts: false is not supported on user-defined networks)",
							svc.Namespace, svc.Name, portLabel(port), external)
					} else {
						ds.External = external
					}
				}
				ds.ExternalLocal = ds.NodePort != 0 && svc.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal
				for _, h := range picked {
					target, ok := targetPort(h.pod, port)
					if !ok {
						continue
					}
					for _, s := range h.a.IPAddresses {
						if p, err := netip.ParsePrefix(s); err == nil && p.Addr().Is4() == vip.Is4() {
							ep := netip.AddrPortFrom(p.Addr(), target)
							ds.Endpoints = append(ds.Endpoints, ep)
							if ds.ExternalLocal && h.node == n.node {
								ds.LocalEndpoints = append(ds.LocalEndpoints, ep)
							}
						}
					}
				}
				for _, eps := range []*[]netip.AddrPort{&ds.Endpoints, &ds.LocalEndpoints} {
					slices.SortFunc(*eps, netip.AddrPort.Compare)
					*eps = slices.Compact(*eps)
				}
				out = append(out, ds)
			}
		}
	}
	return out
}

// clientAffinity returns how long svc keeps a client on one endpoint:
// with sessionAffinity ClientIP, its timeoutSeconds (Kubernetes' default,
// 3 hours, when not set); otherwise 0. A timeout out of Kubernetes'
// bounds (the API server refuses it) is a problem, and the default.
func clientAffinity(svc *corev1.Service, problem func(string, ...any)) time.Duration {
	if svc.Spec.SessionAffinity != corev1.ServiceAffinityClientIP {
		return 0
	}
	secs := corev1.DefaultClientIPServiceAffinitySeconds
	if c := svc.Spec.SessionAffinityConfig; c != nil && c.ClientIP != nil && c.ClientIP.TimeoutSeconds != nil {
		secs = *c.ClientIP.TimeoutSeconds
	}
	if d := time.Duration(secs) * time.Second; secs > 0 && d <= datapath.MaxServiceAffinity {
		return d
	}
	problem("Service %s/%s: sessionAffinityConfig.clientIP.timeoutSeconds %d: must be from 1 to %d; using %d",
		svc.Namespace, svc.Name, secs, int(datapath.MaxServiceAffinity/time.Second), corev1.DefaultClientIPServiceAffinitySeconds)
	return time.Duration(corev1.DefaultClientIPServiceAffinitySeconds) * time.Second
}

// nodeAddrClaims makes the node ports and external addresses of services
// exclusive across a node's plan: the API server keeps node ports unique,
// but two Services (of one tenant or two) may both claim an external
// address and port; the first in the plan gets it, and the other's claim
// is a problem while the rest of its service stays.
type nodeAddrClaims struct {
	nodePorts map[string]string // protocol/port -> network
	external  map[string]string // protocol/address:port -> service
}

func newNodeAddrClaims() *nodeAddrClaims {
	return &nodeAddrClaims{nodePorts: map[string]string{}, external: map[string]string{}}
}

// admit takes services' claims, removing those already taken, and
// returns a function that gives back the claims it took.
func (c *nodeAddrClaims) admit(services []datapath.Service, problem func(string, ...any)) (undo func()) {
	var tookPorts, tookExternal []string
	undo = func() {
		for _, k := range tookPorts {
			delete(c.nodePorts, k)
		}
		for _, k := range tookExternal {
			delete(c.external, k)
		}
	}
	for i := range services {
		sv := &services[i]
		if sv.NodePort != 0 {
			key := fmt.Sprintf("%s/%d", sv.Protocol, sv.NodePort)
			if owner, taken := c.nodePorts[key]; taken && owner != sv.Network {
				problem("Service %s: node port %s %d is already network %s's", sv.Name, sv.Protocol, sv.NodePort, owner)
				sv.NodePort, sv.External = 0, nil
				continue
			}
			if _, had := c.nodePorts[key]; !had {
				tookPorts = append(tookPorts, key)
			}
			c.nodePorts[key] = sv.Network
		}
		var kept []netip.Addr
		for _, a := range sv.External {
			at := netip.AddrPortFrom(a, sv.VIP.Port())
			key := sv.Protocol + "/" + at.String()
			if other, taken := c.external[key]; taken {
				problem("Service %s: external address %s %s is already Service %s's", sv.Name, sv.Protocol, at, other)
				continue
			}
			c.external[key] = sv.Name
			tookExternal = append(tookExternal, key)
			kept = append(kept, a)
		}
		sv.External = kept
	}
	return undo
}

// externalAddrs returns the addresses of svc's family (v4 or not) at which
// it is reached from outside the cluster: for a LoadBalancer, the ingress
// IPs of its status that a load balancer implementation delivers to the
// nodes (ipMode VIP, the default; ipMode Proxy: the load balancer connects
// to the node ports itself), sorted, without duplicates. spec.externalIPs
// are not served: any tenant who may create a Service could take any
// address with them, the node's own or its DNS server's, from the node and
// from every pod (CVE-2020-8554); a load balancer's status is written by
// its controller only.
func externalAddrs(svc *corev1.Service, v4 bool) []netip.Addr {
	var out []netip.Addr
	add := func(s string) {
		if a, err := netip.ParseAddr(s); err == nil && a.Unmap().Is4() == v4 && a.IsGlobalUnicast() && a.Zone() == "" {
			out = append(out, a.Unmap())
		}
	}
	if svc.Spec.Type == corev1.ServiceTypeLoadBalancer {
		for _, in := range svc.Status.LoadBalancer.Ingress {
			if in.IPMode == nil || *in.IPMode == corev1.LoadBalancerIPModeVIP {
				add(in.IP)
			}
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out)
}

// clusterIPs returns svc's cluster IPs (spec.clusterIPs, or the older
// spec.clusterIP), without "None" (headless) and anything unparsable.
func clusterIPs(svc *corev1.Service) []netip.Addr {
	ips := svc.Spec.ClusterIPs
	if len(ips) == 0 && svc.Spec.ClusterIP != "" {
		ips = []string{svc.Spec.ClusterIP}
	}
	var out []netip.Addr
	for _, t := range ips {
		if a, err := netip.ParseAddr(t); err == nil {
			out = append(out, a)
		}
	}
	return out
}

// balancedProtocol returns port's protocol if routers balance it: TCP
// (also when unset) or UDP.
func balancedProtocol(port corev1.ServicePort) (string, bool) {
	proto := cmp.Or(port.Protocol, corev1.ProtocolTCP)
	return string(proto), proto == corev1.ProtocolTCP || proto == corev1.ProtocolUDP
}

// portLabel names a Service port: its name, else its number.
func portLabel(port corev1.ServicePort) string { return cmp.Or(port.Name, fmt.Sprint(port.Port)) }

// portName names one port of svc in plans and rule comments:
// "<namespace>/<name>:<port>".
func portName(svc *corev1.Service, port corev1.ServicePort) string {
	return fmt.Sprintf("%s/%s:%s", svc.Namespace, svc.Name, portLabel(port))
}

// servesTraffic reports whether pod may be a service endpoint: running,
// not being deleted, and Ready if it says.
func servesTraffic(pod *corev1.Pod) bool {
	if pod.DeletionTimestamp != nil || pod.Status.Phase != corev1.PodRunning {
		return false
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return true
}

// targetPort resolves a service port's target on pod: a number, a
// container port's name, or (unset) the service port itself.
func targetPort(pod *corev1.Pod, port corev1.ServicePort) (uint16, bool) {
	switch t := port.TargetPort; {
	case t.Type == intstr.String && t.StrVal != "":
		for _, c := range pod.Spec.Containers {
			for _, cp := range c.Ports {
				if cp.Name == t.StrVal && string(cmp.Or(cp.Protocol, corev1.ProtocolTCP)) == string(cmp.Or(port.Protocol, corev1.ProtocolTCP)) {
					return uint16(cp.ContainerPort), true
				}
			}
		}
		return 0, false
	case t.Type == intstr.Int && t.IntVal > 0 && t.IntVal < 65536:
		return uint16(t.IntVal), true
	case port.Port > 0 && port.Port < 65536:
		return uint16(port.Port), true
	}
	return 0, false
}

// nodeID returns node's ID, if it has a valid one.
func nodeID(node *corev1.Node) (int, bool) {
	if node == nil {
		return 0, false
	}
	return nodeid.Parse(node)
}

// nodePortNetworks returns the primary networks among nets that have
// Services with node ports or external addresses in their namespaces
// (primaryNS: network -> namespaces): these are on every node, since
// their node ports are.
func nodePortNetworks(nets map[string]*network, primaryNS map[string]map[string]bool, services []corev1.Service) map[string]bool {
	byNS := map[string]string{} // namespace -> primary network (the first by name)
	for _, name := range slices.Sorted(maps.Keys(primaryNS)) {
		if n := nets[name]; n != nil && n.conf.IsPrimary() {
			for ns := range primaryNS[name] {
				if _, ok := byNS[ns]; !ok {
					byNS[ns] = name
				}
			}
		}
	}
	out := map[string]bool{}
	for i := range services {
		svc := &services[i]
		name, ok := byNS[svc.Namespace]
		if !ok || len(svc.Spec.Selector) == 0 {
			continue
		}
		if svc.Spec.Type == corev1.ServiceTypeNodePort || svc.Spec.Type == corev1.ServiceTypeLoadBalancer {
			out[name] = true
		}
	}
	return out
}

// allNodeAddrs returns every node's addresses (its VTEP, its InternalIP and
// ExternalIP addresses), at which node ports are open, sorted, without
// duplicates.
func allNodeAddrs(nodes []corev1.Node, vteps map[string]netip.Addr) []netip.Addr {
	var out []netip.Addr
	for _, v := range vteps {
		out = append(out, v)
	}
	for i := range nodes {
		for _, a := range nodes[i].Status.Addresses {
			if a.Type != corev1.NodeInternalIP && a.Type != corev1.NodeExternalIP {
				continue
			}
			if ip, err := netip.ParseAddr(a.Address); err == nil && !ip.IsUnspecified() && ip.Zone() == "" {
				out = append(out, ip.Unmap())
			}
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out)
}

// services returns the Services primary network n (planned as dn) serves
// here: those of its namespaces with endpoints on it, at this node's
// service addresses (set in dn: Layer3 networks serve in their join
// subnet, the others in their transit subnet), then the cluster Services
// (DNS, API server) it reaches through the node, and what the DNS proxy
// does for it (nil: nothing; see proxyDNS).
func (p *planner) services(dn *datapath.Network, n *network, hs []*holder, namespaces map[string]bool) ([]datapath.Service, *dnsproxy.Network) {
	if !dn.Primary {
		return nil, nil
	}
	name, subnets := n.conf.Name, n.subnets
	if n.topology == layer3 {
		subnets = dn.Layer3.ClusterSubnets // endpoints on every node
	}
	services := servicesOf(serviceInput{node: p.in.Node, name: name, conf: n.conf, subnets: subnets, namespaces: namespaces, holders: hs, problem: p.problem}, p.in.Services)
	var viaNode []datapath.Service
	if len(namespaces) > 0 {
		viaNode = viaNodeServices(name, subnets, namespaces, p.clusterSvcs, p.in.EndpointSlices, p.problem)
	}
	dns := p.proxyDNS(*dn, subnets, hs, viaNode)
	if len(services) > 0 {
		id, ok := nodeID(p.self)
		var err error
		switch {
		case !ok:
			p.problem("network %s: this node has no node ID yet (annotation %s, which kvnet-controller writes): %d service ports wait", name, nodeid.Annotation, len(services))
		case n.topology == layer3:
			// Only this router's own pods answer its service port
			// (other nodes' pods answer over the overlay), so the join
			// subnet serves, the overlay keeping the transit subnet.
			dn.ServiceAddrs, dn.ServiceMAC, err = joinAddrs(n.conf.JoinSubnet, id)
		default:
			dn.ServiceAddrs, dn.ServiceMAC, err = serviceAddrs(n.conf.TransitSubnet, id)
		}
		if err != nil {
			p.problem("network %s: services: %v", name, err)
		}
		if dn.ServiceAddrs == nil {
			services = nil
		}
	}
	return append(services, viaNode...), dns
}
