package simvirt

// Unit tests: the pure parts, and the reconciler against controller-runtime's
// fake client (no API server, no root), playing kubelet by hand.

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

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
	failedBindings := failed.DeepCopy()
	if err := setCondition(&failedBindings.Status, unsupportedBindingCondition("why")); err != nil {
		t.Fatal(err)
	}
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
		{RunStrategyAlways, failedBindings, kubevirtv1.VirtualMachineStatus{PrintableStatus: "CrashLoopBackOff", Created: true}},
		{RunStrategyRerunOnFailure, failedBindings, kubevirtv1.VirtualMachineStatus{PrintableStatus: "CrashLoopBackOff", Created: true}},
		{RunStrategyOnce, failedBindings, kubevirtv1.VirtualMachineStatus{PrintableStatus: "Stopped", Created: true}},
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
	vm1 := testVM(RunStrategyAlways)
	vm1.Spec.Template.Spec.Hostname = "guest1" // not the VM's name
	e := newFake(t, []string{"n1", "n2"}, vm1, kubeVirtCR())

	e.reconcile("vm1")
	vmi := e.vmi("vm1")
	// KubeVirt gives a VMI its template's labels, no more.
	if _, ok := vmi.Labels[kubevirtv1.VirtualMachineLabel]; vmi.Labels["app"] != "db" || ok || vmi.Annotations["note"] != "x" {
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
		src.Labels[kubevirtv1.VMNameLabel] != "guest1" || src.Labels[kubevirtv1.VMIIDLabel] != "vm1" || src.Annotations[kubevirtv1.DomainAnnotation] != "vm1" ||
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
	if ms := vmi.Status.MigrationState; ms.MigrationUID != string(m.UID) || ms.StartTimestamp == nil || ms.EndTimestamp == nil ||
		ms.EndTimestamp.Before(ms.StartTimestamp) || ms.FailureReason != "" {
		t.Fatalf("migrationState uid %q (migration %q) start %v end %v reason %q", ms.MigrationUID, m.UID, ms.StartTimestamp, ms.EndTimestamp, ms.FailureReason)
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
	if ms := vmi.Status.MigrationState; ms.FailureReason != m.Annotations[FailureReasonAnnotation] || ms.EndTimestamp == nil {
		t.Fatalf("failed migrationState: reason %q (migration's %q), end %v", ms.FailureReason, m.Annotations[FailureReasonAnnotation], ms.EndTimestamp)
	}
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

// Without the binding plugin registered, the VMI fails and says why, no
// pod is made, and the VM (Always) keeps the failed VMI rather than
// starting it anew in a loop, until the plugin is registered.
func TestUnregisteredBinding(t *testing.T) {
	ctx := context.Background()
	e := newFake(t, []string{"n1"}, testVM(RunStrategyAlways))
	const want = `interface "default": binding plugin "l2bridge" is not registered in the KubeVirt CR (spec.configuration.network.binding)`
	e.reconcile("vm1")
	vmi := e.vmi("vm1")
	if vmi.Status.Phase != PhaseFailed || vmi.Annotations[FailureReasonAnnotation] != want || len(e.pods()) != 0 {
		t.Fatalf("phase %q reason %q pods %d", vmi.Status.Phase, vmi.Annotations[FailureReasonAnnotation], len(e.pods()))
	}
	c, ok := condition(&vmi.Status, ConditionSynchronized)
	if !ok || c.Status != corev1.ConditionFalse || c.Reason != ReasonUnsupportedBinding || c.Message != want || c.LastTransitionTime.IsZero() {
		t.Fatalf("condition %+v (found %v), status %s", c, ok, vmi.Status.Unknown)
	}
	first := vmi.UID
	for range 3 {
		res, err := e.r.Reconcile(ctx, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "vm1"}})
		if err != nil || res.RequeueAfter != retryMax {
			t.Fatalf("reconcile of a held VM: %+v, %v", res, err)
		}
	}
	if vmi = e.vmi("vm1"); vmi.UID != first || vmi.DeletionTimestamp != nil || len(e.pods()) != 0 {
		t.Fatalf("failed VMI started anew or deleted (uid %s, first %s)", vmi.UID, first)
	}
	var vm kubevirtv1.VirtualMachine
	if err := e.c.Get(ctx, client.ObjectKey{Namespace: "ns", Name: "vm1"}, &vm); err != nil {
		t.Fatal(err)
	}
	if vm.Status.PrintableStatus != "CrashLoopBackOff" || !strings.Contains(vm.Annotations[FailureReasonAnnotation], want) {
		t.Fatalf("VM status %+v reason %q", vm.Status, vm.Annotations[FailureReasonAnnotation])
	}
	// Registering it lets the VM start a new VMI, and the reasons go.
	if err := e.c.Create(ctx, kubeVirtCR()); err != nil {
		t.Fatal(err)
	}
	e.reconcile("vm1") // deletes the failed VMI
	e.reconcile("vm1") // releases it
	e.reconcile("vm1") // creates a new one
	if vmi = e.vmi("vm1"); vmi.UID == first || vmi.Status.Phase != PhaseScheduling || vmi.Annotations[FailureReasonAnnotation] != "" || len(e.pods()) != 1 {
		t.Fatalf("after registering: uid %s (first %s) phase %q reason %q", vmi.UID, first, vmi.Status.Phase, vmi.Annotations[FailureReasonAnnotation])
	}
	if _, ok := condition(&vmi.Status, ConditionSynchronized); ok {
		t.Fatalf("new VMI has the old condition: %s", vmi.Status.Unknown)
	}
	if err := e.c.Get(ctx, client.ObjectKey{Namespace: "ns", Name: "vm1"}, &vm); err != nil {
		t.Fatal(err)
	}
	if vm.Status.PrintableStatus != "Starting" || vm.Annotations[FailureReasonAnnotation] != "" {
		t.Fatalf("VM after registering: status %+v reason %q", vm.Status, vm.Annotations[FailureReasonAnnotation])
	}
}

