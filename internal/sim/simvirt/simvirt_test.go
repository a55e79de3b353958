package simvirt

// Unit tests: the pure parts, and the reconciler against controller-runtime's
// fake client (no API server, no root), playing kubelet by hand.

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	kubevirtv1 "kvnet.io/kvnet/api/kubevirt/v1"
	"kvnet.io/kvnet/internal/kubevirt/launcher"
	"kvnet.io/kvnet/internal/multus"
	"kvnet.io/kvnet/internal/podnetworks"
)

func TestRunStrategy(t *testing.T) {
	s := func(v string) *string { return &v }
	b := func(v bool) *bool { return &v }
	for _, tc := range []struct {
		rs      *string
		running *bool
		want    string
		run     bool
	}{
		{want: RunStrategyHalted},
		{running: b(true), want: RunStrategyAlways, run: true},
		{running: b(false), want: RunStrategyHalted},
		{rs: s(RunStrategyRerunOnFailure), running: b(false), want: RunStrategyRerunOnFailure, run: true},
		{rs: s(RunStrategyOnce), want: RunStrategyOnce, run: true},
		{rs: s(RunStrategyManual), want: RunStrategyManual},
		{rs: s("Sometimes"), want: "Sometimes"},
	} {
		vm := &kubevirtv1.VirtualMachine{Spec: kubevirtv1.VirtualMachineSpec{RunStrategy: tc.rs, Running: tc.running}}
		if got := runStrategy(vm); got != tc.want || wantsRunning(got) != tc.run {
			t.Errorf("runStrategy(%v, %v) = %q (running %v), want %q (%v)", tc.rs, tc.running, got, wantsRunning(got), tc.want, tc.run)
		}
	}
}

func TestPickNode(t *testing.T) {
	nodes := []string{"a", "b", "c"}
	for _, tc := range []struct {
		load    map[string]int
		exclude string
		want    string
	}{
		{want: "a"},
		{load: map[string]int{"a": 1}, want: "b"},
		{load: map[string]int{"a": 1, "b": 1, "c": 1}, want: "a"},
		{load: map[string]int{"a": 2, "b": 1, "c": 1, "elsewhere": 0}, want: "b"},
		{exclude: "a", want: "b"},
		{load: map[string]int{"b": 3}, exclude: "a", want: "c"},
	} {
		if got := pickNode(nodes, tc.load, tc.exclude); got != tc.want {
			t.Errorf("pickNode(%v, exclude %q) = %q, want %q", tc.load, tc.exclude, got, tc.want)
		}
	}
	if got := pickNode([]string{"a"}, nil, "a"); got != "" {
		t.Errorf("only node excluded: got %q", got)
	}
}

