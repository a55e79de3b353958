package node

import (
	"context"
	"fmt"
	"net"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	kubevirtv1 "kvnet.io/kvnet/api/kubevirt/v1"
	"kvnet.io/kvnet/internal/datapath"
	"kvnet.io/kvnet/internal/migration"
)

// Switch-over triggers: what opened a live migration's target port.
const (
	// TriggerFirstFrame: the guest's first frame on the target (QEMU's
	// RARP announce or its first IP packet), seen by kvnet-node.
	TriggerFirstFrame = "first-frame"
	// TriggerAPI: the VMI naming the target node (KubeVirt marking the
	// migration complete) before any frame of the guest was seen there:
	// the guest ran on the target while its traffic still went to the
	// source.
	TriggerAPI = "api"
)

// MigrationTarget is a live migration's target port on this node, planned
// while the API still names the source node (Plan.MigrationTargets).
type MigrationTarget struct {
	Network string
	MAC     net.HardwareAddr
	VMI     types.NamespacedName
	// Pod is the target launcher pod; Source the node the VMI runs on
	// and SourcePod its launcher pod there.
	Pod, Source, SourcePod string
}

// Switchover is one network's switch-over to this node in a live
// migration, as kvnet-node observed it.
type Switchover struct {
	VMI     types.NamespacedName
	Network string
	MAC     string
	Source  string // the node the guest left
	Target  string // this node
	Trigger string // TriggerFirstFrame or TriggerAPI
	// Ready is when the target port was first planned, waiting for the
	// guest (zero if kvnet-node started after that).
	Ready time.Time
	// FirstFrame is when the guest's first frame reached the target port
	// and Frame what it was ("RARP", "IPv4 from 10.0.0.4"); zero and ""
	// when the API switched it.
	FirstFrame time.Time
	Frame      string
	// Opened is when the port forwarded the guest's traffic.
	Opened time.Time
	// Probes is how many standby probes kvnet-node had sent into the
	// target port by an API switch-over (-1: not known): none says the
	// guest was not asked, some that it did not answer in time.
	Probes int
	// SourcePod is the source launcher pod; Last the guest's last frame
	// out of its port on the source node, as the source's kvnet-node
	// published it on that pod (zero At: not known).
	SourcePod string
	// TargetPod is the target launcher pod (on this node).
	TargetPod string
	Last      migration.LastFrame
	// LaterFrames counts the frames the source published that were read
	// after the guest ran here (its first frame here, or the API's
	// switch-over): the source pod's own, not the guest's; Last is the
	// last frame before them.
	LaterFrames int
	Later       migration.SeenFrame
}

// Dark is how long the VM's network was dark: from the guest's last
// frame on the source node to its port on this node forwarding its
// traffic (0 if the last frame is not known or the nodes' clocks put it
// after the port opened).
func (s Switchover) Dark() time.Duration {
	if s.Last.At.IsZero() || s.Last.At.After(s.Opened) {
		return 0
	}
	return s.Opened.Sub(s.Last.At)
}

// Waited is how long the target port waited for the guest: from Ready to
// Opened (0 if Ready is not known).
func (s Switchover) Waited() time.Duration {
	if s.Ready.IsZero() {
		return 0
	}
	return s.Opened.Sub(s.Ready)
}

// OpenedAfterFrame is from the guest's first frame to its port open (0 for
// an API switch-over).
func (s Switchover) OpenedAfterFrame() time.Duration {
	if s.FirstFrame.IsZero() {
		return 0
	}
	return s.Opened.Sub(s.FirstFrame)
}

