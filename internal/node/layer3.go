package node

import (
	"fmt"
	"maps"
	"slices"

	"kvnet.io/kvnet/internal/datapath"
	"kvnet.io/kvnet/internal/hostsubnet"
	"kvnet.io/kvnet/internal/nodeid"
)

// A Layer3 network gives each node a host subnet of each of its cluster
// subnets (annotation hostsubnet.Annotation, which kvnet-controller
// writes): the node's router is the gateway of its own host subnets and
// routes the others' over the VXLAN overlay to their nodes' routers. Pod
// MACs stay behind their node's router, so none is pinned remotely.

// layer3FromNAD sets the cluster subnets of Layer3 network n (NAD key), or
// reports why they are unusable.
func (p *planner) layer3FromNAD(n *network, key string) bool {
	nw, err := hostsubnet.FromConf(n.conf)
	if err != nil {
		p.problem("NAD %s: %v", key, err)
		return false
	}
	n.layer3 = &nw
	return true
}

// layer3Addresses sets this node's host subnets of Layer3 network n and
// its router's gateway in each, or reports the network unserved here
// while the node has none.
func (p *planner) layer3Addresses(n *network) bool {
	if n.subnets = p.hostSubnets[n.conf.Name]; len(n.subnets) == 0 {
		p.unserved(n.conf.Name, "node %s has no host subnet of layer3 network %q yet (annotation %s, which kvnet-controller writes)", p.in.Node, n.conf.Name, hostsubnet.Annotation)
		return false
	}
	for _, s := range n.subnets {
		n.gateways = append(n.gateways, hostsubnet.Gateway(s))
	}
	return true
}

// planLayer3 returns Layer3 network n's datapath.Network: its router's
// gateways (primary or not) and overlay address, and the routers of
// members.
func (p *planner) planLayer3(n *network, members map[string]bool) (datapath.Network, error) {
	dn := p.baseNetwork(n)
	dn.Gateways = n.gateways
	var err error
	dn.Layer3, err = p.layer3Of(n, members)
	return dn, err
}

// layer3Of returns what the router of Layer3 network n on this node needs:
// its overlay address and MAC (from the node ID, in the network's transit
// subnet) and the routers of the other nodes with pods of it (members).
func (p *planner) layer3Of(n *network, members map[string]bool) (*datapath.Layer3, error) {
	id, ok := nodeID(p.self)
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
	nodeSubnets := p.allNodeSubnets()
	for _, nodeName := range slices.Sorted(maps.Keys(members)) {
		oid, ok := nodeID(nodeNamed(p.in.Nodes, nodeName))
		vtep, hasVTEP := p.vteps[nodeName]
		subnets := nodeSubnets[nodeName][n.conf.Name]
		if !ok || !hasVTEP || len(subnets) == 0 {
			continue // not ready: its pods are unreachable until it is
		}
		addrs, mac, err := serviceAddrs(n.conf.TransitSubnet, oid)
		if err != nil {
			continue
		}
		peer := datapath.Layer3Peer{VTEP: vtep, MAC: mac, Subnets: subnets}
		for _, a := range addrs {
			peer.Addrs = append(peer.Addrs, a.Addr())
		}
		l3.Peers = append(l3.Peers, peer)
	}
	return l3, nil
}

// allNodeSubnets returns every node's host subnets, parsed on the first
// call of a plan (problems in them were reported for this node only).
func (p *planner) allNodeSubnets() map[string]hostsubnet.Subnets {
	if p.nodeSubnets == nil {
		p.nodeSubnets = map[string]hostsubnet.Subnets{}
		for i := range p.in.Nodes {
			p.nodeSubnets[p.in.Nodes[i].Name] = nodeHostSubnets(&p.in.Nodes[i], func(string, ...any) {})
		}
	}
	return p.nodeSubnets
}
