package node

import (
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kubevirtv1 "kvnet.io/kvnet/api/kubevirt/v1"
	"kvnet.io/kvnet/internal/migration"
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

// An update of what the trimmed cache does not keep (a pod's conditions,
// its container statuses) wakes no reconcile; one of anything the plan
// reads does.
func TestSameButVersion(t *testing.T) {
	base := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", ResourceVersion: "1", Annotations: map[string]string{"a": "1"}},
		Spec:       corev1.PodSpec{NodeName: "n1"},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning},
	}
	trimmed := func(change func(*corev1.Pod)) any {
		p := base.DeepCopy()
		p.ResourceVersion = "2"
		change(p)
		o, err := trimPod(p)
		if err != nil {
			t.Fatal(err)
		}
		return o
	}
	old, err := trimPod(base)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		change func(*corev1.Pod)
		same   bool
	}{
		{"conditions", func(p *corev1.Pod) {
			p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
		}, true},
		{"managed fields", func(p *corev1.Pod) { p.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "x"}} }, true},
		{"annotation", func(p *corev1.Pod) { p.Annotations = map[string]string{"a": "2"} }, false},
		{"label", func(p *corev1.Pod) { p.Labels = map[string]string{"l": "1"} }, false},
		{"node", func(p *corev1.Pod) { p.Spec.NodeName = "n2" }, false},
		{"phase", func(p *corev1.Pod) { p.Status.Phase = corev1.PodSucceeded }, false},
		{"pod IPs", func(p *corev1.Pod) { p.Status.PodIPs = []corev1.PodIP{{IP: "10.0.0.1"}} }, false},
		{"deletion", func(p *corev1.Pod) { p.DeletionTimestamp = &metav1.Time{} }, false},
	} {
		if got := sameButVersion(old, trimmed(tc.change)); got != tc.same {
			t.Errorf("%s changed: sameButVersion = %v, want %v", tc.name, got, tc.same)
		}
	}
	if sameButVersion("not an object", "not an object") {
		t.Error("sameButVersion of non-objects = true, want false (kick)")
	}
}

// TestTrimVMIKeepsWhatThePlanReads: the VMI transform keeps the bindings,
// node and migration the plan reads (and the metadata Events need) and
// drops the rest: status interfaces, managed fields, undeclared fields.
func TestTrimVMIKeepsWhatThePlanReads(t *testing.T) {
	in := &kubevirtv1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "vm", UID: "u1",
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "virt-handler"}}},
		Spec: kubevirtv1.VirtualMachineInstanceSpec{
			Networks: []kubevirtv1.Network{{Name: "default", Pod: &kubevirtv1.PodNetwork{}}},
			Domain: kubevirtv1.DomainSpec{Devices: kubevirtv1.Devices{
				Interfaces: []kubevirtv1.Interface{{Name: "default", Bridge: &kubevirtv1.InterfaceBridge{}, MacAddress: "02:00:00:00:00:01"}},
				Unknown:    `{"disks":[{"name":"root"}]}`,
			}},
		},
		Status: kubevirtv1.VirtualMachineInstanceStatus{
			NodeName:   "n2",
			Interfaces: []kubevirtv1.VirtualMachineInstanceNetworkInterface{{Name: "default", IP: "10.0.0.5"}},
			MigrationState: &kubevirtv1.VirtualMachineInstanceMigrationState{
				SourceNode: "n1", TargetNode: "n2", SourcePod: "a", TargetPod: "b"},
			Unknown: `{"guestOSInfo":{"name":"big"}}`,
		},
	}
	out, err := trimOther(in.DeepCopy())
	if err != nil {
		t.Fatal(err)
	}
	v := out.(*kubevirtv1.VirtualMachineInstance)
	if !launcherServesDHCPv4(v) || v.Status.NodeName != "n2" || v.UID != "u1" ||
		!reflect.DeepEqual(migration.Of(v), migration.Of(in)) {
		t.Errorf("trimmed VMI lost what the plan reads: %+v", v)
	}
	if len(v.ManagedFields) != 0 || len(v.Status.Interfaces) != 0 || v.Status.Unknown != "" ||
		v.Spec.Domain.Devices.Unknown != "" || v.Spec.Domain.Devices.Interfaces[0].MacAddress != "" {
		t.Errorf("trimmed VMI kept what nothing reads: %+v", v)
	}
	// Other kinds lose their managed fields only.
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "s", Labels: map[string]string{"a": "b"},
		ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl"}}}, Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.10"}}
	o, err := trimOther(svc)
	if err != nil {
		t.Fatal(err)
	}
	if s := o.(*corev1.Service); len(s.ManagedFields) != 0 || s.Labels["a"] != "b" || s.Spec.ClusterIP != "10.96.0.10" {
		t.Errorf("trimmed Service %+v", s)
	}
}
