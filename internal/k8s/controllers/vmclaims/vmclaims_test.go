package vmclaims_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nadv1 "kvnet.io/kvnet/api/k8scni/v1"
	ipamclaimv1alpha1 "kvnet.io/kvnet/api/k8scni/v1alpha1"
	kubevirtv1 "kvnet.io/kvnet/api/kubevirt/v1"
	udnv1 "kvnet.io/kvnet/api/udn/v1"
	"kvnet.io/kvnet/internal/k8s/manager"
	"kvnet.io/kvnet/internal/testenv"
	"kvnet.io/kvnet/internal/vmclaims"
)

var (
	env *testenv.Env
	c   client.Client
)

// timeout bounds every wait for the system to converge.
const timeout = 45 * time.Second

func TestMain(m *testing.M) {
	// kube-controller-manager runs: claims are deleted by its garbage collector.
	os.Exit(testenv.Main(m, testenv.Options{}, func(e *testenv.Env) (manager.Options, error) {
		c = e.Client
		return manager.Options{}, nil
	}, &env, nil))
}

func create(t *testing.T, o client.Object) {
	t.Helper()
	testenv.Create(t, c, o)
}

// setup makes a namespace with a persistent primary UDN and a persistent
// and a plain secondary UDN.
func setup(t *testing.T, ns string) {
	t.Helper()
	create(t, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{"k8s.ovn.org/primary-user-defined-network": ""}}})
	for _, u := range []struct {
		name       string
		role       udnv1.NetworkRole
		persistent bool
		subnet     udnv1.CIDR
	}{{"primary", udnv1.NetworkRolePrimary, true, "10.0.0.0/16"}, {"blue", udnv1.NetworkRoleSecondary, true, "10.1.0.0/16"}, {"plain", udnv1.NetworkRoleSecondary, false, "10.2.0.0/16"}} {
		obj := &udnv1.UserDefinedNetwork{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: u.name},
			Spec:       udnv1.UserDefinedNetworkSpec{Topology: udnv1.NetworkTopologyLayer2, Layer2: &udnv1.Layer2Config{Role: u.role, Subnets: udnv1.DualStackCIDRs{u.subnet}}},
		}
		if u.persistent {
			obj.Spec.Layer2.IPAM = &udnv1.IPAMConfig{Lifecycle: udnv1.IPAMLifecyclePersistent}
		}
		create(t, obj)
		testenv.Eventually(t, timeout, "NAD "+u.name, func() error {
			return c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: u.name}, &nadv1.NetworkAttachmentDefinition{})
		})
	}
}

func vmiSpec(nets ...string) kubevirtv1.VirtualMachineInstanceSpec {
	var s kubevirtv1.VirtualMachineInstanceSpec
	for _, n := range nets {
		if n == "pod" {
			s.Networks = append(s.Networks, kubevirtv1.Network{Name: "pod", Pod: &kubevirtv1.PodNetwork{}})
			s.Domain.Devices.Interfaces = append(s.Domain.Devices.Interfaces, kubevirtv1.Interface{Name: "pod", Binding: &kubevirtv1.PluginBinding{Name: "l2bridge"}})
			continue
		}
		s.Networks = append(s.Networks, kubevirtv1.Network{Name: n + "-net", Multus: &kubevirtv1.MultusNetwork{NetworkName: n}})
		s.Domain.Devices.Interfaces = append(s.Domain.Devices.Interfaces, kubevirtv1.Interface{Name: n + "-net", Bridge: &kubevirtv1.InterfaceBridge{}})
	}
	return s
}

func mkVM(t *testing.T, ns, name string, nets ...string) *kubevirtv1.VirtualMachine {
	t.Helper()
	vm := &kubevirtv1.VirtualMachine{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       kubevirtv1.VirtualMachineSpec{Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{Spec: vmiSpec(nets...)}},
	}
	create(t, vm)
	return vm
}

// startVMI creates the VMI a VM runs (as virt-controller would).
func startVMI(t *testing.T, vm *kubevirtv1.VirtualMachine) *kubevirtv1.VirtualMachineInstance {
	t.Helper()
	tr := true
	vmi := &kubevirtv1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{Namespace: vm.Namespace, Name: vm.Name, OwnerReferences: []metav1.OwnerReference{{
			APIVersion: "kubevirt.io/v1", Kind: "VirtualMachine", Name: vm.Name, UID: vm.UID, Controller: &tr, BlockOwnerDeletion: &tr,
		}}},
		Spec: vm.Spec.Template.Spec,
	}
	create(t, vmi)
	return vmi
}

