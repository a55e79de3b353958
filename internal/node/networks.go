package node

import (
	"net/netip"
	"slices"
	"strconv"

	nadv1 "kvnet.io/kvnet/api/k8scni/v1"
	"kvnet.io/kvnet/internal/datapath"
	"kvnet.io/kvnet/internal/hostsubnet"
	"kvnet.io/kvnet/internal/netconf"
	"kvnet.io/kvnet/internal/reserved"
	"kvnet.io/kvnet/internal/udn"
)

// network is a kvnet network as the NADs describe it, with what this node
// needs of it.
type network struct {
	conf     *netconf.NetConf
	id       int
	topology topology
	physical string // localnet: this node's bridge on its physical network
	// layer3 is the Layer3 network's cluster subnets; subnets are then
	// this node's host subnets and gateways its router's addresses in
	// them.
	layer3    *hostsubnet.Network
	subnets   []netip.Prefix
	gateways  []netip.Addr
	exhausted bool
}

// networks is phase 1 of Desired: the kvnet networks the NADs describe,
// by name, and the namespaces whose primary network each is. A CUDN's
// NADs (one per namespace) are one network; NADs of other plugins are
// skipped.
func (p *planner) networks() (nets map[string]*network, primaryNS map[string]map[string]bool) {
	nets, primaryNS = map[string]*network{}, map[string]map[string]bool{}
	parsed := p.in.NetConfs.start(p.in.Reserved)
	if parsed != nil {
		defer func() { p.in.NetConfs.m = parsed }() // drops NADs that are gone
	}
	for i := range p.in.NADs {
		nad := &p.in.NADs[i]
		key := nad.Namespace + "/" + nad.Name
		if _, refused := nad.Annotations[udn.NetworkConflictAnnotation]; refused {
			continue // disagrees with its network's first NAD, which defines it
		}
		conf, err := p.in.NetConfs.parse(nad.Spec.Config, p.in.Reserved, parsed)
		if err != nil {
			p.problem("NAD %s: %v", key, err)
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
		if _, ok := p.plan.Unserved[conf.Name]; ok {
			continue
		}
		if n, ok := p.networkOf(nad, conf); ok {
			nets[conf.Name] = n
		}
	}
	for name, n := range nets {
		if n.exhausted {
			p.plan.Exhausted = append(p.plan.Exhausted, name)
		}
	}
	slices.Sort(p.plan.Exhausted)
	return nets, primaryNS
}

// networkOf returns the network of nad (whose configuration is conf), or
// false after reporting why this node cannot use it: its topology's
// checks (layer3FromNAD, localnetFromNAD), its network ID, then its
// addresses on this node.
func (p *planner) networkOf(nad *nadv1.NetworkAttachmentDefinition, conf *netconf.NetConf) (*network, bool) {
	key := nad.Namespace + "/" + nad.Name
	topo, err := topologyOf(conf)
	if err != nil {
		p.problem("NAD %s: %v", key, err)
		return nil, false
	}
	n := &network{conf: conf, topology: topo, exhausted: nad.Annotations[udn.PoolExhaustedAnnotation] == "true"}
	ok := true
	switch topo {
	case layer3:
		ok = p.layer3FromNAD(n, key)
	case localnet:
		ok = p.localnetFromNAD(n, key)
	}
	if !ok {
		return nil, false
	}
	id, err := strconv.Atoi(nad.Annotations[udn.NetworkIDAnnotation])
	if err != nil || id < 1 || id > datapath.MaxNetworkID {
		p.problem("NAD %s: annotation %s=%q is not a network ID 1-%d", key, udn.NetworkIDAnnotation, nad.Annotations[udn.NetworkIDAnnotation], datapath.MaxNetworkID)
		return nil, false
	}
	n.id = id
	if topo == layer3 {
		return n, p.layer3Addresses(n)
	}
	return n, p.subnetAddresses(n, key)
}

// subnetAddresses sets the subnets of a Layer2 or localnet network n (its
// NAD's, the same on every node) and, if primary, their gateways.
func (p *planner) subnetAddresses(n *network, key string) bool {
	var err error
	if n.subnets, err = netconf.ParsePrefixes("subnets", n.conf.Subnets); err != nil {
		p.problem("NAD %s: %v", key, err)
		return false
	}
	if n.conf.IsPrimary() {
		if n.gateways, err = p.gateways(n.conf); err != nil {
			p.problem("NAD %s: %v", key, err)
			return false
		}
	}
	return true
}

// fillReserved gives a primary network's configuration that names no join
// or transit subnet the cluster's reserved ones (r, or the defaults when
// r is zero).
func fillReserved(conf *netconf.NetConf, r reserved.Subnets) {
	if len(r.Join) == 0 || len(r.Transit) == 0 {
		r = reserved.Default()
	}
	if conf.JoinSubnet == "" {
		conf.JoinSubnet = reserved.Join(r.Join)
	}
	if conf.TransitSubnet == "" {
		conf.TransitSubnet = reserved.Join(r.Transit)
	}
}
