package node

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestTrimNodeKeepsWhatThePlanReads: the node informer's transform keeps
// a Node's addresses and pod CIDRs (the plan reads them: node ports,
// the default network's subnets) and drops the rest.
func TestTrimNodeKeepsWhatThePlanReads(t *testing.T) {
	in := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", Labels: map[string]string{"a": "b"}},
		Spec: corev1.NodeSpec{PodCIDR: "10.244.1.0/24", PodCIDRs: []string{"10.244.1.0/24", "fd00:244::/64"}, ProviderID: "x"},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "192.0.2.1"}},
			Images: []corev1.ContainerImage{{Names: []string{"big"}}}}}
	out, err := trimNode(in)
	if err != nil {
		t.Fatal(err)
	}
	n := out.(*corev1.Node)
	if n.Spec.PodCIDR != "10.244.1.0/24" || len(n.Spec.PodCIDRs) != 2 || len(n.Status.Addresses) != 1 || n.Labels["a"] != "b" {
		t.Errorf("trimmed node lost what the plan reads: %+v", n)
	}
	if n.Spec.ProviderID != "" || len(n.Status.Images) != 0 {
		t.Errorf("trimmed node kept what nothing reads: %+v", n)
	}
}
