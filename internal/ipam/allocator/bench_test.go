package allocator

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"
)

// fullRange returns a /16 with all but free addresses allocated, the free
// ones spread at random so that AllocateNext must skip full words.
func fullRange(b *testing.B, free int) *Range {
	b.Helper()
	r, err := NewRange(netip.MustParsePrefix("10.1.0.0/16"))
	if err != nil {
		b.Fatal(err)
	}
	for r.Used() < r.Size() {
		if _, err := r.AllocateNext(); err != nil {
			b.Fatal(err)
		}
	}
	rng := rand.New(rand.NewPCG(7, 7))
	for r.Size()-r.Used() < free {
		r.Release(r.addrAt(rng.IntN(r.Size())))
	}
	return r
}

// BenchmarkAllocate allocates and releases on a /16 that is 99% full.
func BenchmarkAllocate(b *testing.B) {
	r := fullRange(b, 655)
	b.ReportAllocs()
	for b.Loop() {
		a, err := r.AllocateNext()
		if err != nil {
			b.Fatal(err)
		}
		r.Release(a)
	}
}

// BenchmarkAllocateOneFree is the worst case: a single free address, so
// every AllocateNext wraps around the whole summary.
func BenchmarkAllocateOneFree(b *testing.B) {
	r := fullRange(b, 1)
	b.ReportAllocs()
	for b.Loop() {
		a, err := r.AllocateNext()
		if err != nil {
			b.Fatal(err)
		}
		r.Release(a)
	}
}

// BenchmarkNetworkAllocate allocates and releases for distinct owners on a
// /16 network that is half full; it includes the locking, the maps and the
// copies handed to the caller.
func BenchmarkNetworkAllocate(b *testing.B) {
	n, err := NewNetwork(Config{Name: "bench", Subnets: []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16")}, Primary: true})
	if err != nil {
		b.Fatal(err)
	}
	size, _ := n.Stats()
	for i := range size / 2 {
		if _, err := n.Allocate(Request{Owner: fmt.Sprint("fill/", i)}); err != nil {
			b.Fatal(err)
		}
	}
	owners := make([]string, 4096)
	for i := range owners {
		owners[i] = fmt.Sprint("pod/", i)
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		owner := owners[i%len(owners)]
		i++
		if _, err := n.Allocate(Request{Owner: owner}); err != nil {
			b.Fatal(err)
		}
		n.Release(owner)
	}
}
