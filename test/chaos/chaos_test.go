package chaos

import (
	"encoding/json"
	"strings"
	"testing"

	"kvnet.io/kvnet/internal/testenv"
)

// A chaos run at CI size: 1,000 operations while kvnet-controller is
// killed at least 10 times, the API server restarted once and kvnet-node
// killed once, two of the VMs QEMU guests; no audit snapshot during the run
// sees a duplicate IP or MAC; afterwards every pod and VM has its
// addresses, every migration succeeded or failed because the run stopped
// or deleted its VM, both guests answer at their claims' IPs from a pod,
// and the audit finds no duplicate and no leak. (make chaos runs the full
// 10,000.)
func TestChaos(t *testing.T) {
	testenv.NeedsRoot(t)
	_, run := buildKvnet(t)
	out := run("chaos", "--ops", "1000", "--seed", "7", "--kill-every", "2s", "--guests", "2", "-o", "json")
	// stdout is the JSON document; kvnet's progress lines on stderr come
	// first in the combined output.
	if i := strings.Index(out, "\n{"); i >= 0 {
		out = out[i+1:]
	}
	var res struct {
		OpsDone, OpsFailed                                 int
		ControllerKills, APIServerRestarts, NodeAgentKills int
		PodsChecked, VMsChecked                            int
		Unsettled, Audit                                   []string
		Operations                                         map[string]int
		Allocation                                         struct{ N int } `json:"allocationMs"`
		Migrations                                         struct {
			Started, Succeeded, Failed, Gone int
			Expected                         int `json:"expectedFailures"`
			AfterGuestCrash                  int
			Unexpected                       []string
		}
		Snapshots      int
		Duplicates     []json.RawMessage
		Guests         int
		GuestsAnswered int
		GuestFindings  []string
		GuestCrashes   []string
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("chaos output: %v\n%s", err, out)
	}
	t.Logf("chaos: %s", out)
	if res.OpsDone+res.OpsFailed == 0 || res.OpsFailed != 0 {
		t.Errorf("operations: %d done, %d failed", res.OpsDone, res.OpsFailed)
	}
	if res.ControllerKills < 10 || res.APIServerRestarts != 1 || res.NodeAgentKills != 1 {
		t.Errorf("faults: %d controller kills (want ≥ 10), %d API server restarts, %d kvnet-node kills (want 1 each)",
			res.ControllerKills, res.APIServerRestarts, res.NodeAgentKills)
	}
	for _, op := range []string{"pod-create", "pod-delete", "vm-create", "vm-stop-start", "vm-delete", "tenant-create", "tenant-delete"} {
		if res.Operations[op] == 0 {
			t.Errorf("no %s operation done: %v", op, res.Operations)
		}
	}
	// Migrations and hot plug need a VM that is running at that moment,
	// which the faults make rarer; at least one of them must have run.
	if res.Operations["vm-migrate"]+res.Operations["vm-hotplug"] == 0 {
		t.Errorf("no migration and no hot plug done: %v", res.Operations)
	}
	if res.PodsChecked == 0 || res.VMsChecked == 0 || res.Allocation.N == 0 {
		t.Errorf("checked %d pods, %d VMs, %d allocation latencies: the run left nothing to check", res.PodsChecked, res.VMsChecked, res.Allocation.N)
	}
	if len(res.Unsettled) != 0 || res.Audit == nil || len(res.Audit) != 0 {
		t.Errorf("unsettled %v, audit %v", res.Unsettled, res.Audit)
	}
	m := res.Migrations
	// A migration of a VM whose guest kernel panicked fails for want of a
	// guest; the run counts those apart (afterGuestCrash).
	if m.Succeeded == 0 || m.Started != m.Succeeded+m.Failed+m.Gone || m.Expected+m.AfterGuestCrash != m.Failed || len(m.Unexpected) != 0 {
		t.Errorf("migrations: %d started, %d succeeded, %d failed (%d expected, %d after a guest's kernel panicked), %d gone with their tenant; unexpected: %v",
			m.Started, m.Succeeded, m.Failed, m.Expected, m.AfterGuestCrash, m.Gone, m.Unexpected)
	}
	if m.AfterGuestCrash != 0 && len(res.GuestCrashes) == 0 {
		t.Errorf("%d migrations counted as failed after a guest's kernel panic, but no guest panicked", m.AfterGuestCrash)
	}
	if res.Snapshots == 0 || res.Duplicates == nil || len(res.Duplicates) != 0 {
		t.Errorf("%d audit snapshots during the run; duplicates seen: %s", res.Snapshots, res.Duplicates)
	}
	// A guest whose own kernel panicked (QEMU's TCG emulation, seen after
	// live migrations) is listed, not a finding; every other guest must
	// answer, and at least one must be left to check.
	if res.Guests != 2 || res.GuestsAnswered+len(res.GuestCrashes) != res.Guests || res.GuestsAnswered == 0 || len(res.GuestFindings) != 0 {
		t.Errorf("guests: %d of %d answered at their claims' IPs, %d kernel panics %v: %v",
			res.GuestsAnswered, res.Guests, len(res.GuestCrashes), res.GuestCrashes, res.GuestFindings)
	}
}

// A shorter chaos run with the restart reserve (--restart-reserve): each
// controller killed leaves its records, and the next one serves new pods
// from them before its rebuild; no audit snapshot during the run and no
// audit after it finds a duplicate IP or MAC or a leak. How many pods a
// run serves from the reserve depends on when the kills fall; it is
// logged, not asserted (TestRestartReserve in internal/k8s/controllers/ipam
// shows the serving itself).
func TestChaosRestartReserve(t *testing.T) {
	testenv.NeedsRoot(t)
	_, run := buildKvnet(t)
	out := run("chaos", "--ops", "500", "--seed", "11", "--kill-every", "1s", "--guests", "1", "--restart-reserve", "4", "-o", "json")
	if i := strings.Index(out, "\n{"); i >= 0 {
		out = out[i+1:]
	}
	var res struct {
		OpsDone, OpsFailed      int
		ControllerKills         int
		FromRestartReserve      int
		PodsChecked, VMsChecked int
		Unsettled, Audit        []string
		Snapshots               int
		Duplicates              []json.RawMessage
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("chaos output: %v\n%s", err, out)
	}
	t.Logf("chaos with the restart reserve: %d controller kills, %d pods served from the reserve before a rebuild", res.ControllerKills, res.FromRestartReserve)
	if res.OpsDone == 0 || res.OpsFailed != 0 || res.ControllerKills < 5 || res.PodsChecked == 0 || res.VMsChecked == 0 {
		t.Errorf("%d operations done, %d failed; %d controller kills (want ≥ 5); checked %d pods, %d VMs\n%s",
			res.OpsDone, res.OpsFailed, res.ControllerKills, res.PodsChecked, res.VMsChecked, out)
	}
	if len(res.Unsettled) != 0 || res.Audit == nil || len(res.Audit) != 0 {
		t.Errorf("unsettled %v, audit %v", res.Unsettled, res.Audit)
	}
	if res.Snapshots == 0 || res.Duplicates == nil || len(res.Duplicates) != 0 {
		t.Errorf("%d audit snapshots during the run; duplicates seen: %s", res.Snapshots, res.Duplicates)
	}
}
