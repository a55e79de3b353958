package migration

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kubevirtv1 "kvnet.io/kvnet/api/kubevirt/v1"
)

func TestOf(t *testing.T) {
	start := metav1.Now()
	vmi := func(ms *kubevirtv1.VirtualMachineInstanceMigrationState) *kubevirtv1.VirtualMachineInstance {
		return &kubevirtv1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "vm"},
			Status: kubevirtv1.VirtualMachineInstanceStatus{NodeName: "n1", MigrationState: ms}}
	}
	if m := Of(vmi(nil)); m != nil || m.InProgress() {
		t.Errorf("no migration state: %+v", m)
	}
	for _, tc := range []struct {
		ms         kubevirtv1.VirtualMachineInstanceMigrationState
		state      State
		inProgress bool
	}{
		{kubevirtv1.VirtualMachineInstanceMigrationState{SourceNode: "n1"}, Pending, false}, // no target yet
		{kubevirtv1.VirtualMachineInstanceMigrationState{SourceNode: "n1", TargetNode: "n2"}, Pending, true},
		{kubevirtv1.VirtualMachineInstanceMigrationState{SourceNode: "n1", TargetNode: "n2", StartTimestamp: &start}, Running, true},
		{kubevirtv1.VirtualMachineInstanceMigrationState{SourceNode: "n1", TargetNode: "n2", StartTimestamp: &start, Completed: true}, Succeeded, false},
		{kubevirtv1.VirtualMachineInstanceMigrationState{SourceNode: "n1", TargetNode: "n2", StartTimestamp: &start, Completed: true, Failed: true, FailureReason: "x"}, Failed, false},
	} {
		ms := tc.ms
		ms.SourcePod, ms.TargetPod, ms.MigrationUID = "src", "dst", "uid-1"
		m := Of(vmi(&ms))
		if m == nil || m.State != tc.state || m.InProgress() != tc.inProgress || m.VMI.String() != "ns/vm" ||
			m.SourceNode != ms.SourceNode || m.TargetNode != ms.TargetNode || m.FailureReason != ms.FailureReason || m.UID != "uid-1" {
			t.Errorf("%+v: got %+v (in progress %v), want state %s, in progress %v", ms, m, m.InProgress(), tc.state, tc.inProgress)
			continue
		}
		for _, r := range []struct {
			ns, pod string
			want    Role
		}{{"ns", "src", Source}, {"ns", "dst", Target}, {"other", "src", NoRole}, {"ns", "x", NoRole}, {"ns", "", NoRole}} {
			if got := m.RoleOf(r.ns, r.pod); got != r.want {
				t.Errorf("RoleOf(%s/%s) = %d, want %d", r.ns, r.pod, got, r.want)
			}
		}
	}
}
