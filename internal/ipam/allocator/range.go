package allocator

import (
	"encoding/binary"
	"fmt"
	"math/bits"
	"net/netip"
)

// How many host addresses a Range tracks in its bitmap at most. A /64 would
// need 2^64 bits, so large subnets get a window of their first addresses:
// automatic allocation comes from the window, and static allocations beyond
// it go to a sparse set. IPv4 gets a larger window so that a whole /8 is
// tracked (2 MiB); only shorter IPv4 prefixes are windowed.
const (
	maxWindow6 = 1 << 16
	maxWindow4 = 1 << 24
)

// Range allocates the addresses of one subnet with a bitmap.
//
// Bit i of the bitmap stands for address network+1+i; the window covers the
// first Size() host addresses and never holds the network address nor the
// IPv4 broadcast address. A second level, one bit per bitmap word that
// still has a free bit, lets AllocateNext skip full stretches in a few word
// reads, so a nearly full /16 allocates as fast as an empty one.
//
// A Range is not safe for concurrent use; Network serializes access to its
// ranges.
type Range struct {
	prefix netip.Prefix
	is4    bool
	base   u128 // network address
	last   u128 // last address of the prefix (IPv4 broadcast)
	size   int  // bits in the window

	used    int      // allocated bits in the window
	free    []uint64 // bit set: the address is free
	summary []uint64 // bit w set: free[w] != 0
	next    int      // bit where AllocateNext starts looking (round robin)
	// sparse holds allocated addresses beyond the window; it stays nil
	// unless someone asks for such an address statically.
	sparse map[netip.Addr]struct{}
}

// NewRange returns an empty Range of p, masked. Prefixes without two usable
// addresses (IPv4 /31 and /32, IPv6 /127 and /128) are too small.
func NewRange(p netip.Prefix) (*Range, error) {
	if !p.IsValid() {
		return nil, fmt.Errorf("prefix %q is not a valid CIDR: %w", p.String(), ErrInvalid)
	}
	p = p.Masked()
	hostBits := p.Addr().BitLen() - p.Bits()
	if hostBits < 2 {
		return nil, fmt.Errorf("prefix %q is too small to allocate from: %w", p.String(), ErrInvalid)
	}
	r := &Range{prefix: p, is4: p.Addr().Is4(), base: toU128(p.Addr())}
	r.last = r.base.or(hostMask(hostBits))
	r.size = maxWindow6
	if r.is4 {
		r.size = maxWindow4
	}
	// Beyond 25 host bits every subnet fills either window.
	if hostBits <= 25 {
		hosts := 1<<hostBits - 1 // all but the network address
		if r.is4 {
			hosts-- // nor the broadcast address
		}
		r.size = min(r.size, hosts)
	}

	words := (r.size + 63) / 64
	r.free = make([]uint64, words)
	for w := range r.free {
		r.free[w] = ^uint64(0)
	}
	if tail := r.size % 64; tail != 0 {
		r.free[words-1] = 1<<tail - 1
	}
	r.summary = make([]uint64, (words+63)/64)
	for w := range words {
		r.summary[w>>6] |= 1 << (w & 63)
	}
	return r, nil
}

// Prefix returns the subnet of r.
func (r *Range) Prefix() netip.Prefix { return r.prefix }

// Size returns the number of addresses tracked in the bitmap: every host
// address of the subnet, or the first 65,536 of a large IPv6 subnet.
func (r *Range) Size() int { return r.size }

// Used returns the number of allocated addresses in the bitmap. Static
// allocations beyond the window are not counted, so Size()-Used() is what
// AllocateNext can still hand out.
func (r *Range) Used() int { return r.used }

// Contains reports whether a is inside the prefix.
func (r *Range) Contains(a netip.Addr) bool { return r.prefix.Contains(a) }