func claims(t *testing.T, ns, vm string) map[string]ipamclaimv1alpha1.IPAMClaim {
	t.Helper()
	var list ipamclaimv1alpha1.IPAMClaimList
	if err := c.List(context.Background(), &list, client.InNamespace(ns), client.MatchingLabels{"kubevirt.io/vm": vm}); err != nil {
		t.Fatal(err)
	}
	out := map[string]ipamclaimv1alpha1.IPAMClaim{}
	for _, cl := range list.Items {
		out[cl.Name] = cl
	}
	return out
}

func waitClaims(t *testing.T, ns, vm string, want ...string) map[string]ipamclaimv1alpha1.IPAMClaim {
	t.Helper()
	var got map[string]ipamclaimv1alpha1.IPAMClaim
	testenv.Eventually(t, timeout, fmt.Sprintf("claims of %s/%s = %v", ns, vm, want), func() error {
		got = claims(t, ns, vm)
		var names []string
		for n := range got {
			names = append(names, n)
		}
		slices.Sort(names)
		slices.Sort(want)
		if !slices.Equal(names, want) {
			return fmt.Errorf("claims %v", names)
		}
		return nil
	})
	return got
}

func deleteAndWait(t *testing.T, o client.Object, opts ...client.DeleteOption) {
	t.Helper()
	if err := c.Delete(context.Background(), o, opts...); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, timeout, "gone: "+o.GetName(), func() error {
		err := c.Get(context.Background(), client.ObjectKeyFromObject(o), o)
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("still there (err=%v)", err)
	})
}

// claimsHeld fails the test unless the VM's claims are exactly want, each
// still with the persistent-IPAM finalizer. It checks now, without
// waiting: call it after settle.
func claimsHeld(t *testing.T, ns, vm string, want ...string) {
	t.Helper()
	got := claims(t, ns, vm)
	var names []string
	for n, cl := range got {
		names = append(names, n)
		if !slices.Contains(cl.Finalizers, vmclaims.Finalizer) {
			t.Errorf("claim %s/%s lost its finalizer %s: released", ns, n, vmclaims.Finalizer)
		}
	}
	slices.Sort(names)
	slices.Sort(want)
	if !slices.Equal(names, want) {
		t.Fatalf("claims of %s/%s: %v, want %v", ns, vm, names, want)
	}
}

var sentinels atomic.Int64

// settle returns once the claims controller has finished a reconcile of
// the VM key ns/vm that began after everything done so far, and in which
// the VMI with UID gone (if not empty) no longer existed. It creates
// sentinel claims labelled for the VM, with the finalizer and a VMI as
// their controller, which a reconcile of the key releases once that VMI is
// gone:
//   - the first names the VMI gone: only a reconcile that no longer sees
//     it releases the sentinel;
//   - the second names a VMI that never existed and is created once the
//     first is released: the workqueue never runs a key twice at once, so
//     its release means the reconcile that released the first (and made
//     every other decision about the VM's claims) has returned.
//
// The sentinels are deleted before settle returns.
func settle(t *testing.T, ns, vm string, gone types.UID) {
	t.Helper()
	if gone == "" {
		gone = uuid.NewUUID()
	}
	for _, owner := range []types.UID{gone, uuid.NewUUID()} {
		tr := true
		cl := &ipamclaimv1alpha1.IPAMClaim{
			ObjectMeta: metav1.ObjectMeta{
				Namespace: ns, Name: fmt.Sprintf("%s.sentinel-%d", vm, sentinels.Add(1)),
				Labels:     map[string]string{kubevirtv1.VirtualMachineLabel: vm},
				Finalizers: []string{vmclaims.Finalizer},
				OwnerReferences: []metav1.OwnerReference{{
					APIVersion: "kubevirt.io/v1", Kind: "VirtualMachineInstance", Name: vm, UID: owner, Controller: &tr,
				}},
			},
			Spec: ipamclaimv1alpha1.IPAMClaimSpec{Network: ns + "_blue"},
		}
		create(t, cl)
		testenv.Eventually(t, timeout, "sentinel claim "+cl.Name+" released by a reconcile of "+ns+"/"+vm, func() error {
			var cur ipamclaimv1alpha1.IPAMClaim
			switch err := c.Get(context.Background(), client.ObjectKeyFromObject(cl), &cur); {
			case apierrors.IsNotFound(err):
				return nil // only the controller drops the finalizer
			case err != nil:
				return err
			case slices.Contains(cur.Finalizers, vmclaims.Finalizer):
				return errors.New("still has its finalizer")
			}
			return nil
		})
		if err := c.Delete(context.Background(), cl); err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
		testenv.Eventually(t, timeout, "sentinel claim "+cl.Name+" gone", func() error {
			if err := c.Get(context.Background(), client.ObjectKeyFromObject(cl), cl); !apierrors.IsNotFound(err) {
				return fmt.Errorf("still there (err=%v)", err)
			}
			return nil
		})
	}
}

