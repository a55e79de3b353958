// Package guest runs real QEMU guests for the lab: a Linux kernel and a
// busybox initramfs built from Debian packages by hack/guest/build.sh, booted
// under TCG in a network namespace, with its NICs on tap devices there.
//
// It is lab-only: tests and `kvnet-lab` stand-ins (simvirt) use it; it must
// never be linked into kvnet-controller, kvnet-node or kvnet-cni.
//
// # The guest
//
// The guest brings up every NIC with DHCP, follows IPv6 router
// advertisements there and asks DHCPv6 for an address where one has the
// Managed flag, and serves TCP echo on port 7, HTTP on port 80 (answering
// its name) and, lab only, a one-line exec service on port 2323 ([Exec]).
// It reports on its serial console, which [Start] appends to
// [Config.ConsoleLog], one line per event:
//
//	KVNET-LEASE iface=eth0 mac=52:54:00:77:00:10 ip=10.77.0.10/24 router=10.77.0.1 dns=10.77.0.1 mtu=1400
//	KVNET-LEASE6 iface=eth0 mac=52:54:00:77:00:10 ip=fd00:10:100::5/128 router=fe80::1 dns=fd00:10:96::a mtu=1400
//	KVNET-READY name=vm-a
//	KVNET-ERROR <what went wrong>
//
// [VM.WaitLease], [VM.WaitLease6] and [VM.WaitReady] wait for them;
// [ParseLease] and [ParseLease6] read a lease line.
//
// # QEMU
//
// [Start] runs qemu-system-x86_64 (Debian package qemu-system-x86) inside
// the namespace, entered with setns on a locked thread just for the fork, so
// that the tap devices, the migration listener ([Config.Incoming]) and the
// migration connection are all in it. Every VM has a QMP socket; [VM.QMP]
// is its client, with helpers for live migration ([QMP.Migrate],
// [QMP.WaitMigration]).
//
// Starting VMs needs root (tap devices, setns) and the image: [FindImage]
// tells how to build it, [EnsureImage] builds it.
package guest