// A standalone VMI with passtBinding fails at once; its other conditions
// and status members are kept.
func TestUnsupportedBindingStandalone(t *testing.T) {
	vmi := &kubevirtv1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "vm", UID: "uid"},
		Spec: kubevirtv1.VirtualMachineInstanceSpec{
			Domain: kubevirtv1.DomainSpec{Devices: kubevirtv1.Devices{Interfaces: []kubevirtv1.Interface{
				{Name: "default", PasstBinding: &kubevirtv1.InterfacePasstBinding{}},
			}}},
			Networks: []kubevirtv1.Network{{Name: "default", Pod: &kubevirtv1.PodNetwork{}}},
		},
		Status: kubevirtv1.VirtualMachineInstanceStatus{
			Unknown: `{"conditions":[{"status":"True","type":"Other"}],"guestOSInfo":{"id":"x"}}`,
		},
	}
	e := newFake(t, []string{"n1"}, vmi, kubeVirtCR())
	e.reconcile("vm")
	e.reconcile("vm")
	got := e.vmi("vm")
	const want = `interface "default": binding "passtBinding": the lab cannot run this binding (it runs bridge, masquerade and managedTap binding plugins)`
	if got.Status.Phase != PhaseFailed || got.Annotations[FailureReasonAnnotation] != want || len(e.pods()) != 0 {
		t.Fatalf("phase %q reason %q pods %d", got.Status.Phase, got.Annotations[FailureReasonAnnotation], len(e.pods()))
	}
	if c, ok := condition(&got.Status, ConditionSynchronized); !ok || c.Message != want {
		t.Fatalf("condition %+v: %s", c, got.Status.Unknown)
	}
	if _, ok := condition(&got.Status, "Other"); !ok || !strings.Contains(string(got.Status.Unknown), "guestOSInfo") {
		t.Fatalf("other status members lost: %s", got.Status.Unknown)
	}
}

