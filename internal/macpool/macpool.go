// Package macpool is the in-memory core of a KubeMacPool-style MAC address
// pool: it hands out MACs from a configured range to VM owners, honours
// explicitly requested MACs, and refuses to give one MAC to two VMs.
//
// Two VMs with the same MAC on one L2 segment break each other silently
// (ARP and FDB flapping, DHCP leases stolen), and KubeVirt itself does not
// prevent it. The pool is the single place that knows which MAC belongs to
// which VM. It keeps no state of its own on disk: like KubeMacPool, the VM
// specs are the source of truth and a restarted controller re-registers
// them with Reserve.
//
// The range can span up to 2^48 addresses, so the pool never materialises
// it: held MACs live in a map, and allocation scans from a round-robin
// cursor. Every address the scan looks at is either free or held, so a scan
// visits at most (held MACs + 1) addresses before it finds a free one.
package macpool

import (
	"errors"
	"fmt"
	"math"
	"net"
	"slices"
	"sync"

	kubevirtv1 "kvnet.io/kvnet/api/kubevirt/v1"
)

var (
	// ErrExhausted means every address of the range is held.
	ErrExhausted = errors.New("MAC pool exhausted")
	// ErrConflict means another owner already holds the MAC. Errors
	// wrapping it are *ConflictError and name the holder.
	ErrConflict = errors.New("MAC address already in use")
	// ErrOutOfRange means a range whose start is after its end.
	ErrOutOfRange = errors.New("invalid MAC range")
	// ErrInvalid means a malformed or unusable MAC, range bound or owner.
	ErrInvalid = errors.New("invalid MAC address")
)

// reservedMAC is 02:00:00:00:00:00, the MAC KubeVirt gives the masquerade
// bridge in every launcher pod. It sits at the start of the default range,
// so the pool must skip it rather than rely on the range excluding it.
const reservedMAC uint64 = 0x02_00_00_00_00_00

const (
	macLen    = 6
	blockBits = 40 // bits below the first octet
	// multicastBit is the I/G bit of the first octet; MACs with it set are
	// group addresses and cannot be a NIC's address.
	multicastBit uint64 = 1 << blockBits
)

// ConflictError reports a MAC held by another owner. Callers that know the
// interface can build a fuller message, e.g.
//
//	MAC 02:00:00:00:00:10 of interface "default" is already used by VM default/vm-a
//
// from MAC and Holder.
type ConflictError struct {
	MAC    net.HardwareAddr
	Holder string
}

func (e *ConflictError) Error() string {
	return fmt.Sprintf("%v: MAC %s is already used by %s", ErrConflict, e.MAC, e.Holder)
}

// Unwrap makes errors.Is(err, ErrConflict) true.
func (e *ConflictError) Unwrap() error { return ErrConflict }

// Pool is a MAC address pool. It is safe for concurrent use.
type Pool struct {
	mu sync.RWMutex

	start, end uint64 // inclusive
	// size is how many addresses of [start, end] the pool can hand out:
	// unicast and not reservedMAC.
	size uint64
	// next is the round-robin cursor: the first candidate of the next scan.
	// It may point past end or at an unusable address; the scan fixes it.
	next uint64

	holders map[uint64]string
	owned   map[string][]uint64
	// usedInRange counts held MACs that are allocatable in the current
	// range, so free = size - usedInRange without a scan.
	usedInRange uint64
}

// New returns a pool that hands out MACs from the inclusive range
// [start, end]. Both bounds must be 6-byte unicast MACs and start <= end.
// 02:00:00:00:00:00 is never handed out, even inside the range.
func New(start, end net.HardwareAddr) (*Pool, error) {
	p := &Pool{
		holders: map[uint64]string{},
		owned:   map[string][]uint64{},
	}
	if err := p.SetRange(start, end); err != nil {
		return nil, err
	}
	return p, nil
}