func TestInterfaces(t *testing.T) {
	vmi := &kubevirtv1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "vm"},
		Spec: kubevirtv1.VirtualMachineInstanceSpec{
			Domain: kubevirtv1.DomainSpec{Devices: kubevirtv1.Devices{Interfaces: []kubevirtv1.Interface{
				{Name: "default", Binding: &kubevirtv1.PluginBinding{Name: "l2bridge"}},
				{Name: "blue", Bridge: &kubevirtv1.InterfaceBridge{}},
				{Name: "red", Bridge: &kubevirtv1.InterfaceBridge{}, MacAddress: "02:00:00:00:00:99"},
				{Name: "gone", Bridge: &kubevirtv1.InterfaceBridge{}, State: kubevirtv1.InterfaceStateAbsent},
			}}},
			Networks: []kubevirtv1.Network{
				{Name: "default", Pod: &kubevirtv1.PodNetwork{}},
				{Name: "blue", Multus: &kubevirtv1.MultusNetwork{NetworkName: "bluenad"}},
				{Name: "red", Multus: &kubevirtv1.MultusNetwork{NetworkName: "other/rednad"}},
				{Name: "gone", Multus: &kubevirtv1.MultusNetwork{NetworkName: "bluenad"}},
				{Name: "no-interface", Multus: &kubevirtv1.MultusNetwork{NetworkName: "bluenad"}},
			},
		},
	}
	nets := podnetworks.Networks{
		"ns/udn":     {IPAddresses: []string{"10.0.0.5/24", "fd00::5/64"}, MACAddress: "0a:58:0a:00:00:05", Role: podnetworks.RolePrimary, Network: "ns_udn"},
		"ns/bluenad": {IPAddresses: []string{"192.168.1.7/24"}, MACAddress: "02:00:00:00:00:07", Role: podnetworks.RoleSecondary, Network: "blue"},
	}
	value, err := nets.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{podnetworks.Annotation: value}}}
	got := interfaces(vmi, pod)
	want := []kubevirtv1.VirtualMachineInstanceNetworkInterface{
		{Name: "default", IP: "10.0.0.5", IPs: []string{"10.0.0.5", "fd00::5"}, MAC: "0a:58:0a:00:00:05", PodInterfaceName: "ovn-udn1", InfoSource: InfoSource},
		{Name: "blue", IP: "192.168.1.7", IPs: []string{"192.168.1.7"}, MAC: "02:00:00:00:00:07", PodInterfaceName: launcher.PodInterfaceName("blue"), InfoSource: InfoSource},
		{Name: "red", MAC: "02:00:00:00:00:99", PodInterfaceName: launcher.PodInterfaceName("red"), InfoSource: "domain"},
	}
	if fmt.Sprintf("%+v", got) != fmt.Sprintf("%+v", want) {
		t.Fatalf("interfaces:\n%+v\nwant\n%+v", got, want)
	}

	// No primary attachment: the pod network shows the pod IPs.
	pod = &corev1.Pod{Status: corev1.PodStatus{PodIPs: []corev1.PodIP{{IP: "10.244.0.9"}}}}
	got = interfaces(vmi, pod)
	if got[0].IP != "10.244.0.9" || got[0].PodInterfaceName != "eth0" || got[0].MAC != "" || got[1].IP != "" {
		t.Fatalf("without pod-networks: %+v", got)
	}
	// A garbled annotation is no address, not a panic.
	pod.Annotations = map[string]string{podnetworks.Annotation: "{"}
	_ = interfaces(vmi, pod)
}

func TestVMStatus(t *testing.T) {
	running := &kubevirtv1.VirtualMachineInstance{Status: kubevirtv1.VirtualMachineInstanceStatus{Phase: PhaseRunning}}
	migrating := running.DeepCopy()
	migrating.Status.MigrationState = &kubevirtv1.VirtualMachineInstanceMigrationState{TargetNode: "b"}
	deleting := running.DeepCopy()
	deleting.DeletionTimestamp = &metav1.Time{}
	failed := &kubevirtv1.VirtualMachineInstance{Status: kubevirtv1.VirtualMachineInstanceStatus{Phase: PhaseFailed}}
	for _, tc := range []struct {
		rs   string
		vmi  *kubevirtv1.VirtualMachineInstance
		want kubevirtv1.VirtualMachineStatus
	}{
		{RunStrategyHalted, nil, kubevirtv1.VirtualMachineStatus{PrintableStatus: "Stopped"}},
		{RunStrategyAlways, nil, kubevirtv1.VirtualMachineStatus{PrintableStatus: "Starting"}},
		{RunStrategyAlways, &kubevirtv1.VirtualMachineInstance{}, kubevirtv1.VirtualMachineStatus{PrintableStatus: "Starting", Created: true}},
		{RunStrategyAlways, running, kubevirtv1.VirtualMachineStatus{PrintableStatus: "Running", Ready: true, Created: true}},
		{RunStrategyAlways, migrating, kubevirtv1.VirtualMachineStatus{PrintableStatus: "Migrating", Ready: true, Created: true}},
		{RunStrategyHalted, deleting, kubevirtv1.VirtualMachineStatus{PrintableStatus: "Stopping", Created: true}},
		{RunStrategyOnce, failed, kubevirtv1.VirtualMachineStatus{PrintableStatus: "Stopped", Created: true}},
	} {
		if got := vmStatus(tc.rs, tc.vmi); got != tc.want {
			t.Errorf("vmStatus(%s, %+v) = %+v, want %+v", tc.rs, tc.vmi, got, tc.want)
		}
	}
}

// fakeEnv is a reconciler on a fake client; the test plays kubelet.
type fakeEnv struct {
	t *testing.T
	c client.Client
	r *reconciler
}

