package webhooks_test

// KubeVirt patches live launcher pods; these tests replay its patches,
// object shapes as KubeVirt v1.7.0 writes them, against the launcher-pod
// webhook (through the API server where the installed configuration
// applies).

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	nadv1 "kvnet.io/kvnet/api/k8scni/v1"
	kubevirtv1 "kvnet.io/kvnet/api/kubevirt/v1"
	udnv1 "kvnet.io/kvnet/api/udn/v1"
	"kvnet.io/kvnet/internal/k8s/webhooks"
	"kvnet.io/kvnet/internal/kubevirt/launcher"
	"kvnet.io/kvnet/internal/multus"
	"kvnet.io/kvnet/internal/testenv"
)

// kubevirtBindings is the KubeVirt CR's spec.configuration.network.binding
// with l2bridge registered as kvnet check asks.
var kubevirtBindings = map[string]kubevirtv1.InterfaceBindingPlugin{"l2bridge": {DomainAttachmentType: "managedTap"}}

// jsonPatchAdd patches pod with one JSON patch "add" of annotation key,
// as KubeVirt's controllers do (pkg/controller/controller.go
// SyncPodAnnotations; pkg/virt-controller/watch/migration/migration.go for
// the migration-target-ready timestamp): "/metadata/annotations/<key>"
// with "/" escaped as "~1".
func jsonPatchAdd(ctx context.Context, pod *corev1.Pod, values map[string]string) error {
	type op struct {
		Op    string `json:"op"`
		Path  string `json:"path"`
		Value string `json:"value"`
	}
	var ops []op
	for k, v := range values {
		ops = append(ops, op{Op: "add", Path: "/metadata/annotations/" + strings.NewReplacer("~", "~0", "/", "~1").Replace(k), Value: v})
	}
	b, err := json.Marshal(ops)
	if err != nil {
		return err
	}
	return c.Patch(ctx, pod, client.RawPatch(types.JSONPatchType, b))
}

// secondaryNAD writes a kvnet-cni NAD for a persistent secondary Layer2
// network by hand (a UDN's NAD could not be deleted under a running pod).
func secondaryNAD(t *testing.T, ns, name, subnet string) *nadv1.NetworkAttachmentDefinition {
	t.Helper()
	nad := &nadv1.NetworkAttachmentDefinition{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: nadv1.NetworkAttachmentDefinitionSpec{Config: fmt.Sprintf(`{"cniVersion":"1.1.0","type":"kvnet-cni","name":"%s_%s",`+
			`"topology":"layer2","role":"secondary","allowPersistentIPs":true,"subnets":%q,"netAttachDefName":"%s/%s"}`, ns, name, subnet, ns, name)},
	}
	create(t, nad)
	return nad
}