// Has reports whether a is allocated.
func (r *Range) Has(a netip.Addr) bool {
	if !r.prefix.Contains(a) {
		return false
	}
	if i, ok := r.offset(a); ok {
		return r.free[i>>6]&(1<<(i&63)) == 0
	}
	_, ok := r.sparse[a]
	return ok
}

// AllocateNext allocates the first free address after the one it handed
// out last, wrapping at the end, so a just-released address is not reused
// at once (a peer may still have it in its ARP or neighbour cache).
func (r *Range) AllocateNext() (netip.Addr, error) {
	if r.used == r.size {
		return netip.Addr{}, fmt.Errorf("subnet %s: %w", r.prefix, ErrFull)
	}
	i := r.findFree(r.next)
	r.take(i)
	r.next = i + 1
	if r.next == r.size {
		r.next = 0
	}
	return r.addrAt(i), nil
}

// Allocate allocates a, typically an address someone asked for.
func (r *Range) Allocate(a netip.Addr) error {
	if !r.prefix.Contains(a) {
		return fmt.Errorf("ip %s is outside %s: %w", a, r.prefix, ErrNotInSubnet)
	}
	if r.isNetworkOrBroadcast(a) {
		return fmt.Errorf("ip %s is the network or broadcast address of %s: %w", a, r.prefix, ErrExcluded)
	}
	if i, ok := r.offset(a); ok {
		if r.free[i>>6]&(1<<(i&63)) == 0 {
			return fmt.Errorf("ip %s: %w", a, ErrAllocated)
		}
		r.take(i)
		return nil
	}
	if _, ok := r.sparse[a]; ok {
		return fmt.Errorf("ip %s: %w", a, ErrAllocated)
	}
	if r.sparse == nil {
		r.sparse = map[netip.Addr]struct{}{}
	}
	r.sparse[a] = struct{}{}
	return nil
}

// Release frees a. It is a no-op when a is free or outside r.
func (r *Range) Release(a netip.Addr) {
	if !r.prefix.Contains(a) {
		return
	}
	if i, ok := r.offset(a); ok {
		if r.free[i>>6]&(1<<(i&63)) == 0 {
			r.put(i)
		}
		return
	}
	delete(r.sparse, a)
}

// isNetworkOrBroadcast reports whether a, inside r, is never allocatable.
// IPv6 has no broadcast address, so its last address is a host.
func (r *Range) isNetworkOrBroadcast(a netip.Addr) bool {
	v := toU128(a)
	return v == r.base || (r.is4 && v == r.last)
}

// offset returns the bit of a, which must be inside r, or false when a is
// not in the window.
func (r *Range) offset(a netip.Addr) (int, bool) {
	d := toU128(a).sub(r.base)
	if d.hi != 0 || d.lo == 0 || d.lo > uint64(r.size) {
		return 0, false
	}
	return int(d.lo - 1), true
}

// addrAt returns the address of bit i.
func (r *Range) addrAt(i int) netip.Addr {
	v := r.base.add(uint64(i) + 1)
	if r.is4 {
		var b [4]byte
		binary.BigEndian.PutUint32(b[:], uint32(v.lo))
		return netip.AddrFrom4(b)
	}
	var b [16]byte
	binary.BigEndian.PutUint64(b[:8], v.hi)
	binary.BigEndian.PutUint64(b[8:], v.lo)
	return netip.AddrFrom16(b)
}

// findFree returns the first free bit at or after from, wrapping around.
// The caller makes sure there is one.
func (r *Range) findFree(from int) int {
	w := from >> 6
	if m := r.free[w] &^ (1<<(from&63) - 1); m != 0 {
		return w<<6 + bits.TrailingZeros64(m)
	}
	w = r.nextWord(w + 1)
	if w < 0 {
		// Wrap; this may find the bits of from's word below from.
		w = r.nextWord(0)
	}
	return w<<6 + bits.TrailingZeros64(r.free[w])
}

