package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"kvnet.io/kvnet/internal/cli/lab"
	"kvnet.io/kvnet/internal/sim/guest"
	"kvnet.io/kvnet/internal/testenv"
)

// benchVMs is how many VMs (and pods) BenchmarkVMCreateToLease creates.
const benchVMs = 10

// BenchmarkVMCreateToLease measures, in a two-node lab, the time from
// creating a VM (l2bridge on a primary UDN with persistent IPs) until its
// QEMU guest holds its DHCP lease (the lease line on its console), over
// benchVMs VMs created one after another; then the same for pods on the
// same network (create until Running, i.e. kvnet-cni plumbed it), and the
// ratio of the medians. It also reports the guests' QEMU RSS. Run it with
// -benchtime 1x: one iteration is one lab.
func BenchmarkVMCreateToLease(b *testing.B) {
	testenv.NeedsRoot(b)
	_, run := buildKvnet(b)
	for range b.N {
		dir := b.TempDir()
		run("lab", "up", "--dir", dir, "--nodes", "2")
		c := labClient(b, dir)
		ctx := context.Background()
		const ns = "bench-vm"
		primaryUDN(b, c, ns, "10.60.0.0/24")

		var vms, pods []time.Duration
		for i := range benchVMs {
			name := fmt.Sprintf("vm-%d", i)
			start := time.Now()
			if err := c.Create(ctx, l2bridgeVM(ns, name)); err != nil {
				b.Fatal(err)
			}
			for len(leases(b, dir, ns, name)) == 0 {
				if time.Since(start) > 3*time.Minute {
					b.Fatalf("VM %s: no lease after 3m", name)
				}
				time.Sleep(20 * time.Millisecond)
			}
			vms = append(vms, time.Since(start))
		}
		rss := qemuRSS(b, lab.VMsDir(dir))
		for i := range benchVMs {
			p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("pod-%d", i)},
				Spec: corev1.PodSpec{NodeName: lab.NodeName(1 + i%2), Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}
			start := time.Now()
			if err := c.Create(ctx, p); err != nil {
				b.Fatal(err)
			}
			for p.Status.Phase != corev1.PodRunning {
				if time.Since(start) > time.Minute {
					b.Fatalf("pod %s not Running after 1m", p.Name)
				}
				time.Sleep(20 * time.Millisecond)
				if err := c.Get(ctx, client.ObjectKeyFromObject(p), p); err != nil {
					b.Fatal(err)
				}
			}
			pods = append(pods, time.Since(start))
		}
		run("lab", "down", "--dir", dir)

		vp50, vp99, pp50, pp99 := pct(vms, 50), pct(vms, 99), pct(pods, 50), pct(pods, 99)
		b.ReportMetric(vp50.Seconds(), "vm-p50-s")
		b.ReportMetric(vp99.Seconds(), "vm-p99-s")
		b.ReportMetric(pp50.Seconds(), "pod-p50-s")
		b.ReportMetric(pp99.Seconds(), "pod-p99-s")
		b.ReportMetric(vp50.Seconds()/pp50.Seconds(), "vm/pod-p50")
		b.ReportMetric(rss, "qemu-rss-MiB")
		b.Logf("VM create -> guest lease over %d VMs: p50 %s p99 %s; pod create -> Running: p50 %s p99 %s; QEMU RSS %.0f MiB per guest of %d MiB",
			benchVMs, vp50.Round(time.Millisecond), vp99.Round(time.Millisecond), pp50.Round(time.Millisecond), pp99.Round(time.Millisecond), rss, guest.DefaultMemoryMB)
	}
}

// pct is the p-th percentile (nearest rank) of ds.
func pct(ds []time.Duration, p int) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	i := (p*len(s)+99)/100 - 1
	return s[max(0, min(i, len(s)-1))]
}

// qemuRSS is the mean resident memory, in MiB, of the QEMU processes whose
// command line names dir (the lab's guests).
func qemuRSS(b *testing.B, dir string) float64 {
	b.Helper()
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	var total float64
	n := 0
	for _, p := range procs {
		cmd, err := os.ReadFile(p)
		if err != nil || !strings.Contains(string(cmd), guest.QEMUBinary) || !strings.Contains(string(cmd), dir) {
			continue
		}
		st, err := os.ReadFile(filepath.Join(filepath.Dir(p), "status"))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(st), "\n") {
			if f := strings.Fields(line); len(f) == 3 && f[0] == "VmRSS:" {
				kb, _ := strconv.Atoi(f[1])
				total += float64(kb) / 1024
				n++
			}
		}
	}
	if n == 0 {
		b.Fatalf("no QEMU process of the lab in %s found", dir)
	}
	return total / float64(n)
}
