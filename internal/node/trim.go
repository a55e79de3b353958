package node

import (
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
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
