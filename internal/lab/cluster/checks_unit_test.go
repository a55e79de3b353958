package cluster

import (
	"strings"
	"testing"
)

const probeMetrics = `# HELP prober_probe_total [ALPHA] Cumulative number of a liveness, readiness or startup probe for a container by result.
# TYPE prober_probe_total counter
prober_probe_total{container="web",namespace="scn-tenant-a",pod="a-1",pod_uid="u1",probe_type="Liveness",result="successful"} 7
prober_probe_total{container="web",namespace="scn-tenant-a",pod="a-1",pod_uid="u1",probe_type="Readiness",result="successful"} 20
prober_probe_total{container="web",namespace="scn-tenant-a",pod="a-1",pod_uid="u1",probe_type="Readiness",result="failed"} 1
prober_probe_total{container="web",namespace="scn-tenant-a",pod="a-2",pod_uid="u2",probe_type="Liveness",result="successful"} 6
prober_probe_total{container="web",namespace="scn-tenant-a",pod="a-2",pod_uid="u2",probe_type="Liveness",result="failed"} 2
prober_probe_total{container="web",namespace="scn-tenant-a",pod="a-2",pod_uid="u2",probe_type="Liveness",result="unknown"} 1
prober_probe_total{container="web",namespace="scn-tenant-b",pod="a-1",pod_uid="u3",probe_type="Liveness",result="failed"} 9
prober_probe_total{container="web",namespace="scn-tenant-a",pod="a-10",pod_uid="u4",probe_type="Liveness",result="failed"} 9
`

// TestProbesVerdict: a pod whose liveness probes all succeeded passes;
// one with a failed or unknown probe fails, however many succeeded; so
// does one with too few successes. Other pods' and namespaces' lines do
// not count.
func TestProbesVerdict(t *testing.T) {
	a1, err := probeCounts(probeMetrics, "scn-tenant-a", "a-1", "Liveness")
	if err != nil {
		t.Fatal(err)
	}
	if a1["successful"] != 7 || a1["failed"] != 0 {
		t.Errorf("a-1: %v, want 7 successful, none failed", a1)
	}
	if err := probesVerdict(a1, 5); err != nil {
		t.Errorf("a-1: %v", err)
	}
	if err := probesVerdict(a1, 8); err == nil || !strings.Contains(err.Error(), "7 successful") {
		t.Errorf("a-1 with 8 wanted: %v", err)
	}
	a2, err := probeCounts(probeMetrics, "scn-tenant-a", "a-2", "Liveness")
	if err != nil {
		t.Fatal(err)
	}
	err = probesVerdict(a2, 5)
	if err == nil || !strings.Contains(err.Error(), "3 liveness probes did not succeed (2 failed, 1 unknown") {
		t.Errorf("a-2 (2 failed, 1 unknown): %v", err)
	}
	if _, err := probeCounts("prober_probe_total{pod=\"a-1\"}\n", "x", "a-1", "Liveness"); err == nil {
		t.Error("a line without a value parsed")
	}
}

func TestRuntimeVersion(t *testing.T) {
	v, err := containerdVersion("containerd github.com/containerd/containerd 1.6.20~ds1 1.6.20~ds1-1+deb12u1\n")
	if err != nil || v != "1.6.20~ds1" {
		t.Fatalf("containerdVersion: %q, %v", v, err)
	}
	if _, err := containerdVersion("runc version 1.1.5"); err == nil {
		t.Error("runc's version line parsed as containerd's")
	}
	for _, c := range []struct {
		reported, binary string
		ok               bool
	}{
		{"containerd://1.6.20~ds1", "1.6.20~ds1", true},
		{"containerd://1.6.20", "1.6.20", true},
		{"containerd://1.6.20", "1.6.20~ds1", true},      // seen: the CRI reports the upstream part
		{"containerd://1.6.24~ds1", "1.6.20~ds1", false}, // not the host's binary
		{"containerd://2.0.0", "1.6.20~ds1", false},
		{"cri-o://1.6.20~ds1", "1.6.20~ds1", false},
		{"containerd://", "1.6.20~ds1", false},
		{"containerd://1.6.201", "1.6.201", false}, // the host's, but not the documented release
		{"containerd://1.6.2", "1.6.2", false},
	} {
		err := checkRuntimeVersion(c.reported, c.binary, "1.6.20")
		if (err == nil) != c.ok {
			t.Errorf("checkRuntimeVersion(%q, %q): %v, want ok %v", c.reported, c.binary, err, c.ok)
		}
	}
}

