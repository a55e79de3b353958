package node

import (
	"net"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"k8s.io/apimachinery/pkg/types"

	"kvnet.io/kvnet/internal/datapath"
	"kvnet.io/kvnet/internal/migration"
)

// switchClock is a clock the test advances.
type switchClock struct{ t time.Time }

func (c *switchClock) now() time.Time { return c.t }

func newTestSwitchovers() (*switchovers, *switchClock, *[]Switchover) {
	var got []Switchover
	clock := &switchClock{t: time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)}
	w := newSwitchovers("node-2", func(s Switchover) { got = append(got, s) })
	w.now = clock.now
	return w, clock, &got
}

var (
	swMAC    = net.HardwareAddr{2, 0, 0, 0, 0, 1}
	swVMI    = types.NamespacedName{Namespace: "ns", Name: "vm-1"}
	swTarget = MigrationTarget{Network: "ns_udn", MAC: swMAC, VMI: swVMI, Pod: "virt-launcher-vm-1-b", Source: "node-1"}
	swPort   = datapath.Port{Network: "ns_udn", HostIfName: "kvp1", MAC: swMAC, Migrating: true}
)

func standby(p datapath.Port) datapath.Port { p.Standby = true; return p }

func TestSwitchoverAtFirstFrame(t *testing.T) {
	w, clock, got := newTestSwitchovers()
	var arrived []string
	w.arrived = func(pod types.NamespacedName, at time.Time) {
		arrived = append(arrived, pod.String()+"@"+at.Format(time.RFC3339))
	}
	defer func() {
		if want := "ns/virt-launcher-vm-1-b@2026-11-29T12:00:08Z"; len(arrived) != 1 || arrived[0] != want {
			t.Errorf("arrivals told %q, want one: %s", arrived, want)
		}
	}()
	w.sync([]MigrationTarget{swTarget}, []datapath.Port{standby(swPort)})
	ready := clock.t
	clock.t = clock.t.Add(8 * time.Second)
	frame := clock.t
	w.firstFrame(swPort, "RARP", frame, frame.Add(300*time.Microsecond))
	if len(*got) != 1 {
		t.Fatalf("switch-overs reported at the first frame: %+v, want one", *got)
	}
	s := (*got)[0]
	if s.Trigger != TriggerFirstFrame || s.VMI != swVMI || s.Source != "node-1" || s.Target != "node-2" || s.Frame != "RARP" ||
		!s.Ready.Equal(ready) || s.OpenedAfterFrame() != 300*time.Microsecond || s.Waited() != 8*time.Second+300*time.Microsecond {
		t.Fatalf("switch-over %+v", s)
	}
	msg := s.Message()
	for _, want := range []string{"network ns_udn switched from node node-1 to node node-2 at the guest's first frame there (RARP)", "open 0.3 ms after it", "waited 8s"} {
		if !strings.Contains(msg, want) {
			t.Errorf("message %q lacks %q", msg, want)
		}
	}
	// Later frames, the port open while the API catches up, then the API
	// naming node-2 (the target leaves MigrationTargets): nothing more.
	w.firstFrame(swPort, "IPv4 from 10.0.0.4", clock.t, clock.t)
	w.sync([]MigrationTarget{swTarget}, []datapath.Port{swPort})
	w.sync(nil, []datapath.Port{swPort})
	if len(*got) != 1 {
		t.Fatalf("switch-overs after the first: %+v", (*got)[1:])
	}
	if len(w.pending) != 0 {
		t.Fatalf("still following %v after the switch-over", w.pending)
	}
}

