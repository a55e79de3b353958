package hostsubnets

import (
	"maps"
	"net/netip"
	"slices"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"kvnet.io/kvnet/internal/hostsubnet"
)

// A node keeps a network while it uses it and for the grace period after;
// a node found holding it unused (after a restart) gets a grace period
// from then; the time to the first grace's end is returned.
func TestWantedGrace(t *testing.T) {
	d := &dynamic{grace: 10 * time.Second, seen: map[string]map[string]time.Time{}}
	nets := []hostsubnet.Network{{Name: "n"}}
	sub := hostsubnet.Subnets{"n": []netip.Prefix{netip.MustParsePrefix("10.0.0.0/24")}}
	t0 := time.Unix(1000, 0)
	step := func(at time.Duration, active []string, held []string, want []string, wantNext time.Duration) {
		t.Helper()
		a := map[string]map[string]bool{"n": {}}
		for _, n := range active {
			a["n"][n] = true
		}
		h := map[string]hostsubnet.Subnets{}
		for _, n := range held {
			h[n] = sub
		}
		got, next := d.wanted(nets, a, h, t0.Add(at))
		if names := slices.Sorted(maps.Keys(got["n"])); !slices.Equal(names, want) || next != wantNext {
			t.Fatalf("at +%s: wanted %v, next %s; want %v, %s", at, names, next, want, wantNext)
		}
	}
	step(0, []string{"a"}, []string{"a", "b"}, []string{"a", "b"}, 10*time.Second)
	step(5*time.Second, nil, []string{"a", "b"}, []string{"a", "b"}, 5*time.Second)
	step(7*time.Second, []string{"b"}, []string{"a", "b"}, []string{"a", "b"}, 3*time.Second)
	step(10*time.Second, nil, []string{"a", "b"}, []string{"b"}, 7*time.Second)
	step(17*time.Second, nil, []string{"b"}, nil, 0)
	step(18*time.Second, []string{"c"}, nil, []string{"c"}, 0)
	// A network gone is forgotten.
	if _, next := d.wanted(nil, nil, nil, t0.Add(19*time.Second)); next != 0 || len(d.seen) != 0 {
		t.Fatalf("no networks: next %s, seen %v", next, d.seen)
	}
}

// usage.set asks for a pass only when a network's first pod on a node
// comes or its last goes.
func TestUsageTransitions(t *testing.T) {
	u := newUsage()
	key := func(n string) types.NamespacedName { return types.NamespacedName{Namespace: "t", Name: n} }
	steps := []struct {
		pod  string
		use  podUse
		want bool
	}{
		{"p1", podUse{node: "a", networks: []string{"n"}}, true},       // first of n on a
		{"p2", podUse{node: "a", networks: []string{"n"}}, false},      // second
		{"p1", podUse{}, false},                                        // p1 ends: p2 still there
		{"p2", podUse{node: "a", networks: []string{"n"}}, false},      // the same again
		{"p2", podUse{node: "b", networks: []string{"n"}}, true},       // moved: a left, b came
		{"p3", podUse{node: "b", networks: []string{"n", "m"}}, true},  // m new on b
		{"p3", podUse{node: "b", networks: []string{"n", "m"}}, false}, // repeated event
		{"p3", podUse{node: "b", networks: []string{"n"}}, true},       // m gone from b
		{"p2", podUse{}, false},                                        // p3 keeps n on b
		{"p3", podUse{}, true},                                         // last of n on b
	}
	for i, s := range steps {
		if got := u.set(key(s.pod), s.use); got != s.want {
			t.Fatalf("step %d (%s %+v): changed %v, want %v", i, s.pod, s.use, got, s.want)
		}
	}
	if a := u.active(); len(a) != 0 || len(u.pods) != 0 {
		t.Fatalf("after every pod went: active %v, pods %v", a, u.pods)
	}
}
