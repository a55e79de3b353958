// Package simnet simulates a cluster's network on one machine with network
// namespaces, for the `kvnet-lab` command and for privileged tests (of the
// datapath, of the node agent). It knows nothing of Kubernetes or of the
// datapath; it only builds the wires a real cluster would have.
//
// # Topology
//
// A [Cluster] with prefix P made by [New] has:
//
//   - a switch namespace P-sw holding the bridge sw0, with bridge
//     netfilter off (a physical switch does not run conntrack on what it
//     forwards);
//   - one namespace P-<name> per node, attached to the switch by a veth:
//     [UnderlayDev] (eth0, MTU [UnderlayMTU]) in the node holds
//     192.168.100.<i>/24 ([Node.IP], i counted from 1) and the node's
//     default route points at [ExternalIP]; the switch end is port n<i>;
//   - an external namespace P-ext on the same switch (port ext) with
//     [ExternalIP] on its eth0 and [InternetIP]/32 on its loopback: it
//     stands for the internet, so a node reaches InternetIP through its
//     default route, and it answers nodes directly on the underlay subnet;
//   - a physical network namespace P-phys ([Cluster.Physical]) holding the
//     bridge phys0 with [DatacenterHostIP]/24: a datacenter L2 segment
//     separate from the underlay. Each node has the Linux bridge
//     [PhysicalBridge] (br-phys) with an uplink phys-up into it (port n<i>
//     there): what a node's bridge mapping for [PhysicalNetwork] names, so
//     that localnet networks reach the segment.
//
// [Cluster.NewNS] adds further namespaces P-<name> (pods, raw test
// fixtures) that belong to the cluster.
//
// # Names and cleanup
//
// Everything is a named namespace under /run/netns (see package nl), so
// `ip netns exec P-n1 …` works, and deleting the namespaces removes every
// link with them. A cluster owns every namespace whose name starts with
// "P-", and also those starting with "kvnet-P-": the datapath names the
// router namespaces of a node running in namespace P-n1 "kvnet-P-n1-r<ID>".
// The prefix is lowercase letters and digits only (and not "kvnet"), so no
// cluster's names start with another's "P-". [Cluster.Close] deletes all of
// them; [Cleanup] does the same for a prefix alone, e.g. after a lab
// crashed. [RandomPrefix] gives tests a prefix no other run uses.
//
// Building a cluster needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN).
package simnet
