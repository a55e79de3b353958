package chaos

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// The scale lab at a size CI affords (make scale runs the default size,
// docs/scale.md the full one): KWOK nodes, the networks, pods and VMs
// with persistent IPs, churn with VM stop/starts and migrations, a
// kvnet-controller restart, then the audit. It asserts what must hold at
// any size (no duplicate IP or MAC, no leaked claim, every pod and VM
// served, VM IPs kept) and that every figure of the summary was
// measured; the figures themselves are benchmarks, not assertions.
func TestScale(t *testing.T) {
	_, run := buildKvnet(t)
	real := 0
	if os.Geteuid() == 0 {
		real = 1
	}
	dir := t.TempDir()
	summary := filepath.Join(dir, "summary.json")
	profiles := filepath.Join(dir, "profiles")
	out := run("scale", "--dir", filepath.Join(dir, "lab"), "--nodes", "30", "--real-nodes", strconv.Itoa(real),
		"--udns", "20", "--pods", "1000", "--vms", "100", "--churn", "15s", "--churn-rate", "20", "--summary", summary,
		// The scope a large cluster runs (docs/scale.md); the restart
		// reserve kept through the churn and the restart, under the audit.
		"--pod-scope", "networks", "--restart-reserve", "8", "--profile-dir", profiles)
	t.Logf("kvnet-lab scale:\n%s", out)
	b, err := os.ReadFile(summary)
	if err != nil {
		t.Fatal(err)
	}
	var s struct {
		Parameters     struct{ Pods, VMs, UDNs int }
		Floor          struct{ PodsPerSecond float64 }
		FloorAfterWave struct{ PodsPerSecond float64 }
		Networks       struct {
			Count   int
			ReadyMs struct{ N int } `json:"createToNetworkCreatedMs"`
		}
		Pods struct {
			Count             int
			Alloc             struct{ N int } `json:"createToAllocatedMs"`
			Running           struct{ N int } `json:"createToRunningMs"`
			AllRunningSeconds float64
			VsFloorAfterWave  float64
		}
		VMs struct {
			Count                  int
			Running                struct{ N int } `json:"createToRunningWithIPMs"`
			StopStarts, Migrations int
			IPChanged              []string
		}
		Churn struct {
			Pods  int
			Alloc struct{ N int } `json:"createToAllocatedMs"`
		}
		WebhookMs        struct{ N int }
		WebhookHandlerMs struct{ N int }
		Controller       struct {
			RSSMiB                float64
			RestartClaims         int
			RestartServingSeconds float64
		}
		RealNodes []struct {
			RSSMiB            float64
			PlanMs            struct{ N int }
			NftRules          int
			APIBytesPerMinute float64
			WatchedNetworks   int
			Pods, Networks    int
		}
		NodeObjectBytes int
		EtcdBytes       int64
		Profiles        []string
		Audit           string
		Duplicates      int
		LeakedClaims    int
	}
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatalf("summary: %v\n%s", err, b)
	}
	if s.Duplicates != 0 || s.LeakedClaims != 0 || s.Audit != "no findings" {
		t.Errorf("audit: %q (%d duplicates, %d leaked claims)", s.Audit, s.Duplicates, s.LeakedClaims)
	}
	if s.Pods.Count != 1000 || s.Pods.Alloc.N != 1000 || s.VMs.Count != 100 || s.VMs.Running.N != 100 || s.Networks.Count != 20 || s.Networks.ReadyMs.N != 20 {
		t.Errorf("served: %d/%d pods, %d/%d VMs, %d/%d networks (want 1000, 100, 20)",
			s.Pods.Alloc.N, s.Pods.Count, s.VMs.Running.N, s.VMs.Count, s.Networks.ReadyMs.N, s.Networks.Count)
	}
	// The VMs step starts once KWOK runs every pod of the wave.
	if s.Pods.Running.N != 1000 || s.Pods.AllRunningSeconds <= 0 {
		t.Errorf("pods Running: %d of 1000 timed, the last %v s after the wave began", s.Pods.Running.N, s.Pods.AllRunningSeconds)
	}
	if s.VMs.StopStarts == 0 || s.VMs.Migrations == 0 || s.VMs.IPChanged == nil || len(s.VMs.IPChanged) != 0 {
		t.Errorf("VMs: %d stop/starts, %d migrations (want some of each), IPs changed: %v", s.VMs.StopStarts, s.VMs.Migrations, s.VMs.IPChanged)
	}
	if s.Churn.Pods == 0 || s.Churn.Alloc.N == 0 {
		t.Errorf("churn: %d pods, %d allocation latencies", s.Churn.Pods, s.Churn.Alloc.N)
	}
	if s.FloorAfterWave.PodsPerSecond <= 0 || s.Pods.VsFloorAfterWave <= 0 {
		t.Errorf("floor after the wave not measured: %v pods/s, the wave %v× it", s.FloorAfterWave.PodsPerSecond, s.Pods.VsFloorAfterWave)
	}
	if s.Floor.PodsPerSecond <= 0 || s.WebhookMs.N == 0 || s.WebhookHandlerMs.N == 0 || s.Controller.RSSMiB <= 0 || s.Controller.RestartClaims < 100 ||
		s.Controller.RestartServingSeconds <= 0 || s.NodeObjectBytes <= 0 || s.EtcdBytes <= 0 {
		t.Errorf("figures not measured: %s", b)
	}
	if len(s.RealNodes) != real {
		t.Fatalf("%d real nodes measured, want %d", len(s.RealNodes), real)
	}
	for _, n := range s.RealNodes {
		if n.RSSMiB <= 0 || n.PlanMs.N == 0 || n.NftRules == 0 || n.APIBytesPerMinute <= 0 {
			t.Errorf("real node figures not measured: %+v", n)
		}
		// At least its pods' networks (it keeps a network a minute after
		// its last pod there went).
		if n.Pods < 4 || n.Networks < 1 || n.WatchedNetworks < n.Networks {
			t.Errorf("real node watches the pods of %d networks; its %d pods are on %d (want at least 4 pods, and their networks watched)",
				n.WatchedNetworks, n.Pods, n.Networks)
		}
	}
	// A CPU profile of kvnet-controller for each profiled step, and
	// kvnet's own code in them.
	kvnetCode := false
	for _, step := range []string{"networks", "pods", "vms", "churn"} {
		first := filepath.Join(profiles, "controller-"+step+"-01.pprof")
		if !slices.Contains(s.Profiles, first) {
			t.Errorf("summary's profiles %v lack %s", s.Profiles, first)
		}
	}
	for _, p := range s.Profiles {
		b, err := readProfile(p)
		if err != nil {
			t.Errorf("%s: %v", p, err)
			continue
		}
		kvnetCode = kvnetCode || bytes.Contains(b, []byte("kvnet.io/kvnet/"))
	}
	if len(s.Profiles) > 0 && !kvnetCode {
		t.Errorf("no function of kvnet.io/kvnet in %d CPU profiles of kvnet-controller", len(s.Profiles))
	}
	if !strings.Contains(out, "pods → allocated") {
		t.Errorf("no table printed:\n%s", out)
	}
}

// readProfile reads a CPU profile as go tool pprof would: gzipped, its
// sample type (CPU time in nanoseconds) in its strings. It returns the
// uncompressed profile.
func readProfile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		return nil, fmt.Errorf("not a gzipped profile: %w", err)
	}
	b, err := io.ReadAll(zr)
	if err != nil {
		return nil, err
	}
	if !bytes.Contains(b, []byte("nanoseconds")) {
		return nil, fmt.Errorf("%d bytes without a CPU sample type", len(b))
	}
	return b, nil
}