func newFake(t *testing.T, nodes []string, objs ...client.Object) *fakeEnv {
	t.Helper()
	scheme, err := NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	c := fake.NewClientBuilder().WithScheme(scheme).
		WithStatusSubresource(&kubevirtv1.VirtualMachine{}, &kubevirtv1.VirtualMachineInstance{},
			&kubevirtv1.VirtualMachineInstanceMigration{}, &corev1.Pod{}).
		WithObjects(objs...).
		WithInterceptorFuncs(interceptor.Funcs{Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			// The API server's part: UIDs and creation times.
			if obj.GetUID() == "" {
				obj.SetUID(uuid.NewUUID())
			}
			obj.SetCreationTimestamp(metav1.Now())
			return c.Create(ctx, obj, opts...)
		}}).Build()
	return &fakeEnv{t: t, c: c, r: &reconciler{client: c, reader: c, nodes: nodes}}
}

func (e *fakeEnv) reconcile(name string) {
	e.t.Helper()
	if _, err := e.r.Reconcile(context.Background(), reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "ns", Name: name}}); err != nil {
		e.t.Fatalf("reconcile %s: %v", name, err)
	}
}

func (e *fakeEnv) vmi(name string) *kubevirtv1.VirtualMachineInstance {
	e.t.Helper()
	var vmi kubevirtv1.VirtualMachineInstance
	if err := e.c.Get(context.Background(), client.ObjectKey{Namespace: "ns", Name: name}, &vmi); err != nil {
		e.t.Fatalf("get VMI %s: %v", name, err)
	}
	return &vmi
}

func (e *fakeEnv) pods() []corev1.Pod {
	e.t.Helper()
	var l corev1.PodList
	if err := e.c.List(context.Background(), &l, client.InNamespace("ns")); err != nil {
		e.t.Fatal(err)
	}
	return l.Items
}

// run plays kubelet: the pod runs, with an allocation on the primary
// network.
func (e *fakeEnv) run(pod *corev1.Pod, ip string) {
	e.t.Helper()
	value, err := podnetworks.Networks{"ns/udn": {IPAddresses: []string{ip + "/24"}, MACAddress: "0a:58:0a:32:00:05",
		Role: podnetworks.RolePrimary, Network: "ns_udn"}}.Marshal()
	if err != nil {
		e.t.Fatal(err)
	}
	pod.Annotations[podnetworks.Annotation] = value
	if err := e.c.Update(context.Background(), pod); err != nil {
		e.t.Fatal(err)
	}
	pod.Status.Phase = corev1.PodRunning
	if err := e.c.Status().Update(context.Background(), pod); err != nil {
		e.t.Fatal(err)
	}
}

func (e *fakeEnv) migration(name string) *kubevirtv1.VirtualMachineInstanceMigration {
	e.t.Helper()
	var m kubevirtv1.VirtualMachineInstanceMigration
	if err := e.c.Get(context.Background(), client.ObjectKey{Namespace: "ns", Name: name}, &m); err != nil {
		e.t.Fatal(err)
	}
	return &m
}

func testVM(rs string) *kubevirtv1.VirtualMachine {
	return &kubevirtv1.VirtualMachine{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "vm1", UID: "vm-uid"},
		Spec: kubevirtv1.VirtualMachineSpec{RunStrategy: &rs, Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{
			ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "db"}, Annotations: map[string]string{"note": "x"}},
			Spec: kubevirtv1.VirtualMachineInstanceSpec{
				Domain: kubevirtv1.DomainSpec{Devices: kubevirtv1.Devices{Interfaces: []kubevirtv1.Interface{
					{Name: "default", Binding: &kubevirtv1.PluginBinding{Name: "l2bridge"}},
				}}},
				Networks: []kubevirtv1.Network{{Name: "default", Pod: &kubevirtv1.PodNetwork{}}},
			},
		}},
	}
}

func kubeVirtCR() *kubevirtv1.KubeVirt {
	return &kubevirtv1.KubeVirt{
		ObjectMeta: metav1.ObjectMeta{Namespace: "kubevirt", Name: "kubevirt"},
		Spec: kubevirtv1.KubeVirtSpec{Configuration: kubevirtv1.KubeVirtConfiguration{NetworkConfiguration: &kubevirtv1.NetworkConfiguration{
			Binding: map[string]kubevirtv1.InterfaceBindingPlugin{"l2bridge": {DomainAttachmentType: "managedTap"}},
		}}},
	}
}

