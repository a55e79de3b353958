package node

import (
	"net/netip"
	"slices"
	"strings"

	"kvnet.io/kvnet/internal/datapath"
	"kvnet.io/kvnet/internal/dnsproxy"
)

// The cluster DNS answers a headless Service, or a pod's
// hostname.subdomain name, with pods' default-network addresses, which
// pods on a primary network cannot reach. With Input.DNSProxyPort set,
// each primary network's router sends its pods' DNS queries (the cluster
// DNS Service's cluster IPs at port 53) to kvnet-node's proxy (package
// dnsproxy) at the node's end of the network's transit link; the proxy
// forwards them to the cluster DNS's endpoints and rewrites the
// default-network address of each pod of the network in the answers to
// its address on the network.

// DefaultDNSProxyPort is kvnet-node's --dns-proxy-port: next to its
// metrics (9464) and health (9465) ports. The proxy binds only the
// nodes' transit addresses, so the port is free elsewhere on the node.
const DefaultDNSProxyPort uint16 = 9466

// dnsPort is the port resolvers query: only the cluster DNS Service's
// port 53 is proxied (its metrics port, say, is not).
const dnsPort = 53

// proxyDNS points network dn's services of the cluster DNS (in viaNode,
// changed in place) at the DNS proxy, and returns what the proxy does
// for the network: the queries' former endpoints become its upstream
// servers, and its rewrites are the network's holders' (every node's)
// addresses. It returns nil when the network reaches no cluster DNS.
func (p *planner) proxyDNS(dn datapath.Network, subnets []netip.Prefix, hs []*holder, viaNode []datapath.Service) *dnsproxy.Network {
	if p.in.DNSProxyPort == 0 {
		return nil
	}
	prefix := clusterDNSOf(p.in).String() + ":"
	d := dnsproxy.Network{Name: dn.Name}
	for i := range viaNode {
		sv := &viaNode[i]
		v6 := sv.VIP.Addr().Is6()
		if !strings.HasPrefix(sv.Name, prefix) || sv.VIP.Port() != dnsPort || len(sv.Endpoints) == 0 ||
			!slices.ContainsFunc(subnets, func(s netip.Prefix) bool { return s.Addr().Is6() == v6 }) {
			continue
		}
		router, node, err := datapath.TransitAddrs(dn.ID, v6)
		if err != nil {
			p.problem("network %s: DNS proxy: %v", dn.Name, err)
			continue
		}
		listen := netip.AddrPortFrom(node, p.in.DNSProxyPort)
		switch sv.Protocol {
		case "UDP":
			d.UDP = append(d.UDP, sv.Endpoints...)
		case "TCP":
			d.TCP = append(d.TCP, sv.Endpoints...)
		default:
			continue
		}
		if !slices.Contains(d.Listen, listen) {
			d.Listen = append(d.Listen, listen)
			d.Clients = append(d.Clients, router)
		}
		sv.Endpoints = []netip.AddrPort{listen}
	}
	if len(d.Listen) == 0 {
		return nil
	}
	d.Rewrite = map[netip.Addr]netip.Addr{}
	for _, h := range hs {
		var own []netip.Addr
		for _, s := range h.a.IPAddresses {
			if pfx, err := netip.ParsePrefix(s); err == nil {
				own = append(own, pfx.Addr())
			}
		}
		for _, pip := range h.pod.Status.PodIPs {
			a, err := netip.ParseAddr(pip.IP)
			if err != nil {
				continue
			}
			if i := slices.IndexFunc(own, func(b netip.Addr) bool { return b.Is4() == a.Is4() }); i >= 0 {
				d.Rewrite[a.Unmap()] = own[i]
			}
		}
	}
	return &d
}

// withDirectDNS returns state with the cluster DNS services of the
// networks in dns that direct says (nil: all of them) sent to the
// cluster DNS's endpoints again instead of the proxy: for networks the
// proxy could not serve, and for all when kvnet-node stops, so that DNS
// keeps working (unrewritten) while no proxy runs.
func withDirectDNS(state datapath.State, dns []dnsproxy.Network, direct func(string) bool) datapath.State {
	byName := map[string]*dnsproxy.Network{}
	for i := range dns {
		if direct == nil || direct(dns[i].Name) {
			byName[dns[i].Name] = &dns[i]
		}
	}
	if len(byName) == 0 {
		return state
	}
	state.Services = slices.Clone(state.Services)
	for i := range state.Services {
		sv := &state.Services[i]
		d := byName[sv.Network]
		if d == nil || !sv.ViaNode || len(sv.Endpoints) != 1 || !slices.Contains(d.Listen, sv.Endpoints[0]) {
			continue
		}
		upstream := d.UDP
		if sv.Protocol == "TCP" {
			upstream = d.TCP
		}
		var eps []netip.AddrPort
		for _, ep := range upstream {
			if ep.Addr().Is6() == sv.VIP.Addr().Is6() {
				eps = append(eps, ep)
			}
		}
		sv.Endpoints = eps
	}
	return state
}