// nextWord returns the first bitmap word at or after w with a free bit, or
// -1 if there is none before the end.
func (r *Range) nextWord(w int) int {
	for s := w >> 6; s < len(r.summary); s++ {
		m := r.summary[s]
		if s == w>>6 {
			m &^= 1<<(w&63) - 1
		}
		if m != 0 {
			return s<<6 + bits.TrailingZeros64(m)
		}
	}
	return -1
}

// take marks free bit i allocated.
func (r *Range) take(i int) {
	w := i >> 6
	r.free[w] &^= 1 << (i & 63)
	if r.free[w] == 0 {
		r.summary[w>>6] &^= 1 << (w & 63)
	}
	r.used++
}

// put marks allocated bit i free.
func (r *Range) put(i int) {
	w := i >> 6
	if r.free[w] == 0 {
		r.summary[w>>6] |= 1 << (w & 63)
	}
	r.free[w] |= 1 << (i & 63)
	r.used--
}

// takeSpan allocates bits [lo, hi) a word at a time and returns how many
// were free, so that blocking a large excluded range stays cheap.
func (r *Range) takeSpan(lo, hi int) int {
	n := 0
	for i := lo; i < hi; {
		w := i >> 6
		end := min(hi, (w+1)<<6)
		m := ^uint64(0) << (i & 63)
		if e := end - w<<6; e < 64 {
			m &= 1<<e - 1
		}
		got := bits.OnesCount64(r.free[w] & m)
		r.free[w] &^= m
		if r.free[w] == 0 {
			r.summary[w>>6] &^= 1 << (w & 63)
		}
		r.used += got
		n += got
		i = end
	}
	return n
}

// takePrefix allocates the part of p that lies in the window and returns
// how many addresses were free. Parts beyond the window are not recorded:
// Network checks its excluded and reserved prefixes itself.
func (r *Range) takePrefix(p netip.Prefix) int {
	p = p.Masked()
	if !p.IsValid() || !p.Overlaps(r.prefix) {
		return 0
	}
	lo := toU128(p.Addr())
	hi := lo.or(hostMask(p.Addr().BitLen() - p.Bits()))
	if p.Bits() < r.prefix.Bits() {
		lo, hi = r.base, r.last // p holds all of r
	}
	// The window holds offsets d = address - network in [1, size].
	dlo, dhi := lo.sub(r.base), hi.sub(r.base)
	if dlo.hi != 0 || dlo.lo > uint64(r.size) {
		return 0
	}
	start := max(dlo.lo, 1)
	end := uint64(r.size)
	if dhi.hi == 0 {
		end = min(end, dhi.lo)
	}
	if end < start {
		return 0
	}
	return r.takeSpan(int(start-1), int(end))
}

// u128 is an address as a 128-bit number (IPv4 in the low 32 bits), for
// the arithmetic netip does not offer.
type u128 struct{ hi, lo uint64 }

func toU128(a netip.Addr) u128 {
	if a.Is4() {
		b := a.As4()
		return u128{lo: uint64(binary.BigEndian.Uint32(b[:]))}
	}
	b := a.As16()
	return u128{hi: binary.BigEndian.Uint64(b[:8]), lo: binary.BigEndian.Uint64(b[8:])}
}

// hostMask returns a number with the low h bits set.
func hostMask(h int) u128 {
	switch {
	case h >= 128:
		return u128{^uint64(0), ^uint64(0)}
	case h >= 64:
		return u128{1<<(h-64) - 1, ^uint64(0)}
	default:
		return u128{0, 1<<h - 1}
	}
}

func (x u128) or(y u128) u128 { return u128{x.hi | y.hi, x.lo | y.lo} }

func (x u128) add(n uint64) u128 {
	lo, carry := bits.Add64(x.lo, n, 0)
	return u128{x.hi + carry, lo}
}

func (x u128) sub(y u128) u128 {
	lo, borrow := bits.Sub64(x.lo, y.lo, 0)
	hi, _ := bits.Sub64(x.hi, y.hi, borrow)
	return u128{hi, lo}
}
