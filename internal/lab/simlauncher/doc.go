// Package simlauncher stands in for what KubeVirt's virt-handler and
// virt-launcher do in a launcher pod, for the lab (`kvnet-lab`) and for
// privileged tests; it is never run in a cluster. It is a
// simkubelet.Runtime: when a simulated kubelet has set up a virt-launcher
// pod's network, [Launcher] plumbs each VMI interface for its binding in
// the pod's network namespace ([Plumb]) and starts a QEMU guest there
// (package guest) with the VMI's MACs, and stops it before the pod's
// network is torn down. A VMI annotated simlauncher.kvnet.io/no-guest:
// "true" ([NoGuestAnnotation]) gets no guest and no plumbing.
//
// Bindings, as virt-launcher plumbs them:
//
//   - bridge: the pod interface X is renamed X-nic (another MAC, no IP,
//     learning off) and, with a tap, made a port of bridge k6t-X; the guest
//     takes X's MAC and, when X had an IPv4 address, gets it from the
//     launcher's DHCP server on the bridge (server address
//     169.254.75.1<index>/32, router: X's default gateway); without one (a
//     network without IPAM) there is no DHCP server and the guest gets no
//     lease on that NIC. KubeVirt also
//     creates a dummy X holding the original address; dummy links do not
//     work in the lab's network namespaces, so there is none.
//   - managedTap (binding plugins such as l2bridge, on a primary UDN): the
//     same bridge, without a DHCP server of the launcher's: kvnet-node's
//     DHCP server answers the guest with its IPAMClaim's address.
//   - masquerade: X stays; bridge k6t-X (MAC 02:00:00:00:00:00) holds
//     10.0.2.1/24, the guest gets 10.0.2.2/24 by DHCP, and nftables NAT as
//     KubeVirt writes it forwards X's traffic (or only the interface's
//     ports) to the guest and masquerades the guest's traffic behind X's
//     address. Where X has a global IPv6 address, the same again for IPv6
//     (NAT66): the bridge holds fd10:0:2::1/120 and, as KubeVirt v1.8.4's
//     virt-launcher, the launcher runs a single-client DHCPv6 server there
//     that answers as KubeVirt's: fd10:0:2::2 in an IA_NA with the
//     client's IAID and 999-day lifetimes, its DUID-LL from the bridge's
//     MAC, and the IPv6 DNS servers it was given. As virt-launcher, it
//     sends no router advertisements (kubevirt/kubevirt#19193): a guest
//     whose DHCPv6 client waits for one (the lab's dhcpcd) gets no IPv6
//     address, and none gets the /120 or a default route; the guest must
//     be configured statically (fd10:0:2::2/120 via fd10:0:2::1), as on
//     KubeVirt.
//
// What X had (MAC, IPv4, gateway, MTU) is kept as X-nic's alias, so that
// plumbing a pod again (a restarted lab) gives the same result.
//
// A migration target pod's QEMU waits for the source guest's state, which
// the Launcher streams to it over a unix socket (both QEMUs run on this
// machine): memory and devices move, and the guest keeps its open
// connections. Start returns once the migration completed.
package simlauncher
