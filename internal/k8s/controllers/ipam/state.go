package ipam

import (
	"context"
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"sync"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/event"

	"kvnet.io/kvnet/internal/ipam"
	"kvnet.io/kvnet/internal/ipam/allocator"
	"kvnet.io/kvnet/internal/netconf"
)

// Owner keys of allocations. A claim's IPs belong to the claim, so the two
// launcher pods of a migrating VM share them and deleting a pod frees
// nothing; a pod without a claim owns its IPs.
func podOwner(uid types.UID) string     { return "pod/" + string(uid) }
func claimOwner(ns, name string) string { return "claim/" + ns + "/" + name }

// podRecord is what a pod owns, so it can be released when the pod is gone.
type podRecord struct {
	uid      types.UID
	networks []string // network names where the pod owns an allocation
}

// state holds every network's allocator and who owns what. Safe for
// concurrent use; each allocator has its own lock.
type state struct {
	mu       sync.Mutex          // guards following
	networks map[string]*network // network name -> allocator
	// whole are the allocators of whole networks: networks but the
	// per-node host subnets of Layer3 networks (ipam.HostSubnetKey).
	whole  []*network
	pods   map[types.NamespacedName]podRecord
	claims map[types.NamespacedName][]string // claim -> network names holding its allocation
	// waiting holds pods that failed on an exhausted network, to retry as
	// soon as an address of it is freed.
	waiting map[string]map[types.NamespacedName]struct{} // network name -> pods
	wake    chan event.GenericEvent                      // pods to retry
	// deferred holds pods seen before the rebuild that the restart
	// reserve could not serve, to reconcile once it is done (rebuilt).
	deferred map[types.NamespacedName]struct{}
	rebuilt  bool
	// fresh holds the pods created since the restart reserve began to
	// serve (newPodsSource): the only ones served before the rebuild.
	fresh map[types.NamespacedName]struct{}
}

type network struct {
	alloc *allocator.Network
	cfg   allocator.Config
	// served is the configuration the network was built from; a NAD with
	// the same network name but different addresses does not change it.
	served *netconf.Served
}

func newState() *state {
	return &state{
		networks: map[string]*network{},
		pods:     map[types.NamespacedName]podRecord{},
		claims:   map[types.NamespacedName][]string{},
		waiting:  map[string]map[types.NamespacedName]struct{}{},
		wake:     make(chan event.GenericEvent, 1024),
		deferred: map[types.NamespacedName]struct{}{},
		fresh:    map[types.NamespacedName]struct{}{},
	}
}

// markNew records that pod was created while the restart reserve serves.
func (st *state) markNew(pod types.NamespacedName) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.fresh != nil {
		st.fresh[pod] = struct{}{}
	}
}

// isNew reports whether markNew recorded pod (before the rebuild).
func (st *state) isNew(pod types.NamespacedName) bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	_, ok := st.fresh[pod]
	return ok
}

// deferUntilRebuilt has pod reconciled again once the allocators are
// rebuilt (at once if they are).
func (st *state) deferUntilRebuilt(ctx context.Context, pod types.NamespacedName) {
	st.mu.Lock()
	if !st.rebuilt {
		st.deferred[pod] = struct{}{}
		st.mu.Unlock()
		return
	}
	st.mu.Unlock()
	go st.send(ctx, []types.NamespacedName{pod})
}

// wakeDeferred marks the allocators rebuilt and reconciles the pods
// deferred until then.
func (st *state) wakeDeferred(ctx context.Context) {
	st.mu.Lock()
	st.rebuilt = true
	pods := make([]types.NamespacedName, 0, len(st.deferred))
	for p := range st.deferred {
		pods = append(pods, p)
	}
	st.deferred, st.fresh = nil, nil
	st.mu.Unlock()
	go st.send(ctx, pods)
}

// send queues pods for reconciliation, waiting for room, until ctx ends.
func (st *state) send(ctx context.Context, pods []types.NamespacedName) {
	for _, p := range pods {
		select {
		case st.wake <- event.GenericEvent{Object: &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name}}}:
		case <-ctx.Done():
			return
		}
	}
}

// waitFor records that pod waits for an address of network.
func (st *state) waitFor(network string, pod types.NamespacedName) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.waiting[network] == nil {
		st.waiting[network] = map[types.NamespacedName]struct{}{}
	}
	st.waiting[network][pod] = struct{}{}
}

// freed wakes the pods waiting for an address of the networks.
func (st *state) freed(networks ...string) {
	var pods []types.NamespacedName
	for _, n := range networks {
		pods = append(pods, st.takeWaiting(n)...)
	}
	for _, p := range pods {
		obj := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name}}
		select {
		case st.wake <- event.GenericEvent{Object: obj}:
		default: // full: the periodic retry still serves it
		}
	}
}

// takeWaiting returns and forgets the pods waiting under key.
func (st *state) takeWaiting(key string) []types.NamespacedName {
	st.mu.Lock()
	defer st.mu.Unlock()
	var pods []types.NamespacedName
	for p := range st.waiting[key] {
		pods = append(pods, p)
	}
	delete(st.waiting, key)
	return pods
}

