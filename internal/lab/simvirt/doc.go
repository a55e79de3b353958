// Package simvirt is a stand-in for KubeVirt's virt-controller, for the lab
// (`kvnet-lab`) and for privileged tests. It is never run in a cluster: a
// real cluster has KubeVirt.
//
// It turns VirtualMachines into VirtualMachineInstances, VMIs into
// virt-launcher pods bound to simulated nodes, and carries out
// VirtualMachineInstanceMigrations by starting a target pod and switching
// the VMI over to it: the objects kvnet reacts to (IPAMClaims, the
// launcher-pod webhook, the pod-networks annotation, the VMI's
// status.nodeName that kvnet-node follows) appear and change as KubeVirt
// would make them. simvirt runs no guest itself: in the lab, the simulated
// kubelet's runtime (package simlauncher) boots a QEMU guest in each
// running launcher pod, and moves it to a migration's target pod before
// that pod reports Running; without it, a launcher pod is only its
// network namespace (see package simkubelet).
//
// [Run] reconciles per VM name: a VM, the VMI of the same name, the
// migrations naming that VMI (spec.vmiName) and the launcher pods whose
// kubevirt.io/domain annotation names it, all at once. Every decision is
// made from objects read from the API server (not a cache), so a reconcile
// never acts on a view older than its own last write; informers only
// trigger reconciles. Reconciles are level-triggered and idempotent.
//
// # VirtualMachines
//
// spec.runStrategy (or the deprecated spec.running: true is Always, false
// Halted; neither is Halted) decides:
//
//   - Always: a VMI named as the VM is created when there is none (the
//     template's labels and annotations, the template's spec defaulted
//     as below, controller owner reference to the VM, finalizer
//     foregroundDeleteVirtualMachine);
//     a Failed or Succeeded VMI is deleted and, once gone, created anew
//     (but see "Bindings the lab cannot run" below).
//   - RerunOnFailure: the same, but a Succeeded VMI is left alone.
//   - Once: a VMI is created when there is none; a finished one is left.
//   - Halted: an existing VMI is deleted.
//   - Manual: nothing is created or deleted (KubeVirt's start/stop
//     subresources, which drive Manual VMs, are not served).
//
// A VM that is gone or being deleted gets its VMI deleted (KubeVirt's VM
// finalizer and the garbage collector do that; simvirt does not add the VM
// finalizer, so VMs of clusters without simvirt are never blocked).
// status.created, status.ready (VMI Running) and status.printableStatus
// (Stopped, Starting, Running, Migrating, Stopping, CrashLoopBackOff) are
// kept.
//
// VMI defaulting, which virt-api does at admission, is reduced to one rule:
// a template without interfaces and networks (and without
// autoattachPodInterface: false) gets the pod network "default" with a
// bridge interface, or masquerade when the KubeVirt CR's
// spec.configuration.network.defaultNetworkInterface says so. VMIs created
// directly are not defaulted (there is no admission).
//
// # VirtualMachineInstances
//
// A VMI that is not final and has no launcher pod gets one: generateName
// virt-launcher-<vmi>-, the VMI's labels plus kubevirt.io=virt-launcher,
// kubevirt.io/created-by=<vmi uid>, vm.kubevirt.io/name=<the guest's
// hostname: spec.hostname, else the VMI's name up to its first "."; not
// the VM's name, as in KubeVirt> and vmi.kubevirt.io/id=<vmi> (cut and
// hashed past 63 characters), annotation kubevirt.io/domain=<vmi> plus what
// launcher.Annotations computes with the binding plugins of the KubeVirt
// CR (the first by age, in any namespace; none when there is none), a
// controller owner reference to the VMI, one container "compute", and
// spec.nodeName set to the node of Config.Nodes running the fewest
// launcher pods (ties: the order of Config.Nodes) instead of going through
// a scheduler. The pod is created through the API server, so kvnet's
// launcher-pod webhook adds the IPAMClaim references when kvnet-controller
// serves it. Before that, the VMI's bindings are checked (see below): a
// VMI the lab cannot run fails without a pod. A pod that cannot be created
// (a webhook denial) leaves the VMI Pending with the reason in the
// annotation simvirt.kvnet.io/failure-reason; creation is retried with
// backoff.
//
// Phases: Pending (no pod yet), Scheduling (pod created, not Running yet),
// Running (the pod is Running: status.nodeName, status.activePods
// {uid: node} and status.interfaces are set), Failed (a binding the lab
// cannot run, or the pod failed, vanished or was deleted while the VMI
// wanted it; the reason is in the annotation
// simvirt.kvnet.io/failure-reason). KubeVirt's Scheduled phase (pod
// running, domain starting) is skipped, and VMIs never reach Succeeded by
// themselves (a guest powering off is not noticed). status.conditions holds
// only the condition of a binding failure (below); guestOSInfo, launcher
// container images and the like are not written, and there are no Events.
//
// status.interfaces has one entry per VMI network with an interface that
// is not absent, in spec.networks order: name, mac, ipAddress and
// ipAddresses (without prefix length), podInterfaceName and infoSource
// "domain, guest-agent", taken from the running pod's kvnet.io/pod-networks
// annotation: the primary attachment for the pod network (ovn-udn1; without
// a primary attachment, the pod's status.podIPs on eth0 and no MAC), the
// attachment of the NAD spec.networks[].multus.networkName names (a bare
// name is in the VMI's namespace) for Multus networks. A network without
// an attachment is listed by name with infoSource "domain".
//
// With a guest agent (Config.GuestAgent: in the lab, simlauncher, which
// reads the leases the guests print on their consoles), a running VMI
// whose guest runs reports instead what the guest holds, as virt-handler
// does from KubeVirt's guest agent, polled every GuestPoll: an interface
// whose MAC a guest NIC has gets interfaceName (eth0, ...) and, unless it
// is masquerade (KubeVirt reports the pod's addresses there), the guest's
// addresses, none when the guest has no lease on it; an interface the
// guest does not report gets infoSource "domain".
//
// # Bindings the lab cannot run
//
// The lab runs a VMI's interfaces (those not state: absent) with these
// bindings only: bridge, masquerade on the pod network, and binding
// plugins (binding: {name: X}) the KubeVirt CR registers with
// domainAttachmentType managedTap (l2bridge). A VMI with any other
// interface fails before its first launcher pod is made, and gets none:
// sriov, passtBinding, the removed slirp, macvtap and passt, a plugin
// registered with domainAttachmentType tap or none (a sidecar plugin), a
// plugin the KubeVirt CR does not register, masquerade on another network,
// an interface with no binding method or with several. The VMI goes
// straight to Failed (from Pending); the failure reason annotation gets
// one sentence per such interface, joined by "; ", for example
//
//	interface "default": binding "passtBinding": the lab cannot run this binding (it runs bridge, masquerade and managedTap binding plugins)
//	interface "net1": binding plugin "foo" is not registered in the KubeVirt CR (spec.configuration.network.binding)
//
// and status.conditions a condition as KubeVirt writes for a VMI it cannot
// synchronize: type Synchronized, status False, reason UnsupportedBinding
// (KubeVirt says FailedCreate), the same message. The API types do not
// declare status.conditions: simvirt writes it through the status's
// unknown members, keeping other conditions.
//
// A VM whose run strategy would start such a VMI anew (Always,
// RerunOnFailure) does not while a new VMI would fail the same way (the
// VM's template, defaulted, still has a binding the lab cannot run with
// the KubeVirt CR's plugins): the failed VMI is kept, so no VMI is made
// and failed in a loop; the VM's printableStatus is CrashLoopBackOff and
// its failure reason annotation says why. A change of the VM is looked at
// at once; a change of the KubeVirt CR (registering a plugin), which
// triggers no reconcile, within 30 s (the longest retry backoff), when the
// VM is looked at again. Then the failed VMI is deleted and a new one
// created. KubeVirt's crash-loop backoff of other failures
// (status.startFailure) is not done.
//
// A VMI being deleted has its launcher pods deleted; its finalizer is
// removed once they are gone (kubelet, or simkubelet, confirms a pod's
// deletion after CNI DEL), so the IPs are released only after the network
// is torn down, as with KubeVirt. A final VMI's pods are deleted too, and
// pods made for an earlier VMI of the same name (another UID) are deleted.
// Pods that lack the kubevirt.io/created-by label (made by hand, by tests)
// are never touched.
//
// # Migrations
//
// One migration per VMI runs at a time, the oldest first; the others wait
// in phase Pending, as do migrations of a VMI that is not Running yet. A
// migration of a VMI that is missing, final or being deleted fails.
//
//  1. Scheduling: a target launcher pod as above (plus label
//     kubevirt.io/migrationJobUID=<vmim uid> and annotation
//     kubevirt.io/migrationJobName=<vmim>) on the node with the fewest
//     launcher pods other than the VMI's; status.migrationState of the VMI
//     gets sourceNode, sourcePod, targetNode and targetPod, and
//     status.activePods the target pod.
//  2. TargetReady: the target pod is Running.
//  3. Switch-over (the next reconcile): the VMI's status.nodeName becomes
//     the target node, status.interfaces come from the target pod,
//     migrationState.completed is set; then the source pod is deleted and
//     the migration is Succeeded.
//
// A migration fails (phase Failed, reason in the annotation
// simvirt.kvnet.io/failure-reason, migrationState.failed on the VMI) when
// no other node is available, when its target pod cannot be created (a
// template error, an admission denial; other errors are retried), or when
// the target pod fails or disappears before the switch-over; its target
// pod is deleted and the VMI stays on the source. A migration deleted
// before the switch-over is aborted the same way. The guest's memory moves
// only where simlauncher runs the guests (the target pod then reports
// Running after the migration completed); there is no migration policy,
// bandwidth or timeout, no migration finalizer; neither status.migrationState of the
// migration object itself (KubeVirt ≥ 1.4; the VMI's is written) nor the
// target pod's kubevirt.io/migration-target-ready-timestamp annotation is
// written.
package simvirt
