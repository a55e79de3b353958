package macpool

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

func mac(t testing.TB, s string) net.HardwareAddr {
	t.Helper()
	m, err := net.ParseMAC(s)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func newPool(t testing.TB, start, end string) *Pool {
	t.Helper()
	p, err := New(mac(t, start), mac(t, end))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// checkInvariants verifies that the two indexes agree, no MAC has two
// owners, and the in-range counter matches a recount.
func checkInvariants(t testing.TB, p *Pool) {
	t.Helper()
	p.mu.RLock()
	defer p.mu.RUnlock()
	seen := map[uint64]string{}
	for owner, vs := range p.owned {
		if len(vs) == 0 {
			t.Errorf("owner %q has an empty list", owner)
		}
		for _, v := range vs {
			if other, dup := seen[v]; dup {
				t.Errorf("MAC %s listed for %q and %q", toMAC(v), other, owner)
			}
			seen[v] = owner
			if h := p.holders[v]; h != owner {
				t.Errorf("MAC %s listed for %q but held by %q", toMAC(v), owner, h)
			}
		}
	}
	if len(seen) != len(p.holders) {
		t.Errorf("%d MACs in owner lists, %d holders", len(seen), len(p.holders))
	}
	var used uint64
	for v := range p.holders {
		if v == reservedMAC {
			t.Errorf("reserved MAC %s is held", toMAC(v))
		}
		if p.allocatable(v) {
			used++
		}
	}
	if used != p.usedInRange {
		t.Errorf("usedInRange = %d, recount = %d", p.usedInRange, used)
	}
}

func TestParseRange(t *testing.T) {
	tests := []struct {
		name       string
		start, end string
		wantIs     error
		wantText   []string
	}{
		{name: "kubemacpool default", start: "02:00:00:00:00:00", end: "02:FF:FF:FF:FF:FF"},
		{name: "single address", start: "02:00:00:00:00:05", end: "02:00:00:00:00:05"},
		{name: "dash notation", start: "0a-00-00-00-00-00", end: "0a-00-00-00-ff-ff"},
		{name: "whole unicast space", start: "00:00:00:00:00:00", end: "fe:ff:ff:ff:ff:ff"},
		{name: "malformed start", start: "02:00:00:00:00", end: "02:FF:FF:FF:FF:FF",
			wantIs: ErrInvalid, wantText: []string{"range start", `"02:00:00:00:00"`}},
		{name: "malformed end", start: "02:00:00:00:00:00", end: "nope",
			wantIs: ErrInvalid, wantText: []string{"range end", `"nope"`}},
		{name: "EUI-64 start", start: "02:00:00:00:00:00:00:00", end: "02:FF:FF:FF:FF:FF",
			wantIs: ErrInvalid, wantText: []string{"range start", "6-byte", "8 bytes"}},
		{name: "multicast start", start: "03:00:00:00:00:00", end: "04:00:00:00:00:00",
			wantIs: ErrInvalid, wantText: []string{"range start", "03:00:00:00:00:00", "multicast"}},
		{name: "multicast end", start: "02:00:00:00:00:00", end: "ff:ff:ff:ff:ff:ff",
			wantIs: ErrInvalid, wantText: []string{"range end", "ff:ff:ff:ff:ff:ff", "multicast"}},
		{name: "start after end", start: "02:00:00:00:00:10", end: "02:00:00:00:00:0f",
			wantIs: ErrOutOfRange, wantText: []string{"02:00:00:00:00:10", "02:00:00:00:00:0f"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, e, err := ParseRange(tt.start, tt.end)
			if tt.wantIs == nil {
				if err != nil {
					t.Fatal(err)
				}
				if _, err := New(s, e); err != nil {
					t.Fatalf("New after ParseRange: %v", err)
				}
				return
			}
			if !errors.Is(err, tt.wantIs) {
				t.Fatalf("error %v, want %v", err, tt.wantIs)
			}
			for _, want := range tt.wantText {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not mention %s", err, want)
				}
			}
		})
	}
}

func TestNewBadBounds(t *testing.T) {
	good := net.HardwareAddr{2, 0, 0, 0, 0, 0}
	tests := []struct {
		name       string
		start, end net.HardwareAddr
		wantIs     error
		wantText   string
	}{
		{name: "nil start", start: nil, end: good, wantIs: ErrInvalid, wantText: "range start"},
		{name: "short end", start: good, end: net.HardwareAddr{2, 0}, wantIs: ErrInvalid, wantText: "range end"},
		{name: "reversed", start: net.HardwareAddr{2, 0, 0, 0, 0, 1}, end: good, wantIs: ErrOutOfRange, wantText: "is after range end"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(tt.start, tt.end)
			if !errors.Is(err, tt.wantIs) || !strings.Contains(err.Error(), tt.wantText) {
				t.Fatalf("error %v, want %v mentioning %q", err, tt.wantIs, tt.wantText)
			}
		})
	}
}