func TestLeaseContainer(t *testing.T) {
	id, err := leaseContainer("0123abcd\r\neth0")
	if err != nil || id != "0123abcd" {
		t.Errorf("leaseContainer: %q, %v", id, err)
	}
	if _, err := leaseContainer("\n"); err == nil {
		t.Error("an empty lease parsed")
	}
}

// TestCollectedVerdict: kvnet-cni's collection of lost DELs passes only
// when every lease is released, every kept record gone and none pending.
func TestCollectedVerdict(t *testing.T) {
	lost := []lostDel{{node: "node-1", ip: "10.244.1.5", container: "c1"}, {node: "node-1", ip: "10.244.1.6", container: "c2"}}
	none := func(lostDel) bool { return false }
	only := func(id string) func(lostDel) bool { return func(l lostDel) bool { return l.container == id } }
	for _, c := range []struct {
		name        string
		after       cniGCStatus
		held, kept  func(lostDel) bool
		wantErrPart string
	}{
		{"collected", cniGCStatus{Collected: 5}, none, none, ""},
		{"lease held", cniGCStatus{Collected: 5}, only("c2"), none, "lease of 10.244.1.6 (container c2) still held"},
		{"record kept", cniGCStatus{Collected: 5}, none, only("c1"), "kept record of container c1"},
		{"pending", cniGCStatus{Collected: 5, Pending: []string{"c1"}, LastFailure: "boom"}, none, none, "container c1 pending"},
	} {
		err := collectedVerdict(lost, c.after, c.held, c.kept)
		if c.wantErrPart == "" && err != nil || c.wantErrPart != "" && (err == nil || !strings.Contains(err.Error(), c.wantErrPart)) {
			t.Errorf("%s: %v, want error containing %q", c.name, err, c.wantErrPart)
		}
	}
	// A lost DEL left pending is called for again; one gone from the
	// pending list while still held is not.
	if !allPending(lost, cniGCStatus{Pending: []string{"c2", "c1"}}) {
		t.Error("both pending: not all pending")
	}
	if allPending(lost, cniGCStatus{Pending: []string{"c1"}}) {
		t.Error("c2 not pending: all pending")
	}
	if s, err := parseCNIGCStatus(nil, false); err != nil || s.Collected != 0 {
		t.Errorf("absent gc-status.json: %+v, %v", s, err)
	}
	s, err := parseCNIGCStatus([]byte(`{"collected":2,"failures":1,"lastFailure":"x","pending":["c9"]}`), true)
	if err != nil || s.Collected != 2 || len(s.Pending) != 1 {
		t.Errorf("gc-status.json: %+v, %v", s, err)
	}
	if _, err := parseCNIGCStatus([]byte("{"), true); err == nil {
		t.Error("a truncated gc-status.json parsed")
	}
}

func TestRecapText(t *testing.T) {
	if got := recapText([]string{"only"}); got != "only" {
		t.Errorf("one failure: %q", got)
	}
	first := "T: " + strings.Repeat("a", 400)
	got := recapText([]string{first, "T: second"})
	lines := strings.Split(got, "\n")
	if len(lines) != 3 || len(lines[0]) != 163 || lines[1] != "T: second" || lines[2] != "the first failure in full: "+first {
		t.Errorf("recap %q: want the first failure cut to 160 characters, the second, then the first in full", got)
	}
}
