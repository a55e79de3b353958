package cluster

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A live migration's blackout on real KubeVirt, taken apart from what the
// cluster's own logs and a ping tell (migrateWithEcho):
//
//   - the guest's pause: from the source virt-launcher's libvirt event
//     "suspended, migrated" (QEMU stopped the guest for the last copy) to
//     the target virt-launcher's "resumed, migrated" (the guest runs
//     again): KubeVirt's, libvirt's and QEMU's share;
//   - kvnet's switch-over: from that resume to kvnet-node on the target
//     logging "migrated guest runs here; activated its port" (the first
//     frame of the guest there opened its port): negative when kvnet
//     opened the port before the guest resumed;
//   - what the network saw: the longest run of unanswered requests of a
//     ping every pingInterval from a pod on a third node (with masquerade
//     KubeVirt forwards everything the pod receives, ICMP included, to the
//     guest, so the guest answers), and the longest pause of the TCP echo
//     client, which adds TCP's retransmission back-off.
//
// Every timestamp is from one host's clock (the nodes are namespaces of
// one machine).

// pingInterval is the echo pod's ping interval.
const pingInterval = 10 * time.Millisecond

// libvirt's lifecycle events and details (virDomainEventType and its
// detail enums) virt-launcher logs as "DomainLifecycle event ... with
// event id <event> reason <detail> received".
const (
	domainEventSuspended        = 3
	domainEventSuspendedMigrate = 1
	domainEventResumed          = 4
	domainEventResumedMigrated  = 1
)

// kvnetActivatedMsg is kvnet-node's log message when a migrated guest's
// first frame opened its port on the target.
const kvnetActivatedMsg = "migrated guest runs here; activated its port"

// launcherEventTime returns when virt-launcher's log (the compute
// container's, JSON lines) last reported libvirt lifecycle event id with
// reason at or after since; ok is false if it did not.
func launcherEventTime(log string, id, reason int, since time.Time) (at time.Time, ok bool) {
	want := fmt.Sprintf(" with event id %d reason %d received", id, reason)
	sc := bufio.NewScanner(strings.NewReader(log))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var l struct {
			Msg       string `json:"msg"`
			Timestamp string `json:"timestamp"`
		}
		if json.Unmarshal(sc.Bytes(), &l) != nil || !strings.HasPrefix(l.Msg, "DomainLifecycle event ") || !strings.HasSuffix(l.Msg, want) {
			continue
		}
		t, err := time.Parse(time.RFC3339Nano, l.Timestamp)
		if err != nil || t.Before(since) {
			continue
		}
		at, ok = t, true
	}
	return at, ok
}

// kvnetLogLine is what the scenarios read of a line of kvnet-node's log.
type kvnetLogLine struct {
	Level string `json:"level"`
	Msg   string `json:"msg"`
	TS    string `json:"ts"`
	MAC   string `json:"mac"`
}

// eachKvnetLogLine calls each, in order, with every line of kvnet-node's
// log (JSON lines) logged at or after since, parsed and raw, until each
// returns false.
func eachKvnetLogLine(log string, since time.Time, each func(l kvnetLogLine, at time.Time, raw string) bool) {
	sc := bufio.NewScanner(strings.NewReader(log))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var l kvnetLogLine
		if json.Unmarshal(sc.Bytes(), &l) != nil {
			continue
		}
		t, err := time.Parse(time.RFC3339Nano, l.TS)
		if err != nil || t.Before(since) {
			continue
		}
		if !each(l, t, sc.Text()) {
			return
		}
	}
}

// kvnetActivatedTime returns when kvnet-node's log (JSON lines) first
// reported activating the port of mac at or after since.
func kvnetActivatedTime(log, mac string, since time.Time) (at time.Time, ok bool) {
	eachKvnetLogLine(log, since, func(l kvnetLogLine, t time.Time, _ string) bool {
		if l.Msg == kvnetActivatedMsg && strings.EqualFold(l.MAC, mac) {
			at, ok = t, true
		}
		return !ok
	})
	return at, ok
}

// kvnetNodeNotes returns, from kvnet-node's log (JSON lines), at most
// max lines at or after since that are errors or speak of a migration
// target port: what may tell why a target port did not open at its
// guest's first frame.
func kvnetNodeNotes(log string, since time.Time, max int) []string {
	var notes []string
	eachKvnetLogLine(log, since, func(l kvnetLogLine, _ time.Time, raw string) bool {
		if l.Level != "error" && !strings.Contains(l.Msg, "migration target port") {
			return true
		}
		if len(raw) > 400 {
			raw = strings.ToValidUTF8(raw[:400], "") + "…"
		}
		notes = append(notes, raw)
		return len(notes) < max
	})
	return notes
}

