package udn_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	udnv1 "kvnet.io/kvnet/api/udn/v1"
	"kvnet.io/kvnet/internal/udn"
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

// TestRefusedNamespaceLosesNAD: when the namespace rule comes to refuse
// a namespace a network already has a NAD in (kvnet-controller restarted
// with that namespace among --global-namespaces), the NAD goes, as when
// a CUDN's selector stops matching: a CUDN keeps serving its other
// namespaces and names the refused one; a UDN there reports why; a NAD a
// pod uses stays until the pod is gone.
func TestRefusedNamespaceLosesNAD(t *testing.T) {
	ctx := context.Background()
	const ok, refusedA, refusedB = "late-rule-ok", "late-rule-a", "late-rule-b"
	for _, ns := range []string{ok, refusedA, refusedB} {
		mkNS(t, ns, nil)
	}
	cu := l2CUDN("late-rule", udnv1.NetworkRoleSecondary, []string{ok, refusedA}, "10.63.0.0/24")
	create(t, cu)
	u := l2UDN(refusedB, "late", udnv1.NetworkRoleSecondary, "10.64.0.0/24")
	create(t, u)
	waitNAD(t, ok, cu.Name)
	waitNAD(t, refusedA, cu.Name)
	waitNAD(t, refusedB, u.Name)
	user := pod(refusedB, "user", map[string]string{"k8s.v1.cni.cncf.io/networks": u.Name})
	create(t, user)

	// kvnet-controller restarted with both namespaces global.
	opts := ctl.Options()
	opts.GlobalNamespaces = append(slices.Clone(udn.DefaultGlobalNamespaces), refusedA, refusedB)
	ctl.Stop()
	stop, err := env.RunController(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stop()
		ctl.Start(t)
	})
	global := fmt.Sprintf("one of the cluster's global namespaces (%s)", strings.Join(opts.GlobalNamespaces, ", "))
	waitExactCondition(t, cu, metav1.ConditionFalse, "NetworkAttachmentDefinitionSyncError", forbiddenNSMessage(refusedA, global))
	waitNADGone(t, refusedA, cu.Name)
	waitNAD(t, ok, cu.Name)
	waitCondition(t, u, metav1.ConditionFalse, "SyncError", forbiddenNSMessage(refusedB, global))
	if _, err := getNAD(refusedB, u.Name); err != nil {
		t.Fatalf("NAD %s/%s, which pod %s uses, is gone: %v", refusedB, u.Name, user.Name, err)
	}
	if err := c.Delete(ctx, user); err != nil {
		t.Fatal(err)
	}
	waitNADGone(t, refusedB, u.Name)
}
