// Package nodeid reads a node's cluster-unique node ID, the annotation
// k8s.ovn.org/node-id that kvnet-controller writes (as OVN-Kubernetes'
// cluster manager does). kvnet-node derives per-node addresses and MACs
// from it.
package nodeid

import (
	"strconv"

	corev1 "k8s.io/api/core/v1"
)

// Annotation holds a node's ID, a decimal 1..MaxID.
const Annotation = "k8s.ovn.org/node-id"

// MaxID is the largest node ID: IDs index a /16 of addresses per network
// (first and last left out).
const MaxID = 65534

// Parse returns the node ID a node's annotation holds, and whether it
// holds a valid one; a nil node holds none.
func Parse(node *corev1.Node) (int, bool) {
	if node == nil {
		return 0, false
	}
	v, ok := node.Annotations[Annotation]
	if !ok {
		return 0, false
	}
	id, err := strconv.Atoi(v)
	if err != nil || id < 1 || id > MaxID || strconv.Itoa(id) != v {
		return 0, false
	}
	return id, true
}