// pingSeqs returns the icmp_seq of every reply in busybox ping's output,
// in order (duplicates left out).
func pingSeqs(out string) []int {
	var seqs []int
	for _, l := range strings.Split(out, "\n") {
		if strings.HasSuffix(l, "(DUP!)") {
			continue
		}
		_, rest, ok := strings.Cut(l, " seq=")
		if !ok {
			continue
		}
		var seq int
		if _, err := fmt.Sscanf(rest, "%d", &seq); err == nil {
			seqs = append(seqs, seq)
		}
	}
	return seqs
}

// longestPingGap returns the longest run of unanswered requests between
// two replies whose seqs are above after, as time (requests ×
// pingInterval), and the last seq answered.
func longestPingGap(seqs []int, after int) (gap time.Duration, last int) {
	last = after
	prev := -1
	for _, s := range seqs {
		if s <= after {
			prev = s
			continue
		}
		if prev >= 0 && s-prev-1 > 0 {
			gap = max(gap, time.Duration(s-prev-1)*pingInterval)
		}
		prev, last = s, max(last, s)
	}
	return gap, last
}

// podLog returns the log of container in pod ns/name.
func (s *vmScenarios) podLog(ctx context.Context, ns, name, container string) (string, error) {
	b, err := s.t.Client.CoreV1().Pods(ns).GetLogs(name, &corev1.PodLogOptions{Container: container}).DoRaw(ctx)
	if err != nil {
		return "", fmt.Errorf("log of %s/%s (%s): %w", ns, name, container, err)
	}
	return string(b), nil
}

// kvnetNodeLog returns the log of the kvnet-node pod on node.
func (s *vmScenarios) kvnetNodeLog(ctx context.Context, node string) (string, error) {
	l, err := s.t.Client.CoreV1().Pods("kvnet-system").List(ctx, metav1.ListOptions{
		LabelSelector: "app.kubernetes.io/name=kvnet-node", FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		return "", err
	}
	if len(l.Items) == 0 {
		return "", fmt.Errorf("no kvnet-node pod on %s", node)
	}
	return s.podLog(ctx, "kvnet-system", l.Items[0].Name, "node")
}

// blackout is one migration's blackout taken apart (see above); a zero
// time is one the logs did not tell.
type blackout struct {
	suspended, resumed, activated time.Time
	pingGap                       time.Duration
	// nodeNotes: without an activation, the target kvnet-node's errors
	// and lines on migration target ports since the migration started.
	nodeNotes []string
}

// guestPause is the guest's pause, source suspend to target resume.
func (b blackout) guestPause() (time.Duration, bool) {
	if b.suspended.IsZero() || b.resumed.IsZero() {
		return 0, false
	}
	return b.resumed.Sub(b.suspended), true
}

// switchOver is kvnet's port activation on the target relative to the
// guest's resume.
func (b blackout) switchOver() (time.Duration, bool) {
	if b.resumed.IsZero() || b.activated.IsZero() {
		return 0, false
	}
	return b.activated.Sub(b.resumed), true
}

func (b blackout) String() string {
	var parts []string
	if d, ok := b.guestPause(); ok {
		parts = append(parts, "guest paused "+millis(d)+" (libvirt: source suspended to target resumed)")
	} else {
		parts = append(parts, "guest pause not in virt-launcher's logs")
	}
	if d, ok := b.switchOver(); ok {
		parts = append(parts, "kvnet opened the target port "+millis(d)+" after the resume")
	} else {
		p := "no port activation in kvnet-node's log"
		if len(b.nodeNotes) > 0 {
			p += " (its errors and target-port lines since the start: " + strings.Join(b.nodeNotes, " | ") + ")"
		}
		parts = append(parts, p)
	}
	parts = append(parts, "longest ping gap "+millis(b.pingGap))
	return strings.Join(parts, ", ")
}

// millis formats d in milliseconds.
func millis(d time.Duration) string {
	return fmt.Sprintf("%.0f ms", float64(d.Microseconds())/1000)
}

// migrationBlackout reads what the logs tell of the migration that moved
// the guest with mac from sourcePod to targetPod on targetNode, started
// at since.
func (s *vmScenarios) migrationBlackout(ctx context.Context, ns, sourcePod, targetPod, targetNode, mac string, since time.Time) (blackout, error) {
	var b blackout
	src, err := s.podLog(ctx, ns, sourcePod, "compute")
	if err != nil {
		return b, err
	}
	dst, err := s.podLog(ctx, ns, targetPod, "compute")
	if err != nil {
		return b, err
	}
	node, err := s.kvnetNodeLog(ctx, targetNode)
	if err != nil {
		return b, err
	}
	b.suspended, _ = launcherEventTime(src, domainEventSuspended, domainEventSuspendedMigrate, since)
	b.resumed, _ = launcherEventTime(dst, domainEventResumed, domainEventResumedMigrated, since)
	var ok bool
	if b.activated, ok = kvnetActivatedTime(node, mac, since); !ok {
		b.nodeNotes = kvnetNodeNotes(node, since, 5)
	}
	return b, nil
}

// lastLines returns the last n lines of s.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