// Message is the Event's note.
func (s Switchover) Message() string {
	waited := ""
	if w := s.Waited(); w > 0 {
		waited = fmt.Sprintf("; the target port had waited %s for the guest", w.Round(time.Millisecond))
	}
	if s.Trigger == TriggerAPI {
		probes := ""
		switch {
		case s.Probes == 0:
			probes = "; no standby probe had gone into the target port"
		case s.Probes > 0:
			probes = fmt.Sprintf("; %d standby probes had gone into the target port, none answered by the guest", s.Probes)
		}
		return fmt.Sprintf("network %s switched from node %s to node %s by the API (the VMI named node %s) at %s, not at the guest's first frame, which kvnet-node never saw there: until then the guest's traffic went to node %s%s%s%s",
			s.Network, orUnknown(s.Source), s.Target, s.Target, s.Opened.UTC().Format(time.RFC3339Nano), orUnknown(s.Source), s.darkNote(), waited, probes)
	}
	return fmt.Sprintf("network %s switched from node %s to node %s at the guest's first frame there (%s) at %s, its port open %.1f ms after it%s%s",
		s.Network, orUnknown(s.Source), s.Target, s.Frame, s.FirstFrame.UTC().Format(time.RFC3339Nano),
		float64(s.OpenedAfterFrame().Microseconds())/1000, s.darkNote(), waited)
}

// guestsLastFrame returns the source's last frame of the guest before it
// ran on the target (its first frame there, or the port opened by the
// API), with LaterFrames set on s.
func guestsLastFrame(lf migration.LastFrame, s *Switchover) migration.LastFrame {
	bound := s.FirstFrame
	if bound.IsZero() {
		bound = s.Opened
	}
	last, after, ok := lf.Before(bound)
	s.LaterFrames = after
	if !ok {
		return migration.LastFrame{Node: lf.Node}
	}
	return migration.LastFrame{Node: lf.Node, At: last.At, Frame: last.Frame}
}

// darkNote is the Message's part on the source's last frame.
func (s Switchover) darkNote() string {
	later := ""
	if s.LaterFrames > 0 {
		later = fmt.Sprintf("; the source pod sent %d frames from the guest's MAC and address after the guest ran here, the last (%s) at %s",
			s.LaterFrames, s.Later.Frame, s.Later.At.UTC().Format(time.RFC3339Nano))
	}
	switch {
	case s.Last.Node == "":
		return "; the guest's last frame on node " + orUnknown(s.Source) + " is not known"
	case s.Last.At.IsZero() && s.LaterFrames == 0:
		return "; kvnet-node on node " + s.Last.Node + " saw no frame of the guest while it migrated (no gateway to probe it from)"
	case s.Last.At.IsZero():
		return "; the guest's last frame on node " + s.Last.Node + " is not known" + later
	case s.Dark() == 0:
		return fmt.Sprintf("; the guest's last frame on node %s (%s) is dated %s, after the port opened: the nodes' clocks disagree%s",
			s.Last.Node, s.Last.Frame, s.Last.At.UTC().Format(time.RFC3339Nano), later)
	}
	return fmt.Sprintf("; the network was dark %.1f ms, from the guest's last frame on node %s (%s) at %s%s",
		float64(s.Dark().Microseconds())/1000, s.Last.Node, s.Last.Frame, s.Last.At.UTC().Format(time.RFC3339Nano), later)
}

func orUnknown(s string) string {
	if s == "" {
		return "?"
	}
	return s
}

// switchovers follows this node's live-migration target ports from the
// plan that first has them (waiting for the guest) to their switch-over:
// at the guest's first frame (announcements) or, failing that, when the
// API names this node. Each switch-over is reported once; a target that
// goes away without one (a failed or cancelled migration) is forgotten.
type switchovers struct {
	node   string
	now    func() time.Time
	report func(Switchover) // must not block
	// probes returns the standby probes sent to a guest MAC (nil: not
	// known).
	probes func(mac string) int

	// lastFrame returns the guest's last frame on a network as a source
	// pod's annotation has it (nil: none is waited for); a switch-over is
	// reported once it is there, or lastFrameWait after it switched.
	lastFrame     func(pod types.NamespacedName, network string) (migration.LastFrame, bool)
	lastFrameWait time.Duration
	// after runs f after d (time.AfterFunc).
	after func(d time.Duration, f func())
	// arrived is told, once per switch-over at a first frame, the target
	// pod and the frame's time, as soon as both are known (nil: not
	// told); it must not block.
	arrived func(pod types.NamespacedName, at time.Time)

	mu      sync.Mutex
	pending map[string]*Switchover // network/MAC -> target waiting or switched
	// reported holds the keys of pending whose switch-over was reported
	// (or waits for its source's last frame in awaiting).
	reported map[string]bool
	awaiting []awaitingSwitchover
}

