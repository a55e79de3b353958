package node

import (
	"cmp"
	"net"
	"net/netip"

	"k8s.io/apimachinery/pkg/types"

	kubevirtv1 "kvnet.io/kvnet/api/kubevirt/v1"
	"kvnet.io/kvnet/internal/datapath"
	"kvnet.io/kvnet/internal/dhcp"
	"kvnet.io/kvnet/internal/migration"
	"kvnet.io/kvnet/internal/portalias"
)

// ports plans network n's holders hs (n planned as dn): a port for each
// live local one (and for a live migration's target on this node, on
// standby until its guest announces itself), a remote MAC for each live
// remote one where the topology needs it (remoteMACPinned), and a DHCP
// lease per live local port: on a primary network with an IPv4 gateway or
// an IPv6 subnet, DHCPv4 and DHCPv6; on a secondary network with a router
// and an IPv6 subnet, DHCPv6 only (KubeVirt's bridge binding, the one for
// secondary networks, serves the guest its IPv4 address itself).
func (p *planner) ports(n *network, dn datapath.Network, hs []*holder) {
	name := n.conf.Name
	var leases map[string]dhcp.Lease
	serverIP := firstIPv4(n.gateways)
	if !dn.Primary {
		serverIP = netip.Addr{}
	}
	prefixes6 := ipv6Prefixes(n.subnets)
	if dn.HasRouter() && (serverIP.IsValid() || len(prefixes6) > 0) {
		leases = map[string]dhcp.Lease{}
	}
	standby := false              // a port of n here waits for its guest
	localMAC := map[string]bool{} // MACs with a port on this node
	for _, h := range hs {
		if h.node == p.in.Node && (h.active || h.migrating) && h.mac != nil {
			localMAC[h.mac.String()] = true
		}
	}
	for _, h := range hs {
		p.departedSource(name, h)
		switch {
		case !h.active && !(h.migrating && h.node == p.in.Node):
			// The other copy of a migrating VM's MAC: nothing here,
			// unless it is the migration's port on this node.
		case h.node != p.in.Node:
			if !remoteMACPinned(n.topology) || (h.migrating && localMAC[h.mac.String()]) {
				// The bridge learns whether a migrating guest is here.
				continue
			}
			p.plan.State.RemoteMACs = append(p.plan.State.RemoteMACs, datapath.RemoteMAC{Network: name, MAC: h.mac, VTEP: p.vteps[h.node], Migrating: h.migrating})
		default:
			alias := portalias.Format(h.pod.Namespace+"/"+h.pod.Name, h.nadKey)
			ifName, ok := p.in.Links[alias]
			if !ok {
				p.plan.Waiting++
				continue
			}
			vmi := h.pod.Annotations[kubevirtv1.DomainAnnotation]
			// Once KubeVirt names the target node, the source pod holds
			// the inactive copy of the MAC until the migration ends: its
			// guest left, so its port passes nothing (Departed) and is no
			// migration target.
			// So is it once the guest's first frame reached the target
			// (guestArrived), before KubeVirt moves the VMI.
			key := types.NamespacedName{Namespace: h.pod.Namespace, Name: vmi}
			isSource := h.migrating && vmi != "" && p.in.Migrations[key].RoleOf(h.pod.Namespace, h.pod.Name) == migration.Source
			departed := isSource && (!h.active || p.guestArrived(key))
			target := h.migrating && !h.active && !departed
			source := isSource && h.active && !departed && p.in.Migrations[key].InProgress()
			port := datapath.Port{Network: name, HostIfName: ifName, MAC: h.mac, Migrating: h.migrating,
				// A migration target waits for its guest's announce.
				Standby: target && !p.in.Announced[h.mac.String()], Departed: departed}
			for _, s := range h.a.IPAddresses {
				if pfx, err := netip.ParsePrefix(s); err == nil {
					port.IPs = append(port.IPs, pfx)
				}
			}
			p.plan.State.Ports = append(p.plan.State.Ports, port)
			standby = standby || port.Standby
			if target && vmi != "" {
				t := MigrationTarget{Network: name, MAC: h.mac, VMI: key, Pod: h.pod.Name, Source: p.in.VMINodes[key]}
				if m := p.in.Migrations[key]; m != nil {
					t.SourcePod = m.SourcePod
				}
				p.plan.MigrationTargets = append(p.plan.MigrationTargets, t)
			}
			if source {
				p.plan.MigrationSources = append(p.plan.MigrationSources, MigrationSource{Port: port, VMI: key, Pod: h.pod.Name})
				p.probeFrom(n, dn)
			}
			if leases != nil && h.active {
				if l, ok := lease(h, serverIP, n.conf.MTU, p.dnsServers, p.in); ok {
					leases[h.mac.String()] = l
				}
			}
		}
	}
	if standby {
		p.neighbours(n, dn, hs)
	}
	if leases != nil {
		p.plan.DHCP = append(p.plan.DHCP, DHCPNetwork{Network: name, ID: n.id, ServerIP: serverIP, Leases: leases,
			Prefixes6: prefixes6, DefaultRouter: dn.Primary, MTU: cmp.Or(n.conf.MTU, p.in.MTU)})
	}
}

