package node

import (
	"time"

	corev1 "k8s.io/api/core/v1"

	kubevirtv1 "kvnet.io/kvnet/api/kubevirt/v1"
)

// vmLeaseTime is the lease time of kvnet-node's DHCP for guests: OVN-Kubernetes's
// (3500 s, go-controller/pkg/kubevirt/dhcp.go), so that a guest sees the
// same lease on a primary network served by either.
const vmLeaseTime = 3500 * time.Second

// launcherServesDHCPv4 reports whether KubeVirt's virt-launcher serves the
// guest of vmi DHCPv4 on its pod network itself: the bridge binding does
// (KubeVirt v1.7.0 pkg/network/dhcp/bridge.go, started whenever the pod
// interface has an address, which a primary network's always has), so
// kvnet-node must not answer that guest too. The l2bridge binding
// (managedTap) leaves DHCP to the network, kvnet-node. Masquerade serves
// its own DHCP behind NAT, where the guest's requests never reach the
// network, and IPv6 is never the bridge binding's: kvnet-node keeps
// serving its router advertisements and DHCPv6.
func launcherServesDHCPv4(vmi *kubevirtv1.VirtualMachineInstance) bool {
	for _, n := range vmi.Spec.Networks {
		if n.Pod == nil {
			continue
		}
		for _, i := range vmi.Spec.Domain.Devices.Interfaces {
			if i.Name == n.Name {
				return i.Bridge != nil
			}
		}
	}
	return false
}

// guestHostname is the hostname DHCP hands the guest of launcher pod pod:
// what KubeVirt makes the launcher pod's hostname (v1.7.0
// pkg/virt-controller/services/template.go: the VMI's spec.hostname, else
// its name up to the first "." cut at 63 characters), which it also writes
// in the pod's vm.kubevirt.io/name label and which OVN-Kubernetes and
// KubeVirt's own DHCP servers send; for a pod that is no launcher, its
// name.
func guestHostname(pod *corev1.Pod) string {
	switch {
	case pod.Spec.Hostname != "":
		return pod.Spec.Hostname
	case pod.Labels[kubevirtv1.VMNameLabel] != "":
		return pod.Labels[kubevirtv1.VMNameLabel]
	case pod.Annotations[kubevirtv1.DomainAnnotation] != "":
		return pod.Annotations[kubevirtv1.DomainAnnotation]
	}
	return pod.Name
}
