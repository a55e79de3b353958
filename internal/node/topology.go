package node

import (
	"fmt"

	"kvnet.io/kvnet/internal/netconf"
)

// topology is how a network's pods on different nodes reach each other,
// and so what kvnet-node programs for it. Each has its own file with its
// NAD checks and its planner (the datapath.Network it becomes):
//
//   - layer2 (layer2.go): one subnet stretched over a VXLAN overlay; the
//     node pins every remote pod's MAC to its node's VTEP;
//   - layer3 (layer3.go): each node routes its own host subnet of the
//     network; its router reaches the other nodes' routers over the
//     overlay;
//   - localnet (localnet.go): the node's bridge on a physical network
//     (bridge mappings) carries it between nodes, optionally on a VLAN.
type topology int

const (
	layer2 topology = iota + 1
	layer3
	localnet
)

func (t topology) String() string {
	switch t {
	case layer2:
		return netconf.TopologyLayer2
	case layer3:
		return netconf.TopologyLayer3
	case localnet:
		return netconf.TopologyLocalnet
	}
	return fmt.Sprintf("topology(%d)", int(t))
}

// topologyOf returns the topology conf names.
func topologyOf(conf *netconf.NetConf) (topology, error) {
	switch conf.Topology {
	case netconf.TopologyLayer2:
		return layer2, nil
	case netconf.TopologyLayer3:
		return layer3, nil
	case netconf.TopologyLocalnet:
		return localnet, nil
	}
	return 0, fmt.Errorf("topology %q: kvnet-node programs layer2, layer3 and localnet networks only", conf.Topology)
}