func TestCheckBindings(t *testing.T) {
	const runs = "(it runs bridge, masquerade and managedTap binding plugins)"
	plugins := map[string]kubevirtv1.InterfaceBindingPlugin{
		"l2bridge": {DomainAttachmentType: "managedTap"},
		"macvtap":  {DomainAttachmentType: "tap"},
		"sidecar":  {SidecarImage: "quay.io/x/sidecar"},
		"odd":      {DomainAttachmentType: "Tap"},
	}
	pod := kubevirtv1.Network{Name: "default", Pod: &kubevirtv1.PodNetwork{}}
	blue := kubevirtv1.Network{Name: "blue", Multus: &kubevirtv1.MultusNetwork{NetworkName: "bluenad"}}
	plugin := func(name string) *kubevirtv1.PluginBinding { return &kubevirtv1.PluginBinding{Name: name} }
	for _, tc := range []struct {
		name    string
		ifaces  []kubevirtv1.Interface
		plugins map[string]kubevirtv1.InterfaceBindingPlugin
		want    string // "" is ok
	}{
		{name: "none"},
		{name: "bridge", ifaces: []kubevirtv1.Interface{{Name: "default", Bridge: &kubevirtv1.InterfaceBridge{}}, {Name: "blue", Bridge: &kubevirtv1.InterfaceBridge{}}}},
		{name: "masquerade", ifaces: []kubevirtv1.Interface{{Name: "default", Masquerade: &kubevirtv1.InterfaceMasquerade{}}}},
		{name: "managedTap", ifaces: []kubevirtv1.Interface{{Name: "default", Binding: plugin("l2bridge")}}, plugins: plugins},
		{name: "absent is not looked at", ifaces: []kubevirtv1.Interface{{Name: "blue", SRIOV: &kubevirtv1.InterfaceSRIOV{}, State: kubevirtv1.InterfaceStateAbsent}}},
		{name: "down is", ifaces: []kubevirtv1.Interface{{Name: "blue", SRIOV: &kubevirtv1.InterfaceSRIOV{}, State: kubevirtv1.InterfaceStateDown}},
			want: `interface "blue": binding "sriov": the lab cannot run this binding ` + runs},
		{name: "passtBinding", ifaces: []kubevirtv1.Interface{{Name: "default", PasstBinding: &kubevirtv1.InterfacePasstBinding{}}},
			want: `interface "default": binding "passtBinding": the lab cannot run this binding ` + runs},
		{name: "deprecated", ifaces: []kubevirtv1.Interface{
			{Name: "default", DeprecatedPasst: &kubevirtv1.DeprecatedInterfacePasst{}},
			{Name: "blue", DeprecatedMacvtap: &kubevirtv1.DeprecatedInterfaceMacvtap{}},
			{Name: "red", DeprecatedSlirp: &kubevirtv1.DeprecatedInterfaceSlirp{}},
		}, want: `interface "default": binding "passt": the lab cannot run this binding ` + runs +
			`; interface "blue": binding "macvtap": the lab cannot run this binding ` + runs +
			`; interface "red": binding "slirp": the lab cannot run this binding ` + runs},
		{name: "unregistered", ifaces: []kubevirtv1.Interface{{Name: "net1", Binding: plugin("foo")}}, plugins: plugins,
			want: `interface "net1": binding plugin "foo" is not registered in the KubeVirt CR (spec.configuration.network.binding)`},
		{name: "no KubeVirt CR", ifaces: []kubevirtv1.Interface{{Name: "default", Binding: plugin("l2bridge")}},
			want: `interface "default": binding plugin "l2bridge" is not registered in the KubeVirt CR (spec.configuration.network.binding)`},
		{name: "tap plugin", ifaces: []kubevirtv1.Interface{{Name: "blue", Binding: plugin("macvtap")}}, plugins: plugins,
			want: `interface "blue": binding plugin "macvtap" has domainAttachmentType "tap": the lab cannot run this binding ` + runs},
		{name: "case matters", ifaces: []kubevirtv1.Interface{{Name: "blue", Binding: plugin("odd")}}, plugins: plugins,
			want: `interface "blue": binding plugin "odd" has domainAttachmentType "Tap": the lab cannot run this binding ` + runs},
		{name: "sidecar plugin", ifaces: []kubevirtv1.Interface{{Name: "default", Binding: plugin("sidecar")}}, plugins: plugins,
			want: `interface "default": binding plugin "sidecar" has no domainAttachmentType (a sidecar plugin): the lab cannot run this binding ` + runs},
		{name: "unnamed plugin", ifaces: []kubevirtv1.Interface{{Name: "default", Binding: plugin("")}}, plugins: plugins,
			want: `interface "default": binding.name is empty: it must name a binding plugin registered in the KubeVirt CR (spec.configuration.network.binding)`},
		{name: "no binding", ifaces: []kubevirtv1.Interface{{Name: "default"}},
			want: `interface "default": no binding method: the lab cannot run it ` + runs},
		{name: "two bindings", ifaces: []kubevirtv1.Interface{{Name: "default", Bridge: &kubevirtv1.InterfaceBridge{}, Masquerade: &kubevirtv1.InterfaceMasquerade{}}},
			want: `interface "default": bindings bridge, masquerade are mutually exclusive: set exactly one`},
		{name: "masquerade on multus", ifaces: []kubevirtv1.Interface{{Name: "blue", Masquerade: &kubevirtv1.InterfaceMasquerade{}}},
			want: `interface "blue": binding "masquerade": network "blue" is not the pod network (masquerade runs on the pod network only)`},
		{name: "masquerade without network", ifaces: []kubevirtv1.Interface{{Name: "green", Masquerade: &kubevirtv1.InterfaceMasquerade{}}},
			want: `interface "green": binding "masquerade": spec.networks has no network "green" (masquerade runs on the pod network only)`},
		{name: "one of several", ifaces: []kubevirtv1.Interface{
			{Name: "default", Binding: plugin("l2bridge")},
			{Name: "blue", SRIOV: &kubevirtv1.InterfaceSRIOV{}},
		}, plugins: plugins, want: `interface "blue": binding "sriov": the lab cannot run this binding ` + runs},
	} {
		spec := &kubevirtv1.VirtualMachineInstanceSpec{
			Domain:   kubevirtv1.DomainSpec{Devices: kubevirtv1.Devices{Interfaces: tc.ifaces}},
			Networks: []kubevirtv1.Network{pod, blue, {Name: "red", Multus: &kubevirtv1.MultusNetwork{NetworkName: "rednad"}}},
		}
		got := ""
		if err := checkBindings(spec, tc.plugins); err != nil {
			got = err.Error()
		}
		if got != tc.want {
			t.Errorf("%s:\n got %q\nwant %q", tc.name, got, tc.want)
		}
	}
}