// TestLifecycleFake drives a VM through start, migration, a failed
// migration and stop, checking what each reconcile writes.
func TestLifecycleFake(t *testing.T) {
	ctx := context.Background()
	e := newFake(t, []string{"n1", "n2"}, testVM(RunStrategyAlways), kubeVirtCR())

	e.reconcile("vm1")
	vmi := e.vmi("vm1")
	if vmi.Labels["app"] != "db" || vmi.Labels[kubevirtv1.VirtualMachineLabel] != "vm1" || vmi.Annotations["note"] != "x" {
		t.Fatalf("VMI metadata %v %v", vmi.Labels, vmi.Annotations)
	}
	if !controlledBy(vmi, "vm-uid") || len(vmi.Finalizers) != 1 || vmi.Finalizers[0] != VMIFinalizer {
		t.Fatalf("VMI owners %v finalizers %v", vmi.OwnerReferences, vmi.Finalizers)
	}
	pods := e.pods()
	if len(pods) != 1 {
		t.Fatalf("%d launcher pods, want 1", len(pods))
	}
	src := pods[0]
	if src.Spec.NodeName != "n1" || !strings.HasPrefix(src.Name, "virt-launcher-vm1-") ||
		src.Labels[kubevirtv1.AppLabel] != kubevirtv1.VirtLauncherValue || src.Labels[CreatedByLabel] != string(vmi.UID) ||
		src.Labels[kubevirtv1.VMNameLabel] != "vm1" || src.Annotations[kubevirtv1.DomainAnnotation] != "vm1" ||
		!controlledBy(&src, string(vmi.UID)) || src.Spec.Containers[0].Name != ComputeContainer {
		t.Fatalf("launcher pod %+v", src.ObjectMeta)
	}
	if vmi.Status.Phase != PhaseScheduling {
		t.Fatalf("VMI phase %q, want Scheduling", vmi.Status.Phase)
	}
	e.reconcile("vm1") // idempotent: no second pod
	if n := len(e.pods()); n != 1 {
		t.Fatalf("%d launcher pods after a second reconcile", n)
	}

	e.run(&src, "10.50.0.5")
	e.reconcile("vm1")
	vmi = e.vmi("vm1")
	if vmi.Status.Phase != PhaseRunning || vmi.Status.NodeName != "n1" || vmi.Status.ActivePods[string(src.UID)] != "n1" ||
		len(vmi.Status.Interfaces) != 1 || vmi.Status.Interfaces[0].IP != "10.50.0.5" || vmi.Status.Interfaces[0].MAC != "0a:58:0a:32:00:05" {
		t.Fatalf("VMI status %+v", vmi.Status)
	}
	var vm kubevirtv1.VirtualMachine
	if err := e.c.Get(ctx, client.ObjectKey{Namespace: "ns", Name: "vm1"}, &vm); err != nil {
		t.Fatal(err)
	}
	if vm.Status != (kubevirtv1.VirtualMachineStatus{PrintableStatus: "Running", Ready: true, Created: true}) {
		t.Fatalf("VM status %+v", vm.Status)
	}

	// Migration: target on n2, TargetReady, switch-over.
	if err := e.c.Create(ctx, &kubevirtv1.VirtualMachineInstanceMigration{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "mig1"},
		Spec: kubevirtv1.VirtualMachineInstanceMigrationSpec{VMIName: "vm1"}}); err != nil {
		t.Fatal(err)
	}
	e.reconcile("vm1")
	m := e.migration("mig1")
	var dst corev1.Pod
	for _, p := range e.pods() {
		if p.Name != src.Name {
			dst = p
		}
	}
	if m.Status.Phase != PhaseScheduling || dst.Spec.NodeName != "n2" || dst.Labels[MigrationJobUIDLabel] != string(m.UID) {
		t.Fatalf("migration phase %q, target pod %s on %q labels %v", m.Status.Phase, dst.Name, dst.Spec.NodeName, dst.Labels)
	}
	vmi = e.vmi("vm1")
	if ms := vmi.Status.MigrationState; ms == nil || ms.SourceNode != "n1" || ms.SourcePod != src.Name || ms.TargetNode != "n2" || ms.TargetPod != dst.Name || ms.Completed {
		t.Fatalf("migrationState %+v", vmi.Status.MigrationState)
	}
	e.run(&dst, "10.50.0.5")
	e.reconcile("vm1")
	if m = e.migration("mig1"); m.Status.Phase != PhaseTargetReady {
		t.Fatalf("migration phase %q, want TargetReady", m.Status.Phase)
	}
	e.reconcile("vm1")
	vmi = e.vmi("vm1")
	if m = e.migration("mig1"); m.Status.Phase != PhaseSucceeded || vmi.Status.NodeName != "n2" || !vmi.Status.MigrationState.Completed {
		t.Fatalf("after switch-over: migration %q, VMI node %q, state %+v", m.Status.Phase, vmi.Status.NodeName, vmi.Status.MigrationState)
	}
	if err := e.c.Get(ctx, client.ObjectKeyFromObject(&src), &corev1.Pod{}); !apierrors.IsNotFound(err) {
		t.Fatalf("source pod not deleted: %v", err)
	}
	e.reconcile("vm1")
	if vmi = e.vmi("vm1"); len(vmi.Status.ActivePods) != 1 || vmi.Status.ActivePods[string(dst.UID)] != "n2" {
		t.Fatalf("activePods %v", vmi.Status.ActivePods)
	}

	// A migration whose target pod fails: Failed with a reason, VMI stays.
	if err := e.c.Create(ctx, &kubevirtv1.VirtualMachineInstanceMigration{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "mig2"},
		Spec: kubevirtv1.VirtualMachineInstanceMigrationSpec{VMIName: "vm1"}}); err != nil {
		t.Fatal(err)
	}
	e.reconcile("vm1")
	var tgt corev1.Pod
	for _, p := range e.pods() {
		if p.Name != dst.Name {
			tgt = p
		}
	}
	if tgt.Spec.NodeName != "n1" {
		t.Fatalf("second target on %q, want n1", tgt.Spec.NodeName)
	}
	tgt.Status.Phase = corev1.PodFailed
	if err := e.c.Status().Update(ctx, &tgt); err != nil {
		t.Fatal(err)
	}
	e.reconcile("vm1")
	m = e.migration("mig2")
	if m.Status.Phase != PhaseFailed || !strings.Contains(m.Annotations[FailureReasonAnnotation], tgt.Name) {
		t.Fatalf("failed migration: phase %q reason %q", m.Status.Phase, m.Annotations[FailureReasonAnnotation])
	}
	vmi = e.vmi("vm1")
	if vmi.Status.Phase != PhaseRunning || vmi.Status.NodeName != "n2" || !vmi.Status.MigrationState.Failed {
		t.Fatalf("VMI after a failed migration: %+v", vmi.Status)
	}
	if err := e.c.Get(ctx, client.ObjectKeyFromObject(&tgt), &corev1.Pod{}); !apierrors.IsNotFound(err) {
		t.Fatalf("failed target pod not deleted: %v", err)
	}

	// Stop: the VMI is deleted, its pods go, then the VMI.
	halted := RunStrategyHalted
	if err := e.c.Get(ctx, client.ObjectKey{Namespace: "ns", Name: "vm1"}, &vm); err != nil {
		t.Fatal(err)
	}
	vm.Spec.RunStrategy = &halted
	if err := e.c.Update(ctx, &vm); err != nil {
		t.Fatal(err)
	}
	e.reconcile("vm1")
	if n := len(e.pods()); n != 0 {
		t.Fatalf("%d pods left after stop", n)
	}
	e.reconcile("vm1")
	if err := e.c.Get(ctx, client.ObjectKey{Namespace: "ns", Name: "vm1"}, &kubevirtv1.VirtualMachineInstance{}); !apierrors.IsNotFound(err) {
		t.Fatalf("VMI not gone after stop: %v", err)
	}
	if err := e.c.Get(ctx, client.ObjectKey{Namespace: "ns", Name: "vm1"}, &vm); err != nil {
		t.Fatal(err)
	}
	if vm.Status != (kubevirtv1.VirtualMachineStatus{PrintableStatus: "Stopped"}) {
		t.Fatalf("VM status after stop %+v", vm.Status)
	}
}

