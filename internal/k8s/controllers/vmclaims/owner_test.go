package vmclaims

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kubevirtv1 "kvnet.io/kvnet/api/kubevirt/v1"
)

// claimOwner gives a VMI's claims to its VM even when the controller's
// cache has not seen the VM yet (a VM created a moment before its VMI):
// the VMI's controller reference names it. Owned by the VMI, the claims
// would go with it at the next stop. (A unit test: no real cache can be
// held behind on purpose.)
func TestClaimOwner(t *testing.T) {
	yes := true
	ref := func(apiVersion, kind string) []metav1.OwnerReference {
		return []metav1.OwnerReference{{APIVersion: apiVersion, Kind: kind, Name: "vm1", UID: "vm-uid", Controller: &yes}}
	}
	vm := &kubevirtv1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "vm1", UID: "vm-uid"}}
	for _, tc := range []struct {
		name     string
		vm       *kubevirtv1.VirtualMachine
		refs     []metav1.OwnerReference
		wantKind string
		wantUID  string
	}{
		{"VM in the cache", vm, ref("kubevirt.io/v1", "VirtualMachine"), "VirtualMachine", "vm-uid"},
		{"VM not in the cache yet", nil, ref("kubevirt.io/v1", "VirtualMachine"), "VirtualMachine", "vm-uid"},
		{"standalone VMI", nil, nil, "VirtualMachineInstance", "vmi-uid"},
		{"VMI controlled by something else", nil, ref("pool.kubevirt.io/v1alpha1", "VirtualMachinePool"), "VirtualMachineInstance", "vmi-uid"},
		{"a VirtualMachine kind of another group", nil, ref("example.com/v1", "VirtualMachine"), "VirtualMachineInstance", "vmi-uid"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vmi := &kubevirtv1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "vm1", UID: "vmi-uid", OwnerReferences: tc.refs}}
			owner, gvk := claimOwner(tc.vm, vmi)
			if gvk.Kind != tc.wantKind || string(owner.GetUID()) != tc.wantUID || owner.GetName() != "vm1" {
				t.Errorf("owner %s %s (UID %s), want %s UID %s", gvk.Kind, owner.GetName(), owner.GetUID(), tc.wantKind, tc.wantUID)
			}
		})
	}
}