// step is one pool operation of a scripted test.
type step struct {
	op    string // allocate, reserve, release, releaseOwner, setRange
	owner string
	mac   string // reserve/release MAC, or "start-end" for setRange
	want  string // allocate: expected MAC
	err   error  // expected error (errors.Is)
}

func run(t *testing.T, p *Pool, steps []step) {
	t.Helper()
	for i, s := range steps {
		var err error
		switch s.op {
		case "allocate":
			var got net.HardwareAddr
			got, err = p.Allocate(s.owner)
			if err == nil && got.String() != s.want {
				t.Fatalf("step %d: Allocate(%q) = %s, want %s", i, s.owner, got, s.want)
			}
		case "reserve":
			err = p.Reserve(s.owner, mac(t, s.mac))
		case "release":
			p.Release(s.owner, mac(t, s.mac))
		case "releaseOwner":
			p.ReleaseOwner(s.owner)
		case "setRange":
			start, end, _ := strings.Cut(s.mac, "-")
			err = p.SetRange(mac(t, start), mac(t, end))
		default:
			t.Fatalf("step %d: unknown op %q", i, s.op)
		}
		if !errors.Is(err, s.err) {
			t.Fatalf("step %d (%s %s %s): error %v, want %v", i, s.op, s.owner, s.mac, err, s.err)
		}
		checkInvariants(t, p)
	}
}

func TestAllocate(t *testing.T) {
	tests := []struct {
		name       string
		start, end string
		steps      []step
	}{
		{
			name:  "sequence skips 02:00:00:00:00:00 and exhausts",
			start: "02:00:00:00:00:00", end: "02:00:00:00:00:03",
			steps: []step{
				{op: "allocate", owner: "ns/a", want: "02:00:00:00:00:01"},
				{op: "allocate", owner: "ns/a", want: "02:00:00:00:00:02"},
				{op: "allocate", owner: "ns/b", want: "02:00:00:00:00:03"},
				{op: "allocate", owner: "ns/c", err: ErrExhausted},
			},
		},
		{
			name:  "wraps to the start",
			start: "0a:00:00:00:00:10", end: "0a:00:00:00:00:12",
			steps: []step{
				{op: "allocate", owner: "ns/a", want: "0a:00:00:00:00:10"},
				{op: "allocate", owner: "ns/b", want: "0a:00:00:00:00:11"},
				{op: "allocate", owner: "ns/c", want: "0a:00:00:00:00:12"},
				{op: "releaseOwner", owner: "ns/a"},
				{op: "allocate", owner: "ns/d", want: "0a:00:00:00:00:10"},
				{op: "allocate", owner: "ns/e", err: ErrExhausted},
			},
		},
		{
			name:  "released MAC is reused last (round robin)",
			start: "0a:00:00:00:00:00", end: "0a:00:00:00:00:04",
			steps: []step{
				{op: "allocate", owner: "ns/a", want: "0a:00:00:00:00:00"},
				{op: "allocate", owner: "ns/b", want: "0a:00:00:00:00:01"},
				{op: "release", owner: "ns/b", mac: "0a:00:00:00:00:01"},
				{op: "releaseOwner", owner: "ns/a"},
				{op: "allocate", owner: "ns/c", want: "0a:00:00:00:00:02"},
				{op: "allocate", owner: "ns/c", want: "0a:00:00:00:00:03"},
				{op: "allocate", owner: "ns/c", want: "0a:00:00:00:00:04"},
				{op: "allocate", owner: "ns/c", want: "0a:00:00:00:00:00"},
				{op: "allocate", owner: "ns/c", want: "0a:00:00:00:00:01"},
			},
		},
		{
			name:  "reserved MACs are skipped",
			start: "0a:00:00:00:00:00", end: "0a:00:00:00:00:03",
			steps: []step{
				{op: "reserve", owner: "ns/x", mac: "0a:00:00:00:00:00"},
				{op: "reserve", owner: "ns/x", mac: "0a:00:00:00:00:02"},
				{op: "allocate", owner: "ns/a", want: "0a:00:00:00:00:01"},
				{op: "allocate", owner: "ns/a", want: "0a:00:00:00:00:03"},
				{op: "allocate", owner: "ns/a", err: ErrExhausted},
			},
		},
		{
			name:  "release by another owner is ignored",
			start: "0a:00:00:00:00:00", end: "0a:00:00:00:00:01",
			steps: []step{
				{op: "allocate", owner: "ns/a", want: "0a:00:00:00:00:00"},
				{op: "release", owner: "ns/b", mac: "0a:00:00:00:00:00"},
				{op: "release", owner: "", mac: "0a:00:00:00:00:01"},
				{op: "allocate", owner: "ns/b", want: "0a:00:00:00:00:01"},
				{op: "allocate", owner: "ns/c", err: ErrExhausted},
			},
		},
		{
			name:  "multicast block inside the range is skipped",
			start: "02:ff:ff:ff:ff:fe", end: "04:00:00:00:00:01",
			steps: []step{
				{op: "allocate", owner: "ns/a", want: "02:ff:ff:ff:ff:fe"},
				{op: "allocate", owner: "ns/a", want: "02:ff:ff:ff:ff:ff"},
				{op: "allocate", owner: "ns/a", want: "04:00:00:00:00:00"},
				{op: "allocate", owner: "ns/a", want: "04:00:00:00:00:01"},
				{op: "allocate", owner: "ns/a", err: ErrExhausted},
			},
		},
		{
			name:  "multicast and reserved skipped at a block boundary",
			start: "00:ff:ff:ff:ff:ff", end: "fe:ff:ff:ff:ff:ff",
			steps: []step{
				{op: "allocate", owner: "ns/a", want: "00:ff:ff:ff:ff:ff"},
				{op: "allocate", owner: "ns/a", want: "02:00:00:00:00:01"},
			},
		},
		{
			name:  "empty owner",
			start: "0a:00:00:00:00:00", end: "0a:00:00:00:00:01",
			steps: []step{{op: "allocate", owner: "", err: ErrInvalid}},
		},
		{
			name:  "range holding only the reserved MAC",
			start: "02:00:00:00:00:00", end: "02:00:00:00:00:00",
			steps: []step{{op: "allocate", owner: "ns/a", err: ErrExhausted}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			run(t, newPool(t, tt.start, tt.end), tt.steps)
		})
	}
}

