package webhooks_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"gomodules.xyz/jsonpatch/v2"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	udnv1 "kvnet.io/kvnet/api/udn/v1"
	"kvnet.io/kvnet/internal/k8s/webhooks"
	"kvnet.io/kvnet/internal/multus"
)

// admit runs handler h on a CREATE of pod and returns the response and
// the pod's annotations after its patch.
func admit(t *testing.T, h admission.Handler, pod *corev1.Pod) (admission.Response, map[string]string) {
	t.Helper()
	raw, err := json.Marshal(pod)
	if err != nil {
		t.Fatal(err)
	}
	resp := h.Handle(context.Background(), admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		Operation: admissionv1.Create, Namespace: pod.Namespace, Object: runtime.RawExtension{Raw: raw},
		Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Pod"},
	}})
	ann := map[string]string{}
	for k, v := range pod.Annotations {
		ann[k] = v
	}
	for _, op := range resp.Patches {
		applyAnnotationPatch(t, op, ann)
	}
	return resp, ann
}

// applyAnnotationPatch applies the annotation operations of a JSON patch.
func applyAnnotationPatch(t *testing.T, op jsonpatch.JsonPatchOperation, ann map[string]string) {
	t.Helper()
	switch {
	case op.Path == "/metadata/annotations":
		m, _ := op.Value.(map[string]any)
		for k := range ann {
			delete(ann, k)
		}
		for k, v := range m {
			ann[k], _ = v.(string)
		}
	case strings.HasPrefix(op.Path, "/metadata/annotations/"):
		k := strings.NewReplacer("~1", "/", "~0", "~").Replace(strings.TrimPrefix(op.Path, "/metadata/annotations/"))
		if op.Operation == "remove" {
			delete(ann, k)
		} else {
			ann[k], _ = op.Value.(string)
		}
	default:
		t.Fatalf("patch touches %s, not only annotations", op.Path)
	}
}