// TestLauncherPodUpdatesNeverDenied: once a launcher pod runs, the
// webhook admits every update KubeVirt makes, even when what CREATE
// checks no longer holds (here the NAD of a secondary network was deleted
// under the running VM), and keeps kvnet's annotations through them: the
// claim references, the default-network element.
func TestLauncherPodUpdatesNeverDenied(t *testing.T) {
	ctx := context.Background()
	const ns = "lp-upd"
	mkNS(t, ns, map[string]string{"k8s.ovn.org/primary-user-defined-network": ""})
	mkUDN(t, ns, "tenant", udnv1.NetworkRolePrimary, "10.120.0.0/16")
	blue := secondaryNAD(t, ns, "blue", "192.168.20.0/24")
	secondaryNAD(t, ns, "red", "192.168.21.0/24")
	vmi := primaryVMI(ns, "vm1", "02:dd:00:00:00:01", "")
	vmi.Spec.Domain.Devices.Interfaces = append(vmi.Spec.Domain.Devices.Interfaces,
		kubevirtv1.Interface{Name: "blue-net", Bridge: &kubevirtv1.InterfaceBridge{}, MacAddress: "02:dd:00:00:00:02"})
	vmi.Spec.Networks = append(vmi.Spec.Networks, kubevirtv1.Network{Name: "blue-net", Multus: &kubevirtv1.MultusNetwork{NetworkName: "blue"}})
	create(t, vmi)
	// The launcher pod as virt-controller templates it.
	ann, err := launcher.Annotations(vmi, kubevirtBindings)
	if err != nil {
		t.Fatal(err)
	}
	pod := launcherPod(ns, "vm1", ann)
	create(t, pod)
	wantDefault := pod.Annotations[multus.DefaultNetworkAnnotation]
	if wantDefault == "" || pod.Annotations["k8s.ovn.org/primary-udn-ipamclaim"] != "vm1.podnet" {
		t.Fatalf("launcher pod admitted without its primary claim: %v", pod.Annotations)
	}
	checkClaims := func(step string, want map[string]string) {
		t.Helper()
		elems, err := multus.ParseSelection(multus.NetworksAnnotation, pod.Annotations[multus.NetworksAnnotation], ns)
		if err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		got := map[string]string{}
		for _, e := range elems {
			got[e.Name] = e.IPAMClaimReference
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s: claim references by NAD %v, want %v", step, got, want)
		}
		if pod.Annotations[multus.DefaultNetworkAnnotation] != wantDefault || pod.Annotations["k8s.ovn.org/primary-udn-ipamclaim"] != "vm1.podnet" {
			t.Errorf("%s: primary claim lost: default-network %q, legacy %q", step, pod.Annotations[multus.DefaultNetworkAnnotation], pod.Annotations["k8s.ovn.org/primary-udn-ipamclaim"])
		}
	}
	checkClaims("after CREATE", map[string]string{"blue": "vm1.blue-net"})

	// The secondary network's NAD goes while the VM runs; wait until the
	// webhook knows (a new launcher pod of the VM is refused for it).
	if err := c.Delete(ctx, blue); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, timeout, "the webhook sees NAD blue gone", func() error {
		err := c.Create(ctx, launcherPod(ns, "vm1", ann))
		if err == nil || !strings.Contains(err.Error(), "NetworkAttachmentDefinition "+ns+"/blue, named by a network of VMI vm1, does not exist") {
			return fmt.Errorf("CREATE of a second launcher pod: %v", err)
		}
		return nil
	})

	// virt-controller's VMI sync (pkg/virt-controller/watch/vmi/lifecycle.go
	// through pkg/controller/controller.go SyncPodAnnotations) adds the
	// descheduler's evict-only annotation to a ready launcher pod.
	if err := jsonPatchAdd(ctx, pod, map[string]string{"descheduler.alpha.kubernetes.io/request-evict-only": ""}); err != nil {
		t.Fatalf("virt-controller's annotation sync refused: %v", err)
	}
	// The migration controller (pkg/virt-controller/watch/migration/
	// migration.go) stamps a target pod whose domain is ready.
	if err := jsonPatchAdd(ctx, pod, map[string]string{kubevirtv1.MigrationTargetReadyAnnotation: "2026-11-27 10:00:00 +0000 UTC"}); err != nil {
		t.Fatalf("the migration-target-ready timestamp refused: %v", err)
	}
	// A label patch (kubectl label, a descheduler, an operator).
	before := pod.DeepCopy()
	pod.Labels["kvnet-test/updated"] = "yes"
	if err := c.Patch(ctx, pod, client.MergeFrom(before)); err != nil {
		t.Fatalf("label patch refused: %v", err)
	}
	checkClaims("after KubeVirt's patches", map[string]string{"blue": "vm1.blue-net"})

	// Hot plug of network red: virt-controller rebuilds the networks
	// annotation from the VMI alone (pkg/network/pod/annotations/
	// generator.go GenerateFromActivePod), without kvnet's claim
	// references, and adds it with the same JSON patch.
	if err := c.Get(ctx, client.ObjectKeyFromObject(vmi), vmi); err != nil {
		t.Fatal(err)
	}
	if err := hotPlug(ctx, vmi, pod, "red-net", "red", "02:dd:00:00:00:03"); err != nil {
		t.Fatalf("hot plug's networks annotation refused: %v", err)
	}
	checkClaims("after hot plug", map[string]string{"blue": "vm1.blue-net", "red": "vm1.red-net"})
}

