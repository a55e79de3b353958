package e2e

import (
	"encoding/json"
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
	for _, op := range []string{"pod-create", "pod-delete", "vm-create", "vm-stop-start", "vm-delete", "vm-migrate", "vm-hotplug", "tenant-create", "tenant-delete"} {
		if res.Operations[op] == 0 {
			t.Errorf("no %s operation done: %v", op, res.Operations)
		}
	}
	if res.PodsChecked == 0 || res.VMsChecked == 0 || res.Allocation.N == 0 {
		t.Errorf("checked %d pods, %d VMs, %d allocation latencies: the run left nothing to check", res.PodsChecked, res.VMsChecked, res.Allocation.N)
	}
	if len(res.Unsettled) != 0 || res.Audit == nil || len(res.Audit) != 0 {
		t.Errorf("unsettled %v, audit %v", res.Unsettled, res.Audit)
	}
}
