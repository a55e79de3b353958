package node

import (
	"net/netip"
)

// peers is phase 2 of Desired: each node's VTEP (its underlay address,
// annotation VTEPAnnotation), by node name. A node without one is no peer.
func (p *planner) peers() map[string]netip.Addr {
	vteps := map[string]netip.Addr{}
	for i := range p.in.Nodes {
		nd := &p.in.Nodes[i]
		v, ok := nd.Annotations[VTEPAnnotation]
		if !ok {
			continue
		}
		ip, err := netip.ParseAddr(v)
		if err != nil || ip.IsUnspecified() {
			p.problem("node %s: annotation %s=%q is not an IP address", nd.Name, VTEPAnnotation, v)
			continue
		}
		vteps[nd.Name] = ip
	}
	return vteps
}

// members returns the nodes that hold a network besides this one: those
// with its holders hs, or every peer if it has node ports (they are open
// on every node). False: the network has no pod here and no node port,
// so nothing of it is on this node.
func (p *planner) members(hs []*holder, nodePorts bool) (map[string]bool, bool) {
	members := map[string]bool{}
	local := false
	for _, h := range hs {
		if h.node == p.in.Node {
			local = true
		} else {
			members[h.node] = true
		}
	}
	if !nodePorts {
		return members, local
	}
	for nodeName, v := range p.vteps {
		// A node with this node's VTEP is this machine under an old
		// name: never a peer.
		if nodeName != p.in.Node && v != p.vteps[p.in.Node] {
			members[nodeName] = true
		}
	}
	return members, true
}