// admitUpdate runs handler h on an UPDATE of old to pod and returns the
// response and the pod's annotations after its patch.
func admitUpdate(t *testing.T, h admission.Handler, old, pod *corev1.Pod) (admission.Response, map[string]string) {
	t.Helper()
	rawOld, err := json.Marshal(old)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := json.Marshal(pod)
	if err != nil {
		t.Fatal(err)
	}
	resp := h.Handle(context.Background(), admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		Operation: admissionv1.Update, Namespace: pod.Namespace, Name: pod.Name,
		Object: runtime.RawExtension{Raw: raw}, OldObject: runtime.RawExtension{Raw: rawOld},
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

// TestLauncherPodHotPlugKeepsPrimaryElement: in multus mode the primary
// network is the networks annotation's ovn-udn1 element, which KubeVirt
// does not know: its rebuild of the annotation on hot plug and unplug
// (pkg/network/pod/annotations/generator.go GenerateFromActivePod, patched
// in by pkg/controller/controller.go SyncPodAnnotations) drops it. The
// webhook puts it back, for a primary network with persistent IPs (with
// the claim, MAC and IPs) and without (the bare element). Namespaces,
// NADs and VMIs are read from the API server.
func TestLauncherPodHotPlugKeepsPrimaryElement(t *testing.T) {
	ctx := context.Background()
	dec := admission.NewDecoder(env.Client.Scheme())
	primaryH := &webhooks.PrimaryPodMutator{Reader: c, Decoder: dec, Multus: true}
	launcherH := &webhooks.LauncherPodMutator{Reader: c, Decoder: dec, PrimaryInNetworks: true, DefaultNetworkNAD: "unused/unused"}
	for _, persistent := range []bool{true, false} {
		t.Run(fmt.Sprintf("persistent=%v", persistent), func(t *testing.T) {
			ns := fmt.Sprintf("lp-hotplug-%v", persistent)
			mkNS(t, ns, map[string]string{"k8s.ovn.org/primary-user-defined-network": ""})
			l2 := &udnv1.Layer2Config{Role: udnv1.NetworkRolePrimary, Subnets: udnv1.DualStackCIDRs{"10.121.0.0/16"}}
			if persistent {
				l2.IPAM = &udnv1.IPAMConfig{Lifecycle: udnv1.IPAMLifecyclePersistent}
			}
			create(t, &udnv1.UserDefinedNetwork{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "tenant"},
				Spec: udnv1.UserDefinedNetworkSpec{Topology: udnv1.NetworkTopologyLayer2, Layer2: l2}})
			testenv.Eventually(t, timeout, "NAD "+ns+"/tenant", func() error {
				return c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "tenant"}, &nadv1.NetworkAttachmentDefinition{})
			})
			secondaryNAD(t, ns, "blue", "192.168.30.0/24")
			vmi := primaryVMI(ns, "vm1", "02:ee:00:00:00:01", "")
			create(t, vmi)

			// CREATE: both webhooks in the API server's order.
			ann, err := launcher.Annotations(vmi, kubevirtBindings)
			if err != nil {
				t.Fatal(err)
			}
			pod := launcherPod(ns, "vm1", ann)
			pod.Name = "virt-launcher-vm1-abcde"
			resp, got := admit(t, launcherH, pod)
			if !resp.Allowed {
				t.Fatalf("launcher pod denied: %s", resp.Result.Message)
			}
			pod.Annotations = got
			if resp, got = admit(t, primaryH, pod); !resp.Allowed {
				t.Fatalf("launcher pod denied by the primary mutator: %s", resp.Result.Message)
			}
			pod.Annotations = got
			wantPrimary := multus.NetworkSelectionElement{Name: "tenant", Namespace: ns, InterfaceRequest: multus.PrimaryInterface}
			if persistent {
				wantPrimary.IPAMClaimReference, wantPrimary.MacRequest = "vm1.podnet", "02:ee:00:00:00:01"
			}
			checkPrimary := func(step string, ann map[string]string, secondaries int) {
				t.Helper()
				elems, err := multus.ParseSelection(multus.NetworksAnnotation, ann[multus.NetworksAnnotation], ns)
				if err != nil {
					t.Fatalf("%s: %v", step, err)
				}
				if len(elems) != 1+secondaries || !equalElem(elems[0], wantPrimary) {
					t.Fatalf("%s: networks %s, want the primary element %+v first and %d more", step, ann[multus.NetworksAnnotation], wantPrimary, secondaries)
				}
			}
			checkPrimary("after CREATE", pod.Annotations, 0)

			// Hot plug of blue: the VMI gains the interface, and
			// virt-controller writes the annotation it rebuilt.
			vmi.Spec.Domain.Devices.Interfaces = append(vmi.Spec.Domain.Devices.Interfaces,
				kubevirtv1.Interface{Name: "blue-net", Bridge: &kubevirtv1.InterfaceBridge{}, MacAddress: "02:ee:00:00:00:02"})
			vmi.Spec.Networks = append(vmi.Spec.Networks, kubevirtv1.Network{Name: "blue-net", Multus: &kubevirtv1.MultusNetwork{NetworkName: "blue"}})
			if err := c.Update(ctx, vmi); err != nil {
				t.Fatal(err)
			}
			rebuilt, err := launcher.Annotations(vmi, kubevirtBindings)
			if err != nil {
				t.Fatal(err)
			}
			updated := pod.DeepCopy()
			updated.Annotations[multus.NetworksAnnotation] = rebuilt[multus.NetworksAnnotation]
			resp, got = admitUpdate(t, launcherH, pod, updated)
			if !resp.Allowed {
				t.Fatalf("hot plug denied: %s", resp.Result.Message)
			}
			checkPrimary("after hot plug", got, 1)
			elems, _ := multus.ParseSelection(multus.NetworksAnnotation, got[multus.NetworksAnnotation], ns)
			if elems[1].Name != "blue" || elems[1].IPAMClaimReference != "vm1.blue-net" {
				t.Errorf("hot-plugged element %+v, want blue with claim vm1.blue-net", elems[1])
			}
			pod.Annotations = got

			// Unplug: state absent, so virt-controller's rebuild has no
			// multus network left and writes an empty annotation.
			vmi.Spec.Domain.Devices.Interfaces[1].State = kubevirtv1.InterfaceStateAbsent
			rebuilt, err = launcher.Annotations(vmi, kubevirtBindings)
			if err != nil {
				t.Fatal(err)
			}
			updated = pod.DeepCopy()
			updated.Annotations[multus.NetworksAnnotation] = rebuilt[multus.NetworksAnnotation]
			resp, got = admitUpdate(t, launcherH, pod, updated)
			if !resp.Allowed {
				t.Fatalf("unplug denied: %s", resp.Result.Message)
			}
			checkPrimary("after unplug", got, 0)
		})
	}
}

