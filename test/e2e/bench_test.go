package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kubevirtv1 "kvnet.io/kvnet/api/kubevirt/v1"
	"kvnet.io/kvnet/internal/lab/cli/lab"
	"kvnet.io/kvnet/internal/lab/guest"
	"kvnet.io/kvnet/internal/lab/simkubelet"
	"kvnet.io/kvnet/internal/lab/simvirt"
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
		run("up", "--dir", dir, "--nodes", "2")
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
		run("down", "--dir", dir)

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

// benchMigrations is how many live migrations BenchmarkMigrationBlackout
// makes.
const benchMigrations = 10

// BenchmarkMigrationBlackout live-migrates one VM (l2bridge, primary UDN)
// benchMigrations times in a three-node lab while a pod on another node
// keeps one TCP echo exchange at a time going with the guest. Per
// migration, the blackout is the longest exchange during it, and the
// longest gap between replies to a 10 ms ping from the same pod; QEMU's own
// downtime for the same migration comes from the launcher's log. It
// reports both p50/p99 and the connections lost. Run with -benchtime 1x.
func BenchmarkMigrationBlackout(b *testing.B) {
	testenv.NeedsRoot(b)
	_, run := buildKvnet(b)
	for range b.N {
		dir := b.TempDir()
		run("up", "--dir", dir, "--nodes", "3")
		c := labClient(b, dir)
		ctx := context.Background()
		const ns = "bench-mig"
		primaryUDN(b, c, ns, "10.80.0.0/24")
		if err := c.Create(ctx, l2bridgeVM(ns, "vm-1")); err != nil {
			b.Fatal(err)
		}
		lease := waitBoot(b, dir, ns, "vm-1", 1)
		peer := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "peer"},
			Spec: corev1.PodSpec{NodeName: lab.NodeName(3), Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}
		if err := c.Create(ctx, peer); err != nil {
			b.Fatal(err)
		}
		testenv.Eventually(b, time.Minute, "peer Running", func() error {
			if err := c.Get(ctx, client.ObjectKeyFromObject(peer), peer); err != nil {
				return err
			}
			if peer.Status.Phase != corev1.PodRunning {
				return fmt.Errorf("phase %q", peer.Status.Phase)
			}
			return nil
		})
		peerNS := simkubelet.PodNetNS(lab.KubeletConfig(dir, lab.NodeName(3)), peer)
		var conn net.Conn
		testenv.Eventually(b, time.Minute, "connect to the guest", func() error {
			dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			var err error
			conn, err = guest.DialContext(dctx, peerNS, "tcp", netip.AddrPortFrom(lease.IP(), guest.EchoPort).String())
			return err
		})
		mon := newExchangeMonitor(conn)
		ping, err := startPinger(peerNS, lease.IP(), 10*time.Millisecond)
		if err != nil {
			b.Fatal(err)
		}
		var vmi kubevirtv1.VirtualMachineInstance
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "vm-1"}, &vmi); err != nil {
			b.Fatal(err)
		}
		guestMAC, err := net.ParseMAC(vmi.Status.Interfaces[0].MAC)
		if err != nil {
			b.Fatal(err)
		}
		nodeNS := map[string]string{}
		for i := 1; i <= 3; i++ {
			nodeNS[lab.NodeName(i)] = filepath.Join("/run/netns", labNetnsPrefix(b, dir)+"-"+lab.NodeName(i))
		}
		tap, err := startFrameTap(nodeNS, guestMAC)
		if err != nil {
			b.Fatal(err)
		}
		type window struct {
			target     string
			start, end time.Time
		}
		var windows []window

		var blackouts, pingGaps []time.Duration
		var gapSpans [][2]time.Time
		lost := 0
		for i := range benchMigrations {
			mon.reset()
			migStart := time.Now()
			mig := &kubevirtv1.VirtualMachineInstanceMigration{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("mig-%d", i)},
				Spec: kubevirtv1.VirtualMachineInstanceMigrationSpec{VMIName: "vm-1"}}
			if err := c.Create(ctx, mig); err != nil {
				b.Fatal(err)
			}
			testenv.Eventually(b, 2*time.Minute, "migration "+mig.Name+" Succeeded", func() error {
				if err := c.Get(ctx, client.ObjectKeyFromObject(mig), mig); err != nil {
					return err
				}
				if mig.Status.Phase == simvirt.PhaseFailed {
					b.Fatalf("migration %s failed: %s", mig.Name, mig.Annotations[simvirt.FailureReasonAnnotation])
				}
				if mig.Status.Phase != simvirt.PhaseSucceeded {
					return fmt.Errorf("phase %q", mig.Status.Phase)
				}
				return nil
			})
			// Let the switch-over settle before the next migration.
			time.Sleep(2 * time.Second)
			if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "vm-1"}, &vmi); err != nil {
				b.Fatal(err)
			}
			windows = append(windows, window{target: vmi.Status.NodeName, start: migStart, end: time.Now()})
			start, g := ping.longestGapAt(migStart, time.Now())
			pingGaps = append(pingGaps, g)
			gapSpans = append(gapSpans, [2]time.Time{start, start.Add(g)})
			longest, err := mon.longest()
			if err != nil {
				lost++
				b.Errorf("migration %s: the TCP connection broke: %v", mig.Name, err)
				break
			}
			blackouts = append(blackouts, longest)
		}
		mon.stop()
		ping.stop()
		tap.stop()
		run("down", "--dir", dir)

		downtimes, qemuPauses, resumes := migrationDowntimes(b, dir)
		if len(blackouts) == 0 || len(downtimes) == 0 || len(qemuPauses) != len(downtimes) {
			b.Fatalf("%d blackouts, %d QEMU downtimes, %d guest pauses measured", len(blackouts), len(downtimes), len(qemuPauses))
		}
		// The switch-over as the target's pod port saw it: when the
		// guest's first frame came out there (after QEMU's RESUME), how
		// long each echo request the peer sent after that frame took to
		// reach the guest's new port (kvnet's part), how many went
		// elsewhere, and how long the guest took to answer the first.
		var toFirstFrame, toAnyFrame, reqDelays, guestAnswers []time.Duration
		misdelivered, requests := 0, 0
		for i, w := range windows {
			if i >= len(resumes) {
				break
			}
			frames := tap.between(w.target, resumes[i].Add(-20*time.Millisecond), w.end)
			var first, firstAny time.Time
			for _, f := range frames {
				if f.fromGuest && firstAny.IsZero() {
					firstAny = f.at
				}
				if f.fromGuest && f.guestOnly {
					first = f.at
					break
				}
			}
			if first.IsZero() {
				b.Errorf("migration %d: no frame of the guest seen on %s after it resumed", i, w.target)
				continue
			}
			toFirstFrame = append(toFirstFrame, first.Sub(resumes[i]))
			toAnyFrame = append(toAnyFrame, firstAny.Sub(resumes[i]))
			delivered, replied := map[int]time.Time{}, map[int]time.Time{}
			for _, f := range frames {
				if f.echoReq >= 0 && !f.at.Before(first) {
					if _, seen := delivered[f.echoReq]; !seen {
						delivered[f.echoReq] = f.at
					}
				}
				if f.echoReply >= 0 {
					if _, seen := replied[f.echoReply]; !seen {
						replied[f.echoReply] = f.at
					}
				}
			}
			sent := ping.sentBetween(first, first.Add(time.Second))
			var firstSeq int
			var firstSent time.Time
			for seq, at := range sent {
				requests++
				d, ok := delivered[seq]
				if !ok {
					misdelivered++
					continue
				}
				reqDelays = append(reqDelays, d.Sub(at))
				if firstSent.IsZero() || at.Before(firstSent) {
					firstSeq, firstSent = seq, at
				}
			}
			if r, ok := replied[firstSeq]; ok && !firstSent.IsZero() {
				guestAnswers = append(guestAnswers, r.Sub(delivered[firstSeq]))
			}
		}
		if len(reqDelays) == 0 {
			b.Fatalf("in %d migrations, with the guest's first frame on the target seen in %d, none of the %d echo requests the peer sent in the second after it reached the new port: no switch-over to the target's port seen",
				len(windows), len(toFirstFrame), requests)
		}
		b.ReportMetric(pct(toFirstFrame, 50).Seconds()*1000, "resume-to-first-frame-p50-ms")
		b.ReportMetric(pct(reqDelays, 50).Seconds()*1000, "request-to-new-port-p50-ms")
		b.ReportMetric(pct(reqDelays, 99).Seconds()*1000, "request-to-new-port-p99-ms")
		b.ReportMetric(float64(misdelivered), "requests-misdelivered")
		b.Logf("the guest's first frame of any kind on the target came %s (p50; p99 %s) after QEMU's RESUME", pct(toAnyFrame, 50), pct(toAnyFrame, 99))
		b.Logf("the guest's first RARP or unicast IP frame on the target came %s (p50; p99 %s) after QEMU's RESUME; of the %d echo requests the peer sent in the second after it, %d reached the new port, in %s (p50; p99 %s), %d did not",
			pct(toFirstFrame, 50), pct(toFirstFrame, 99), requests, len(reqDelays), pct(reqDelays, 50), pct(reqDelays, 99), misdelivered)
		if len(guestAnswers) > 0 {
			b.ReportMetric(pct(guestAnswers, 50).Seconds()*1000, "guest-first-answer-p50-ms")
			b.Logf("the resumed guest answered the first request that reached it in %s (p50; p99 %s)", pct(guestAnswers, 50), pct(guestAnswers, 99))
		}
		// What each migration's blackout adds to the guest's own pause:
		// kvnet's switch-over, the guest's first answer, and for TCP the
		// client's retransmission timer.
		var pingOver, tcpOver []time.Duration
		for i, p := range qemuPauses {
			if i < len(pingGaps) {
				pingOver = append(pingOver, pingGaps[i]-p)
			}
			if i < len(blackouts) {
				tcpOver = append(tcpOver, blackouts[i]-p)
			}
		}
		b.ReportMetric(pct(qemuPauses, 50).Seconds()*1000, "guest-pause-p50-ms")
		b.ReportMetric(pct(qemuPauses, 99).Seconds()*1000, "guest-pause-p99-ms")
		b.ReportMetric(pct(pingOver, 50).Seconds()*1000, "ping-over-pause-p50-ms")
		b.ReportMetric(pct(pingOver, 99).Seconds()*1000, "ping-over-pause-p99-ms")
		b.ReportMetric(pct(tcpOver, 50).Seconds()*1000, "tcp-over-pause-p50-ms")
		b.ReportMetric(pct(tcpOver, 99).Seconds()*1000, "tcp-over-pause-p99-ms")
		b.ReportMetric(pct(blackouts, 50).Seconds()*1000, "blackout-p50-ms")
		b.ReportMetric(pct(blackouts, 99).Seconds()*1000, "blackout-p99-ms")
		b.ReportMetric(pct(downtimes, 50).Seconds()*1000, "qemu-downtime-p50-ms")
		b.ReportMetric(pct(downtimes, 99).Seconds()*1000, "qemu-downtime-p99-ms")
		b.ReportMetric(pct(pingGaps, 50).Seconds()*1000, "ping-gap-p50-ms")
		b.ReportMetric(pct(pingGaps, 99).Seconds()*1000, "ping-gap-p99-ms")
		b.ReportMetric(float64(lost), "connections-lost")
		// Each gap split at the guest's first frame on the target (when
		// kvnet-node activated the port): before it the guest is paused or
		// loading (QEMU's part, including what its downtime figure leaves
		// out), after it kvnet's switch and the guest's first answer.
		var pauses, switches []time.Duration
		acts := activations(b, dir)
		if len(acts) == 0 {
			b.Fatalf("no kvnet-node log under %s says it activated a migration target's port (%q) in %d migrations: the frame watcher never saw a guest's first frame on its target, so there is no switch-over to measure",
				filepath.Join(dir, "nodes", "*", "kvnet-node.log"), "migrated guest runs here; activated its port", len(gapSpans))
		}
		for _, sp := range gapSpans {
			for _, a := range acts {
				if a.After(sp[0]) && a.Before(sp[1]) {
					pauses = append(pauses, a.Sub(sp[0]))
					switches = append(switches, sp[1].Sub(a))
					break
				}
			}
		}
		if len(switches) == 0 {
			b.Fatalf("%d activations of a target's port logged, none inside any of the %d migrations' longest ping gaps: the switch-over (gap split at the guest's first frame) cannot be measured",
				len(acts), len(gapSpans))
		}
		if len(switches) < len(gapSpans) {
			b.Logf("%d of %d ping gaps hold no activation of the target's port; the switch figures are of the other %d", len(gapSpans)-len(switches), len(gapSpans), len(switches))
		}
		b.ReportMetric(pct(pauses, 50).Seconds()*1000, "before-first-frame-p50-ms")
		b.ReportMetric(pct(switches, 50).Seconds()*1000, "switch-p50-ms")
		b.ReportMetric(pct(switches, 99).Seconds()*1000, "switch-p99-ms")
		b.Logf("%d gaps split at the guest's first frame on the target: before it (guest paused or loading) p50 %s p99 %s; after it (kvnet's switch and the guest's first answer) p50 %s p99 %s",
			len(switches), pct(pauses, 50), pct(pauses, 99), pct(switches, 50), pct(switches, 99))
		b.Logf("%d migrations: TCP blackout p50 %s p99 %s; 10 ms ping gap p50 %s p99 %s; QEMU downtime p50 %s p99 %s; guest paused (STOP to RESUME) p50 %s p99 %s; connections lost %d",
			len(blackouts), pct(blackouts, 50), pct(blackouts, 99), pct(pingGaps, 50), pct(pingGaps, 99), pct(downtimes, 50), pct(downtimes, 99), pct(qemuPauses, 50), pct(qemuPauses, 99), lost)
		b.Logf("beyond the guest's pause: 10 ms ping p50 %s p99 %s; TCP p50 %s p99 %s", pct(pingOver, 50), pct(pingOver, 99), pct(tcpOver, 50), pct(tcpOver, 99))
	}
}