// ParseRange parses range bounds as written in KubeMacPool's ConfigMap
// (RANGE_START, RANGE_END) and validates them like New.
func ParseRange(start, end string) (net.HardwareAddr, net.HardwareAddr, error) {
	s, err := net.ParseMAC(start)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: range start %q: %v", ErrInvalid, start, err)
	}
	e, err := net.ParseMAC(end)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: range end %q: %v", ErrInvalid, end, err)
	}
	if _, _, err := checkRange(s, e); err != nil {
		return nil, nil, err
	}
	return s, e, nil
}

// SetRange replaces the range, as on a live ConfigMap reload. Existing
// allocations are kept even if they now fall outside: the VMs still use
// them. New allocations come from the new range. The cursor stays where it
// is when it lies inside the new range, so recently released MACs are not
// handed out again at once; otherwise it moves to the new start.
func (p *Pool) SetRange(start, end net.HardwareAddr) error {
	s, e, err := checkRange(start, end)
	if err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.start, p.end = s, e
	p.size = countUnicast(s, e)
	if s <= reservedMAC && reservedMAC <= e {
		p.size--
	}
	p.usedInRange = 0
	for v := range p.holders {
		if p.allocatable(v) {
			p.usedInRange++
		}
	}
	if p.next < s || p.next > e {
		p.next = s
	}
	return nil
}

// checkRange validates range bounds and returns them as integers.
func checkRange(start, end net.HardwareAddr) (uint64, uint64, error) {
	s, err := bound("start", start)
	if err != nil {
		return 0, 0, err
	}
	e, err := bound("end", end)
	if err != nil {
		return 0, 0, err
	}
	if s > e {
		return 0, 0, fmt.Errorf("%w: range start %s is after range end %s", ErrOutOfRange, start, end)
	}
	return s, e, nil
}

func bound(name string, mac net.HardwareAddr) (uint64, error) {
	if len(mac) != macLen {
		return 0, fmt.Errorf("%w: range %s %q: want a 6-byte MAC, got %d bytes", ErrInvalid, name, mac.String(), len(mac))
	}
	v := toUint(mac)
	if v&multicastBit != 0 {
		return 0, fmt.Errorf("%w: range %s %s is a multicast address", ErrInvalid, name, mac)
	}
	return v, nil
}