func TestSetCondition(t *testing.T) {
	st := &kubevirtv1.VirtualMachineInstanceStatus{Unknown: `{"conditions":[{"status":"True","type":"Ready"},{"status":"True","type":"Synchronized"}],"qosClass":"Burstable"}`}
	c := unsupportedBindingCondition("why")
	if err := setCondition(st, c); err != nil {
		t.Fatal(err)
	}
	if got, ok := condition(st, ConditionSynchronized); !ok || got.Status != corev1.ConditionFalse || got.Message != "why" || got.Reason != ReasonUnsupportedBinding {
		t.Fatalf("condition %+v: %s", got, st.Unknown)
	}
	if _, ok := condition(st, "Ready"); !ok || strings.Count(string(st.Unknown), `"type":"Synchronized"`) != 1 || !strings.Contains(string(st.Unknown), `"qosClass":"Burstable"`) {
		t.Fatalf("others lost or condition doubled: %s", st.Unknown)
	}
	var members map[string][]map[string]any
	if err := json.Unmarshal([]byte(strings.Replace(string(st.Unknown), `,"qosClass":"Burstable"`, "", 1)), &members); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"type", "status", "reason", "message", "lastProbeTime", "lastTransitionTime"} {
		if _, ok := members["conditions"][1][k]; !ok {
			t.Errorf("condition lacks %s (KubeVirt's VirtualMachineInstanceCondition has it): %v", k, members["conditions"][1])
		}
	}
	// The same condition again changes nothing (not even the time).
	before := st.Unknown
	c.LastTransitionTime = metav1.NewTime(c.LastTransitionTime.Add(time.Hour))
	if err := setCondition(st, c); err != nil || st.Unknown != before {
		t.Fatalf("set again: %v\n%s\n%s", err, before, st.Unknown)
	}
	// On an empty status.
	empty := &kubevirtv1.VirtualMachineInstanceStatus{}
	if err := setCondition(empty, c); err != nil || !failedForBindings(&kubevirtv1.VirtualMachineInstance{Status: kubevirtv1.VirtualMachineInstanceStatus{Phase: PhaseFailed, Unknown: empty.Unknown}}) {
		t.Fatalf("empty status: %v %s", err, empty.Unknown)
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
	// As KubeVirt: vm.kubevirt.io/name is the hostname, a VM or not.
	if l := pods[0].Labels; l[kubevirtv1.VMNameLabel] != "vm" || l[kubevirtv1.VMIIDLabel] != "vm" {
		t.Fatalf("standalone VMI's pod labels %v", l)
	}
	if v := e.vmi("vm"); len(v.Finalizers) != 1 {
		t.Fatalf("standalone VMI finalizers %v", v.Finalizers)
	}
}

// The launcher pod's vm.kubevirt.io/name and vmi.kubevirt.io/id, as
// KubeVirt's template service writes them.
func TestLauncherPodNameLabels(t *testing.T) {
	long := strings.Repeat("a", 70)
	for _, tt := range []struct {
		name, hostname, wantHost, wantID string
	}{
		{"vm1", "", "vm1", "vm1"},
		{"vm1", "guest", "guest", "vm1"},
		{"web.example", "", "web", "web.example"},
		{long, "", long[:63], long[:54] + "-" + "ed6c69d9"},
	} {
		vmi := &kubevirtv1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: tt.name, UID: "u"},
			Spec: kubevirtv1.VirtualMachineInstanceSpec{Hostname: tt.hostname}}
		l := launcherPod(vmi, "n1", nil, nil).Labels
		if l[kubevirtv1.VMNameLabel] != tt.wantHost || l[kubevirtv1.VMIIDLabel] != tt.wantID {
			t.Errorf("VMI %q hostname %q: vm.kubevirt.io/name %q vmi.kubevirt.io/id %q, want %q and %q",
				tt.name, tt.hostname, l[kubevirtv1.VMNameLabel], l[kubevirtv1.VMIIDLabel], tt.wantHost, tt.wantID)
		}
	}
}