// exchangeMonitor keeps one echo exchange at a time going on a connection
// and records the longest since the last reset.
type exchangeMonitor struct {
	mu   sync.Mutex
	max  time.Duration
	err  error
	done chan struct{}
	wg   sync.WaitGroup
}

func newExchangeMonitor(conn net.Conn) *exchangeMonitor {
	m := &exchangeMonitor{done: make(chan struct{})}
	m.wg.Go(func() {
		r := bufio.NewReader(conn)
		for i := 0; ; i++ {
			select {
			case <-m.done:
				return
			case <-time.After(5 * time.Millisecond):
			}
			msg := fmt.Sprintf("bench-%d", i)
			start := time.Now()
			conn.SetDeadline(start.Add(30 * time.Second))
			_, err := fmt.Fprintln(conn, msg)
			var got string
			if err == nil {
				got, err = r.ReadString('\n')
			}
			if err == nil && got != msg+"\n" {
				err = fmt.Errorf("echo %q, sent %q", got, msg)
			}
			m.mu.Lock()
			if err != nil {
				m.err = err
				m.mu.Unlock()
				return
			}
			m.max = max(m.max, time.Since(start))
			m.mu.Unlock()
		}
	})
	return m
}

func (m *exchangeMonitor) reset() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.max = 0
}

