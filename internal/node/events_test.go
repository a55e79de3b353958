package node

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	toolscache "k8s.io/client-go/tools/cache"
)

// A pod event of this node kicks the loop at once; another node's is
// batched (remote); a pod that leaves this node counts as this node's.
func TestPodEventsLocalAtOnceRemoteBatched(t *testing.T) {
	pod := func(node string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p"}, Spec: corev1.PodSpec{NodeName: node}}
	}
	for _, tc := range []struct {
		name     string
		obj, old any
		now      bool
	}{
		{"added here", pod("n1"), nil, true},
		{"added elsewhere", pod("n2"), nil, false},
		{"unscheduled", pod(""), nil, false},
		{"bound here", pod("n1"), pod(""), true},
		{"moved away", pod("n2"), pod("n1"), true},
		{"changed elsewhere", pod("n2"), pod("n2"), false},
		{"deleted here, state unknown", toolscache.DeletedFinalStateUnknown{Key: "ns/p", Obj: pod("n1")}, nil, true},
		{"deleted elsewhere, state unknown", toolscache.DeletedFinalStateUnknown{Key: "ns/p", Obj: pod("n2")}, nil, false},
	} {
		a := &Agent{cfg: Config{NodeName: "n1"}, trigger: make(chan struct{}, 1), remote: make(chan struct{}, 1)}
		a.podChanged(tc.obj, tc.old)
		now, later := len(a.trigger) == 1, len(a.remote) == 1
		if now != tc.now || later == tc.now {
			t.Errorf("%s: kicked at once %v, batched %v; want at once %v", tc.name, now, later, tc.now)
		}
	}
}
