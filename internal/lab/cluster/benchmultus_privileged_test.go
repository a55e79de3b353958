//go:build cluster

package cluster

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// benchMultusCPUEnv names the environment variable that sets the CPU
// limit of Multus's daemon for BenchmarkClusterPodReady: a quantity
// ("500m", "2"), or "none" to remove it. Unset, upstream's manifest
// stays as it is (100m).
const benchMultusCPUEnv = "KVNET_BENCH_MULTUS_CPU_LIMIT"

// setMultusCPULimit applies $KVNET_BENCH_MULTUS_CPU_LIMIT to Multus's
// DaemonSet, if set, and waits for its pods to roll; it returns the
// limit the benchmark runs with.
func setMultusCPULimit(ctx context.Context, b *testing.B, c *Cluster) string {
	limit := os.Getenv(benchMultusCPUEnv)
	if limit == "" {
		return "100m (upstream's manifest)"
	}
	value := `"` + limit + `"`
	if limit == "none" {
		value = "null"
	}
	patch := fmt.Sprintf(`{"spec":{"template":{"spec":{"containers":[{"name":"kube-multus","resources":{"limits":{"cpu":%s}}}]}}}}`, value)
	if _, err := c.Client.AppsV1().DaemonSets("kube-system").Patch(ctx, MultusDaemonSet, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		b.Fatalf("%s=%s: patch %s: %v", benchMultusCPUEnv, limit, MultusDaemonSet, err)
	}
	if err := c.waitFor(ctx, 5*time.Minute, "Multus's DaemonSet rolled with the new CPU limit", func() (bool, error) {
		ds, err := c.Client.AppsV1().DaemonSets("kube-system").Get(ctx, MultusDaemonSet, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return dsRolled(ds, int32(len(c.Nodes))), nil
	}); err != nil {
		b.Fatal(err)
	}
	return limit
}

func dsRolled(ds *appsv1.DaemonSet, n int32) bool {
	return ds.Status.ObservedGeneration >= ds.Generation && ds.Status.DesiredNumberScheduled == n &&
		ds.Status.NumberReady == n && ds.Status.UpdatedNumberScheduled == n && ds.Status.NumberAvailable == n
}

// multusThrottle sums, over the machine's multus-daemon processes, the
// CFS throttling of their CPU cgroups (cgroup v1 cpu.stat: the daemon
// and every delegate plugin it runs share it): periods throttled and
// time throttled.
func multusThrottle(b *testing.B) (periods int64, throttled time.Duration) {
	procs, err := filepath.Glob("/proc/[0-9]*/cmdline")
	if err != nil {
		b.Fatal(err)
	}
	seen := map[string]bool{}
	for _, p := range procs {
		cmd, err := os.ReadFile(p)
		if err != nil || !strings.HasSuffix(strings.SplitN(string(cmd), "\x00", 2)[0], "/multus-daemon") {
			continue
		}
		cg, err := cpuCgroup(filepath.Join(filepath.Dir(p), "cgroup"))
		if err != nil || seen[cg] {
			continue
		}
		seen[cg] = true
		st, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/cpu", cg, "cpu.stat"))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(st), "\n") {
			k, v, _ := strings.Cut(line, " ")
			n, _ := strconv.ParseInt(v, 10, 64)
			switch k {
			case "nr_throttled":
				periods += n
			case "throttled_time":
				throttled += time.Duration(n)
			}
		}
	}
	if len(seen) == 0 {
		b.Fatal("no multus-daemon process with a cgroup v1 cpu controller")
	}
	return periods, throttled
}

// cpuCgroup reads a /proc/<pid>/cgroup file's cgroup v1 cpu path.
func cpuCgroup(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		parts := strings.SplitN(s.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		for _, ctl := range strings.Split(parts[1], ",") {
			if ctl == "cpu" {
				return parts[2], nil
			}
		}
	}
	return "", fmt.Errorf("%s: no cpu controller", path)
}