func (m *exchangeMonitor) longest() (time.Duration, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.max, m.err
}

func (m *exchangeMonitor) stop() {
	close(m.done)
	m.wg.Wait()
}

// activations reads when kvnet-node activated a migration target's port
// (the guest's first frame there) from every node's log.
func activations(b *testing.B, dir string) []time.Time {
	b.Helper()
	logs, err := filepath.Glob(filepath.Join(dir, "nodes", "*", "kvnet-node.log"))
	if err != nil {
		b.Fatal(err)
	}
	var out []time.Time
	for _, l := range logs {
		data, err := os.ReadFile(l)
		if err != nil {
			b.Fatal(err)
		}
		for _, line := range strings.Split(string(data), "\n") {
			if !strings.Contains(line, `"migrated guest runs here; activated its port"`) {
				continue
			}
			var rec struct {
				TS time.Time `json:"ts"`
			}
			if err := json.Unmarshal([]byte(line), &rec); err == nil {
				out = append(out, rec.TS)
			}
		}
	}
	return out
}

// migrationDowntimes reads, from the lab's log (the launcher's "guest
// migrated" lines, one per migration in order), QEMU's reported downtime
// of every migration, the guest's pause (source STOP to target RESUME,
// QEMU's event timestamps) and when the guest resumed.
func migrationDowntimes(b *testing.B, dir string) (downtimes, pauses []time.Duration, resumes []time.Time) {
	b.Helper()
	data, err := os.ReadFile(filepath.Join(dir, "lab.log"))
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if !strings.Contains(line, `"guest migrated"`) {
			continue
		}
		var rec struct {
			DowntimeMS int64     `json:"downtimeMs"`
			PauseMS    *float64  `json:"pauseMs"`
			Resumed    time.Time `json:"resumed"`
		}
		if err := json.Unmarshal([]byte(line), &rec); err == nil {
			downtimes = append(downtimes, time.Duration(rec.DowntimeMS)*time.Millisecond)
			if rec.PauseMS != nil {
				pauses = append(pauses, time.Duration(*rec.PauseMS*float64(time.Millisecond)))
				resumes = append(resumes, rec.Resumed)
			}
		}
	}
	return downtimes, pauses, resumes
}
