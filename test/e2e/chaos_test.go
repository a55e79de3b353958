package e2e

import (
	"encoding/json"
	"strings"
	"testing"

	"kvnet.io/kvnet/internal/testenv"
)

// A chaos run at CI size: 1,000 operations while kvnet-controller is
// killed at least 10 times, the API server restarted once and kvnet-node
// killed once; afterwards every pod and VM has its addresses and the audit
// finds no duplicate and no leak. (make chaos runs the full 10,000.)
func TestChaos(t *testing.T) {
	testenv.NeedsRoot(t)
	_, run := buildKvnet(t)
	out := run("chaos", "--ops", "1000", "--seed", "7", "--kill-every", "2s", "-o", "json")
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
}