// awaitingSwitchover is a switch-over waiting for its source's last frame
// until deadline.
type awaitingSwitchover struct {
	s        Switchover
	deadline time.Time
}

// defaultLastFrameWait bounds how long a switch-over's report waits for
// the source node's kvnet-node to publish the guest's last frame there:
// it does when the API moves the VMI, which KubeVirt does within seconds
// of the guest running on the target.
const defaultLastFrameWait = 30 * time.Second

func newSwitchovers(node string, report func(Switchover)) *switchovers {
	return &switchovers{node: node, now: time.Now, report: report, pending: map[string]*Switchover{}, reported: map[string]bool{},
		lastFrameWait: defaultLastFrameWait, after: func(d time.Duration, f func()) { time.AfterFunc(d, f) }}
}

// settle reports each switch-over of ss whose source's last frame is
// known, or not waited for, and keeps the others in awaiting; then it
// reports the awaiting ones whose last frame came or whose wait is over.
// Called without w.mu.
func (w *switchovers) settle(ss ...Switchover) {
	now := w.now()
	var out []Switchover
	w.mu.Lock()
	for _, s := range ss {
		w.awaiting = append(w.awaiting, awaitingSwitchover{s: s, deadline: now.Add(w.lastFrameWait)})
		if w.lastFrame != nil && s.SourcePod != "" {
			w.after(w.lastFrameWait, func() { w.settle() })
		}
	}
	kept := w.awaiting[:0]
	for _, a := range w.awaiting {
		s := a.s
		if w.lastFrame == nil || s.SourcePod == "" {
			out = append(out, s)
			continue
		}
		if lf, ok := w.lastFrame(types.NamespacedName{Namespace: s.VMI.Namespace, Name: s.SourcePod}, s.Network); ok && lf.Node == s.Source {
			s.Last = guestsLastFrame(lf, &s)
			if s.LaterFrames > 0 {
				s.Later = migration.SeenFrame{At: lf.At, Frame: lf.Frame}
			}
			out = append(out, s)
			continue
		}
		if !now.Before(a.deadline) {
			out = append(out, s)
			continue
		}
		kept = append(kept, a)
	}
	w.awaiting = kept
	w.mu.Unlock()
	for _, s := range out {
		w.report(s)
	}
}

func switchKey(network, mac string) string { return network + "/" + mac }