func TestReserve(t *testing.T) {
	tests := []struct {
		name  string
		steps []step
	}{
		{
			name: "idempotent for the same owner",
			steps: []step{
				{op: "reserve", owner: "default/vm-a", mac: "02:00:00:00:00:10"},
				{op: "reserve", owner: "default/vm-a", mac: "02:00:00:00:00:10"},
				{op: "reserve", owner: "default/vm-a", mac: "02-00-00-00-00-10"},
			},
		},
		{
			name: "conflict with another owner",
			steps: []step{
				{op: "reserve", owner: "default/vm-a", mac: "02:00:00:00:00:10"},
				{op: "reserve", owner: "default/vm-b", mac: "02:00:00:00:00:10", err: ErrConflict},
			},
		},
		{
			name: "out of range allowed",
			steps: []step{
				{op: "reserve", owner: "default/vm-a", mac: "de:ad:00:00:be:af"},
				{op: "reserve", owner: "default/vm-b", mac: "de:ad:00:00:be:af", err: ErrConflict},
			},
		},
		{
			name: "multicast MAC is recorded but never counted in range",
			steps: []step{
				{op: "reserve", owner: "default/vm-a", mac: "03:00:00:00:00:01"},
			},
		},
		{
			name: "reserved MAC refused",
			steps: []step{
				{op: "reserve", owner: "default/vm-a", mac: "02:00:00:00:00:00", err: ErrInvalid},
			},
		},
		{
			name: "EUI-64 refused",
			steps: []step{
				{op: "reserve", owner: "default/vm-a", mac: "02:00:00:00:00:00:00:01", err: ErrInvalid},
			},
		},
		{
			name: "empty owner refused",
			steps: []step{
				{op: "reserve", owner: "", mac: "02:00:00:00:00:01", err: ErrInvalid},
			},
		},
		{
			name: "free again after release",
			steps: []step{
				{op: "reserve", owner: "default/vm-a", mac: "02:00:00:00:00:10"},
				{op: "release", owner: "default/vm-a", mac: "02:00:00:00:00:10"},
				{op: "reserve", owner: "default/vm-b", mac: "02:00:00:00:00:10"},
				{op: "releaseOwner", owner: "default/vm-b"},
				{op: "reserve", owner: "default/vm-c", mac: "02:00:00:00:00:10"},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			run(t, newPool(t, "02:00:00:00:00:00", "02:00:00:00:00:ff"), tt.steps)
		})
	}
}