func TestSwitchoverByAPI(t *testing.T) {
	w, clock, got := newTestSwitchovers()
	w.probes = func(mac string) int {
		if mac == swMAC.String() {
			return 47
		}
		return 0
	}
	w.sync([]MigrationTarget{swTarget}, []datapath.Port{standby(swPort)})
	clock.t = clock.t.Add(5 * time.Second)
	// The API names node-2 before any frame of the guest came: the port is
	// an ordinary one now.
	w.sync(nil, []datapath.Port{{Network: "ns_udn", HostIfName: "kvp1", MAC: swMAC}})
	if len(*got) != 1 {
		t.Fatalf("switch-overs reported: %+v, want one by the API", *got)
	}
	s := (*got)[0]
	if s.Trigger != TriggerAPI || s.Waited() != 5*time.Second || s.OpenedAfterFrame() != 0 || s.Frame != "" {
		t.Fatalf("switch-over %+v", s)
	}
	if msg := s.Message(); !strings.Contains(msg, "by the API") || !strings.Contains(msg, "never saw there") ||
		!strings.Contains(msg, "47 standby probes had gone into the target port, none answered by the guest") {
		t.Errorf("message %q", msg)
	}
	s.Probes = 0
	if msg := s.Message(); !strings.Contains(msg, "no standby probe had gone into the target port") {
		t.Errorf("message without probes %q", msg)
	}
	s.Probes = -1
	if msg := s.Message(); strings.Contains(msg, "probe") {
		t.Errorf("message with the probes not known %q", msg)
	}
	// A frame after that changes nothing.
	w.firstFrame(swPort, "RARP", clock.t, clock.t)
	if len(*got) != 1 {
		t.Fatalf("a late frame reported again: %+v", *got)
	}
}

// TestSwitchoverFrameBeforePlan: the guest's first frame opened the port
// before a plan named its VMI (the port applied, the targets not yet
// synced): the switch-over is reported at the next sync, once.
func TestSwitchoverFrameBeforePlan(t *testing.T) {
	w, clock, got := newTestSwitchovers()
	w.firstFrame(swPort, "RARP", clock.t, clock.t.Add(time.Millisecond))
	if len(*got) != 0 {
		t.Fatalf("reported without its VMI: %+v", *got)
	}
	w.sync([]MigrationTarget{swTarget}, []datapath.Port{swPort})
	if len(*got) != 1 {
		t.Fatalf("switch-overs reported once the plan named the VMI: %+v, want one", *got)
	}
	if s := (*got)[0]; s.Trigger != TriggerFirstFrame || s.VMI != swVMI || s.Source != "node-1" || s.Frame != "RARP" {
		t.Fatalf("switch-over %+v", s)
	}
	w.sync([]MigrationTarget{swTarget}, []datapath.Port{swPort})
	w.sync(nil, []datapath.Port{swPort})
	if len(*got) != 1 {
		t.Fatalf("reported again: %+v", (*got)[1:])
	}
	if len(w.pending) != 0 || len(w.reported) != 0 {
		t.Fatalf("still following %v (reported %v)", w.pending, w.reported)
	}
}

func TestSwitchoverMigrationAbandoned(t *testing.T) {
	w, _, got := newTestSwitchovers()
	w.sync([]MigrationTarget{swTarget}, []datapath.Port{standby(swPort)})
	// The migration failed: the target pod's port is gone, the source
	// keeps the guest.
	w.sync(nil, nil)
	if len(*got) != 0 || len(w.pending) != 0 {
		t.Fatalf("an abandoned migration: reported %+v, following %v", *got, w.pending)
	}
	// Another network's port with the same MAC does not count either.
	w.sync([]MigrationTarget{swTarget}, []datapath.Port{standby(swPort)})
	other := swPort
	other.Network = "ns_other"
	w.sync(nil, []datapath.Port{other})
	if len(*got) != 0 {
		t.Fatalf("a port of another network taken for the switch-over: %+v", *got)
	}
}

