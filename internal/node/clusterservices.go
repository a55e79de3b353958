package node

import (
	"cmp"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/types"

	"kvnet.io/kvnet/internal/datapath"
)

// Pods on a primary user-defined network keep two services of the
// cluster default network, as upstream allows: the cluster DNS and the
// Kubernetes API server. Their cluster IPs are translated by each
// network's router to their endpoints (from their EndpointSlices) and
// leave through the node like egress, so they work whatever proxies
// Services on the default network; every other cluster IP leads nowhere
// from a UDN.

// Defaults of Input.ClusterDNS and Input.ClusterDomain.
var (
	DefaultClusterDNS    = types.NamespacedName{Namespace: "kube-system", Name: "kube-dns"}
	DefaultClusterDomain = "cluster.local"
)

// apiServerService is the Service of the Kubernetes API server.
var apiServerService = types.NamespacedName{Namespace: "default", Name: "kubernetes"}

// ClusterServiceNames are the names of the Services whose EndpointSlices
// the agent needs (label kubernetes.io/service-name): the cluster DNS
// Service's, dns, and the API server's.
func ClusterServiceNames(dns types.NamespacedName) []string {
	return slices.Compact(slices.Sorted(slices.Values([]string{dns.Name, apiServerService.Name})))
}

// clusterDNSOf returns in's cluster DNS Service name.
func clusterDNSOf(in Input) types.NamespacedName {
	if in.ClusterDNS.Name == "" {
		return DefaultClusterDNS
	}
	return in.ClusterDNS
}

// clusterServices returns the Services of the cluster default network
// that primary networks reach: the cluster DNS and the API server, those
// of them that exist.
func clusterServices(in Input) []*corev1.Service {
	var out []*corev1.Service
	for _, want := range []types.NamespacedName{clusterDNSOf(in), apiServerService} {
		for i := range in.Services {
			if s := &in.Services[i]; s.Namespace == want.Namespace && s.Name == want.Name {
				out = append(out, s)
			}
		}
	}
	return out
}

// viaNodeServices returns the datapath services of network name (whose
// subnets are subnets and whose namespaces are namespaces) for the
// cluster services svcs: each port of each cluster IP, to the ready
// endpoints of the service's EndpointSlices, reached through the node.
// Endpoints inside the network's subnets cannot be reached from it: they
// are left out, as a problem.
func viaNodeServices(name string, subnets []netip.Prefix, namespaces map[string]bool, svcs []*corev1.Service,
	eps []discoveryv1.EndpointSlice, problem func(string, ...any)) []datapath.Service {
	var out []datapath.Service
	for _, svc := range svcs {
		if namespaces[svc.Namespace] {
			continue // the network's own: servicesOf has it
		}
		for _, vip := range clusterIPs(svc) {
			for _, port := range svc.Spec.Ports {
				proto, ok := balancedProtocol(port)
				if !ok {
					continue
				}
				ds := datapath.Service{Network: name, Protocol: proto, VIP: netip.AddrPortFrom(vip, uint16(port.Port)), ViaNode: true,
					Name: portName(svc, port)}
				for _, ep := range sliceEndpoints(svc, port, vip.Is4(), eps) {
					if !ep.Addr().IsGlobalUnicast() {
						continue // loopback (an API server on a lab's host): not reachable from a router
					}
					if sub, inside := subnetOf(subnets, ep.Addr()); inside {
						problem("Service %s: endpoint %s is inside network %s's subnet %s: unreachable from it", ds.Name, ep, name, sub)
						continue
					}
					ds.Endpoints = append(ds.Endpoints, ep)
				}
				slices.SortFunc(ds.Endpoints, netip.AddrPort.Compare)
				ds.Endpoints = slices.Compact(ds.Endpoints)
				out = append(out, ds)
			}
		}
	}
	return out
}

// sliceEndpoints returns the ready endpoints of svc's port (by name and
// protocol) of one family in its EndpointSlices.
func sliceEndpoints(svc *corev1.Service, port corev1.ServicePort, v4 bool, eps []discoveryv1.EndpointSlice) []netip.AddrPort {
	family := discoveryv1.AddressTypeIPv6
	if v4 {
		family = discoveryv1.AddressTypeIPv4
	}
	var out []netip.AddrPort
	for i := range eps {
		s := &eps[i]
		if s.Namespace != svc.Namespace || s.Labels[discoveryv1.LabelServiceName] != svc.Name || s.AddressType != family {
			continue
		}
		var target int32
		for _, p := range s.Ports {
			if p.Port != nil && ptrOr(p.Name, "") == port.Name && ptrOr(p.Protocol, corev1.ProtocolTCP) == cmp.Or(port.Protocol, corev1.ProtocolTCP) {
				target = *p.Port
			}
		}
		if target <= 0 || target > 65535 {
			continue
		}
		for _, e := range s.Endpoints {
			if !ptrOr(e.Conditions.Ready, true) {
				continue
			}
			for _, a := range e.Addresses {
				if ip, err := netip.ParseAddr(a); err == nil && ip.Is4() == v4 {
					out = append(out, netip.AddrPortFrom(ip, uint16(target)))
				}
			}
		}
	}
	return out
}

// ptrOr returns *p, or def for nil.
func ptrOr[T any](p *T, def T) T {
	if p == nil {
		return def
	}
	return *p
}

// clusterDNSServers returns the cluster IPs of the cluster DNS Service
// dns among svcs (clusterServices' result), which DHCP (IPv4) and DHCPv6
// (IPv6) hand to guests on primary networks, if it exists.
func clusterDNSServers(svcs []*corev1.Service, dns types.NamespacedName) []netip.Addr {
	var out []netip.Addr
	for _, s := range svcs {
		if s.Namespace != dns.Namespace || s.Name != dns.Name {
			continue
		}
		out = append(out, clusterIPs(s)...)
	}
	return out
}

// clusterSearch returns the DNS search list of a pod in namespace ns, as
// the kubelet writes it: <ns>.svc.<domain>, svc.<domain>, <domain>.
func clusterSearch(ns, domain string) []string {
	domain = cmp.Or(domain, DefaultClusterDomain)
	return []string{ns + ".svc." + domain, "svc." + domain, domain}
}

// familiesOf returns the prefixes of ps of a family subnets have, sorted,
// without duplicates.
func familiesOf(ps, subnets []netip.Prefix) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range ps {
		if slices.ContainsFunc(subnets, func(s netip.Prefix) bool { return s.Addr().Is4() == p.Addr().Is4() }) {
			out = append(out, p.Masked())
		}
	}
	slices.SortFunc(out, func(a, b netip.Prefix) int {
		return cmp.Or(a.Addr().Compare(b.Addr()), cmp.Compare(a.Bits(), b.Bits()))
	})
	return slices.Compact(out)
}

// ServiceCIDRsOf returns the valid ranges of the cluster's ServiceCIDR
// objects.
func ServiceCIDRsOf(objs []networkingv1.ServiceCIDR) []netip.Prefix {
	var out []netip.Prefix
	for _, o := range objs {
		for _, c := range o.Spec.CIDRs {
			if p, err := netip.ParsePrefix(c); err == nil {
				out = append(out, p.Masked())
			}
		}
	}
	return out
}
