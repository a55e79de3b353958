//go:build cluster

package cluster

import (
	"context"
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"kvnet.io/kvnet/internal/testenv"
)

// minLivenessPasses is how many successful liveness probes probesHeld
// waits for.
const minLivenessPasses = 5

// probesHeld checks that the kubelet's probes of the pods ns/names (webPod:
// HTTP readiness, TCP liveness on eth0's address) keep passing: each
// pod's kubelet has counted at least minLivenessPasses successful liveness
// probes of it and not one failed or unknown one over the pod's life
// (prober_probe_total in its /metrics/probes, through the API server's
// node proxy; webPod's liveness probe starts after httpd listens), and
// then the pod is still Ready with no restart. A broken probe path
// fails readiness and counts failed liveness probes; after three in a
// row the container restarts.
//
// First, the control: a pod of the same namespace on the first pod's
// node whose liveness probe has no listener behind it must be counted
// failing, so that a count of failures that stays 0 is the probes'
// doing and not a metric that does not count them.
func probesHeld(ctx context.Context, t testing.TB, c *Cluster, ns string, names ...string) {
	t.Helper()
	first := mustPod(ctx, t, c, ns, names[0])
	probeFailControl(ctx, t, c, ns, first.Spec.NodeName)
	for _, name := range names {
		p := mustPod(ctx, t, c, ns, name)
		var counts map[string]int
		testenv.Eventually(t, 2*time.Minute, fmt.Sprintf("%d successful liveness probes of %s/%s on %s, none failed", minLivenessPasses, ns, name, p.Spec.NodeName), func() error {
			var err error
			if counts, err = probeCount(ctx, c, p.Spec.NodeName, ns, name, "Liveness"); err != nil {
				return err
			}
			return probesVerdict(counts, minLivenessPasses)
		})
		t.Logf("pod %s/%s on %s: liveness probes %v", ns, name, p.Spec.NodeName, counts)
		p = mustPod(ctx, t, c, ns, name)
		if !PodReady(p) {
			t.Errorf("pod %s/%s not Ready after its liveness probes: %+v", ns, name, p.Status.Conditions)
		}
		for _, cs := range p.Status.ContainerStatuses {
			if cs.RestartCount != 0 || cs.State.Running == nil {
				t.Errorf("pod %s/%s container %s: %d restarts, state %+v; want running, never restarted", ns, name, cs.Name, cs.RestartCount, cs.State)
			}
		}
	}
}

// probeFailControl runs a web pod in ns on node whose liveness probe
// asks a port nothing listens on, waits until its kubelet counts a
// failed liveness probe of it and probesVerdict refuses its counts,
// then deletes it.
func probeFailControl(ctx context.Context, t testing.TB, c *Cluster, ns, node string) {
	t.Helper()
	const name = "probe-fail"
	p := webPod(ns, name, node, c.Images["busybox"])
	p.Labels = map[string]string{"app": "probe-fail"} // not a backend of the Services
	p.Spec.Containers[0].ReadinessProbe = nil
	p.Spec.Containers[0].LivenessProbe.TCPSocket.Port = intstr.FromInt32(8081)
	p.Spec.Containers[0].LivenessProbe.FailureThreshold = 1000 // counted, never restarted
	if _, err := c.Client.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatalf("control: create pod %s/%s: %v", ns, name, err)
	}
	defer func() {
		if err := c.Client.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Errorf("control: delete pod %s/%s: %v", ns, name, err)
		}
	}()
	testenv.Eventually(t, 3*time.Minute, fmt.Sprintf("control: failed liveness probes of %s/%s (nothing on 8081) counted on %s", ns, name, node), func() error {
		counts, err := probeCount(ctx, c, node, ns, name, "Liveness")
		if err != nil {
			return err
		}
		if counts["failed"] == 0 {
			return fmt.Errorf("liveness probes %v, no failed one yet", counts)
		}
		if err := probesVerdict(counts, 0); err == nil {
			return fmt.Errorf("liveness probes %v pass the verdict", counts)
		}
		t.Logf("control: pod %s/%s on %s: liveness probes %v", ns, name, node, counts)
		return nil
	})
}

// probeCount returns the kubelet's prober_probe_total of pod ns/name and
// probeType by result, read from node's /metrics/probes.
func probeCount(ctx context.Context, c *Cluster, node, ns, name, probeType string) (map[string]int, error) {
	b, err := c.Client.CoreV1().RESTClient().Get().AbsPath("/api/v1/nodes", node, "proxy", "metrics", "probes").DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("node %s /metrics/probes: %w", node, err)
	}
	counts, err := probeCounts(string(b), ns, name, probeType)
	if err != nil {
		return nil, fmt.Errorf("node %s /metrics/probes: %w", node, err)
	}
	return counts, nil
}