func TestObserveSwitchover(t *testing.T) {
	base := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	s := Switchover{Network: "test_obs", Target: "node-obs", Trigger: TriggerFirstFrame, Ready: base, FirstFrame: base.Add(time.Second), Opened: base.Add(time.Second + time.Millisecond)}
	s.Last = migration.LastFrame{Node: "node-src", At: base.Add(800 * time.Millisecond)}
	observeSwitchover(s)
	observeSwitchover(Switchover{Network: "test_obs", Target: "node-obs", Trigger: TriggerAPI, Ready: base, Opened: base.Add(2 * time.Second)})
	if n := observations(t, darkSeconds.WithLabelValues("node-obs", "test_obs")); n != 1 {
		t.Errorf("dark durations observed %d, want 1 (the API one has no last frame)", n)
	}
	if n := metricValue(t, switchoversTotal.WithLabelValues("node-obs", "test_obs", TriggerFirstFrame)); n != 1 {
		t.Errorf("first-frame switch-overs %v, want 1", n)
	}
	if n := metricValue(t, switchoversTotal.WithLabelValues("node-obs", "test_obs", TriggerAPI)); n != 1 {
		t.Errorf("API switch-overs %v, want 1", n)
	}
	if n := observations(t, switchoverSeconds.WithLabelValues("node-obs", "test_obs")); n != 1 {
		t.Errorf("switch-over durations observed %d, want 1 (the API one has no first frame)", n)
	}
	if n := observations(t, switchoverWaitSeconds.WithLabelValues("node-obs", "test_obs", TriggerAPI)); n != 1 {
		t.Errorf("API waits observed %d, want 1", n)
	}
}

func writeMetric(t *testing.T, m prometheus.Metric) *dto.Metric {
	t.Helper()
	var out dto.Metric
	if err := m.Write(&out); err != nil {
		t.Fatal(err)
	}
	return &out
}

func metricValue(t *testing.T, c prometheus.Counter) float64 {
	return writeMetric(t, c).GetCounter().GetValue()
}

func observations(t *testing.T, o prometheus.Observer) uint64 {
	return writeMetric(t, o.(prometheus.Metric)).GetHistogram().GetSampleCount()
}

// TestWatched: only a migration target's Standby port is watched for
// its guest's first frame; another Standby port (a departed source's)
// is not.
func TestWatched(t *testing.T) {
	departed := standby(swPort)
	departed.MAC = net.HardwareAddr{2, 0, 0, 0, 0, 2}
	plan := Plan{MigrationTargets: []MigrationTarget{swTarget}}
	plan.State.Ports = []datapath.Port{standby(swPort), departed}
	got := watched(plan)
	if !got[0].Standby || got[1].Standby {
		t.Fatalf("watched %+v, want the target's port on Standby and the departed one not", got)
	}
	if !plan.State.Ports[1].Standby {
		t.Fatal("watched changed the plan's own ports")
	}
}

