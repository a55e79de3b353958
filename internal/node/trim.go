package node

import (
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kubevirtv1 "kvnet.io/kvnet/api/kubevirt/v1"
)

// trimPod keeps what Desired reads of a pod: the cache holds every pod of
// the cluster.
func trimPod(obj any) (any, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	return &corev1.Pod{
		TypeMeta:   pod.TypeMeta,
		ObjectMeta: trimMeta(pod.ObjectMeta),
		Spec:       corev1.PodSpec{NodeName: pod.Spec.NodeName, Containers: namedContainerPorts(pod)},
		// PodIPs: the DNS proxy rewrites them to the pod's addresses on
		// its primary network.
		Status: corev1.PodStatus{Phase: pod.Status.Phase, PodIPs: pod.Status.PodIPs},
	}, nil
}

// namedContainerPorts returns one container holding pod's named
// container ports (which NetworkPolicies may name), or none.
func namedContainerPorts(pod *corev1.Pod) []corev1.Container {
	var ports []corev1.ContainerPort
	for _, c := range append(slices.Clip(pod.Spec.InitContainers), pod.Spec.Containers...) {
		for _, p := range c.Ports {
			if p.Name != "" {
				ports = append(ports, corev1.ContainerPort{Name: p.Name, ContainerPort: p.ContainerPort, Protocol: p.Protocol})
			}
		}
	}
	if len(ports) == 0 {
		return nil
	}
	return []corev1.Container{{Name: "ports", Ports: ports}}
}

// trimNamespace keeps a namespace's metadata (its labels).
func trimNamespace(obj any) (any, error) {
	ns, ok := obj.(*corev1.Namespace)
	if !ok {
		return obj, nil
	}
	return &corev1.Namespace{TypeMeta: ns.TypeMeta, ObjectMeta: trimMeta(ns.ObjectMeta)}, nil
}

// trimNode keeps a node's metadata: its annotations hold the VTEP.
func trimNode(obj any) (any, error) {
	node, ok := obj.(*corev1.Node)
	if !ok {
		return obj, nil
	}
	// Addresses: tenants are kept off node ports at every node's. Pod
	// CIDRs: the cluster default network's pod subnets, which tenants
	// never reach.
	return &corev1.Node{TypeMeta: node.TypeMeta, ObjectMeta: trimMeta(node.ObjectMeta),
		Spec:   corev1.NodeSpec{PodCIDR: node.Spec.PodCIDR, PodCIDRs: node.Spec.PodCIDRs},
		Status: corev1.NodeStatus{Addresses: node.Status.Addresses}}, nil
}

// trimVMI keeps what the plan and the agent's Events read of a VMI: its
// metadata, which network each interface binds how (launcherServesDHCPv4),
// its node and its live migration. kvnet's VMI type keeps every field it
// does not declare; a VMI's status and managed fields are kilobytes, and
// every node caches every VMI.
func trimVMI(obj any) (any, error) {
	vmi, ok := obj.(*kubevirtv1.VirtualMachineInstance)
	if !ok {
		return obj, nil
	}
	out := &kubevirtv1.VirtualMachineInstance{TypeMeta: vmi.TypeMeta, ObjectMeta: trimMeta(vmi.ObjectMeta)}
	for _, n := range vmi.Spec.Networks {
		out.Spec.Networks = append(out.Spec.Networks, kubevirtv1.Network{Name: n.Name, Pod: n.Pod})
	}
	for _, i := range vmi.Spec.Domain.Devices.Interfaces {
		out.Spec.Domain.Devices.Interfaces = append(out.Spec.Domain.Devices.Interfaces, kubevirtv1.Interface{Name: i.Name, Bridge: i.Bridge})
	}
	out.Status.NodeName = vmi.Status.NodeName
	out.Status.MigrationState = vmi.Status.MigrationState
	return out, nil
}

// trimOther is the cache's transform of the kinds without their own: a
// VMI is trimmed (trimVMI), any other object loses its managed fields,
// which nothing reads.
func trimOther(obj any) (any, error) {
	switch o := obj.(type) {
	case *kubevirtv1.VirtualMachineInstance:
		return trimVMI(o)
	case metav1.Object:
		o.SetManagedFields(nil)
	}
	return obj, nil
}

func trimMeta(m metav1.ObjectMeta) metav1.ObjectMeta {
	return metav1.ObjectMeta{
		Name: m.Name, Namespace: m.Namespace, UID: m.UID, ResourceVersion: m.ResourceVersion,
		CreationTimestamp: m.CreationTimestamp, DeletionTimestamp: m.DeletionTimestamp,
		Labels: m.Labels, Annotations: m.Annotations,
	}
}

// sameButVersion reports whether two versions of a cached object differ
// in nothing but their resourceVersion (and managed fields): an update
// that changes nothing the agent keeps.
func sameButVersion(oldObj, newObj any) bool {
	o, ok1 := oldObj.(client.Object)
	n, ok2 := newObj.(client.Object)
	if !ok1 || !ok2 {
		return false
	}
	if o.GetResourceVersion() == n.GetResourceVersion() {
		// A relist delivering what the cache had: nothing new either.
		return equality.Semantic.DeepEqual(o, n)
	}
	oc, nc := o.DeepCopyObject().(client.Object), n.DeepCopyObject().(client.Object)
	oc.SetResourceVersion("")
	nc.SetResourceVersion("")
	oc.SetManagedFields(nil)
	nc.SetManagedFields(nil)
	return equality.Semantic.DeepEqual(oc, nc)
}