// hotPlug does what virt-controller does on a hot plug of a bridge
// interface iface on NAD nad with mac: adds it to the VMI, rebuilds the
// launcher pod's networks annotation from the VMI alone
// (pkg/network/pod/annotations/generator.go GenerateFromActivePod) and
// writes it with a JSON patch; it returns the patch's error.
func hotPlug(ctx context.Context, vmi *kubevirtv1.VirtualMachineInstance, pod *corev1.Pod, iface, nad, mac string) error {
	vmi.Spec.Domain.Devices.Interfaces = append(vmi.Spec.Domain.Devices.Interfaces,
		kubevirtv1.Interface{Name: iface, Bridge: &kubevirtv1.InterfaceBridge{}, MacAddress: mac})
	vmi.Spec.Networks = append(vmi.Spec.Networks, kubevirtv1.Network{Name: iface, Multus: &kubevirtv1.MultusNetwork{NetworkName: nad}})
	if err := c.Update(ctx, vmi); err != nil {
		return fmt.Errorf("update VMI: %w", err)
	}
	rebuilt, err := launcher.Annotations(vmi, kubevirtBindings)
	if err != nil {
		return err
	}
	return jsonPatchAdd(ctx, pod, map[string]string{multus.NetworksAnnotation: rebuilt[multus.NetworksAnnotation]})
}