func TestClaimsLifecycle(t *testing.T) {
	setup(t, "vmc")
	vm := mkVM(t, "vmc", "vm1", "pod", "blue", "plain")
	vmi := startVMI(t, vm)
	got := waitClaims(t, "vmc", "vm1", "vm1.pod", "vm1.blue-net")
	for name, cl := range got {
		ref := metav1.GetControllerOf(&cl)
		if ref == nil || ref.Kind != "VirtualMachine" || ref.UID != vm.UID || ref.BlockOwnerDeletion == nil || !*ref.BlockOwnerDeletion {
			t.Errorf("claim %s owner %+v", name, ref)
		}
		if !slices.Contains(cl.Finalizers, "kubevirt.io/persistent-ipam") {
			t.Errorf("claim %s finalizers %v", name, cl.Finalizers)
		}
	}
	if got["vm1.pod"].Spec.Network != "vmc_primary" || got["vm1.blue-net"].Spec.Network != "vmc_blue" {
		t.Errorf("spec.network: %q, %q", got["vm1.pod"].Spec.Network, got["vm1.blue-net"].Spec.Network)
	}

	// Stop: the VMI goes, the claims stay, also after the controller has
	// reconciled the VM without its VMI.
	deleteAndWait(t, vmi)
	settle(t, "vmc", "vm1", vmi.UID)
	claimsHeld(t, "vmc", "vm1", "vm1.pod", "vm1.blue-net")
	// Start: same claims (same UIDs).
	startVMI(t, vm)
	again := waitClaims(t, "vmc", "vm1", "vm1.pod", "vm1.blue-net")
	for n := range got {
		if again[n].UID != got[n].UID {
			t.Errorf("claim %s was replaced across stop/start", n)
		}
	}

	// Hot plug: a new persistent network gets its claim; unplug keeps it.
	var cur kubevirtv1.VirtualMachineInstance
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: "vmc", Name: "vm1"}, &cur); err != nil {
		t.Fatal(err)
	}
	cur.Spec.Networks = append(cur.Spec.Networks, kubevirtv1.Network{Name: "hot", Multus: &kubevirtv1.MultusNetwork{NetworkName: "vmc/blue"}})
	cur.Spec.Domain.Devices.Interfaces = append(cur.Spec.Domain.Devices.Interfaces, kubevirtv1.Interface{Name: "hot", Bridge: &kubevirtv1.InterfaceBridge{}})
	if err := c.Update(context.Background(), &cur); err != nil {
		t.Fatal(err)
	}
	waitClaims(t, "vmc", "vm1", "vm1.pod", "vm1.blue-net", "vm1.hot")
	cur.Spec.Domain.Devices.Interfaces[len(cur.Spec.Domain.Devices.Interfaces)-1].State = kubevirtv1.InterfaceStateAbsent
	if err := c.Update(context.Background(), &cur); err != nil {
		t.Fatal(err)
	}
	// Plug another network after the unplug: the controller sees VMI
	// revisions in order, so once it created that claim it has seen the
	// unplug; settle then waits for that reconcile to have finished.
	cur.Spec.Networks = append(cur.Spec.Networks, kubevirtv1.Network{Name: "hot2", Multus: &kubevirtv1.MultusNetwork{NetworkName: "vmc/blue"}})
	cur.Spec.Domain.Devices.Interfaces = append(cur.Spec.Domain.Devices.Interfaces, kubevirtv1.Interface{Name: "hot2", Bridge: &kubevirtv1.InterfaceBridge{}})
	if err := c.Update(context.Background(), &cur); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, timeout, "claim vm1.hot2 of the later plug", func() error {
		return c.Get(context.Background(), client.ObjectKey{Namespace: "vmc", Name: "vm1.hot2"}, &ipamclaimv1alpha1.IPAMClaim{})
	})
	settle(t, "vmc", "vm1", "")
	claimsHeld(t, "vmc", "vm1", "vm1.pod", "vm1.blue-net", "vm1.hot", "vm1.hot2")

	// Delete the VM (background): VMI and claims go.
	deleteAndWait(t, vm, client.PropagationPolicy(metav1.DeletePropagationBackground))
	waitClaims(t, "vmc", "vm1")
}

