package node

import (
	"cmp"

	"kvnet.io/kvnet/internal/datapath"
	"kvnet.io/kvnet/internal/physnet"
	"kvnet.io/kvnet/internal/udn"
)

// A localnet network is carried between nodes by a physical network: each
// node's bridge mapping (annotation physnet.BridgeMappingsAnnotation)
// names its Linux bridge on it, optionally tagged with the network's VLAN.
// The physical network learns where each MAC is, so no remote MAC is
// programmed, and a localnet network is never primary.

// localnetFromNAD sets this node's bridge of localnet network n (NAD key),
// or returns false after reporting why the network cannot be used (a
// problem) or attached here (unserved: kvnet-cni refuses its pods with
// that reason).
func (p *planner) localnetFromNAD(n *network, key string) bool {
	conf, node := n.conf, p.in.Node
	n.physical = p.mappings[conf.PhysicalNetworkName]
	switch {
	case conf.IsPrimary():
		p.problem("NAD %s: a localnet network cannot be primary (\"role\": %q)", key, conf.Role)
	case p.mappingsErr != nil:
		p.unserved(conf.Name, "node %s: its annotation %s is invalid: %v", node, physnet.BridgeMappingsAnnotation, p.mappingsErr)
	case n.physical == "":
		p.unserved(conf.Name, "node %s has no bridge for physical network %q: add %q to its annotation %s", node, conf.PhysicalNetworkName, conf.PhysicalNetworkName+":<bridge>", physnet.BridgeMappingsAnnotation)
	case p.in.Bridges != nil && !p.in.Bridges[n.physical]:
		p.unserved(conf.Name, "node %s maps physical network %q to %q, which is not a Linux bridge there (annotation %s)", node, conf.PhysicalNetworkName, n.physical, physnet.BridgeMappingsAnnotation)
	case conf.VLANID != 0 && p.lacksVLAN:
		p.unserved(conf.Name, "%s", physnet.NoVLANReason(node, conf.VLANID))
	default:
		return true
	}
	return false
}

// planLocalnet returns localnet network n's datapath.Network: its bridge,
// VLAN and MTU.
func (p *planner) planLocalnet(n *network) datapath.Network {
	dn := p.baseNetwork(n)
	dn.Physical, dn.VLAN, dn.MTU = n.physical, n.conf.VLANID, cmp.Or(n.conf.MTU, udn.LocalnetDefaultMTU)
	return dn
}