// remoteMACPinned tells whether the node pins a remote pod's MAC to its
// node's VTEP: on a Layer2 overlay only. A localnet network's physical
// network learns where a MAC is; a Layer3 network routes to the pod's
// node.
func remoteMACPinned(t topology) bool { return t == layer2 }

// lease is what the DHCP servers give h: its IPv4 address with the
// subnet's mask and its IPv6 address (DHCPv6), the gateway as router, the
// pod interface's MTU (the network's, else the node's pod MTU, as
// kvnet-cni sets it), the guest's hostname (guestHostname) and
// OVN-Kubernetes's lease time. A guest whose virt-launcher serves it
// DHCPv4 itself (Input.LauncherDHCPv4) gets no IPv4 lease here, so that
// it hears one DHCPv4 server.
func lease(h *holder, router netip.Addr, mtu int, clusterDNS []netip.Addr, in Input) (dhcp.Lease, bool) {
	if mtu == 0 {
		mtu = in.MTU
	}
	l := dhcp.Lease{Router: router, DNS: guestDNS(clusterDNS, in.DNS), MTU: mtu, Hostname: guestHostname(h.pod), LeaseTime: vmLeaseTime}
	if len(clusterDNS) > 0 {
		l.Search = clusterSearch(h.pod.Namespace, in.ClusterDomain)
	}
	vmi := h.pod.Annotations[kubevirtv1.DomainAnnotation]
	launcherV4 := vmi != "" && in.LauncherDHCPv4[types.NamespacedName{Namespace: h.pod.Namespace, Name: vmi}]
	for _, s := range h.a.IPAddresses {
		p, err := netip.ParsePrefix(s)
		switch {
		case err != nil:
		case p.Addr().Is4() && !l.IP.IsValid() && !launcherV4:
			l.IP = p
		case p.Addr().Is6() && !l.IP6.IsValid():
			l.IP6 = p.Addr()
		}
	}
	return l, l.IP.IsValid() || l.IP6.IsValid()
}

// departedSource records h in Plan.DepartedSources if it is a local
// launcher pod that was the source of its VMI's last live migration and
// the VMI now runs on another node, or its guest's first frame reached
// the target.
func (p *planner) departedSource(network string, h *holder) {
	if h.node != p.in.Node || h.mac == nil {
		return
	}
	vmi := h.pod.Annotations[kubevirtv1.DomainAnnotation]
	if vmi == "" {
		return
	}
	key := types.NamespacedName{Namespace: h.pod.Namespace, Name: vmi}
	on := p.in.VMINodes[key]
	moved := on != "" && on != p.in.Node
	if !(moved || p.guestArrived(key)) || p.in.Migrations[key].RoleOf(h.pod.Namespace, h.pod.Name) != migration.Source {
		return
	}
	if p.plan.DepartedSources == nil {
		p.plan.DepartedSources = map[string]bool{}
	}
	p.plan.DepartedSources[switchKey(network, h.mac.String())] = true
}

// guestArrived reports whether VMI key's migration in progress has its
// guest's first frame on the target (Input.GuestArrived).
func (p *planner) guestArrived(key types.NamespacedName) bool {
	m := p.in.Migrations[key]
	return m.InProgress() && p.in.GuestArrived[types.NamespacedName{Namespace: key.Namespace, Name: m.TargetPod}]
}

// probeFrom records network n's first IPv4 gateway, if it has a router,
// as the source of its migration probes (Plan.ProbeFrom).
func (p *planner) probeFrom(n *network, dn datapath.Network) {
	if _, ok := p.plan.ProbeFrom[n.conf.Name]; ok || !dn.HasRouter() {
		return
	}
	for _, gw := range dn.Gateways {
		if gw.Is4() {
			if p.plan.ProbeFrom == nil {
				p.plan.ProbeFrom = map[string]Gateway{}
			}
			p.plan.ProbeFrom[n.conf.Name] = Gateway{IP: gw, MAC: datapath.GatewayMAC(dn.ID)}
			return
		}
	}
}

// neighbours records, for network n (one of whose ports on this node is
// on Standby), the IPv4 addresses of its live holders and of its
// gateways with their MACs (Plan.Neighbours).
func (p *planner) neighbours(n *network, dn datapath.Network, hs []*holder) {
	m := map[netip.Addr]net.HardwareAddr{}
	for _, h := range hs {
		if !h.active || h.mac == nil {
			continue
		}
		for _, s := range h.a.IPAddresses {
			if pfx, err := netip.ParsePrefix(s); err == nil && pfx.Addr().Is4() {
				m[pfx.Addr()] = h.mac
			}
		}
	}
	if dn.HasRouter() {
		for _, gw := range dn.Gateways {
			if gw.Is4() {
				m[gw] = datapath.GatewayMAC(dn.ID)
			}
		}
	}
	p.probeFrom(n, dn)
	if p.plan.Neighbours == nil {
		p.plan.Neighbours = map[string]map[netip.Addr]net.HardwareAddr{}
	}
	p.plan.Neighbours[n.conf.Name] = m
}
