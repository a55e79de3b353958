package udn_test

import (
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	udnv1 "kvnet.io/kvnet/api/udn/v1"
)

func forbiddenNSMessage(ns, what string) string {
	return fmt.Sprintf("namespace %q may not be served by a user-defined network: it is %s, which stays on the cluster default network", ns, what)
}

const globalNS = "one of the cluster's global namespaces (kube-system, kube-public, kube-node-lease)"

func wantNoNAD(t *testing.T, ns, name string) {
	t.Helper()
	if _, err := getNAD(ns, name); !apierrors.IsNotFound(err) {
		t.Errorf("NAD %s/%s rendered in a namespace no user-defined network may serve (err=%v)", ns, name, err)
	}
}

// TestForbiddenNamespaces: a UDN in the default namespace, an openshift-*
// namespace or a global namespace reports why (SyncError, with an event)
// and renders no NAD there; a CUDN selecting such namespaces among
// others serves the others and reports the refused ones
// (NetworkAttachmentDefinitionSyncError), as it reports any namespace it
// cannot serve.
func TestForbiddenNamespaces(t *testing.T) {
	mkNS(t, "openshift-udn-rule", nil)
	mkNS(t, "udn-rule-ok", nil)
	for _, tt := range []struct{ ns, what string }{
		{"default", "the default namespace"},
		{"openshift-udn-rule", "an openshift-* namespace"},
		{"kube-system", globalNS},
	} {
		u := l2UDN(tt.ns, "forbidden", udnv1.NetworkRoleSecondary, "10.61.0.0/24")
		create(t, u)
		waitExactCondition(t, u, metav1.ConditionFalse, "SyncError", forbiddenNSMessage(tt.ns, tt.what))
		waitEvent(t, u, corev1.EventTypeWarning, "SyncError")
		wantNoNAD(t, tt.ns, u.Name)
		del(t, u)
		waitGone(t, u)
	}

	cu := l2CUDN("forbidden-ns", udnv1.NetworkRoleSecondary, []string{"kube-node-lease", "openshift-udn-rule", "udn-rule-ok"}, "10.62.0.0/24")
	create(t, cu)
	waitExactCondition(t, cu, metav1.ConditionFalse, "NetworkAttachmentDefinitionSyncError",
		forbiddenNSMessage("kube-node-lease", globalNS)+"\n"+forbiddenNSMessage("openshift-udn-rule", "an openshift-* namespace"))
	waitEvent(t, cu, corev1.EventTypeWarning, "NetworkAttachmentDefinitionSyncError")
	waitNAD(t, "udn-rule-ok", cu.Name)
	wantNoNAD(t, "kube-node-lease", cu.Name)
	wantNoNAD(t, "openshift-udn-rule", cu.Name)
	del(t, cu)
	waitGone(t, cu)
}

// TestReservedSubnetOverlap: a UDN or CUDN whose subnets overlap the
// cluster's reserved subnets (here the default masquerade and transit
// subnets) is refused with both subnets named, as other validation
// failures are reported; no NAD is rendered.
func TestReservedSubnetOverlap(t *testing.T) {
	const ns = "reserved-overlap"
	mkNS(t, ns, nil)
	u := l2UDN(ns, "masq", udnv1.NetworkRoleSecondary, "169.254.10.0/24")
	create(t, u)
	waitExactCondition(t, u, metav1.ConditionFalse, "SyncError",
		`failed to generate NetworkAttachmentDefinition: render "reserved-overlap_masq": invalid subnet configuration: pod or join subnet overlaps with already configured internal subnets: `+
			`masquerade subnet "169.254.0.0/17" (kvnet-controller --masquerade-subnets) overlaps user defined subnet "169.254.10.0/24"`)
	wantNoNAD(t, ns, u.Name)

	cu := &udnv1.ClusterUserDefinedNetwork{
		ObjectMeta: metav1.ObjectMeta{Name: "transit-overlap"},
		Spec: udnv1.ClusterUserDefinedNetworkSpec{
			NamespaceSelector: metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelMetadataName: ns}},
			Network: udnv1.NetworkSpec{Topology: udnv1.NetworkTopologyLayer3, Layer3: &udnv1.Layer3Config{
				Role: udnv1.NetworkRoleSecondary, Subnets: []udnv1.Layer3Subnet{{CIDR: "100.88.0.0/14", HostSubnet: 24}},
			}},
		},
	}
	create(t, cu)
	waitExactCondition(t, cu, metav1.ConditionFalse, "NetworkAttachmentDefinitionSyncError",
		`failed to generate NetworkAttachmentDefinition: render "cluster_udn_transit-overlap": invalid subnet configuration: pod or join subnet overlaps with already configured internal subnets: `+
			`transit subnet "100.88.0.0/16" (kvnet-controller --transit-subnets) overlaps user defined subnet "100.88.0.0/14"`)
	wantNoNAD(t, ns, cu.Name)
}