// TestPrimaryPodMutatorMultus: in multus mode, pods in a primary-UDN
// namespace get the primary NAD as ovn-udn1 in their networks annotation,
// next to what they select; launcher pods carry their claim there; the
// namespaces and NADs are read from a real API server.
func TestPrimaryPodMutatorMultus(t *testing.T) {
	dec := admission.NewDecoder(env.Client.Scheme())
	primary := &webhooks.PrimaryPodMutator{Reader: c, Decoder: dec, Multus: true}
	labels := map[string]string{"k8s.ovn.org/primary-user-defined-network": ""}
	mkNS(t, "pm-early", labels)
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "pm-early", Name: "p"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "i"}}}}
	if resp, _ := admit(t, primary, pod); resp.Allowed || !strings.Contains(resp.Result.Message, "no primary UserDefinedNetwork or ClusterUserDefinedNetwork serves it") {
		t.Fatalf("pod before the primary NAD exists: allowed=%v %q", resp.Allowed, resp.Result.Message)
	}

	mkNS(t, "pm", labels)
	mkUDN(t, "pm", "tenant", udnv1.NetworkRolePrimary, "10.110.0.0/16")
	mkUDN(t, "pm", "extra", udnv1.NetworkRoleSecondary, "10.111.0.0/16")
	pod.Namespace = "pm"
	pod.Annotations = map[string]string{multus.NetworksAnnotation: "extra@net1"}
	resp, ann := admit(t, primary, pod)
	if !resp.Allowed {
		t.Fatalf("denied: %s", resp.Result.Message)
	}
	elems, err := multus.ParseSelection(multus.NetworksAnnotation, ann[multus.NetworksAnnotation], "pm")
	if err != nil || len(elems) != 2 || elems[0].Key() != "pm/tenant" || elems[0].InterfaceRequest != multus.PrimaryInterface || elems[1].Key() != "pm/extra" {
		t.Fatalf("networks after admission %q (%v)", ann[multus.NetworksAnnotation], err)
	}
	// Admitting the result again changes nothing (reinvocation).
	pod.Annotations = ann
	if resp, _ := admit(t, primary, pod); !resp.Allowed || len(resp.Patches) != 0 {
		t.Errorf("second admission: allowed=%v patches=%v", resp.Allowed, resp.Patches)
	}
	pod.Annotations = map[string]string{multus.NetworksAnnotation: "tenant@eth7"}
	if resp, _ := admit(t, primary, pod); resp.Allowed || !strings.Contains(resp.Result.Message, `attached as ovn-udn1, not "eth7"`) {
		t.Errorf("primary NAD on another interface: allowed=%v %q", resp.Allowed, resp.Result.Message)
	}

	// Other namespaces, host-network pods, and the default-network mode
	// are left alone.
	mkNS(t, "pm-plain", nil)
	for _, tc := range []struct {
		h   admission.Handler
		pod *corev1.Pod
	}{
		{primary, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "pm-plain", Name: "p"}}},
		{primary, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "pm", Name: "h"}, Spec: corev1.PodSpec{HostNetwork: true}}},
		{&webhooks.PrimaryPodMutator{Reader: c, Decoder: dec}, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "pm", Name: "p"}}},
	} {
		if resp, _ := admit(t, tc.h, tc.pod); !resp.Allowed || len(resp.Patches) != 0 {
			t.Errorf("%s/%s: allowed=%v patches=%v", tc.pod.Namespace, tc.pod.Name, resp.Allowed, resp.Patches)
		}
	}

	// A launcher pod: the claim, MAC and IPs go in the same element, and
	// no default-network element is written.
	create(t, primaryVMI("pm", "vm1", "02:cc:00:00:00:01", `{"podnet":["10.110.0.9"]}`))
	launcherH := &webhooks.LauncherPodMutator{Reader: c, Decoder: dec, PrimaryInNetworks: true, DefaultNetworkNAD: "unused/unused"}
	lp := launcherPod("pm", "vm1", nil)
	lp.Name = "virt-launcher-vm1-x"
	resp, ann = admit(t, launcherH, lp)
	if !resp.Allowed {
		t.Fatalf("launcher pod denied: %s", resp.Result.Message)
	}
	if _, ok := ann[multus.DefaultNetworkAnnotation]; ok {
		t.Errorf("launcher pod got %s in multus mode", multus.DefaultNetworkAnnotation)
	}
	lp.Annotations = ann
	resp, ann = admit(t, primary, lp)
	if !resp.Allowed {
		t.Fatalf("launcher pod denied by the primary mutator: %s", resp.Result.Message)
	}
	elems, err = multus.ParseSelection(multus.NetworksAnnotation, ann[multus.NetworksAnnotation], "pm")
	want := multus.NetworkSelectionElement{Name: "tenant", Namespace: "pm", InterfaceRequest: multus.PrimaryInterface,
		IPAMClaimReference: "vm1.podnet", MacRequest: "02:cc:00:00:00:01", IPRequest: []string{"10.110.0.9/16"}}
	if err != nil || len(elems) != 1 || !equalElem(elems[0], want) {
		t.Fatalf("launcher networks %q (%v), want one element %+v", ann[multus.NetworksAnnotation], err, want)
	}
}

func equalElem(a, b multus.NetworkSelectionElement) bool {
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return string(ja) == string(jb)
}

