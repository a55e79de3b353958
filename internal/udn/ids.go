package udn

import (
	"errors"
	"fmt"
	"sync"
)

// MaxNetworkID is the largest network ID. IDs number VXLAN segments and
// per-network addresses; 0 is the cluster default network.
const MaxNetworkID = 4095

// ErrNoNetworkIDs is returned when all network IDs are in use.
var ErrNoNetworkIDs = errors.New("all network IDs (1-4095) are in use")

// IDAllocator hands out network IDs by network name. It is safe for
// concurrent use.
type IDAllocator struct {
	mu     sync.Mutex     // guards following
	byName map[string]int // network name -> ID
	byID   map[int]string // ID -> network name
	next   int            // where the next search starts
}

// NewIDAllocator returns an empty allocator.
func NewIDAllocator() *IDAllocator {
	return &IDAllocator{byName: map[string]int{}, byID: map[int]string{}, next: 1}
}

// Reserve records that name holds id (read back from a NAD at start-up).
// It fails when id is out of range or held by another network.
func (a *IDAllocator) Reserve(name string, id int) error {
	if id < 1 || id > MaxNetworkID {
		return fmt.Errorf("reserve network ID %d for %q: out of range 1-%d", id, name, MaxNetworkID)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if holder, ok := a.byID[id]; ok && holder != name {
		return fmt.Errorf("reserve network ID %d for %q: held by %q", id, name, holder)
	}
	if old, ok := a.byName[name]; ok && old != id {
		return fmt.Errorf("reserve network ID %d for %q: network already has ID %d", id, name, old)
	}
	a.byName[name] = id
	a.byID[id] = name
	return nil
}

// Allocate returns name's ID, allocating the next free one if it has none.
func (a *IDAllocator) Allocate(name string) (int, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if id, ok := a.byName[name]; ok {
		return id, nil
	}
	for i := range MaxNetworkID {
		id := (a.next-1+i)%MaxNetworkID + 1
		if _, taken := a.byID[id]; !taken {
			a.byName[name] = id
			a.byID[id] = name
			a.next = id%MaxNetworkID + 1
			return id, nil
		}
	}
	return 0, ErrNoNetworkIDs
}

// Release frees name's ID, if any.
func (a *IDAllocator) Release(name string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if id, ok := a.byName[name]; ok {
		delete(a.byName, name)
		delete(a.byID, id)
	}
}

// ID returns name's ID and whether it has one.
func (a *IDAllocator) ID(name string) (int, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	id, ok := a.byName[name]
	return id, ok
}
