package allocator

import (
	"errors"
	"math/rand/v2"
	"net/netip"
	"testing"
)

func TestNewRange(t *testing.T) {
	tests := []struct {
		name     string
		prefix   netip.Prefix
		wantErr  bool
		size     int
		wantPfx  string
		firstOut string // first AllocateNext result
	}{
		{name: "ipv4 /29", prefix: netip.MustParsePrefix("10.0.0.0/29"), size: 6, wantPfx: "10.0.0.0/29", firstOut: "10.0.0.1"},
		{name: "ipv4 /30", prefix: netip.MustParsePrefix("10.0.0.4/30"), size: 2, wantPfx: "10.0.0.4/30", firstOut: "10.0.0.5"},
		{name: "ipv4 unmasked", prefix: netip.MustParsePrefix("10.1.2.3/24"), size: 254, wantPfx: "10.1.2.0/24", firstOut: "10.1.2.1"},
		{name: "ipv4 /16", prefix: netip.MustParsePrefix("10.1.0.0/16"), size: 65534, wantPfx: "10.1.0.0/16", firstOut: "10.1.0.1"},
		{name: "ipv4 /8 tracked whole", prefix: netip.MustParsePrefix("10.0.0.0/8"), size: 1<<24 - 2, wantPfx: "10.0.0.0/8", firstOut: "10.0.0.1"},
		{name: "ipv4 /7 windowed", prefix: netip.MustParsePrefix("10.0.0.0/7"), size: 1 << 24, wantPfx: "10.0.0.0/7", firstOut: "10.0.0.1"},
		{name: "ipv6 /126", prefix: netip.MustParsePrefix("fd00::/126"), size: 3, wantPfx: "fd00::/126", firstOut: "fd00::1"},
		{name: "ipv6 /112", prefix: netip.MustParsePrefix("fd00::/112"), size: 65535, wantPfx: "fd00::/112", firstOut: "fd00::1"},
		{name: "ipv6 /64 windowed", prefix: netip.MustParsePrefix("fd00:1::/64"), size: 65536, wantPfx: "fd00:1::/64", firstOut: "fd00:1::1"},
		{name: "ipv6 /0 windowed", prefix: netip.MustParsePrefix("::/0"), size: 65536, wantPfx: "::/0", firstOut: "::1"},
		{name: "invalid", prefix: netip.Prefix{}, wantErr: true},
		{name: "ipv4 /31", prefix: netip.MustParsePrefix("10.0.0.0/31"), wantErr: true},
		{name: "ipv4 /32", prefix: netip.MustParsePrefix("10.0.0.1/32"), wantErr: true},
		{name: "ipv6 /127", prefix: netip.MustParsePrefix("fd00::/127"), wantErr: true},
		{name: "ipv6 /128", prefix: netip.MustParsePrefix("fd00::1/128"), wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := NewRange(tt.prefix)
			if tt.wantErr {
				if !errors.Is(err, ErrInvalid) {
					t.Fatalf("err = %v, want ErrInvalid", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if r.Size() != tt.size || r.Used() != 0 || r.Prefix().String() != tt.wantPfx {
				t.Fatalf("size %d used %d prefix %s, want %d 0 %s", r.Size(), r.Used(), r.Prefix(), tt.size, tt.wantPfx)
			}
			a, err := r.AllocateNext()
			if err != nil || a.String() != tt.firstOut {
				t.Fatalf("AllocateNext = %v, %v; want %s", a, err, tt.firstOut)
			}
		})
	}
}

func TestRangeExhaustion(t *testing.T) {
	tests := []struct {
		name   string
		prefix string
		count  int
		never  []string
	}{
		{name: "ipv4 /29", prefix: "10.0.0.0/29", count: 6, never: []string{"10.0.0.0", "10.0.0.7"}},
		{name: "ipv4 /30", prefix: "192.168.1.8/30", count: 2, never: []string{"192.168.1.8", "192.168.1.11"}},
		{name: "ipv6 /125 keeps last", prefix: "fd00::/125", count: 7, never: []string{"fd00::"}},
		{name: "ipv4 /22 across words", prefix: "10.0.4.0/22", count: 1022, never: []string{"10.0.4.0", "10.0.7.255"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := NewRange(netip.MustParsePrefix(tt.prefix))
			if err != nil {
				t.Fatal(err)
			}
			seen := map[netip.Addr]bool{}
			for i := range tt.count {
				a, err := r.AllocateNext()
				if err != nil {
					t.Fatalf("allocation %d: %v", i, err)
				}
				if seen[a] || !r.Contains(a) || !r.Has(a) {
					t.Fatalf("allocation %d: %s duplicate, outside or not recorded", i, a)
				}
				seen[a] = true
			}
			for _, s := range tt.never {
				if seen[netip.MustParseAddr(s)] {
					t.Errorf("%s was handed out", s)
				}
			}
			if _, err := r.AllocateNext(); !errors.Is(err, ErrFull) {
				t.Fatalf("after %d allocations err = %v, want ErrFull", tt.count, err)
			}
			if r.Used() != r.Size() {
				t.Fatalf("used %d, size %d", r.Used(), r.Size())
			}
		})
	}
}

func TestRangeAllocate(t *testing.T) {
	tests := []struct {
		name    string
		prefix  string
		before  []string // allocated first
		ip      string
		wantErr error
	}{
		{name: "free", prefix: "10.0.0.0/24", ip: "10.0.0.7"},
		{name: "taken", prefix: "10.0.0.0/24", before: []string{"10.0.0.7"}, ip: "10.0.0.7", wantErr: ErrAllocated},
		{name: "outside", prefix: "10.0.0.0/24", ip: "10.0.1.7", wantErr: ErrNotInSubnet},
		{name: "other family", prefix: "10.0.0.0/24", ip: "fd00::7", wantErr: ErrNotInSubnet},
		{name: "network address", prefix: "10.0.0.0/24", ip: "10.0.0.0", wantErr: ErrExcluded},
		{name: "broadcast", prefix: "10.0.0.0/24", ip: "10.0.0.255", wantErr: ErrExcluded},
		{name: "ipv6 network address", prefix: "fd00::/120", ip: "fd00::", wantErr: ErrExcluded},
		{name: "ipv6 last address", prefix: "fd00::/120", ip: "fd00::ff"},
		{name: "ipv6 beyond window", prefix: "fd00::/64", ip: "fd00::ffff:ffff:ffff:ffff"},
		{name: "ipv6 beyond window taken", prefix: "fd00::/64", before: []string{"fd00::dead:beef"}, ip: "fd00::dead:beef", wantErr: ErrAllocated},
		{name: "ipv4 beyond window", prefix: "10.0.0.0/7", ip: "11.255.255.254"},
		{name: "ipv4 beyond window broadcast", prefix: "10.0.0.0/7", ip: "11.255.255.255", wantErr: ErrExcluded},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := NewRange(netip.MustParsePrefix(tt.prefix))
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range tt.before {
				if err := r.Allocate(netip.MustParseAddr(s)); err != nil {
					t.Fatal(err)
				}
			}
			a := netip.MustParseAddr(tt.ip)
			err = r.Allocate(a)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("err = %v, want %v", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !r.Has(a) {
				t.Fatal("not recorded")
			}
			r.Release(a)
			if r.Has(a) {
				t.Fatal("not released")
			}
			r.Release(a) // no-op
			r.Release(netip.MustParseAddr("192.0.2.1"))
			if r.Used() != 0 {
				t.Fatalf("used %d after release", r.Used())
			}
		})
	}
}

func TestRangeRoundRobin(t *testing.T) {
	r, err := NewRange(netip.MustParsePrefix("10.0.0.0/29"))
	if err != nil {
		t.Fatal(err)
	}
	// Allocate and release at once: each address comes once before the
	// first one comes back.
	var order []string
	for range 8 {
		a, err := r.AllocateNext()
		if err != nil {
			t.Fatal(err)
		}
		r.Release(a)
		order = append(order, a.String())
	}
	want := []string{"10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5", "10.0.0.6", "10.0.0.1", "10.0.0.2"}
	for i := range want {
		if order[i] != want[i] {
			t.Fatalf("order %v, want %v", order, want)
		}
	}

	t.Run("wrap finds bits before the cursor", func(t *testing.T) {
		r, _ := NewRange(netip.MustParsePrefix("10.0.0.0/24"))
		for range 254 {
			if _, err := r.AllocateNext(); err != nil {
				t.Fatal(err)
			}
		}
		r.Release(netip.MustParseAddr("10.0.0.3"))
		r.Release(netip.MustParseAddr("10.0.0.200"))
		for _, want := range []string{"10.0.0.3", "10.0.0.200"} {
			if a, err := r.AllocateNext(); err != nil || a.String() != want {
				t.Fatalf("got %v, %v; want %s", a, err, want)
			}
		}
	})
}

// TestRangeModel compares a Range with a map under random operations,
// including the round robin order.
func TestRangeModel(t *testing.T) {
	for _, pfx := range []string{"10.0.0.0/22", "fd00::/118", "10.0.0.0/25", "fd00::/64"} {
		t.Run(pfx, func(t *testing.T) {
			p := netip.MustParsePrefix(pfx)
			r, err := NewRange(p)
			if err != nil {
				t.Fatal(err)
			}
			rng := rand.New(rand.NewPCG(1, 2))
			size := min(r.Size(), 1200) // the part of the window the test uses
			held := map[int]bool{}
			next := 0
			for step := range 20000 {
				i := rng.IntN(size)
				a := r.addrAt(i)
				switch rng.IntN(3) {
				case 0:
					err := r.Allocate(a)
					if held[i] != errors.Is(err, ErrAllocated) || (!held[i] && err != nil) {
						t.Fatalf("step %d: Allocate(%s) = %v, held %v", step, a, err, held[i])
					}
					held[i] = true
				case 1:
					r.Release(a)
					delete(held, i)
				case 2:
					if r.Size() > size {
						continue // the model only knows the first part
					}
					got, err := r.AllocateNext()
					if len(held) == size {
						if !errors.Is(err, ErrFull) {
							t.Fatalf("step %d: full range: %v, %v", step, got, err)
						}
						continue
					}
					want := next
					for held[want] {
						want = (want + 1) % size
					}
					if err != nil || got != r.addrAt(want) {
						t.Fatalf("step %d: AllocateNext = %v, %v; want %s", step, got, err, r.addrAt(want))
					}
					held[want] = true
					next = (want + 1) % size
				}
				if r.Used() != len(held) {
					t.Fatalf("step %d: used %d, model %d", step, r.Used(), len(held))
				}
			}
			for i := range size {
				if r.Has(r.addrAt(i)) != held[i] {
					t.Fatalf("%s: Has %v, model %v", r.addrAt(i), !held[i], held[i])
				}
			}
		})
	}
}

func TestRangeTakePrefix(t *testing.T) {
	tests := []struct {
		name   string
		range_ string
		take   string
		want   int
	}{
		{name: "inside", range_: "10.0.0.0/22", take: "10.0.1.0/26", want: 64},
		{name: "holds network address", range_: "10.0.0.0/22", take: "10.0.0.0/30", want: 3},
		{name: "holds broadcast", range_: "10.0.0.0/22", take: "10.0.3.252/30", want: 3},
		{name: "whole", range_: "10.0.0.0/22", take: "10.0.0.0/22", want: 1022},
		{name: "larger than range", range_: "10.0.0.0/22", take: "10.0.0.0/8", want: 1022},
		{name: "single", range_: "10.0.0.0/22", take: "10.0.2.7/32", want: 1},
		{name: "disjoint", range_: "10.0.0.0/22", take: "10.0.4.0/24", want: 0},
		{name: "other family", range_: "10.0.0.0/22", take: "fd00::/64", want: 0},
		{name: "ipv6 beyond window", range_: "fd00::/64", take: "fd00::1:0:0/96", want: 0},
		{name: "ipv6 straddling window", range_: "fd00::/64", take: "fd00::1:0/112", want: 1},
		{name: "ipv6 upper half", range_: "fd00::/64", take: "fd00::8000/113", want: 0x8000},
		{name: "ipv6 all", range_: "fd00::/64", take: "fd00::/64", want: 65536},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := NewRange(netip.MustParsePrefix(tt.range_))
			if err != nil {
				t.Fatal(err)
			}
			p := netip.MustParsePrefix(tt.take)
			if got := r.takePrefix(p); got != tt.want || r.Used() != tt.want {
				t.Fatalf("takePrefix = %d, used %d; want %d", got, r.Used(), tt.want)
			}
			if got := r.takePrefix(p); got != 0 {
				t.Fatalf("second takePrefix = %d, want 0", got)
			}
			// Every bit agrees with the prefix.
			for i := range r.Size() {
				if a := r.addrAt(i); r.Has(a) != p.Contains(a) && p.Bits() >= r.Prefix().Bits() {
					t.Fatalf("%s: Has %v", a, r.Has(a))
				}
			}
			if r.Used() < r.Size() {
				a, err := r.AllocateNext()
				if err != nil || (p.Contains(a) && p.Bits() >= r.Prefix().Bits()) {
					t.Fatalf("AllocateNext = %v, %v inside the taken prefix", a, err)
				}
			}
		})
	}
}

func TestRangeIPv6Window(t *testing.T) {
	r, err := NewRange(netip.MustParsePrefix("fd00:10::/64"))
	if err != nil {
		t.Fatal(err)
	}
	if len(r.free) != 1024 || len(r.summary) != 16 {
		t.Fatalf("bitmap of %d words and summary of %d words; want 1024 and 16", len(r.free), len(r.summary))
	}
	far := netip.MustParseAddr("fd00:10::abcd:1234:5678:9abc")
	if err := r.Allocate(far); err != nil {
		t.Fatal(err)
	}
	if err := r.Allocate(far); !errors.Is(err, ErrAllocated) {
		t.Fatalf("second Allocate = %v, want ErrAllocated", err)
	}
	if !r.Has(far) || r.Used() != 0 || len(r.sparse) != 1 {
		t.Fatalf("has %v used %d sparse %d", r.Has(far), r.Used(), len(r.sparse))
	}
	r.Release(far)
	if r.Has(far) || len(r.sparse) != 0 {
		t.Fatal("not released")
	}
	last := r.addrAt(r.Size() - 1)
	if last.String() != "fd00:10::1:0" {
		t.Fatalf("last window address %s", last)
	}
}