func TestMigrationWithoutTargetNode(t *testing.T) {
	e := newFake(t, []string{"only"}, testVM(RunStrategyAlways), kubeVirtCR(),
		&kubevirtv1.VirtualMachineInstanceMigration{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "mig", UID: "mig-uid"},
			Spec: kubevirtv1.VirtualMachineInstanceMigrationSpec{VMIName: "vm1"}})
	e.reconcile("vm1")
	if m := e.migration("mig"); m.Status.Phase != PhasePending {
		t.Fatalf("migration of a VMI not running yet: phase %q, want Pending", m.Status.Phase)
	}
	pod := e.pods()[0]
	e.run(&pod, "10.50.0.9")
	e.reconcile("vm1") // the VMI runs
	e.reconcile("vm1") // the migration starts
	m := e.migration("mig")
	if m.Status.Phase != PhaseFailed || !strings.Contains(m.Annotations[FailureReasonAnnotation], "no node to migrate") {
		t.Fatalf("phase %q reason %q", m.Status.Phase, m.Annotations[FailureReasonAnnotation])
	}
	if n := len(e.pods()); n != 1 {
		t.Fatalf("%d pods, want the source only", n)
	}
	if vmi := e.vmi("vm1"); vmi.Status.Phase != PhaseRunning || vmi.Status.NodeName != "only" {
		t.Fatalf("VMI %+v", vmi.Status)
	}
}

