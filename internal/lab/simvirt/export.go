package simvirt

import (
	corev1 "k8s.io/api/core/v1"

	kubevirtv1 "kvnet.io/kvnet/api/kubevirt/v1"
)

// PodInterfaces is what the VMI's status.interfaces say for its launcher
// pod (see the package doc): per VMI network with an interface that is not
// absent, in spec.networks order, the pod interface, the MAC and the IPs.
// The lab's virt-launcher stand-in plumbs those interfaces for the guest.
func PodInterfaces(vmi *kubevirtv1.VirtualMachineInstance, pod *corev1.Pod) []kubevirtv1.VirtualMachineInstanceNetworkInterface {
	return interfaces(vmi, pod)
}