func TestConflictMessage(t *testing.T) {
	p := newPool(t, "02:00:00:00:00:00", "02:FF:FF:FF:FF:FF")
	if err := p.Reserve("default/vm-a", mac(t, "02:00:00:00:00:10")); err != nil {
		t.Fatal(err)
	}
	err := p.Reserve("default/vm-b", mac(t, "02:00:00:00:00:10"))
	if !errors.Is(err, ErrConflict) {
		t.Fatalf("error %v, want ErrConflict", err)
	}
	const wantText = "MAC address already in use: MAC 02:00:00:00:00:10 is already used by default/vm-a"
	if err.Error() != wantText {
		t.Fatalf("error %q, want %q", err, wantText)
	}
	var ce *ConflictError
	if !errors.As(err, &ce) {
		t.Fatalf("error %T is not a *ConflictError", err)
	}
	// The message a webhook builds from it, naming VM and interface.
	got := fmt.Sprintf("MAC %s of interface %q is already used by VM %s", ce.MAC, "default", ce.Holder)
	const want = `MAC 02:00:00:00:00:10 of interface "default" is already used by VM default/vm-a`
	if got != want {
		t.Fatalf("caller message %q, want %q", got, want)
	}
	if h, _ := p.Holder(mac(t, "02:00:00:00:00:10")); h != "default/vm-a" {
		t.Fatalf("holder changed to %q after a conflict", h)
	}
}

func TestSetRange(t *testing.T) {
	tests := []struct {
		name  string
		steps []step
		// wantHeld maps MACs to their expected holders at the end.
		wantHeld map[string]string
		wantSize int
		wantUsed int
	}{
		{
			name: "keeps old allocations, allocates from the new range",
			steps: []step{
				{op: "allocate", owner: "ns/a", want: "0a:00:00:00:00:00"},
				{op: "allocate", owner: "ns/b", want: "0a:00:00:00:00:01"},
				{op: "setRange", mac: "0e:00:00:00:00:00-0e:00:00:00:00:02"},
				{op: "allocate", owner: "ns/c", want: "0e:00:00:00:00:00"},
			},
			wantHeld: map[string]string{"0a:00:00:00:00:00": "ns/a", "0a:00:00:00:00:01": "ns/b", "0e:00:00:00:00:00": "ns/c"},
			wantSize: 3, wantUsed: 1,
		},
		{
			name: "old allocations still conflict",
			steps: []step{
				{op: "allocate", owner: "ns/a", want: "0a:00:00:00:00:00"},
				{op: "setRange", mac: "0e:00:00:00:00:00-0e:00:00:00:00:02"},
				{op: "reserve", owner: "ns/b", mac: "0a:00:00:00:00:00", err: ErrConflict},
			},
			wantHeld: map[string]string{"0a:00:00:00:00:00": "ns/a"},
			wantSize: 3, wantUsed: 0,
		},
		{
			name: "shrinking counts only the MACs still inside",
			steps: []step{
				{op: "allocate", owner: "ns/a", want: "0a:00:00:00:00:00"},
				{op: "allocate", owner: "ns/a", want: "0a:00:00:00:00:01"},
				{op: "allocate", owner: "ns/a", want: "0a:00:00:00:00:02"},
				{op: "setRange", mac: "0a:00:00:00:00:01-0a:00:00:00:00:02"},
				{op: "allocate", owner: "ns/b", err: ErrExhausted},
				{op: "releaseOwner", owner: "ns/a"},
				{op: "allocate", owner: "ns/b", want: "0a:00:00:00:00:01"},
			},
			wantHeld: map[string]string{"0a:00:00:00:00:01": "ns/b"},
			wantSize: 2, wantUsed: 1,
		},
		{
			name: "cursor kept when still inside",
			steps: []step{
				{op: "allocate", owner: "ns/a", want: "0a:00:00:00:00:00"},
				{op: "allocate", owner: "ns/a", want: "0a:00:00:00:00:01"},
				{op: "releaseOwner", owner: "ns/a"},
				{op: "setRange", mac: "0a:00:00:00:00:00-0a:00:00:00:00:ff"},
				{op: "allocate", owner: "ns/b", want: "0a:00:00:00:00:02"},
			},
			wantHeld: map[string]string{"0a:00:00:00:00:02": "ns/b"},
			wantSize: 256, wantUsed: 1,
		},
		{
			name: "bad range leaves the pool unchanged",
			steps: []step{
				{op: "setRange", mac: "0e:00:00:00:00:02-0e:00:00:00:00:00", err: ErrOutOfRange},
				{op: "allocate", owner: "ns/a", want: "0a:00:00:00:00:00"},
			},
			wantHeld: map[string]string{"0a:00:00:00:00:00": "ns/a"},
			wantSize: 3, wantUsed: 1,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := newPool(t, "0a:00:00:00:00:00", "0a:00:00:00:00:02")
			run(t, p, tt.steps)
			for m, want := range tt.wantHeld {
				if got, ok := p.Holder(mac(t, m)); !ok || got != want {
					t.Errorf("Holder(%s) = %q, %v; want %q", m, got, ok, want)
				}
			}
			if size, used := p.Stats(); size != tt.wantSize || used != tt.wantUsed {
				t.Errorf("Stats() = %d, %d; want %d, %d", size, used, tt.wantSize, tt.wantUsed)
			}
		})
	}
}