// A launcher pod that vanishes fails the VMI; run strategy Always starts a
// new one.
func TestPodLossRestarts(t *testing.T) {
	ctx := context.Background()
	e := newFake(t, []string{"n1", "n2"}, testVM(RunStrategyAlways), kubeVirtCR())
	e.reconcile("vm1")
	pod := e.pods()[0]
	e.run(&pod, "10.50.0.5")
	e.reconcile("vm1")
	first := e.vmi("vm1")
	// Force deletion: the pod is simply gone.
	if err := e.c.Delete(ctx, &pod); err != nil {
		t.Fatal(err)
	}
	e.reconcile("vm1")
	// The reconcile failed the VMI and (Always) deleted it; no pods left
	// holds it, so the next one releases it and the one after starts anew.
	e.reconcile("vm1")
	e.reconcile("vm1")
	vmi := e.vmi("vm1")
	if vmi.UID == first.UID {
		t.Fatalf("VMI not replaced: phase %q reason %q", vmi.Status.Phase, vmi.Annotations[FailureReasonAnnotation])
	}
	if pods := e.pods(); len(pods) != 1 || pods[0].Labels[CreatedByLabel] != string(vmi.UID) {
		t.Fatalf("pods after restart: %d", len(pods))
	}
}

// Without the binding plugin registered, the VMI waits in Pending and says
// why.
func TestUnregisteredBinding(t *testing.T) {
	e := newFake(t, []string{"n1"}, testVM(RunStrategyAlways))
	_, err := e.r.Reconcile(context.Background(), reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "vm1"}})
	if err == nil || !strings.Contains(err.Error(), "l2bridge") {
		t.Fatalf("err = %v, want the unregistered binding", err)
	}
	vmi := e.vmi("vm1")
	if vmi.Status.Phase != PhasePending || !strings.Contains(vmi.Annotations[FailureReasonAnnotation], "l2bridge") || len(e.pods()) != 0 {
		t.Fatalf("phase %q reason %q pods %d", vmi.Status.Phase, vmi.Annotations[FailureReasonAnnotation], len(e.pods()))
	}
	// Registering it lets the VMI start, and the reason goes.
	if err := e.c.Create(context.Background(), kubeVirtCR()); err != nil {
		t.Fatal(err)
	}
	e.reconcile("vm1")
	if vmi = e.vmi("vm1"); vmi.Status.Phase != PhaseScheduling || vmi.Annotations[FailureReasonAnnotation] != "" || len(e.pods()) != 1 {
		t.Fatalf("after registering: phase %q reason %q", vmi.Status.Phase, vmi.Annotations[FailureReasonAnnotation])
	}
}

