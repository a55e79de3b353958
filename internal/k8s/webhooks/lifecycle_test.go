package webhooks_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ipamclaimv1alpha1 "kvnet.io/kvnet/api/k8scni/v1alpha1"
	kubevirtv1 "kvnet.io/kvnet/api/kubevirt/v1"
	udnv1 "kvnet.io/kvnet/api/udn/v1"
	"kvnet.io/kvnet/internal/kubevirt/launcher"
	"kvnet.io/kvnet/internal/multus"
	"kvnet.io/kvnet/internal/testenv"
)

// TestVMLifecycleThroughAdmissionAndGC follows one VM through every part
// the other tests cover one at a time, in one cluster with the webhooks
// registered and the garbage collector running: the MAC pool webhook gives
// the VM its secondary MAC, the claims controller creates its IPAMClaims,
// the launcher-pod webhook points the pod at them, the IPAM fills them,
// and deleting the VM lets the garbage collector remove the VMI, the pod
// and (once kvnet drops its finalizer) the claims, and frees the MAC.
func TestVMLifecycleThroughAdmissionAndGC(t *testing.T) {
	ctx := context.Background()
	const ns = "vm-life"
	mkNS(t, ns, map[string]string{"k8s.ovn.org/primary-user-defined-network": ""})
	mkUDN(t, ns, "tenant", udnv1.NetworkRolePrimary, "10.102.0.0/16")
	mkUDN(t, ns, "blue", udnv1.NetworkRoleSecondary, "192.168.30.0/24")

	always := "Always"
	v := &kubevirtv1.VirtualMachine{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "vm1"},
		Spec: kubevirtv1.VirtualMachineSpec{RunStrategy: &always, Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{
			Spec: kubevirtv1.VirtualMachineInstanceSpec{
				Domain: kubevirtv1.DomainSpec{Devices: kubevirtv1.Devices{Interfaces: []kubevirtv1.Interface{
					{Name: "podnet", Binding: &kubevirtv1.PluginBinding{Name: "l2bridge"}},
					{Name: "blue-net", Bridge: &kubevirtv1.InterfaceBridge{}},
				}}},
				Networks: []kubevirtv1.Network{
					{Name: "podnet", Pod: &kubevirtv1.PodNetwork{}},
					{Name: "blue-net", Multus: &kubevirtv1.MultusNetwork{NetworkName: "blue"}},
				},
			},
		}},
	}
	create(t, v)
	mac := v.Spec.Template.Spec.Domain.Devices.Interfaces[1].MacAddress
	if mac == "" {
		t.Fatal("the MAC pool gave the multus interface no MAC")
	}

	// What virt-controller does: the VMI, owned by the VM, and its launcher
	// pod, owned by the VMI.
	tr := true
	vmi := &kubevirtv1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "vm1", OwnerReferences: []metav1.OwnerReference{{
			APIVersion: "kubevirt.io/v1", Kind: "VirtualMachine", Name: v.Name, UID: v.UID, Controller: &tr, BlockOwnerDeletion: &tr,
		}}},
		Spec: v.Spec.Template.Spec,
	}
	create(t, vmi)
	wantClaims := []string{"vm1.blue-net", "vm1.podnet"}
	testenv.Eventually(t, timeout, "claims of vm1", func() error {
		names, err := claimNames(ctx, ns)
		if err != nil {
			return err
		}
		if !slices.Equal(names, wantClaims) {
			return fmt.Errorf("claims %v, want %v", names, wantClaims)
		}
		return nil
	})

	// l2bridge as the docs register it: a core binding with no NAD.
	ann, err := launcher.Annotations(vmi, map[string]kubevirtv1.InterfaceBindingPlugin{"l2bridge": {DomainAttachmentType: "managedTap"}})
	if err != nil {
		t.Fatal(err)
	}
	pod := launcherPod(ns, "vm1", ann)
	pod.OwnerReferences = []metav1.OwnerReference{{
		APIVersion: "kubevirt.io/v1", Kind: "VirtualMachineInstance", Name: vmi.Name, UID: vmi.UID, Controller: &tr, BlockOwnerDeletion: &tr,
	}}
	create(t, pod)
	elems, err := multus.ParseSelection(multus.NetworksAnnotation, pod.Annotations[multus.NetworksAnnotation], ns)
	if err != nil {
		t.Fatal(err)
	}
	if len(elems) != 1 || elems[0].IPAMClaimReference != "vm1.blue-net" || elems[0].MacRequest != mac {
		t.Fatalf("secondary element after admission: %+v (pool MAC %s)", elems, mac)
	}
	var def []multus.NetworkSelectionElement
	if err := json.Unmarshal([]byte(pod.Annotations[multus.DefaultNetworkAnnotation]), &def); err != nil || len(def) != 1 || def[0].IPAMClaimReference != "vm1.podnet" {
		t.Fatalf("default-network element %q (%v)", pod.Annotations[multus.DefaultNetworkAnnotation], err)
	}
	// The IPAM allocates through the claims the webhook named.
	testenv.Eventually(t, timeout, "claims hold IPs", func() error {
		for _, name := range wantClaims {
			var cl ipamclaimv1alpha1.IPAMClaim
			if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &cl); err != nil {
				return err
			}
			if len(cl.Status.IPs) == 0 {
				return fmt.Errorf("claim %s has no IPs yet", name)
			}
		}
		return nil
	})

	// Delete the VM: the garbage collector takes the VMI and the pod, kvnet
	// then releases the claims, and the garbage collector deletes them.
	if err := c.Delete(ctx, v, client.PropagationPolicy(metav1.DeletePropagationBackground)); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, timeout, "VMI, launcher pod and claims gone", func() error {
		for _, o := range []client.Object{&kubevirtv1.VirtualMachineInstance{}, &corev1.Pod{}} {
			name := vmi.Name
			if _, isPod := o.(*corev1.Pod); isPod {
				name = pod.Name
			}
			if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, o); !apierrors.IsNotFound(err) {
				return fmt.Errorf("%T %s still there (err=%v)", o, name, err)
			}
		}
		names, err := claimNames(ctx, ns)
		if err != nil {
			return err
		}
		if len(names) != 0 {
			return fmt.Errorf("claims %v left", names)
		}
		return nil
	})
	// The VM's MAC is free again.
	testenv.Eventually(t, timeout, "MAC "+mac+" free", func() error {
		return c.Create(ctx, vm(ns, "reuse", bridge("sec", mac)))
	})
}

func claimNames(ctx context.Context, ns string) ([]string, error) {
	var list ipamclaimv1alpha1.IPAMClaimList
	if err := c.List(ctx, &list, client.InNamespace(ns)); err != nil {
		return nil, err
	}
	var names []string
	for _, cl := range list.Items {
		names = append(names, cl.Name)
	}
	slices.Sort(names)
	return names, nil
}
