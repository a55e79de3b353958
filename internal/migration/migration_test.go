package migration

import (
	"strings"
	"testing"
	"time"

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

func TestLastFrames(t *testing.T) {
	at := time.Date(2026, 11, 29, 12, 0, 0, 123456789, time.UTC)
	v := MergeLastFrames("", map[string]LastFrame{"ns/udn": {Node: "n1", At: at, Frame: "RARP"}})
	v = MergeLastFrames(v, map[string]LastFrame{"ns/sec": {Node: "n1", At: at.Add(time.Second), Frame: "IPv4 from 10.0.0.4"}})
	got, err := ParseLastFrames(v)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || !got["ns/udn"].At.Equal(at) || got["ns/sec"].Frame != "IPv4 from 10.0.0.4" || got["ns/udn"].Node != "n1" {
		t.Fatalf("ParseLastFrames(%s) = %+v", v, got)
	}
	f := LastFrame{Node: "n1", At: at.Add(3 * time.Second), Frame: "IPv4 from 10.0.0.4 (the pod's)",
		Earlier: []SeenFrame{{At: at, Frame: "RARP"}, {At: at.Add(time.Second), Frame: "IPv4 from 10.0.0.4"}}}
	for _, tc := range []struct {
		t     time.Time
		want  string
		after int
		ok    bool
	}{
		{at.Add(-time.Second), "", 3, false},
		{at, "RARP", 2, true},
		{at.Add(2 * time.Second), "IPv4 from 10.0.0.4", 1, true},
		{at.Add(time.Hour), "IPv4 from 10.0.0.4 (the pod's)", 0, true},
	} {
		if got, after, ok := f.Before(tc.t); got.Frame != tc.want || after != tc.after || ok != tc.ok {
			t.Errorf("Before(%s) = %+v, %d, %v; want %q, %d, %v", tc.t, got, after, ok, tc.want, tc.after, tc.ok)
		}
	}
	if m, err := ParseLastFrames(`{"ns/udn":{"node":"n1"}}`); err != nil || !m["ns/udn"].At.IsZero() {
		t.Errorf("a network without a frame seen: %+v, %v", m, err)
	}
	for _, bad := range []string{"", "[]", `{"ns/udn":{"at":"2026-11-29T12:00:00Z"}}`, `{"ns/udn":{"node":"n1","at":"yesterday"}}`} {
		if _, err := ParseLastFrames(bad); err == nil || !strings.Contains(err.Error(), LastFramesAnnotation) {
			t.Errorf("ParseLastFrames(%q) = %v, want an error naming the annotation", bad, err)
		}
	}
	if v := MergeLastFrames("{garbage", map[string]LastFrame{"a": {Node: "n", At: at}}); !strings.Contains(v, `"a"`) || strings.Contains(v, "garbage") {
		t.Errorf("MergeLastFrames over an unreadable value = %s", v)
	}
}

func FuzzParseLastFrames(f *testing.F) {
	f.Add(`{"ns/udn":{"node":"n1","at":"2026-11-29T12:00:00.5Z","frame":"RARP"}}`)
	f.Add(`{}`)
	f.Fuzz(func(t *testing.T, s string) {
		m, err := ParseLastFrames(s)
		if err != nil {
			return
		}
		for n, lf := range m {
			if lf.Node == "" {
				t.Fatalf("accepted %q: network %q without a node", s, n)
			}
		}
	})
}