// Allocate hands owner the next free MAC at or after the cursor, wrapping
// at the end of the range, and moves the cursor past it. Moving on instead
// of reusing the lowest free MAC keeps a just-released MAC out of
// circulation for as long as possible, because switches, ARP caches and
// DHCP servers may still map it to the old VM.
func (p *Pool) Allocate(owner string) (net.HardwareAddr, error) {
	if owner == "" {
		return nil, fmt.Errorf("%w: owner must not be empty", ErrInvalid)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.usedInRange >= p.size {
		return nil, fmt.Errorf("%w: all %d MACs of range %s-%s are in use", ErrExhausted, p.size, toMAC(p.start), toMAC(p.end))
	}
	// At least one allocatable address is free, and each allocatable
	// address the loop rejects is held, so it ends within usedInRange+1
	// candidates. The bound only guards against a broken invariant.
	v := p.next
	for range p.usedInRange + 1 {
		v = p.firstAllocatableFrom(v)
		if _, held := p.holders[v]; !held {
			p.hold(owner, v)
			p.next = v + 1
			return toMAC(v), nil
		}
		v++
	}
	return nil, fmt.Errorf("%w: no free MAC found in range %s-%s after %d candidates", ErrExhausted, toMAC(p.start), toMAC(p.end), p.usedInRange+1)
}

// firstAllocatableFrom returns the first allocatable address at or after v,
// wrapping to start. It jumps over multicast blocks whole, so it is O(1)
// however large the range. The caller guarantees size > 0.
func (p *Pool) firstAllocatableFrom(v uint64) uint64 {
	for {
		switch {
		case v > p.end || v < p.start:
			v = p.start
		case v&multicastBit != 0:
			// Next block whose first octet is even.
			v = (v>>blockBits + 1) << blockBits
		case v == reservedMAC:
			v++
		default:
			return v
		}
	}
}

// Reserve records that owner uses mac, as for a VM that asks for a MAC
// explicitly or a VM re-registered at start-up. The MAC may lie in or out
// of the range. Reserving a MAC the owner already holds is a no-op, so
// webhook retries and resyncs are safe; a MAC held by another owner is a
// *ConflictError naming that owner.
func (p *Pool) Reserve(owner string, mac net.HardwareAddr) error {
	if owner == "" {
		return fmt.Errorf("%w: owner must not be empty", ErrInvalid)
	}
	if len(mac) != macLen {
		return fmt.Errorf("%w: MAC %q of %s: want a 6-byte MAC, got %d bytes", ErrInvalid, mac.String(), owner, len(mac))
	}
	v := toUint(mac)
	if v == reservedMAC {
		return fmt.Errorf("%w: MAC %s of %s is reserved for KubeVirt's masquerade bridge", ErrInvalid, mac, owner)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if holder, held := p.holders[v]; held {
		if holder == owner {
			return nil
		}
		return &ConflictError{MAC: toMAC(v), Holder: holder}
	}
	p.hold(owner, v)
	return nil
}

// ReleaseOwner frees every MAC of owner, as when its VM is deleted.
func (p *Pool) ReleaseOwner(owner string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, v := range p.owned[owner] {
		p.drop(v)
	}
	delete(p.owned, owner)
}

// Release frees mac if owner holds it, as when an interface is removed. A
// MAC held by someone else is left alone: a stale caller must not free a
// MAC that has moved on to another VM.
func (p *Pool) Release(owner string, mac net.HardwareAddr) {
	if len(mac) != macLen {
		return
	}
	v := toUint(mac)
	p.mu.Lock()
	defer p.mu.Unlock()
	if holder, held := p.holders[v]; !held || holder != owner {
		return
	}
	p.drop(v)
	p.disown(owner, v)
}

// Transfer moves mac from owner from to owner to, in one step (no other
// owner can take it in between), and reports whether it did: it does
// nothing unless from holds mac.
func (p *Pool) Transfer(from, to string, mac net.HardwareAddr) bool {
	if len(mac) != macLen || to == "" {
		return false
	}
	v := toUint(mac)
	p.mu.Lock()
	defer p.mu.Unlock()
	if holder, held := p.holders[v]; !held || holder != from {
		return false
	}
	p.disown(from, v)
	p.holders[v] = to
	p.owned[to] = append(p.owned[to], v)
	return true
}

// CheckExplicit says why a VM may not ask for mac: not MAC-48, or the
// MAC KubeVirt gives the masquerade bridge.
func CheckExplicit(mac net.HardwareAddr) error {
	if len(mac) != macLen {
		return fmt.Errorf("%w: MAC %q: want a 6-byte MAC, got %d bytes", ErrInvalid, mac.String(), len(mac))
	}
	if toUint(mac) == reservedMAC {
		return fmt.Errorf("%w: MAC %s is reserved for KubeVirt's masquerade bridge", ErrInvalid, mac)
	}
	return nil
}

// Set makes owner the holder of mac whoever held it before, as when the
// authoritative record of the MAC (kvnet's reservation in the API) names
// owner. 02:00:00:00:00:00 and malformed MACs are ignored.
func (p *Pool) Set(owner string, mac net.HardwareAddr) {
	if owner == "" || len(mac) != macLen {
		return
	}
	v := toUint(mac)
	if v == reservedMAC {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if holder, held := p.holders[v]; held {
		if holder == owner {
			return
		}
		p.drop(v)
		p.disown(holder, v)
	}
	p.hold(owner, v)
}

// Forget frees mac whoever holds it, as when no record of it is left.
func (p *Pool) Forget(mac net.HardwareAddr) {
	if len(mac) != macLen {
		return
	}
	v := toUint(mac)
	p.mu.Lock()
	defer p.mu.Unlock()
	if holder, held := p.holders[v]; held {
		p.drop(v)
		p.disown(holder, v)
	}
}

// Holder returns the owner of mac.
func (p *Pool) Holder(mac net.HardwareAddr) (string, bool) {
	if len(mac) != macLen {
		return "", false
	}
	p.mu.RLock()
	defer p.mu.RUnlock()
	owner, ok := p.holders[toUint(mac)]
	return owner, ok
}

// MACs returns the MACs owner holds, in ascending order.
func (p *Pool) MACs(owner string) []net.HardwareAddr {
	p.mu.RLock()
	vs := slices.Clone(p.owned[owner])
	p.mu.RUnlock()
	slices.Sort(vs)
	out := make([]net.HardwareAddr, 0, len(vs))
	for _, v := range vs {
		out = append(out, toMAC(v))
	}
	return out
}

// Stats returns how many MACs the current range can hand out (without
// 02:00:00:00:00:00 and multicast addresses) and how many of those are held.
// MACs held outside the range, explicit or left from an earlier range, are
// not counted, so size-used is what Allocate can still hand out. size is
// capped at math.MaxInt on 32-bit platforms.
func (p *Pool) Stats() (size, used int) {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return clampInt(p.size), clampInt(p.usedInRange)
}

// hold records v for owner; p.mu must be held for writing.
func (p *Pool) hold(owner string, v uint64) {
	p.holders[v] = owner
	p.owned[owner] = append(p.owned[owner], v)
	if p.allocatable(v) {
		p.usedInRange++
	}
}

// disown removes v from owner's list; p.mu must be held.
func (p *Pool) disown(owner string, v uint64) {
	macs := p.owned[owner]
	i := slices.Index(macs, v)
	if i < 0 {
		return
	}
	macs = slices.Delete(macs, i, i+1)
	if len(macs) == 0 {
		delete(p.owned, owner)
	} else {
		p.owned[owner] = macs
	}
}

// drop forgets v's holder but not the owner's list; p.mu must be held.
func (p *Pool) drop(v uint64) {
	delete(p.holders, v)
	if p.allocatable(v) {
		p.usedInRange--
	}
}

// allocatable reports whether Allocate could hand out v in the current
// range.
func (p *Pool) allocatable(v uint64) bool {
	return v >= p.start && v <= p.end && v&multicastBit == 0 && v != reservedMAC
}

// countUnicast returns the number of unicast addresses in [lo, hi].
func countUnicast(lo, hi uint64) uint64 {
	return unicastBelow(hi+1) - unicastBelow(lo)
}

// unicastBelow returns the number of unicast addresses in [0, x): the full
// blocks with an even first octet below x, plus the part of x's own block
// when that block is unicast.
func unicastBelow(x uint64) uint64 {
	block := x >> blockBits
	n := (block + 1) / 2 << blockBits
	if block%2 == 0 {
		n += x & (1<<blockBits - 1)
	}
	return n
}

func toUint(mac net.HardwareAddr) uint64 {
	var v uint64
	for _, b := range mac[:macLen] {
		v = v<<8 | uint64(b)
	}
	return v
}

func toMAC(v uint64) net.HardwareAddr {
	mac := make(net.HardwareAddr, macLen)
	for i := macLen - 1; i >= 0; i-- {
		mac[i] = byte(v)
		v >>= 8
	}
	return mac
}

func clampInt(v uint64) int {
	if v > math.MaxInt {
		return math.MaxInt
	}
	return int(v)
}

// Considered reports whether iface gets a MAC from the pool: masquerade, or
// any interface on a multus network (KubeMacPool's rule; bridge, passt and
// l2bridge on the pod network keep the pod's MAC).
func Considered(iface kubevirtv1.Interface, networks []kubevirtv1.Network) bool {
	if iface.Masquerade != nil {
		return true
	}
	for _, n := range networks {
		if n.Name == iface.Name {
			return n.Multus != nil
		}
	}
	return false
}
