package node

import (
	"maps"
	"net/netip"
	"slices"

	"kvnet.io/kvnet/internal/datapath"
)

// A Layer2 network is one set of subnets (its NAD's, subnetAddresses)
// stretched over a VXLAN overlay between the nodes with its pods: the node
// floods to their VTEPs and pins each remote pod's MAC (and each remote
// router's service MAC) to its node's VTEP.

// planLayer2 returns Layer2 network n's datapath.Network: its overlay
// reaches the VTEPs of members.
func (p *planner) planLayer2(n *network, members map[string]bool) datapath.Network {
	dn := p.baseNetwork(n)
	remotes := map[netip.Addr]bool{}
	for nodeName := range members {
		if v, ok := p.vteps[nodeName]; ok {
			remotes[v] = true
		}
	}
	dn.Remotes = slices.SortedFunc(maps.Keys(remotes), netip.Addr.Compare)
	return dn
}

// remoteServiceMACs pins the service MACs of the other nodes' routers on
// Layer2 network n (members), which endpoints here answer, to their VTEPs.
func (p *planner) remoteServiceMACs(n *network, members map[string]bool) {
	for _, nodeName := range slices.Sorted(maps.Keys(members)) {
		other := nodeNamed(p.in.Nodes, nodeName)
		oid, ok := nodeID(other)
		if !ok || !p.vteps[nodeName].IsValid() {
			continue
		}
		if _, mac, err := serviceAddrs(n.conf.TransitSubnet, oid); err == nil {
			p.plan.State.RemoteMACs = append(p.plan.State.RemoteMACs, datapath.RemoteMAC{Network: n.conf.Name, MAC: mac, VTEP: p.vteps[nodeName]})
		}
	}
}