// TestSwitchoverWaitsForLastFrame: a switch-over is reported once the
// source pod's last frame is there (with how long the network was dark),
// or when the wait for it is over (saying it is not known).
func TestSwitchoverWaitsForLastFrame(t *testing.T) {
	w, clock, got := newTestSwitchovers()
	var timers []func()
	w.after = func(d time.Duration, f func()) {
		if d != w.lastFrameWait {
			t.Errorf("timer of %s, want the wait %s", d, w.lastFrameWait)
		}
		timers = append(timers, f)
	}
	published := map[string]migration.LastFrame{} // pod/network -> last frame
	w.lastFrame = func(pod types.NamespacedName, network string) (migration.LastFrame, bool) {
		f, ok := published[pod.String()+"/"+network]
		return f, ok
	}
	target := swTarget
	target.SourcePod = "virt-launcher-vm-1-a"
	w.sync([]MigrationTarget{target}, []datapath.Port{standby(swPort)})
	clock.t = clock.t.Add(5 * time.Second)
	last := clock.t
	clock.t = clock.t.Add(200 * time.Millisecond)
	w.firstFrame(swPort, "RARP", clock.t, clock.t.Add(time.Millisecond))
	w.sync(nil, []datapath.Port{swPort})
	if len(*got) != 0 || len(timers) != 1 {
		t.Fatalf("reported %+v (timers %d) before the source's last frame was published", *got, len(timers))
	}
	// Another node's frame on the same pod is not the source's.
	published["ns/virt-launcher-vm-1-a/ns_udn"] = migration.LastFrame{Node: "node-3", At: last, Frame: "RARP"}
	w.sync(nil, []datapath.Port{swPort})
	if len(*got) != 0 {
		t.Fatalf("reported %+v with a last frame of another node", *got)
	}
	// The source pod's own frame after the guest ran on node-2 (seen on
	// real KubeVirt) is not the guest's last.
	published["ns/virt-launcher-vm-1-a/ns_udn"] = migration.LastFrame{Node: "node-1", At: clock.t.Add(3 * time.Second), Frame: "IPv4 from 10.0.0.4 (pod)",
		Earlier: []migration.SeenFrame{{At: last.Add(-time.Second), Frame: "RARP"}, {At: last, Frame: "IPv4 from 10.0.0.4"}}}
	w.sync(nil, []datapath.Port{swPort})
	if len(*got) != 1 {
		t.Fatalf("reported %+v once the last frame was published, want one", *got)
	}
	s := (*got)[0]
	if s.Dark() != 201*time.Millisecond || s.Last.Frame != "IPv4 from 10.0.0.4" {
		t.Fatalf("dark %s, last frame %+v; want 201ms after IPv4 from 10.0.0.4", s.Dark(), s.Last)
	}
	for _, want := range []string{"the network was dark 201.0 ms, from the guest's last frame on node node-1 (IPv4 from 10.0.0.4) at 2026-11-29T12:00:05Z",
		"the source pod sent 1 frames from the guest's MAC and address after the guest ran here, the last (IPv4 from 10.0.0.4 (pod)) at 2026-11-29T12:00:08.2Z"} {
		if msg := s.Message(); !strings.Contains(msg, want) {
			t.Errorf("message %q lacks %q", msg, want)
		}
	}

	// A source that never publishes: reported when the wait is over.
	*got = nil
	w.sync([]MigrationTarget{target}, []datapath.Port{standby(swPort)})
	clock.t = clock.t.Add(time.Second)
	delete(published, "ns/virt-launcher-vm-1-a/ns_udn")
	w.sync(nil, []datapath.Port{swPort}) // the API switched it
	clock.t = clock.t.Add(w.lastFrameWait - time.Millisecond)
	timers[len(timers)-1]()
	if len(*got) != 0 {
		t.Fatalf("reported %+v before the wait was over", *got)
	}
	clock.t = clock.t.Add(time.Millisecond)
	timers[len(timers)-1]()
	if len(*got) != 1 || (*got)[0].Trigger != TriggerAPI || (*got)[0].Dark() != 0 {
		t.Fatalf("reported %+v when the wait was over, want the API switch-over without a last frame", *got)
	}
	if msg := (*got)[0].Message(); !strings.Contains(msg, "the guest's last frame on node node-1 is not known") {
		t.Errorf("message %q does not say the last frame is not known", msg)
	}
}

// TestSwitchoverSourceSawNoFrame: a source that saw no frame of its
// guest (no gateway to probe it from) says so; the report need not wait.
func TestSwitchoverSourceSawNoFrame(t *testing.T) {
	w, _, got := newTestSwitchovers()
	w.after = func(time.Duration, func()) {}
	w.lastFrame = func(types.NamespacedName, string) (migration.LastFrame, bool) {
		return migration.LastFrame{Node: "node-1"}, true
	}
	target := swTarget
	target.SourcePod = "virt-launcher-vm-1-a"
	w.sync([]MigrationTarget{target}, []datapath.Port{standby(swPort)})
	w.sync(nil, []datapath.Port{swPort})
	if len(*got) != 1 || (*got)[0].Dark() != 0 {
		t.Fatalf("reported %+v, want one switch-over without a dark time", *got)
	}
	if msg := (*got)[0].Message(); !strings.Contains(msg, "kvnet-node on node node-1 saw no frame of the guest while it migrated") {
		t.Errorf("message %q does not say the source saw no frame", msg)
	}
}
