package simkubelet_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"

	"kvnet.io/kvnet/internal/lab/simkubelet"
	"kvnet.io/kvnet/internal/nl"
	"kvnet.io/kvnet/internal/testenv"
)

// recRuntime records what the kubelet asks of its runtime; it fails Start
// for pods labelled fail=yes.
type recRuntime struct {
	mu      sync.Mutex
	started map[types.UID]string // pod UID -> netns it was started in
	netnsUp map[types.UID]bool   // whether that netns had the pod's interface at Start
	stopped map[types.UID]bool
}

func (r *recRuntime) Start(_ context.Context, pod *corev1.Pod, netns string) error {
	_, _, err := podLink(netns, simkubelet.PrimaryIfName)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.started[pod.UID], r.netnsUp[pod.UID] = netns, err == nil
	if pod.Labels["fail"] == "yes" {
		return errors.New("qemu: no such binding")
	}
	return nil
}

func (r *recRuntime) Stop(uid types.UID) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.started[uid]; ok {
		r.stopped[uid] = nl.IsNetNS(r.started[uid]) // stopped while its netns still existed
	}
}

func (r *recRuntime) get(uid types.UID) (string, bool, bool, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	ns, ok := r.started[uid]
	stoppedWithNS, stopped := r.stopped[uid]
	return ns, ok && r.netnsUp[uid], stopped, stoppedWithNS
}

// The runtime starts a pod's containers once its network is up, before
// the pod reports Running, and stops them before the network goes; a
// container that cannot start fails the pod with the runtime's error.
func TestRuntime(t *testing.T) {
	testenv.NeedsFixture(t, privileged)
	ctx := context.Background()
	const ns = "sk-runtime"
	primaryNetwork(t, ns, "10.21.0.0/24")
	rt := &recRuntime{started: map[types.UID]string{}, netnsUp: map[types.UID]bool{}, stopped: map[types.UID]bool{}}
	k := startKubelet(t, func(cfg *simkubelet.Config) { cfg.Runtime = rt })

	testenv.Create(t, c, newPod(ns, "ok", nil))
	pod := waitRunning(t, ns, "ok")
	netns, netUp, _, _ := rt.get(pod.UID)
	if netns != simkubelet.PodNetNS(k.cfg, pod) || !netUp {
		t.Fatalf("runtime started in %q (interface up: %v), want %q with the pod's network up", netns, netUp, simkubelet.PodNetNS(k.cfg, pod))
	}
	if err := c.Delete(ctx, pod); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, waitTimeout, "pod ok gone", func() error {
		if _, err := getPod(ns, "ok"); !apierrors.IsNotFound(err) {
			return fmt.Errorf("still there (err %v)", err)
		}
		return nil
	})
	if _, _, stopped, withNS := rt.get(pod.UID); !stopped || !withNS {
		t.Fatalf("runtime stopped: %v, while the pod's netns existed: %v; want both", stopped, withNS)
	}

	bad := newPod(ns, "bad", nil)
	bad.Labels = map[string]string{"fail": "yes"}
	testenv.Create(t, c, bad)
	testenv.Eventually(t, waitTimeout, "pod bad Failed", func() error {
		p, err := getPod(ns, "bad")
		if err != nil {
			return err
		}
		if p.Status.Phase != corev1.PodFailed || p.Status.Reason != simkubelet.ReasonContainerFailed || p.Status.Message != "qemu: no such binding" {
			return fmt.Errorf("phase %q reason %q message %q", p.Status.Phase, p.Status.Reason, p.Status.Message)
		}
		bad = p
		return nil
	})
	// Its network is torn down, as a completed pod's.
	waitTornDown(t, "failed pod's namespace and host end gone", simkubelet.PodNetNS(k.cfg, bad), bad)
	k.running(t)
}
