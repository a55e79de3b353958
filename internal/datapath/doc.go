// Package datapath is what every kvnet node runs: it turns a desired State
// (networks, local pod ports, remote pod MACs) into Linux bridges, VXLAN
// devices, per-tenant router namespaces and nftables rules, and removes
// whatever kvnet owns that the State does not list. It knows nothing of
// Kubernetes; a thin layer computes the State from the API and calls Apply.
//
// # Per network (ID 1..4095)
//
//   - bridge kvbr<ID> and VXLAN device kvvx<ID>, a port of it. VNI = ID:
//     network IDs are cluster-wide and unique, so they can name the
//     segment directly, and the VNI of a capture tells which network it is.
//     The VXLAN device has the node's UnderlayIP as source, UDP port 4789
//     and no learning.
//   - broadcast and unknown unicast: head-end replication, one all-zero-MAC
//     FDB entry per remote node (Network.Remotes).
//   - unicast: one FDB entry per RemoteMAC (MAC -> VTEP), replaced in place
//     when a MAC moves to another node (live migration), plus a static
//     bridge entry on the VXLAN port. Bridge learning is off on every port:
//     every MAC is known from the State.
//   - pod ports (host ends made by SetupPodInterface) are ports of the
//     bridge, each with a static FDB entry for its MAC.
//
// A secondary network is that and nothing more: pure L2.
//
// # Primary networks: the router namespace
//
// VRF devices are not available everywhere kvnet runs, so each primary
// network gets a router namespace (RouterNSName, "kvnet-r<ID>" on a real
// node) connected by two veths (see router.go): kvgw<ID> on the bridge to
// "gw", which holds every gateway IP with GatewayMAC(ID), identical on all
// nodes; and kvtr<ID> in the node namespace to "transit", addressed from
// 169.254.0.0/17 (TransitAddrs) like OVN-Kubernetes' masquerade subnet.
// The router forwards only new connections from the bridge outwards (and
// replies), and masquerades them to its transit address; the node
// masquerades them again to its underlay address. Tenant subnets never
// appear in the node namespace, so tenants may use the same subnet.
//
// # nftables
//
// All rules live in tables named "kvnet" (bridge, inet and arp families in
// the node namespace, inet in router namespaces); Apply rewrites only the
// chains whose rules changed, atomically, so counters of unchanged chains
// survive. The golden files in testdata show the full rule sets. The
// bridge table
//
//   - keeps the gateway MAC off the overlay in both directions (every node
//     answers for it; bridges must never learn it on the tunnel);
//   - checks every frame a pod port sends, at prerouting (before the bridge
//     could learn anything from it): source MAC; IPv4 source among the
//     port's IPs or DHCP from 0.0.0.0; ARP sender MAC and IP (or an RFC
//     5227 probe); IPv6 source among its IPs, link-local or :: (DAD);
//     nothing but IPv4/ARP/IPv6. A port without IPs gets the MAC check
//     only. Each drop rule has a counter and a comment naming the port
//     (Counters).
//
// The inet and arp tables keep the node's own stack off tenant bridges (no
// ARP answers, no routing around the tenant router); the inet table also
// drops forwarding between transit veths, lets only replies into routers,
// stops tenants from reaching other networks' transit addresses or any
// VXLAN port, masquerades egress, and keeps bridged tenant frames
// (br_netfilter) out of the node's conntrack, since tenants reuse
// addresses.
//
// Pod host ends stay down until Apply has their rules in place and has
// attached them; Apply then waits until they (and the pod ends) are up, so
// it returns with a datapath that forwards.
//
// # Ownership and reconciliation
//
// kvnet owns: links named kvbr<ID>, kvvx<ID>, kvgw<ID>, kvtr<ID> in the
// node namespace; named namespaces <RouterNSPrefix><ID>; static FDB entries
// on its bridges' ports and all FDB entries of its VXLAN devices; tables
// named kvnet. Apply reads the kernel and keeps no state of its own, so a
// fresh Datapath on a node with leftovers converges. Pod host ends belong
// to the CNI plugin: Apply attaches those listed in the State and detaches
// (and sets down) any other interface on a kvnet bridge, but never
// deletes them.
//
// # MTU
//
// Pods, bridges, VXLAN devices and router veths use one MTU: NodeConfig.MTU,
// or the underlay device's MTU minus the VXLAN overhead (PodMTU).
//
// # Known limits
//
// A host firewall whose forward policy drops (Docker's) also drops tenant
// egress from transit veths and, with br_netfilter, bridged pod traffic;
// kvnet does not add accept rules to other tables. IPv6 neighbour
// advertisements are not checked against the port's addresses. Egress
// connections of a VM live-migrated to another node restart (they are
// NATed by the old node's router); pod-to-pod connections survive.
// During a migration the VXLAN devices learn: a remote node could move a
// migrating MAC by sending a frame with it; kvnet's nodes only forward
// frames that passed their ports' anti-spoofing rules.
package datapath
