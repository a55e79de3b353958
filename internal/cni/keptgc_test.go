package cni

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
)

func TestParseKeptRecord(t *testing.T) {
	for _, tt := range []struct {
		name, in string
		want     string // a piece of the error; "" for success
	}{
		{"valid", `{"netns":"/var/run/netns/cni-1","ifName":"eth0","args":[["K8S_POD_NAME","p"]]}`, ""},
		{"bad JSON", `{"netns":`, "decode"},
		{"wrong type", `{"netns":3,"ifName":"eth0"}`, "decode"},
		{"no netns", `{"ifName":"eth0"}`, `"netns"`},
		{"no ifName", `{"netns":"/var/run/netns/cni-1"}`, `"ifName"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			rec, err := parseKeptRecord([]byte(tt.in))
			if tt.want == "" {
				if err != nil || rec.NetNS != "/var/run/netns/cni-1" || rec.IfName != "eth0" || len(rec.Args) != 1 {
					t.Fatalf("got %+v, %v", rec, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %+v, %v; want an error naming %s", rec, err, tt.want)
			}
		})
	}
}

func FuzzParseKeptRecord(f *testing.F) {
	for _, s := range []string{
		`{"netns":"/var/run/netns/cni-1","ifName":"eth0","args":[["K8S_POD_NAME","p"]],"capabilityArgs":{"portMappings":[]}}`,
		`{"netns":"","ifName":"eth0"}`, `{"netns":"/x"}`, `{"args":[["a"]]}`, `[]`, `{`, ``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		rec, err := parseKeptRecord(b)
		if err != nil {
			return
		}
		if rec.NetNS == "" || rec.IfName == "" {
			t.Fatalf("accepted %q with an empty netns or ifName", b)
		}
		// What is accepted is written back the same.
		out, err := json.Marshal(rec)
		if err != nil {
			t.Fatal(err)
		}
		again, err := parseKeptRecord(out)
		if err != nil || again.NetNS != rec.NetNS || again.IfName != rec.IfName || !slices.Equal(again.Args, rec.Args) {
			t.Fatalf("round trip of %q: %+v, %v", out, again, err)
		}
	})
}

// fakeCNI records the DELs collection runs.
type fakeCNI struct {
	dels   []libcni.RuntimeConf
	fail   map[string]bool // container IDs whose DEL fails
	cached map[string][]*libcni.NetworkAttachment
}

func (f *fakeCNI) DelNetworkList(_ context.Context, list *libcni.NetworkConfigList, rt *libcni.RuntimeConf) error {
	if list.Name != "defnet" {
		return errors.New("wrong network " + list.Name)
	}
	f.dels = append(f.dels, *rt)
	if f.fail[rt.ContainerID] {
		return errors.New("plugin failed")
	}
	return nil
}

func (f *fakeCNI) GetCachedAttachments(id string) ([]*libcni.NetworkAttachment, error) {
	return f.cached[id], nil
}

// TestCollectKept: of the containers kept, collection deletes (netns
// empty, recorded interface and arguments) and forgets those whose
// recorded netns is gone: by record, or by libcni's cache for an entry
// without one. It leaves a container whose netns exists, the running
// verb's own, one whose record does not parse (logged, counted), one it
// cannot tell (no record, no cache) and one whose DEL fails (logged,
// counted, there for the next run).
func TestCollectKept(t *testing.T) {
	dir := t.TempDir()
	live := filepath.Join(t.TempDir(), "netns-live")
	if err := os.WriteFile(live, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	gone := filepath.Join(t.TempDir(), "netns-gone")
	args := [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", "ns"}, {"K8S_POD_NAME", "p"}}
	record := func(netns string) string {
		b, _ := json.Marshal(keptRecord{NetNS: netns, IfName: "eth0", Args: args})
		return string(b)
	}
	conf := `{"cniVersion":"1.0.0","name":"defnet","plugins":[{"type":"bridge"}]}`
	files := map[string]string{
		"gone.conflist": conf, "gone.json": record(gone),
		"live.conflist": conf, "live.json": record(live),
		"self.conflist": conf, "self.json": record(gone),
		"badrec.conflist": conf, "badrec.json": `{"netns":`,
		"delfails.conflist": conf, "delfails.json": record(gone),
		"legacy.conflist":  conf, // its netns from libcni's cache
		"unknown.conflist": conf, // nothing says where its netns was
		"orphan.json":      record(gone),
		"adding.json":      record(live), // an ADD between record and configuration
		// An ADD writing its configuration as another kvnet-cni
		// collects: its record says its netns lives, so the
		// configuration is not read.
		"writing.conflist": "", "writing.json": record(live),
	}
	for n, d := range files {
		if err := os.WriteFile(filepath.Join(dir, n), []byte(d), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cni := &fakeCNI{fail: map[string]bool{"delfails": true}, cached: map[string][]*libcni.NetworkAttachment{
		"legacy": {{ContainerID: "legacy", Network: "other", IfName: "net1", NetNS: live},
			{ContainerID: "legacy", Network: "defnet", IfName: "eth0", NetNS: gone, CniArgs: args}},
	}}
	var log bytes.Buffer
	run := collectKept(context.Background(), dir, "self", cni, &log)

	var deleted []string
	for _, rt := range cni.dels {
		deleted = append(deleted, rt.ContainerID)
		if rt.NetNS != "" || rt.IfName != "eth0" || !reflect.DeepEqual(rt.Args, args) {
			t.Errorf("DEL of %s with netns %q, ifname %q, args %v; want an empty netns, eth0 and %v", rt.ContainerID, rt.NetNS, rt.IfName, rt.Args, args)
		}
	}
	slices.Sort(deleted)
	if want := []string{"delfails", "gone", "legacy"}; !slices.Equal(deleted, want) {
		t.Errorf("DEL ran for %v, want %v", deleted, want)
	}
	slices.Sort(run.collected)
	if want := []string{"gone", "legacy"}; !slices.Equal(run.collected, want) {
		t.Errorf("collected %v, want %v", run.collected, want)
	}
	slices.Sort(run.failed)
	if want := []string{"badrec", "delfails"}; !slices.Equal(run.failed, want) {
		t.Errorf("failed %v, want %v", run.failed, want)
	}
	slices.Sort(run.live)
	if want := []string{"live", "writing"}; !slices.Equal(run.live, want) {
		t.Errorf("live %v, want %v", run.live, want)
	}
	left, _ := filepath.Glob(filepath.Join(dir, "*"))
	for i := range left {
		left[i] = filepath.Base(left[i])
	}
	slices.Sort(left)
	want := []string{"adding.json", "badrec.conflist", "badrec.json", "delfails.conflist", "delfails.json",
		"live.conflist", "live.json", "self.conflist", "self.json", "unknown.conflist", "writing.conflist", "writing.json"}
	if !slices.Equal(left, want) {
		t.Errorf("left in the directory: %v, want %v", left, want)
	}
	for _, s := range []string{filepath.Join(dir, "badrec.json"), `"unknown"`, "plugin failed"} {
		if !strings.Contains(log.String(), s) {
			t.Errorf("log does not name %s:\n%s", s, log.String())
		}
	}

	// A later run, the plugin fixed: what failed is collected then.
	cni.fail, cni.dels = nil, nil
	run2 := collectKept(context.Background(), dir, "self", cni, &log)
	if !slices.Equal(run2.collected, []string{"delfails"}) || !slices.Equal(run2.failed, []string{"badrec"}) {
		t.Errorf("second run collected %v and failed %v, want [delfails] and [badrec]", run2.collected, run2.failed)
	}

	// The status file adds the runs up.
	status := filepath.Join(t.TempDir(), "gc-status.json")
	now := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	readStatus := func() (gcStatus, []byte) {
		t.Helper()
		b, err := os.ReadFile(status)
		if err != nil {
			t.Fatal(err)
		}
		var st gcStatus
		if err := json.Unmarshal(b, &st); err != nil {
			t.Fatal(err)
		}
		return st, b
	}
	for i, r := range []gcRun{run, {}, run2} {
		if err := recordStatus(status, r, now, keptIn(dir)); err != nil {
			t.Fatal(err)
		}
		// A run that did nothing leaves pending what is still kept
		// (badrec), not what is no longer (delfails, which run2, made
		// before, collected).
		if st, b := readStatus(); i == 1 && !slices.Equal(st.Pending, []string{"badrec"}) {
			t.Errorf("status file after a run that did nothing: %s; want badrec alone still pending", b)
		}
	}
	st, b := readStatus()
	if st.Collected != 3 || st.Failures != 3 || !slices.Equal(st.Pending, []string{"badrec"}) ||
		!strings.Contains(st.LastFailure, "badrec.json") || !st.LastFailureTime.Equal(now) {
		t.Errorf("status file %s; want 3 collected, 3 failures, badrec pending, the last failure's message and time", b)
	}

	// badrec's own DEL comes (it forgets both files): the next run,
	// which does nothing, leaves nothing pending, and the totals stand.
	for _, n := range []string{"badrec.conflist", "badrec.json"} {
		if err := os.Remove(filepath.Join(dir, n)); err != nil {
			t.Fatal(err)
		}
	}
	if err := recordStatus(status, gcRun{}, now.Add(time.Minute), keptIn(dir)); err != nil {
		t.Fatal(err)
	}
	if st, b := readStatus(); len(st.Pending) != 0 || st.Collected != 3 || st.Failures != 3 {
		t.Errorf("status file after badrec's DEL: %s; want nothing pending, 3 collected, 3 failures", b)
	}
	// A container found live is not pending either.
	if err := recordStatus(status, gcRun{failed: []string{"live"}}, now, keptIn(dir)); err != nil {
		t.Fatal(err)
	}
	if err := recordStatus(status, gcRun{live: []string{"live"}}, now, keptIn(dir)); err != nil {
		t.Fatal(err)
	}
	if st, b := readStatus(); len(st.Pending) != 0 {
		t.Errorf("status file after a run found the pending container live: %s; want nothing pending", b)
	}
	if tmps, _ := filepath.Glob(filepath.Join(filepath.Dir(status), ".*")); len(tmps) != 0 {
		t.Errorf("temporary files left beside the status file: %v", tmps)
	}
}

// TestWriteFileAtomic: the file has the content and mode asked for, an
// existing one is replaced, and no temporary file is left; a directory
// that does not exist is an error that leaves nothing.
func TestWriteFileAtomic(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "c.conflist")
	for _, content := range []string{`{"a":1}`, `{"b":2}`} {
		if err := writeFileAtomic(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(path)
		if err != nil || string(b) != content {
			t.Fatalf("read %s: %q, %v; want %q", path, b, err, content)
		}
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("mode %v, %v; want 0600", fi.Mode(), err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("directory holds %d entries, want only c.conflist", len(entries))
	}
	if err := writeFileAtomic(filepath.Join(dir, "missing", "x.json"), []byte("{}"), 0o600); err == nil {
		t.Error("write into a missing directory: no error")
	}
}

// TestCollectKeptStopsWhenOutOfTime: a run whose time is up collects
// nothing and says so; the entries stay for the next.
func TestCollectKeptStopsWhenOutOfTime(t *testing.T) {
	dir := t.TempDir()
	b, _ := json.Marshal(keptRecord{NetNS: filepath.Join(dir, "gone"), IfName: "eth0"})
	for n, d := range map[string]string{"a.conflist": `{"cniVersion":"1.0.0","name":"defnet","plugins":[{"type":"bridge"}]}`, "a.json": string(b)} {
		if err := os.WriteFile(filepath.Join(dir, n), []byte(d), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var log bytes.Buffer
	cni := &fakeCNI{}
	if run := collectKept(ctx, dir, "", cni, &log); len(run.collected) != 0 || len(cni.dels) != 0 {
		t.Errorf("collected %v with no time left", run.collected)
	}
	if !strings.Contains(log.String(), "out of time") {
		t.Errorf("log %q does not say the run was out of time", log.String())
	}
	if _, err := os.Stat(filepath.Join(dir, "a.conflist")); err != nil {
		t.Errorf("entry gone after a run out of time: %v", err)
	}
}
