//go:build cluster

package cluster

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"kvnet.io/kvnet/internal/testenv"
)

// probesHeld checks that the kubelet's probes of the pods ns/names (webPod:
// HTTP readiness, TCP liveness on eth0's address) keep passing: each
// pod's kubelet has counted at least minLivenessPasses successful liveness
// probes of it (prober_probe_total in its /metrics/probes, through the API
// server's node proxy), and then the pod is still Ready with no restart.
// A broken probe path fails readiness and restarts the container after
// three failed liveness probes.
func probesHeld(ctx context.Context, t *testing.T, c *Cluster, ns string, names ...string) {
	t.Helper()
	const minLivenessPasses = 5
	for _, name := range names {
		p := mustPod(ctx, t, c, ns, name)
		testenv.Eventually(t, time.Minute, fmt.Sprintf("%d successful liveness probes of %s/%s on %s", minLivenessPasses, ns, name, p.Spec.NodeName), func() error {
			n, err := probeCount(ctx, c, p.Spec.NodeName, ns, name, "Liveness", "successful")
			if err != nil {
				return err
			}
			if n < minLivenessPasses {
				return fmt.Errorf("%d so far", n)
			}
			return nil
		})
		p = mustPod(ctx, t, c, ns, name)
		ready := false
		for _, cond := range p.Status.Conditions {
			ready = ready || (cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue)
		}
		if !ready {
			t.Errorf("pod %s/%s not Ready after its liveness probes: %+v", ns, name, p.Status.Conditions)
		}
		for _, cs := range p.Status.ContainerStatuses {
			if cs.RestartCount != 0 || cs.State.Running == nil {
				t.Errorf("pod %s/%s container %s: %d restarts, state %+v; want running, never restarted", ns, name, cs.Name, cs.RestartCount, cs.State)
			}
		}
	}
}

// probeCount sums the kubelet's prober_probe_total of pod ns/name for
// probe type and result, read from node's /metrics/probes.
func probeCount(ctx context.Context, c *Cluster, node, ns, name, probeType, result string) (int, error) {
	b, err := c.Client.CoreV1().RESTClient().Get().AbsPath("/api/v1/nodes", node, "proxy", "metrics", "probes").DoRaw(ctx)
	if err != nil {
		return 0, fmt.Errorf("node %s /metrics/probes: %w", node, err)
	}
	total := 0
	for _, l := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(l, "prober_probe_total{") {
			continue
		}
		labels, value, ok := strings.Cut(strings.TrimPrefix(l, "prober_probe_total{"), "} ")
		if !ok {
			continue
		}
		want := []string{`namespace="` + ns + `"`, `pod="` + name + `"`, `probe_type="` + probeType + `"`, `result="` + result + `"`}
		match := true
		for _, w := range want {
			match = match && strings.Contains(","+labels+",", ","+w+",")
		}
		if !match {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err != nil {
			return 0, fmt.Errorf("node %s /metrics/probes: %q: %w", node, l, err)
		}
		total += int(v)
	}
	return total, nil
}