// sync takes a plan's migration targets and its ports: a new target starts
// waiting; one that left the targets while this node has an open port
// with its MAC on its network switched here by the API, unless its first
// frame did before; one that left without such a port is forgotten.
func (w *switchovers) sync(targets []MigrationTarget, ports []datapath.Port) {
	now := w.now()
	want := map[string]MigrationTarget{}
	for _, t := range targets {
		want[switchKey(t.Network, t.MAC.String())] = t
	}
	open := map[string]bool{}
	for _, p := range ports {
		if !p.Standby {
			open[switchKey(p.Network, p.MAC.String())] = true
		}
	}
	var out, arrivals []Switchover
	w.mu.Lock()
	for k, t := range want {
		s := w.pending[k]
		if s == nil {
			s = &Switchover{Network: t.Network, MAC: t.MAC.String(), Target: w.node, Ready: now}
			w.pending[k] = s
		}
		// A first frame may have come before the plan named the VMI: its
		// switch-over is reported now.
		s.VMI, s.Source, s.SourcePod, s.TargetPod = t.VMI, t.Source, t.SourcePod, t.Pod
		if s.Trigger != "" && !w.reported[k] {
			w.reported[k] = true
			out = append(out, *s)
			if s.Trigger == TriggerFirstFrame {
				arrivals = append(arrivals, *s)
			}
		}
	}
	for k, s := range w.pending {
		if _, ok := want[k]; ok {
			continue
		}
		delete(w.pending, k)
		reported := w.reported[k]
		delete(w.reported, k)
		if reported || s.Trigger != "" || !open[k] || s.VMI.Name == "" {
			continue // reported at its first frame, or no switch-over here
		}
		s.Trigger, s.Opened, s.Probes = TriggerAPI, now, -1
		if w.probes != nil {
			s.Probes = w.probes(s.MAC)
		}
		out = append(out, *s)
	}
	w.mu.Unlock()
	for _, s := range arrivals {
		w.tellArrived(s)
	}
	w.settle(out...)
}

// tellArrived tells arrived of s's guest's first frame on its target pod.
func (w *switchovers) tellArrived(s Switchover) {
	if w.arrived != nil && s.TargetPod != "" {
		w.arrived(types.NamespacedName{Namespace: s.VMI.Namespace, Name: s.TargetPod}, s.FirstFrame)
	}
}

// firstFrame records that port p opened at its guest's first frame (frame,
// received at) and was open at opened, and reports the switch-over.
func (w *switchovers) firstFrame(p datapath.Port, frame string, at, opened time.Time) {
	k := switchKey(p.Network, p.MAC.String())
	w.mu.Lock()
	s := w.pending[k]
	if s == nil {
		s = &Switchover{Network: p.Network, MAC: p.MAC.String(), Target: w.node}
		w.pending[k] = s
	}
	first := s.Trigger == ""
	if first {
		s.Trigger, s.FirstFrame, s.Frame, s.Opened = TriggerFirstFrame, at, frame, opened
	}
	// Without the VMI (a frame before the plan named it) the next sync
	// reports it.
	report := first && s.VMI.Name != ""
	if report {
		w.reported[k] = true
	}
	r := *s
	w.mu.Unlock()
	if report {
		w.tellArrived(r)
		w.settle(r)
	}
}

// newSwitchoverReporter counts each switch-over in the node's metrics,
// logs it and posts it as an Event on the VMI (Normal at the guest's first
// frame, Warning when the API switched it), no related object. The VMI is read from c; it must not block.
func newSwitchoverReporter(ctx context.Context, c client.Reader, rec events.EventRecorder) func(Switchover) {
	logger := log.FromContext(ctx)
	return func(s Switchover) {
		observeSwitchover(s)
		logger.Info("live migration: the network switched to this node", "vmi", s.VMI.String(), "network", s.Network, "mac", s.MAC,
			"from", s.Source, "trigger", s.Trigger, "frame", s.Frame, "openedAfterFrameMs", float64(s.OpenedAfterFrame().Microseconds())/1000,
			"waitedMs", s.Waited().Milliseconds(), "darkMs", float64(s.Dark().Microseconds())/1000, "lastFrameAtSource", s.Last.Frame)
		go func() {
			var vmi kubevirtv1.VirtualMachineInstance
			if err := c.Get(ctx, s.VMI, &vmi); err != nil {
				logger.Error(err, "live migration: cannot post the switch-over's Event on the VMI", "vmi", s.VMI.String())
				return
			}
			typ, reason := corev1.EventTypeNormal, migration.EventSwitchover
			if s.Trigger == TriggerAPI {
				typ, reason = corev1.EventTypeWarning, migration.EventSwitchedByAPI
			}
			rec.Eventf(&vmi, nil, typ, reason, "SwitchOver", "%s", s.Message())
		}()
	}
}