func TestStats(t *testing.T) {
	tests := []struct {
		name       string
		start, end string
		wantSize   int
	}{
		{name: "kubemacpool default", start: "02:00:00:00:00:00", end: "02:ff:ff:ff:ff:ff", wantSize: 1<<40 - 1},
		{name: "without reserved", start: "0a:00:00:00:00:00", end: "0a:00:00:00:00:ff", wantSize: 256},
		{name: "spanning a multicast block", start: "02:ff:ff:ff:ff:fe", end: "04:00:00:00:00:01", wantSize: 4},
		{name: "whole unicast space", start: "00:00:00:00:00:00", end: "fe:ff:ff:ff:ff:ff", wantSize: 128<<40 - 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			size, used := newPool(t, tt.start, tt.end).Stats()
			if size != tt.wantSize || used != 0 {
				t.Fatalf("Stats() = %d, %d; want %d, 0", size, used, tt.wantSize)
			}
		})
	}
}

func TestMACs(t *testing.T) {
	p := newPool(t, "0a:00:00:00:00:00", "0a:00:00:00:00:ff")
	for _, m := range []string{"0a:00:00:00:00:50", "00:00:00:00:00:01"} {
		if err := p.Reserve("ns/a", mac(t, m)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := p.Allocate("ns/a"); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, m := range p.MACs("ns/a") {
		got = append(got, m.String())
	}
	want := "00:00:00:00:00:01 0a:00:00:00:00:00 0a:00:00:00:00:50"
	if strings.Join(got, " ") != want {
		t.Fatalf("MACs = %v, want %s", got, want)
	}
	if got := p.MACs("ns/none"); len(got) != 0 {
		t.Fatalf("MACs of unknown owner = %v", got)
	}
	p.Release("ns/a", mac(t, "0a:00:00:00:00:50"))
	if got := p.MACs("ns/a"); len(got) != 2 {
		t.Fatalf("MACs after Release = %v", got)
	}
	if _, ok := p.Holder(mac(t, "0a:00:00:00:00:50")); ok {
		t.Fatal("released MAC still has a holder")
	}
	checkInvariants(t, p)
}

func TestManyOwnersUnique(t *testing.T) {
	p := newPool(t, "02:00:00:00:00:00", "02:FF:FF:FF:FF:FF")
	seen := map[string]string{}
	for i := range 1000 {
		owner := fmt.Sprintf("ns/vm-%d", i)
		m, err := p.Allocate(owner)
		if err != nil {
			t.Fatal(err)
		}
		if prev, dup := seen[m.String()]; dup {
			t.Fatalf("MAC %s given to %s and %s", m, prev, owner)
		}
		seen[m.String()] = owner
		if h, _ := p.Holder(m); h != owner {
			t.Fatalf("Holder(%s) = %q, want %q", m, h, owner)
		}
	}
	if _, used := p.Stats(); used != 1000 {
		t.Fatalf("used = %d, want 1000", used)
	}
	checkInvariants(t, p)
}

// A full range must fail at once, not after a scan of the range.
func TestExhaustedPromptly(t *testing.T) {
	p := newPool(t, "0a:00:00:00:00:01", "0a:00:00:00:27:10") // 10,000 MACs
	for range 10000 {
		if _, err := p.Allocate("ns/a"); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	for range 1000 {
		if _, err := p.Allocate("ns/b"); !errors.Is(err, ErrExhausted) {
			t.Fatalf("error %v, want ErrExhausted", err)
		}
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("1,000 failed allocations took %v", d)
	}
	// One free MAC is found wherever the cursor is.
	p.Release("ns/a", mac(t, "0a:00:00:00:13:88"))
	if m, err := p.Allocate("ns/b"); err != nil || m.String() != "0a:00:00:00:13:88" {
		t.Fatalf("Allocate = %v, %v; want 0a:00:00:00:13:88", m, err)
	}
}

func TestConcurrent(t *testing.T) {
	p := newPool(t, "02:00:00:00:00:00", "02:00:00:00:ff:ff")
	const workers, perWorker = 16, 200
	var wg sync.WaitGroup
	got := make([][]net.HardwareAddr, workers)
	for w := range workers {
		wg.Go(func() {
			owner := fmt.Sprintf("ns/vm-%d", w)
			for i := range perWorker {
				m, err := p.Allocate(owner)
				if err != nil {
					t.Error(err)
					return
				}
				got[w] = append(got[w], m)
				// Mix in the other operations so -race sees them contend.
				switch i % 4 {
				case 0:
					_ = p.Reserve(owner, m)
				case 1:
					p.Holder(m)
					p.Stats()
				case 2:
					_ = p.Reserve(owner, net.HardwareAddr{0x0a, 0, 0, 0, byte(w), byte(i)})
				case 3:
					p.MACs(owner)
				}
			}
		})
	}
	wg.Wait()
	seen := map[string]bool{}
	for w, macs := range got {
		if len(macs) != perWorker {
			t.Fatalf("worker %d got %d MACs", w, len(macs))
		}
		for _, m := range macs {
			if seen[m.String()] {
				t.Fatalf("MAC %s handed out twice", m)
			}
			seen[m.String()] = true
		}
	}
	checkInvariants(t, p)
	for w := range workers {
		p.ReleaseOwner(fmt.Sprintf("ns/vm-%d", w))
	}
	if _, used := p.Stats(); used != 0 {
		t.Fatalf("used = %d after releasing everyone", used)
	}
	checkInvariants(t, p)
}

// BenchmarkAllocate measures Allocate followed by ReleaseOwner, in a pool
// where the round-robin scan finds a free MAC at once (plain) and in
// fragmented pools where most MACs are held and the scan must skip the
// held ones between the randomly scattered free ones. skipped/op is how
// many candidates each Allocate passed over, so a fragmented case that
// stopped exercising the skip would show it.
func BenchmarkAllocate(b *testing.B) {
	b.Run("plain", func(b *testing.B) {
		p, err := New(net.HardwareAddr{2, 0, 0, 0, 0, 0}, net.HardwareAddr{2, 0xff, 0xff, 0xff, 0xff, 0xff})
		if err != nil {
			b.Fatal(err)
		}
		// Held MACs behind the cursor: the scan never meets them.
		for i := range 10000 {
			if _, err := p.Allocate(fmt.Sprintf("ns/held-%d", i)); err != nil {
				b.Fatal(err)
			}
		}
		benchAllocate(b, p, false)
	})
	for _, freeOneIn := range []int{16, 1024} {
		b.Run(fmt.Sprintf("fragmented/free=1in%d", freeOneIn), func(b *testing.B) {
			// 65536 addresses, all held, then about one in freeOneIn
			// released at random (fixed seed): the free MACs are scattered
			// among held ones, as in a pool after long VM churn.
			p, err := New(net.HardwareAddr{2, 0, 0, 0, 0, 0}, net.HardwareAddr{2, 0, 0, 0, 0xff, 0xff})
			if err != nil {
				b.Fatal(err)
			}
			size, _ := p.Stats()
			for i := range size {
				if _, err := p.Allocate(fmt.Sprintf("ns/held-%d", i)); err != nil {
					b.Fatal(err)
				}
			}
			r := rand.New(rand.NewPCG(1, uint64(freeOneIn)))
			for i := range size {
				if r.IntN(freeOneIn) == 0 {
					p.ReleaseOwner(fmt.Sprintf("ns/held-%d", i))
				}
			}
			if _, used := p.Stats(); used == size {
				b.Fatal("nothing freed")
			}
			benchAllocate(b, p, true)
		})
	}
}

// benchAllocate allocates a MAC and releases it again per iteration, so the
// pool keeps its shape, and reports the candidates skipped per Allocate.
// It fails if Allocate handed out a held MAC (the holders shrink when it is
// released) or, when the pool is fragmented, never had to skip one.
func benchAllocate(b *testing.B, p *Pool, fragmented bool) {
	b.Helper()
	span := p.end - p.start + 1
	held := len(p.holders)
	var skipped uint64
	b.ReportAllocs()
	for b.Loop() {
		from := p.next
		m, err := p.Allocate("ns/vm")
		if err != nil {
			b.Fatal(err)
		}
		// Candidates from the cursor to the MAC handed out, across a wrap.
		skipped += (toUint(m) - p.start + span - (from-p.start)%span) % span
		p.ReleaseOwner("ns/vm")
	}
	if len(p.holders) != held {
		b.Fatalf("%d MACs held after the run, %d before: Allocate handed out held MACs", len(p.holders), held)
	}
	if fragmented && skipped == 0 {
		b.Fatal("the scan skipped no held MAC in a fragmented pool")
	}
	b.ReportMetric(float64(skipped)/float64(b.N), "skipped/op")
}

func FuzzReserve(f *testing.F) {
	f.Add("02:00:00:00:00:01", "02:00:00:00:00:01", uint8(0), uint8(1))
	f.Add("02:00:00:00:00:00", "02-00-00-00-00-03", uint8(2), uint8(2))
	f.Add("0200.0000.0002", "02:00:00:00:00:00:00:01", uint8(1), uint8(0))
	f.Add("ff:ff:ff:ff:ff:ff", "", uint8(3), uint8(4))
	f.Add("00:00:5e:00:53:01", "00:00:00:00:fe:80:00:00:00:00:00:00:02:00:5e:10:00:00:00:01", uint8(5), uint8(6))
	owners := []string{"ns/a", "ns/b", "ns/c"}
	f.Fuzz(func(t *testing.T, s1, s2 string, o1, o2 uint8) {
		p := newPool(t, "02:00:00:00:00:00", "02:00:00:00:00:03")
		owner1, owner2 := owners[int(o1)%len(owners)], owners[int(o2)%len(owners)]
		reserve := func(owner, s string) {
			m, err := net.ParseMAC(s)
			if err != nil {
				return
			}
			err = p.Reserve(owner, m)
			switch {
			case err == nil:
				if h, ok := p.Holder(m); !ok || h != owner {
					t.Fatalf("Reserve(%s, %s) succeeded but Holder = %q, %v", owner, m, h, ok)
				}
			case errors.Is(err, ErrConflict):
				var ce *ConflictError
				if !errors.As(err, &ce) || ce.Holder == owner || !strings.Contains(err.Error(), ce.Holder) {
					t.Fatalf("bad conflict error %v for %s", err, owner)
				}
			case errors.Is(err, ErrInvalid):
			default:
				t.Fatalf("Reserve(%s, %q): unexpected error %v", owner, s, err)
			}
			checkInvariants(t, p)
		}
		reserve(owner1, s1)
		if _, err := p.Allocate(owner2); err != nil && !errors.Is(err, ErrExhausted) {
			t.Fatal(err)
		}
		reserve(owner2, s2)
		reserve(owner2, s1)
		reserve(owner1, s2)
		for range 4 {
			if _, err := p.Allocate(owner1); err != nil && !errors.Is(err, ErrExhausted) {
				t.Fatal(err)
			}
			checkInvariants(t, p)
		}
		if m, err := net.ParseMAC(s1); err == nil {
			p.Release(owner2, m)
			checkInvariants(t, p)
		}
		p.ReleaseOwner(owner1)
		checkInvariants(t, p)
		if _, used := p.Stats(); used > 3 {
			t.Fatalf("used = %d in a range of 3", used)
		}
	})
}

func TestTransfer(t *testing.T) {
	p := newPool(t, "0a:00:00:00:00:00", "0a:00:00:00:00:ff")
	m, err := p.Allocate("ns/generateName:uid-1")
	if err != nil {
		t.Fatal(err)
	}
	if p.Transfer("ns/other", "ns/vm", m) {
		t.Fatal("moved a MAC its from-owner does not hold")
	}
	if !p.Transfer("ns/generateName:uid-1", "ns/vm", m) {
		t.Fatal("Transfer from the holder refused")
	}
	if h, _ := p.Holder(m); h != "ns/vm" {
		t.Fatalf("holder after Transfer = %q", h)
	}
	if got := p.MACs("ns/generateName:uid-1"); len(got) != 0 {
		t.Fatalf("from-owner still lists %v", got)
	}
	if _, used := p.Stats(); used != 1 {
		t.Fatalf("used = %d after a transfer, want 1", used)
	}
	checkInvariants(t, p)
	p.ReleaseOwner("ns/vm")
	if _, held := p.Holder(m); held {
		t.Fatal("MAC held after its new owner released it")
	}
	checkInvariants(t, p)
}

// FuzzParseRange feeds the ConfigMap's RANGE_START and RANGE_END: errors
// name the bound, and a range that parses gives a pool whose MACs are
// unicast, inside the range and never the masquerade bridge's.
func FuzzParseRange(f *testing.F) {
	for _, r := range [][2]string{
		{"02:00:00:00:00:00", "02:FF:FF:FF:FF:FF"}, {"02:00:00:00:00:05", "02:00:00:00:00:05"},
		{"02:00:00:00:00:00", "02:00:00:00:00:00"}, {"0a-00-00-00-00-00", "0a-00-00-00-ff-ff"},
		{"0200.0000.0000", "0200.0000.0003"}, {"00:00:00:00:00:00", "fe:ff:ff:ff:ff:ff"},
		{"02:00:00:00:00", "02:FF:FF:FF:FF:FF"}, {"03:00:00:00:00:00", "04:00:00:00:00:00"},
		{"02:00:00:00:00:10", "02:00:00:00:00:0f"}, {"02:00:00:00:00:00:00:00", ""},
	} {
		f.Add(r[0], r[1])
	}
	f.Fuzz(func(t *testing.T, start, end string) {
		s, e, err := ParseRange(start, end)
		if err != nil {
			if !errors.Is(err, ErrInvalid) && !errors.Is(err, ErrOutOfRange) {
				t.Fatalf("error of no known kind: %v", err)
			}
			if !strings.Contains(err.Error(), "range ") {
				t.Fatalf("error names no bound: %v", err)
			}
			return
		}
		p, err := New(s, e)
		if err != nil {
			t.Fatalf("New(%s, %s) after ParseRange: %v", s, e, err)
		}
		for i := range 3 {
			m, err := p.Allocate(fmt.Sprintf("ns/vm%d", i))
			if err != nil {
				if !errors.Is(err, ErrExhausted) {
					t.Fatalf("allocate from %s-%s: %v", s, e, err)
				}
				return
			}
			v := toUint(m)
			if m[0]&1 != 0 || v < toUint(s) || v > toUint(e) || m.String() == "02:00:00:00:00:00" {
				t.Fatalf("allocated %s from %s-%s", m, s, e)
			}
		}
	})
}

func TestSetAndForget(t *testing.T) {
	p, err := New(net.HardwareAddr{2, 0, 0, 0, 0, 1}, net.HardwareAddr{2, 0, 0, 0, 0, 3})
	if err != nil {
		t.Fatal(err)
	}
	a, err := p.Allocate("ns/a")
	if err != nil {
		t.Fatal(err)
	}
	p.Set("ns/b", a)
	if h, _ := p.Holder(a); h != "ns/b" {
		t.Fatalf("holder of %s after Set: %q, want ns/b", a, h)
	}
	if got := p.MACs("ns/a"); len(got) != 0 {
		t.Fatalf("ns/a still owns %v after Set moved %s", got, a)
	}
	if _, used := p.Stats(); used != 1 {
		t.Fatalf("used %d after Set moved one MAC, want 1", used)
	}
	p.Forget(a)
	if _, held := p.Holder(a); held {
		t.Fatalf("%s still held after Forget", a)
	}
	if _, used := p.Stats(); used != 0 {
		t.Fatalf("used %d after Forget, want 0", used)
	}
	if got := p.MACs("ns/b"); len(got) != 0 {
		t.Fatalf("ns/b still owns %v after Forget", got)
	}
	p.Set("ns/c", net.HardwareAddr{2, 0, 0, 0, 0, 0})
	if _, held := p.Holder(net.HardwareAddr{2, 0, 0, 0, 0, 0}); held {
		t.Fatal("Set held the masquerade bridge's MAC")
	}
}