func TestClaimsForegroundDeletion(t *testing.T) {
	setup(t, "vmc-fg")
	vm := mkVM(t, "vmc-fg", "vm2", "blue")
	startVMI(t, vm)
	waitClaims(t, "vmc-fg", "vm2", "vm2.blue-net")
	deleteAndWait(t, vm, client.PropagationPolicy(metav1.DeletePropagationForeground))
	waitClaims(t, "vmc-fg", "vm2")
}

func TestStandaloneVMI(t *testing.T) {
	setup(t, "vmc-sa")
	vmi := &kubevirtv1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: "vmc-sa", Name: "lonely"}, Spec: vmiSpec("blue")}
	create(t, vmi)
	got := waitClaims(t, "vmc-sa", "lonely", "lonely.blue-net")
	if ref := metav1.GetControllerOf(ptr(got["lonely.blue-net"])); ref == nil || ref.Kind != "VirtualMachineInstance" || ref.UID != vmi.UID {
		t.Fatalf("owner %+v", ref)
	}
	deleteAndWait(t, vmi)
	waitClaims(t, "vmc-sa", "lonely")
}

func ptr[T any](v T) *T { return &v }

func TestLeakedClaimReported(t *testing.T) {
	setup(t, "vmc-leak")
	// A claim with the VM's claim name but another (live) owner: the
	// garbage collector keeps it, and the VM must not take it over.
	other := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "vmc-leak", Name: "someone"}}
	create(t, other)
	create(t, &ipamclaimv1alpha1.IPAMClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "vmc-leak", Name: "vm3.blue-net", OwnerReferences: []metav1.OwnerReference{{
			APIVersion: "v1", Kind: "ConfigMap", Name: "someone", UID: other.UID,
		}}},
		Spec: ipamclaimv1alpha1.IPAMClaimSpec{Network: "vmc-leak_blue"},
	})
	vm := mkVM(t, "vmc-leak", "vm3", "blue")
	startVMI(t, vm)
	testenv.Eventually(t, timeout, "LeakedIPAMClaim event", func() error {
		var evs corev1.EventList
		if err := c.List(context.Background(), &evs, client.InNamespace("vmc-leak")); err != nil {
			return err
		}
		for _, e := range evs.Items {
			if e.Reason == "LeakedIPAMClaim" && e.InvolvedObject.Kind == "VirtualMachine" && strings.Contains(e.Message, "leaked IPAMClaim found: vmc-leak/vm3.blue-net") {
				return nil
			}
		}
		var seen []string
		for _, e := range evs.Items {
			seen = append(seen, e.InvolvedObject.Kind+"/"+e.Reason+": "+e.Message)
		}
		return fmt.Errorf("no LeakedIPAMClaim event on the VM; events: %v", seen)
	})
}

// finalized reports whether the claim exists with the persistent-IPAM
// finalizer (nil) or not (an error saying why).
func finalized(t *testing.T, ns, vm, claim string) error {
	cl, ok := claims(t, ns, vm)[claim]
	switch {
	case !ok:
		return fmt.Errorf("claim %s is gone", claim)
	case !slices.Contains(cl.Finalizers, "kubevirt.io/persistent-ipam"):
		return fmt.Errorf("claim %s has no finalizer", claim)
	}
	return nil
}

func setActivePods(t *testing.T, vmi *kubevirtv1.VirtualMachineInstance, pods map[string]string) {
	t.Helper()
	if err := c.Get(context.Background(), client.ObjectKeyFromObject(vmi), vmi); err != nil {
		t.Fatal(err)
	}
	vmi.Status.ActivePods = pods
	if err := c.Status().Update(context.Background(), vmi); err != nil {
		t.Fatal(err)
	}
}

