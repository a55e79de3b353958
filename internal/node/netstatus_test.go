package node

import (
	"encoding/json"
	"errors"
	"testing"
)

func defaults(t *testing.T, v string) []bool {
	t.Helper()
	var es []struct {
		Default bool `json:"default"`
	}
	if err := json.Unmarshal([]byte(v), &es); err != nil {
		t.Fatal(err)
	}
	var out []bool
	for _, e := range es {
		out = append(out, e.Default)
	}
	return out
}

func TestPrimaryDefault(t *testing.T) {
	// As stock Multus writes it: eth0 from the cluster default network is
	// default, ovn-udn1 is not.
	multusWrote := `[{"name":"cbr0","interface":"eth0","ips":["10.244.1.5"],"mac":"0a:58:0a:f4:01:05","default":true,"dns":{}},` +
		`{"name":"blue/primary","interface":"ovn-udn1","ips":["10.100.0.7"],"mac":"0a:58:0a:64:00:07","dns":{},"gateway":["10.100.0.1"]}]`
	out, changed, err := primaryDefault(multusWrote, "blue/primary")
	if err != nil || !changed {
		t.Fatalf("primaryDefault = %v, %v", changed, err)
	}
	if got := defaults(t, out); len(got) != 2 || got[0] || !got[1] {
		t.Errorf("defaults after = %v, want [false true]", got)
	}
	var es []map[string]any
	_ = json.Unmarshal([]byte(out), &es)
	if es[1]["gateway"] == nil || es[0]["mac"] != "0a:58:0a:f4:01:05" {
		t.Errorf("fields lost: %s", out)
	}
	// Idempotent.
	if _, changed, err := primaryDefault(out, "blue/primary"); changed || err != nil {
		t.Errorf("second pass changed=%v err=%v", changed, err)
	}
	// Another NAD on ovn-udn1, or the primary NAD on another interface, is
	// not the primary attachment.
	for _, nad := range []string{"red/primary", "blue/other"} {
		if _, changed, _ := primaryDefault(multusWrote, nad); changed {
			t.Errorf("primaryDefault(%s) changed an unrelated status", nad)
		}
	}
	if _, changed, _ := primaryDefault(`[{"name":"blue/primary","interface":"net1"}]`, "blue/primary"); changed {
		t.Error("changed an entry on net1")
	}
	for _, bad := range []string{``, `{}`, `[null]`, `[1]`, `"x"`} {
		if _, _, err := primaryDefault(bad, "blue/primary"); !errors.Is(err, errNetworkStatus) {
			t.Errorf("primaryDefault(%q) error %v, want errNetworkStatus", bad, err)
		}
	}
}

func FuzzPrimaryDefault(f *testing.F) {
	f.Add(`[{"name":"a/b","interface":"ovn-udn1"},{"name":"x","interface":"eth0","default":true}]`, "a/b")
	f.Add(`[]`, "")
	f.Add(`[{"default":"yes","interface":7}]`, "a/b")
	f.Fuzz(func(t *testing.T, v, nad string) {
		out, changed, err := primaryDefault(v, nad)
		if err != nil {
			return
		}
		if !changed {
			return
		}
		// A changed value has exactly one default entry and is stable.
		n := 0
		for _, d := range defaults(t, out) {
			if d {
				n++
			}
		}
		if n != 1 {
			t.Fatalf("%d default entries in %s", n, out)
		}
		if _, again, err := primaryDefault(out, nad); again || err != nil {
			t.Fatalf("not stable: %v %v", again, err)
		}
	})
}
