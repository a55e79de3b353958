package node

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
		Spec:       corev1.PodSpec{NodeName: pod.Spec.NodeName},
		Status:     corev1.PodStatus{Phase: pod.Status.Phase},
	}, nil
}

// trimNode keeps a node's metadata: its annotations hold the VTEP.
func trimNode(obj any) (any, error) {
	node, ok := obj.(*corev1.Node)
	if !ok {
		return obj, nil
	}
	// Addresses: tenants are kept off node ports at every node's.
	return &corev1.Node{TypeMeta: node.TypeMeta, ObjectMeta: trimMeta(node.ObjectMeta),
		Status: corev1.NodeStatus{Addresses: node.Status.Addresses}}, nil
}

func trimMeta(m metav1.ObjectMeta) metav1.ObjectMeta {
	return metav1.ObjectMeta{
		Name: m.Name, Namespace: m.Namespace, UID: m.UID, ResourceVersion: m.ResourceVersion,
		CreationTimestamp: m.CreationTimestamp, DeletionTimestamp: m.DeletionTimestamp,
		Labels: m.Labels, Annotations: m.Annotations,
	}
}