// TestPrimaryPodMutatorDefaultNetwork: in multus-default mode the primary
// NAD becomes the pod's default network for Multus: one default-network
// element naming it with kvnet-cni's attach-default-network cni-arg and
// nothing added to the networks annotation; a launcher pod's claim, MAC
// and IPs go in that element (written by the launcher mutator, which runs
// first, and kept by the primary mutator); a default-network annotation
// naming another network, or the primary network selected in the
// networks annotation, is refused, naming it.
func TestPrimaryPodMutatorDefaultNetwork(t *testing.T) {
	dec := admission.NewDecoder(env.Client.Scheme())
	primary := &webhooks.PrimaryPodMutator{Reader: c, Decoder: dec, Multus: true, AsDefaultNetwork: true}
	labels := map[string]string{"k8s.ovn.org/primary-user-defined-network": ""}
	mkNS(t, "pmd", labels)
	mkUDN(t, "pmd", "tenant", udnv1.NetworkRolePrimary, "10.112.0.0/16")
	mkUDN(t, "pmd", "extra", udnv1.NetworkRoleSecondary, "10.113.0.0/16")
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "pmd", Name: "p", Annotations: map[string]string{multus.NetworksAnnotation: "extra@net1"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "i"}}}}
	resp, ann := admit(t, primary, pod)
	if !resp.Allowed {
		t.Fatalf("denied: %s", resp.Result.Message)
	}
	if ann[multus.NetworksAnnotation] != "extra@net1" {
		t.Errorf("networks annotation changed to %q", ann[multus.NetworksAnnotation])
	}
	elems, err := multus.ParseSelection(multus.DefaultNetworkAnnotation, ann[multus.DefaultNetworkAnnotation], "pmd")
	if err != nil || len(elems) != 1 || elems[0].Key() != "pmd/tenant" || elems[0].CNIArgs[multus.AttachDefaultNetworkArg] != true || elems[0].InterfaceRequest != "" {
		t.Fatalf("default-network after admission %q (%v)", ann[multus.DefaultNetworkAnnotation], err)
	}
	pod.Annotations = ann
	if resp, _ := admit(t, primary, pod); !resp.Allowed || len(resp.Patches) != 0 {
		t.Errorf("second admission: allowed=%v patches=%v", resp.Allowed, resp.Patches)
	}
	for _, tc := range []struct{ name, key, value, msg string }{
		{"another default network", multus.DefaultNetworkAnnotation, "kube-system/other", `annotation v1.multus-cni.io/default-network is "kube-system/other": in a namespace with a primary network kvnet sets it to the primary network pmd/tenant`},
		{"primary in networks", multus.NetworksAnnotation, "tenant@ovn-udn1", `element 0 selects the namespace's primary network pmd/tenant, which kvnet attaches as the pod's default network`},
	} {
		pod.Annotations = map[string]string{tc.key: tc.value}
		resp, _ := admit(t, primary, pod)
		if msg := message(resp); resp.Allowed || !strings.Contains(msg, tc.msg) {
			t.Errorf("%s: allowed=%v %q, want denied with %q", tc.name, resp.Allowed, msg, tc.msg)
		}
	}

	create(t, primaryVMI("pmd", "vm1", "02:cc:00:00:00:02", `{"podnet":["10.112.0.9"]}`))
	launcherH := &webhooks.LauncherPodMutator{Reader: c, Decoder: dec, PrimaryAsDefaultNetwork: true}
	lp := launcherPod("pmd", "vm1", nil)
	lp.Name = "virt-launcher-vm1-x"
	resp, ann = admit(t, launcherH, lp)
	if !resp.Allowed {
		t.Fatalf("launcher pod denied: %s", resp.Result.Message)
	}
	lp.Annotations = ann
	resp, ann2 := admit(t, primary, lp)
	if !resp.Allowed || len(resp.Patches) != 0 {
		t.Fatalf("primary mutator on the launcher pod: allowed=%v %q patches=%v", resp.Allowed, message(resp), resp.Patches)
	}
	elems, err = multus.ParseSelection(multus.DefaultNetworkAnnotation, ann2[multus.DefaultNetworkAnnotation], "pmd")
	if err != nil || len(elems) != 1 {
		t.Fatalf("launcher default-network %q (%v)", ann2[multus.DefaultNetworkAnnotation], err)
	}
	e := elems[0]
	if e.Key() != "pmd/tenant" || e.IPAMClaimReference != "vm1.podnet" || e.MacRequest != "02:cc:00:00:00:02" ||
		len(e.IPRequest) != 1 || e.IPRequest[0] != "10.112.0.9/16" || e.CNIArgs[multus.AttachDefaultNetworkArg] != true {
		t.Errorf("launcher default-network element %+v", e)
	}
	if strings.Contains(ann2[multus.NetworksAnnotation], "tenant") {
		t.Errorf("launcher networks annotation selects the primary network: %q", ann2[multus.NetworksAnnotation])
	}
}

// message is a response's result message ("" when it has none).
func message(resp admission.Response) string {
	if resp.Result == nil {
		return ""
	}
	return resp.Result.Message
}