// TestStandaloneVMIWithActivePod: a standalone VMI being deleted keeps its
// claims' finalizer while status.activePods lists a launcher pod, loses it
// once none remains, and garbage collection deletes the claims once the
// VMI is gone.
func TestStandaloneVMIWithActivePod(t *testing.T) {
	const ns, hold = "vmc-pods", "kvnet.io/test-hold"
	setup(t, ns)
	// hold keeps the deleted VMI around, as virt-controller's finalizer does
	// until its pods are gone.
	vmi := &kubevirtv1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "busy", Finalizers: []string{hold}}, Spec: vmiSpec("blue")}
	create(t, vmi)
	waitClaims(t, ns, "busy", "busy.blue-net")
	setActivePods(t, vmi, map[string]string{"launcher-pod-uid": "node1"})
	if err := c.Delete(context.Background(), vmi); err != nil {
		t.Fatal(err)
	}
	// Once the controller has reconciled the deleted VMI, its claim still
	// holds the finalizer: a launcher pod is active.
	settle(t, ns, "busy", "")
	if err := finalized(t, ns, "busy", "busy.blue-net"); err != nil {
		t.Fatalf("deleting VMI with an active launcher pod: %v", err)
	}

	setActivePods(t, vmi, nil)
	testenv.Eventually(t, timeout, "finalizer released once no launcher pod is active", func() error {
		if finalized(t, ns, "busy", "busy.blue-net") == nil {
			return errors.New("claim still has its finalizer")
		}
		return nil
	})
	patch := client.MergeFrom(vmi.DeepCopy())
	vmi.Finalizers = nil
	if err := c.Patch(context.Background(), vmi, patch); err != nil {
		t.Fatal(err)
	}
	waitClaims(t, ns, "busy")
}

// TestStoppedVMDeletion: deleting a stopped VM (no VMI) releases its claims,
// with either propagation policy.
func TestStoppedVMDeletion(t *testing.T) {
	for _, p := range []metav1.DeletionPropagation{metav1.DeletePropagationBackground, metav1.DeletePropagationForeground} {
		t.Run(string(p), func(t *testing.T) {
			ns := "vmc-stopped-" + strings.ToLower(string(p))
			setup(t, ns)
			vm := mkVM(t, ns, "vm4", "blue")
			vmi := startVMI(t, vm)
			waitClaims(t, ns, "vm4", "vm4.blue-net")
			deleteAndWait(t, vmi) // stop: the claims stay
			settle(t, ns, "vm4", vmi.UID)
			claimsHeld(t, ns, "vm4", "vm4.blue-net")
			deleteAndWait(t, vm, client.PropagationPolicy(p))
			waitClaims(t, ns, "vm4")
		})
	}
}

// TestClaimNamesOfInvalidNetworkNames: a VM network named my_net gets the
// claim ipam-extensions would create, vm5.my.net; a VM with networks
// my_net and my.net, which compose one name, gets no claim and an
// InvalidIPAMClaimName event on the VM saying which networks collide.
func TestClaimNamesOfInvalidNetworkNames(t *testing.T) {
	setup(t, "vmc-names")
	withNets := func(t *testing.T, name string, nets ...string) *kubevirtv1.VirtualMachine {
		vm := &kubevirtv1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: "vmc-names", Name: name}}
		var spec kubevirtv1.VirtualMachineInstanceSpec
		for _, n := range nets {
			spec.Networks = append(spec.Networks, kubevirtv1.Network{Name: n, Multus: &kubevirtv1.MultusNetwork{NetworkName: "blue"}})
			spec.Domain.Devices.Interfaces = append(spec.Domain.Devices.Interfaces, kubevirtv1.Interface{Name: n, Bridge: &kubevirtv1.InterfaceBridge{}})
		}
		vm.Spec.Template = &kubevirtv1.VirtualMachineInstanceTemplateSpec{Spec: spec}
		create(t, vm)
		startVMI(t, vm)
		return vm
	}
	withNets(t, "vm5", "my_net")
	testenv.Eventually(t, timeout, "claim vm5.my.net", func() error { return finalized(t, "vmc-names", "vm5", "vm5.my.net") })

	withNets(t, "vm6", "my_net", "my.net")
	testenv.Eventually(t, timeout, "InvalidIPAMClaimName event", func() error {
		var evs corev1.EventList
		if err := c.List(context.Background(), &evs, client.InNamespace("vmc-names")); err != nil {
			return err
		}
		for _, e := range evs.Items {
			if e.Reason == "InvalidIPAMClaimName" && e.InvolvedObject.Kind == "VirtualMachine" && e.InvolvedObject.Name == "vm6" &&
				strings.Contains(e.Message, `networks "my_net" and "my.net" both compose IPAMClaim name "vm6.my.net"`) {
				return nil
			}
		}
		return fmt.Errorf("no InvalidIPAMClaimName event on VM vm6 yet (%d events)", len(evs.Items))
	})
	settle(t, "vmc-names", "vm6", "")
	claimsHeld(t, "vmc-names", "vm6")
}