// Odd objects neither panic nor loop.
func TestOddObjects(t *testing.T) {
	noTemplate := testVM(RunStrategyAlways)
	noTemplate.Name, noTemplate.UID = "notemplate", "u1"
	noTemplate.Spec.Template = nil
	invalid := testVM(RunStrategyAlways)
	invalid.Name, invalid.UID = "invalid", "u2"
	invalid.Spec.Template.Spec.Networks = nil // interface without network
	standalone := &kubevirtv1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "standalone", UID: "u3"}}
	unknown := testVM("Sometimes")
	unknown.Name, unknown.UID = "unknown", "u4"
	foreign := testVM(RunStrategyHalted)
	foreign.Name, foreign.UID = "standalone", "u5"
	handMade := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "hand", UID: "u6",
		Labels:      map[string]string{kubevirtv1.AppLabel: kubevirtv1.VirtLauncherValue},
		Annotations: map[string]string{kubevirtv1.DomainAnnotation: "nothing"}}}
	e := newFake(t, []string{"n1"}, noTemplate, invalid, standalone, unknown, foreign, handMade, kubeVirtCR(),
		&kubevirtv1.VirtualMachineInstanceMigration{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "orphan"},
			Spec: kubevirtv1.VirtualMachineInstanceMigrationSpec{VMIName: "nothing"}})
	for _, name := range []string{"notemplate", "invalid", "standalone", "unknown", "nothing", "empty"} {
		e.reconcile(name)
		e.reconcile(name)
	}
	ctx := context.Background()
	var vm kubevirtv1.VirtualMachine
	for name, want := range map[string]string{"notemplate": "spec.template is missing", "invalid": "no network of that name"} {
		if err := e.c.Get(ctx, client.ObjectKey{Namespace: "ns", Name: name}, &vm); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(vm.Annotations[FailureReasonAnnotation], want) {
			t.Errorf("VM %s reason %q, want %q", name, vm.Annotations[FailureReasonAnnotation], want)
		}
	}
	if err := e.c.Get(ctx, client.ObjectKey{Namespace: "ns", Name: "unknown"}, &kubevirtv1.VirtualMachineInstance{}); !apierrors.IsNotFound(err) {
		t.Errorf("VM with an unknown run strategy started: %v", err)
	}
	// The standalone VMI runs though a Halted VM of its name exists.
	if vmi := e.vmi("standalone"); vmi.Status.Phase != PhaseScheduling || vmi.DeletionTimestamp != nil {
		t.Errorf("standalone VMI: phase %q deleting %v", vmi.Status.Phase, vmi.DeletionTimestamp != nil)
	}
	if err := e.c.Get(ctx, client.ObjectKey{Namespace: "ns", Name: "hand"}, &corev1.Pod{}); err != nil {
		t.Errorf("hand-made launcher pod touched: %v", err)
	}
	if m := e.migration("orphan"); m.Status.Phase != PhaseFailed || !strings.Contains(m.Annotations[FailureReasonAnnotation], "does not exist") {
		t.Errorf("migration of a missing VMI: phase %q reason %q", m.Status.Phase, m.Annotations[FailureReasonAnnotation])
	}
}

// The launcher pod carries launcher.Annotations for secondary networks.
func TestLauncherPodAnnotations(t *testing.T) {
	vmi := &kubevirtv1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "vm", UID: "uid"},
		Spec: kubevirtv1.VirtualMachineInstanceSpec{
			Domain: kubevirtv1.DomainSpec{Devices: kubevirtv1.Devices{Interfaces: []kubevirtv1.Interface{
				{Name: "default", Masquerade: &kubevirtv1.InterfaceMasquerade{}},
				{Name: "blue", Bridge: &kubevirtv1.InterfaceBridge{}},
			}}},
			Networks: []kubevirtv1.Network{
				{Name: "default", Pod: &kubevirtv1.PodNetwork{}},
				{Name: "blue", Multus: &kubevirtv1.MultusNetwork{NetworkName: "bluenad"}},
			},
		},
	}
	e := newFake(t, []string{"n1"}, vmi)
	e.reconcile("vm")
	pods := e.pods()
	if len(pods) != 1 {
		t.Fatalf("%d pods", len(pods))
	}
	var elems []multus.NetworkSelectionElement
	if err := json.Unmarshal([]byte(pods[0].Annotations[multus.NetworksAnnotation]), &elems); err != nil {
		t.Fatal(err)
	}
	if len(elems) != 1 || elems[0].Name != "bluenad" || elems[0].Namespace != "ns" || elems[0].InterfaceRequest != launcher.PodInterfaceName("blue") {
		t.Fatalf("networks annotation %v", elems)
	}
	if _, ok := pods[0].Labels[kubevirtv1.VMNameLabel]; ok {
		t.Fatal("standalone VMI's pod labelled with a VM name")
	}
	if v := e.vmi("vm"); len(v.Finalizers) != 1 {
		t.Fatalf("standalone VMI finalizers %v", v.Finalizers)
	}
}