// nodeWait is the waiting key of pods waiting for a host subnet on node
// (no network name holds a NUL).
func nodeWait(node string) string { return "\x00node/" + node }

// network returns the allocator of s's network, creating it on first use.
func (st *state) network(s *netconf.Served) (*network, error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if n, ok := st.networks[s.Name]; ok {
		return n, nil
	}
	cfg, err := ipam.NetworkConfig(s)
	if err != nil {
		return nil, err
	}
	a, err := allocator.NewNetwork(cfg)
	if err != nil {
		return nil, fmt.Errorf("network %q: %w", s.Name, err)
	}
	n := &network{alloc: a, cfg: cfg, served: s}
	st.networks[s.Name] = n
	st.whole = append(st.whole, n)
	size, used := a.Stats()
	poolSize.WithLabelValues(s.Name).Set(float64(size))
	poolUsed.WithLabelValues(s.Name).Set(float64(used))
	return n, nil
}

// hostNetwork returns the allocator of one node's host subnets of the
// Layer3 network s, creating it on first use. Each set of host subnets has
// its own allocator, so a subnet handed to another node after its node is
// gone still holds the addresses of pods not yet released.
func (st *state) hostNetwork(s *netconf.Served, hostSubnets []netip.Prefix) (*network, error) {
	key := ipam.HostSubnetKey(s.Name, hostSubnets)
	st.mu.Lock()
	defer st.mu.Unlock()
	if n, ok := st.networks[key]; ok {
		return n, nil
	}
	cfg, err := ipam.HostSubnetConfig(s, hostSubnets)
	if err != nil {
		return nil, err
	}
	a, err := allocator.NewNetwork(cfg)
	if err != nil {
		return nil, fmt.Errorf("network %q: host subnets %v: %w", s.Name, hostSubnets, err)
	}
	n := &network{alloc: a, cfg: cfg, served: s}
	st.networks[key] = n
	return n, nil
}

// sameAddresses reports whether two configurations allocate alike.
func sameAddresses(a, b allocator.Config) bool {
	a.Name, b.Name = "", ""
	return reflect.DeepEqual(a, b)
}

func (st *state) lookup(name string) (*network, bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	n, ok := st.networks[name]
	return n, ok
}

func (n *network) updateGauges() {
	size, used := n.alloc.Stats()
	poolSize.WithLabelValues(n.alloc.Name()).Set(float64(size))
	poolUsed.WithLabelValues(n.alloc.Name()).Set(float64(used))
}

// recordPod notes that pod owns allocations on networks.
func (st *state) recordPod(key types.NamespacedName, uid types.UID, networks []string) {
	if len(networks) == 0 {
		return
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	rec := st.pods[key]
	if rec.uid != uid {
		rec = podRecord{uid: uid}
	}
	for _, n := range networks {
		if !slices.Contains(rec.networks, n) {
			rec.networks = append(rec.networks, n)
		}
	}
	st.pods[key] = rec
}

// releasePod frees what the pod at key owns. When uid is set, only a record
// of that pod is released (a new pod with the same name keeps its own).
func (st *state) releasePod(key types.NamespacedName, uid types.UID) {
	st.mu.Lock()
	rec, ok := st.pods[key]
	if !ok || (uid != "" && rec.uid != uid) {
		st.mu.Unlock()
		return
	}
	delete(st.pods, key)
	nets := make([]*network, 0, len(rec.networks))
	for _, name := range rec.networks {
		if n, ok := st.networks[name]; ok {
			nets = append(nets, n)
		}
	}
	st.mu.Unlock()
	names := make([]string, 0, len(nets))
	for _, n := range nets {
		n.alloc.Release(podOwner(rec.uid))
		n.updateGauges()
		names = append(names, n.served.Name)
	}
	st.freed(names...)
}

func (st *state) recordClaim(key types.NamespacedName, network string) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if !slices.Contains(st.claims[key], network) {
		st.claims[key] = append(st.claims[key], network)
	}
}

// recordClaims notes the claims the rebuild reserved, under one lock.
func (st *state) recordClaims(claims []*heldClaim) {
	st.mu.Lock()
	defer st.mu.Unlock()
	for _, c := range claims {
		if !slices.Contains(st.claims[c.key], c.network) {
			st.claims[c.key] = append(st.claims[c.key], c.network)
		}
	}
}

// claimKeys returns the claims holding an allocation.
func (st *state) claimKeys() []types.NamespacedName {
	st.mu.Lock()
	defer st.mu.Unlock()
	keys := make([]types.NamespacedName, 0, len(st.claims))
	for k := range st.claims {
		keys = append(keys, k)
	}
	return keys
}

// releaseClaim frees a deleted claim's IPs on every network.
func (st *state) releaseClaim(key types.NamespacedName) []string {
	st.mu.Lock()
	names := st.claims[key]
	delete(st.claims, key)
	nets := make([]*network, 0, len(names))
	for _, name := range names {
		if n, ok := st.networks[name]; ok {
			nets = append(nets, n)
		}
	}
	st.mu.Unlock()
	for _, n := range nets {
		n.alloc.Release(claimOwner(key.Namespace, key.Name))
		n.updateGauges()
	}
	st.freed(names...)
	return names
}
