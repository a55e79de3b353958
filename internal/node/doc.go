// Package node is kvnet-node, the agent every node runs: it reads from the
// API what the node's datapath must look like and keeps it so.
//
// Inputs, all from informer caches:
//   - NetworkAttachmentDefinitions of type kvnet-cni: each network's name,
//     role, subnets and gateways, and its cluster-wide ID (annotation
//     k8s.ovn.org/network-id, written by kvnet-controller), which is the
//     VXLAN VNI;
//   - pods with the kvnet.io/pod-networks annotation (kvnet-controller's
//     allocations) and a node: local ones become bridge ports, remote ones
//     unicast FDB entries towards their node's VTEP;
//   - nodes, whose kvnet.io/vtep annotation (written by each agent for
//     itself at start) is their underlay address;
//   - VirtualMachineInstances: during a live migration two launcher pods
//     hold the VM's MAC; the VMI's status.nodeName tells which one is live,
//     and its migration (package migration, one value per VMI) which two
//     pods are the migration's source and target.
//
// and, from the node itself, the host ends of pod veths made by kvnet-cni,
// found by their alias (portalias.Format).
//
// Desired computes the datapath.State and the DHCP leases from these inputs
// as a pure function. The Agent recomputes and applies it whenever anything
// changes (API events, a link appearing) and every resync period; the
// datapath reads the kernel each time, so the agent keeps no state that can
// go stale and a restart reconciles from scratch. It runs DHCP servers
// (DHCPv4, and router advertisements + DHCPv6 where the network has IPv6)
// per local primary network in the network's router namespace, and writes
// the status file kvnet-cni's STATUS verb reads.
package node
