package ipam

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"kvnet.io/kvnet/internal/ipam/allocator"
	"kvnet.io/kvnet/internal/netconf"
)

// The restart reserve lets a restarted controller allocate before it has
// read every IPAMClaim and pod, which takes seconds with 100,000 claims
// (the API server serializing each one).
//
// While it knows every allocation (after its rebuild), the leader keeps,
// per network, a few free address sets (one address per subnet, with the
// MAC derived from the first) held in its allocator by reserve owners, so
// that nothing else takes them, and recorded in a ConfigMap of its
// namespace (the record). A new leader reads the records first and, until
// its rebuild is done, gives new pods (no IPAMClaim, no static IP or MAC)
// addresses of the record only, each removed from the record in the API
// before the pod gets it. What the record lists is therefore free: it was
// free when written, only the leader hands addresses out, and it hands out
// a listed address only after unlisting it.
//
// That holds only while every leader since the record was written kept
// that rule. The marker ConfigMap says which leaders did: leader election
// counts leaders (the Lease's leaseTransitions, the epoch), and each leader
// with the reserve writes its epoch into the marker before it uses any
// record. A record is used only if the chain of marking leaders reaches
// from its writer to the current leader (to = epoch-1); a leader without
// the reserve (an older kvnet, or the reserve turned off, which also
// deletes the records) breaks the chain, and the next leader rebuilds
// before it allocates, as without the reserve. Without leader election
// (one replica) the epoch is always 0 and the records are trusted.
const (
	reserveLabel       = "ipam.kvnet.io/restart-reserve"
	reserveMarkerName  = "kvnet-restart-reserve"
	reserveRecordName  = "kvnet-reserve-"
	reserveOwnerPrefix = "reserve/"
	// Record keys.
	keyNetwork   = "network"
	keyConfig    = "config"
	keyEpoch     = "epoch"
	keyAddresses = "addresses"
	keyFrom      = "from"
	keyTo        = "to"
	// keepInterval paces the keeper's passes over every network.
	keepInterval = time.Second
)

// ReserveOptions configures the restart reserve.
type ReserveOptions struct {
	// Size is the number of address sets kept per network; 0 turns the
	// reserve off (and deletes its records). A network keeps its reserve
	// only while at least twice as many sets are free.
	Size int
	// Namespace holds the records.
	Namespace string
	// Epoch returns the current leader's epoch (the leader Lease's
	// leaseTransitions); fenced is false without leader election. Nil
	// means no leader election.
	Epoch func(ctx context.Context) (epoch int64, fenced bool, err error)
}

// reserveTuple is one reserved address set.
type reserveTuple struct {
	owner string
	ips   []netip.Addr // one per subnet, IPv4 first
}

// netReserve is one network's reserve and its record.
type netReserve struct {
	mu     sync.Mutex // serializes changes of the record and of tuples
	n      *network
	tuples []reserveTuple
	rv     string // the record's resourceVersion; "" if it does not exist
	// written is the addresses value the record holds; stale records
	// (not written under the current chain) are rewritten even when equal.
	written string
	stale   bool
}

// reserveSet holds every network's reserve.
type reserveSet struct {
	opts ReserveOptions
	api  client.Reader // uncached: records must be read as the API has them
	c    client.Client
	st   *state

	mu     sync.Mutex // guards following
	nets   map[string]*netReserve
	active bool  // the chain is known: records may be used and written
	epoch  int64 // this leader's
	seq    int   // reserve owner numbering
}

func newReserveSet(opts ReserveOptions, api client.Reader, c client.Client, st *state) *reserveSet {
	if opts.Epoch == nil {
		opts.Epoch = func(context.Context) (int64, bool, error) { return 0, false, nil }
	}
	return &reserveSet{opts: opts, api: api, c: c, st: st, nets: map[string]*netReserve{}}
}

// recordName is the ConfigMap name of network's record.
func recordName(network string) string {
	h := fnv.New64a()
	h.Write([]byte(network))
	return reserveRecordName + strconv.FormatUint(h.Sum64(), 16)
}

// fingerprint identifies how a network allocates: a record made for other
// subnets or exclusions is not used.
func fingerprint(cfg allocator.Config) string {
	cfg.Name = ""
	b, _ := json.Marshal(cfg)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:8])
}

// encodeTuples writes address sets one per line, a set's addresses
// separated by commas.
func encodeTuples(ts []reserveTuple) string {
	lines := make([]string, 0, len(ts))
	for _, t := range ts {
		parts := make([]string, 0, len(t.ips))
		for _, ip := range t.ips {
			parts = append(parts, ip.String())
		}
		lines = append(lines, strings.Join(parts, ","))
	}
	return strings.Join(lines, "\n")
}

// decodeTuples parses encodeTuples' format; every set must have one
// address per subnet of cfg, each inside its subnet.
func decodeTuples(v string, cfg allocator.Config) ([][]netip.Addr, error) {
	var out [][]netip.Addr
	if v == "" {
		return nil, nil
	}
	for i, line := range strings.Split(v, "\n") {
		parts := strings.Split(line, ",")
		if len(parts) != len(cfg.Subnets) {
			return nil, fmt.Errorf("%s line %d %q: %d addresses, want one per subnet (%d)", keyAddresses, i+1, line, len(parts), len(cfg.Subnets))
		}
		ips := make([]netip.Addr, 0, len(parts))
		for j, p := range parts {
			ip, err := netip.ParseAddr(p)
			if err != nil {
				return nil, fmt.Errorf("%s line %d: %w", keyAddresses, i+1, err)
			}
			if !cfg.Subnets[j].Contains(ip) {
				return nil, fmt.Errorf("%s line %d: %s is not in subnet %s", keyAddresses, i+1, ip, cfg.Subnets[j])
			}
			ips = append(ips, ip)
		}
		out = append(out, ips)
	}
	return out, nil
}

// chainValid reports whether records marked from epoch from on may be used
// by the leader of epoch, given the marker (nil: none).
func chainValid(marker map[string]string, epoch int64, fenced bool) (from int64, valid bool) {
	if marker == nil {
		return epoch, false
	}
	f, err1 := strconv.ParseInt(marker[keyFrom], 10, 64)
	t, err2 := strconv.ParseInt(marker[keyTo], 10, 64)
	if err1 != nil || err2 != nil || f > t {
		return epoch, false
	}
	if fenced && t != epoch-1 {
		return epoch, false
	}
	if !fenced && (t != 0 || epoch != 0) {
		return epoch, false
	}
	return f, true
}

// load marks this leader in the chain and, if the chain holds, reserves
// the addresses of the valid records in their networks' allocators. served
// maps network names to their configuration (from the NADs). It reports
// whether any network can allocate from its reserve.
func (rs *reserveSet) load(ctx context.Context, served map[string]*netconf.Served) (bool, error) {
	logger := log.FromContext(ctx).WithName("ipam-reserve")
	epoch, fenced, err := rs.opts.Epoch(ctx)
	if err != nil {
		return false, fmt.Errorf("read the leader epoch: %w", err)
	}
	var marker corev1.ConfigMap
	key := client.ObjectKey{Namespace: rs.opts.Namespace, Name: reserveMarkerName}
	var data map[string]string
	switch err := rs.api.Get(ctx, key, &marker); {
	case err == nil:
		data = marker.Data
		if data == nil {
			data = map[string]string{}
		}
	case apierrors.IsNotFound(err):
		marker = corev1.ConfigMap{}
	default:
		return false, fmt.Errorf("read %s: %w", key, err)
	}
	from, valid := chainValid(data, epoch, fenced)
	marker.Name, marker.Namespace = reserveMarkerName, rs.opts.Namespace
	marker.Labels = map[string]string{reserveLabel: ""}
	marker.Data = map[string]string{keyFrom: strconv.FormatInt(from, 10), keyTo: strconv.FormatInt(epoch, 10)}
	if marker.ResourceVersion == "" {
		err = rs.c.Create(ctx, &marker)
	} else {
		err = rs.c.Update(ctx, &marker)
	}
	if err != nil {
		return false, fmt.Errorf("write %s: %w", key, err)
	}
	rs.mu.Lock()
	rs.active, rs.epoch = true, epoch
	rs.mu.Unlock()

	var records corev1.ConfigMapList
	if err := rs.api.List(ctx, &records, client.InNamespace(rs.opts.Namespace), client.HasLabels{reserveLabel}); err != nil {
		return false, fmt.Errorf("list the restart reserve's records: %w", err)
	}
	loaded, sets, listed := 0, 0, 0
	for i := range records.Items {
		cm := &records.Items[i]
		name := cm.Data[keyNetwork]
		if cm.Name == reserveMarkerName || name == "" || cm.Name != recordName(name) {
			continue
		}
		listed++
		nr := rs.reserveOf(name)
		nr.rv, nr.written, nr.stale = cm.ResourceVersion, cm.Data[keyAddresses], true
		s := served[name]
		if s == nil {
			if served != nil {
				// A network no NAD serves now: its record goes, or a
				// network made again under the name, allocating freely
				// before the keeper rewrote the record, could meet it.
				if err := rs.c.Delete(ctx, cm); client.IgnoreNotFound(err) != nil {
					return false, fmt.Errorf("delete the record of network %q, which is not served: %w", name, err)
				}
				nr.rv, nr.written = "", ""
			}
			continue
		}
		e, err := strconv.ParseInt(cm.Data[keyEpoch], 10, 64)
		if !valid || err != nil || e < from || e > epoch {
			continue
		}
		n, err := rs.st.network(s)
		if err != nil || cm.Data[keyConfig] != fingerprint(n.cfg) {
			continue
		}
		ipsets, err := decodeTuples(cm.Data[keyAddresses], n.cfg)
		if err != nil {
			logger.Info("ignoring a record it cannot read", "configmap", cm.Name, "network", name, "reason", err.Error())
			continue
		}
		nr.stale = false
		for _, ips := range ipsets {
			owner := rs.nextOwner()
			if _, err := n.alloc.Reserve(owner, ips, allocator.DeriveMAC(ips[0])); err != nil {
				logger.Error(err, "record lists an address twice", "network", name)
				continue
			}
			nr.tuples = append(nr.tuples, reserveTuple{owner: owner, ips: ips})
		}
		if len(nr.tuples) > 0 {
			loaded++
			sets += len(nr.tuples)
		}
		reserveSets.WithLabelValues(name).Set(float64(len(nr.tuples)))
	}
	logger.Info("restart reserve loaded", "epoch", epoch, "fenced", fenced, "chainFrom", from, "chainValid", valid,
		"records", listed, "networks", loaded, "addressSets", sets)
	return loaded > 0, nil
}

// reserveOf returns network's reserve, made on first use.
func (rs *reserveSet) reserveOf(name string) *netReserve {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if nr, ok := rs.nets[name]; ok {
		return nr
	}
	nr := &netReserve{}
	rs.nets[name] = nr
	return nr
}

func (rs *reserveSet) nextOwner() string {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	rs.seq++
	return reserveOwnerPrefix + strconv.Itoa(rs.seq)
}

// has reports whether network has an address set to hand out.
func (rs *reserveSet) has(network string) bool {
	if rs == nil {
		return false
	}
	nr := rs.lookup(network)
	if nr == nil {
		return false
	}
	nr.mu.Lock()
	defer nr.mu.Unlock()
	return len(nr.tuples) > 0
}

// errReserveEmpty: the network's reserve has nothing left (or its record
// could not be written); the pod waits for the rebuild.
var errReserveEmpty = errors.New("restart reserve empty")

// take hands one of n's reserved address sets to owner, after removing it
// from the record.
func (rs *reserveSet) take(ctx context.Context, n *network, owner string) (allocator.Allocation, error) {
	nr := rs.lookup(n.served.Name)
	if nr == nil {
		return allocator.Allocation{}, errReserveEmpty
	}
	nr.mu.Lock()
	defer nr.mu.Unlock()
	if a, held := n.alloc.Get(owner); held {
		return a, nil // served already (a retry after a failed patch)
	}
	if len(nr.tuples) == 0 {
		return allocator.Allocation{}, errReserveEmpty
	}
	t := nr.tuples[0]
	if err := rs.write(ctx, n, nr, nr.tuples[1:]); err != nil {
		return allocator.Allocation{}, fmt.Errorf("%w: %v", errReserveEmpty, err)
	}
	nr.tuples = nr.tuples[1:]
	reserveSets.WithLabelValues(n.served.Name).Set(float64(len(nr.tuples)))
	return n.alloc.Transfer(t.owner, owner)
}

// evict frees the reserved sets of n that hold one of ips or mac (or the
// MAC derived from ips[0]), after removing them from the record: a claim
// or static request for them wins. It reports whether it freed any.
func (rs *reserveSet) evict(ctx context.Context, n *network, ips []netip.Addr, mac net.HardwareAddr) (bool, error) {
	if rs == nil {
		return false, nil
	}
	var owners []string
	for _, ip := range ips {
		if o, ok := n.alloc.OwnerOf(ip); ok && strings.HasPrefix(o, reserveOwnerPrefix) {
			owners = append(owners, o)
		}
	}
	macs := []net.HardwareAddr{mac}
	if len(ips) > 0 {
		macs = append(macs, allocator.DeriveMAC(ips[0]))
	}
	for _, m := range macs {
		if o, ok := n.alloc.OwnerOfMAC(m); ok && strings.HasPrefix(o, reserveOwnerPrefix) {
			owners = append(owners, o)
		}
	}
	if len(owners) == 0 {
		return false, nil
	}
	nr := rs.lookup(n.served.Name)
	if nr == nil {
		return false, nil
	}
	nr.mu.Lock()
	defer nr.mu.Unlock()
	keep := slices.DeleteFunc(slices.Clone(nr.tuples), func(t reserveTuple) bool { return slices.Contains(owners, t.owner) })
	if len(keep) == len(nr.tuples) {
		return false, nil
	}
	if err := rs.shrink(ctx, n, nr, keep); err != nil {
		return false, err
	}
	log.FromContext(ctx).WithName("ipam-reserve").Info("freed reserved addresses a request asked for", "network", n.served.Name, "ips", ips, "mac", mac.String())
	return true, nil
}

// giveBack frees all of n's reserve, after unlisting it: the network is
// full. It reports whether it freed any.
func (rs *reserveSet) giveBack(ctx context.Context, n *network) (bool, error) {
	nr := rs.lookup(n.served.Name)
	if nr == nil {
		return false, nil
	}
	nr.mu.Lock()
	defer nr.mu.Unlock()
	if len(nr.tuples) == 0 {
		return false, nil
	}
	if err := rs.shrink(ctx, n, nr, nil); err != nil {
		return false, err
	}
	log.FromContext(ctx).WithName("ipam-reserve").Info("network full: restart reserve given back", "network", n.served.Name)
	return true, nil
}

// keep grows or drops n's reserve, once the allocators are rebuilt, and
// writes its record when it changed. A network keeps Size sets while at
// least twice as many are free (counting its own); below that it gives
// them back, unlisting them first.
func (rs *reserveSet) keep(ctx context.Context, n *network) error {
	if len(n.cfg.Subnets) == 0 {
		return nil // MAC-only: nothing to reserve
	}
	nr := rs.reserveOf(n.served.Name)
	nr.mu.Lock()
	defer nr.mu.Unlock()
	nr.n = n
	size, used := n.alloc.Stats()
	free := (size-used)/len(n.cfg.Subnets) + len(nr.tuples)
	want := rs.opts.Size
	if free < 2*want {
		want = 0
	}
	switch {
	case len(nr.tuples) > want:
		if err := rs.shrink(ctx, n, nr, slices.Clone(nr.tuples[:want])); err != nil {
			return err
		}
		rs.st.freed(n.served.Name)
	case len(nr.tuples) < want:
		for len(nr.tuples) < want {
			owner := rs.nextOwner()
			a, err := n.alloc.Allocate(allocator.Request{Owner: owner})
			if err != nil {
				break
			}
			ips := make([]netip.Addr, 0, len(a.IPs))
			for _, p := range a.IPs {
				ips = append(ips, p.Addr())
			}
			nr.tuples = append(nr.tuples, reserveTuple{owner: owner, ips: ips})
		}
		n.updateGauges()
		fallthrough
	default:
		if nr.stale || nr.written != encodeTuples(nr.tuples) {
			if err := rs.write(ctx, n, nr, nr.tuples); err != nil {
				return err
			}
		}
	}
	reserveSets.WithLabelValues(n.served.Name).Set(float64(len(nr.tuples)))
	return nil
}

// lookup returns network's reserve; nil if it has none.
func (rs *reserveSet) lookup(network string) *netReserve {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return rs.nets[network]
}

// shrink makes n's reserve keep (a subset of its sets): it unlists the
// others first, then frees them. The caller holds nr.mu.
func (rs *reserveSet) shrink(ctx context.Context, n *network, nr *netReserve, keep []reserveTuple) error {
	if err := rs.write(ctx, n, nr, keep); err != nil {
		return err
	}
	for _, t := range nr.tuples {
		if !slices.ContainsFunc(keep, func(k reserveTuple) bool { return k.owner == t.owner }) {
			n.alloc.Release(t.owner)
		}
	}
	nr.tuples = keep
	n.updateGauges()
	reserveSets.WithLabelValues(n.served.Name).Set(float64(len(keep)))
	return nil
}

// write makes n's record list tuples. The caller holds nr.mu.
func (rs *reserveSet) write(ctx context.Context, n *network, nr *netReserve, tuples []reserveTuple) error {
	rs.mu.Lock()
	active, epoch := rs.active, rs.epoch
	rs.mu.Unlock()
	if !active {
		return errors.New("the restart reserve's chain of leaders is not recorded")
	}
	v := encodeTuples(tuples)
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: rs.opts.Namespace, Name: recordName(n.served.Name),
			Labels: map[string]string{reserveLabel: ""}, ResourceVersion: nr.rv},
		Data: map[string]string{keyNetwork: n.served.Name, keyConfig: fingerprint(n.cfg),
			keyEpoch: strconv.FormatInt(epoch, 10), keyAddresses: v},
	}
	var err error
	if nr.rv == "" {
		err = rs.c.Create(ctx, cm)
	} else {
		err = rs.c.Update(ctx, cm)
	}
	if err != nil {
		// Another writer, or a record this leader did not know: read it
		// again before the next attempt.
		if apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) || apierrors.IsNotFound(err) {
			var cur corev1.ConfigMap
			switch gerr := rs.api.Get(ctx, client.ObjectKeyFromObject(cm), &cur); {
			case gerr == nil:
				nr.rv, nr.written, nr.stale = cur.ResourceVersion, cur.Data[keyAddresses], true
			case apierrors.IsNotFound(gerr):
				nr.rv, nr.written = "", ""
			}
		}
		return fmt.Errorf("write the restart reserve's record of network %q: %w", n.served.Name, err)
	}
	nr.rv, nr.written, nr.stale = cm.ResourceVersion, v, false
	return nil
}

// clear deletes every record and the marker: a leader without the reserve
// runs this, so that none is used after it.
func (rs *reserveSet) clear(ctx context.Context) error {
	return client.IgnoreNotFound(rs.c.DeleteAllOf(ctx, &corev1.ConfigMap{}, client.InNamespace(rs.opts.Namespace), client.HasLabels{reserveLabel}))
}

// keeper runs the reserve's upkeep on the leader once the allocators are
// rebuilt; with the reserve off, it deletes the records instead.
type keeper struct {
	rs      *reserveSet
	rebuilt <-chan struct{}
}

func (k *keeper) Start(ctx context.Context) error {
	logger := log.FromContext(ctx).WithName("ipam-reserve")
	if k.rs.opts.Size == 0 {
		if err := k.rs.clear(ctx); err != nil {
			// With leader election this leader broke the chain anyway;
			// without, a later controller with the reserve would trust
			// records this one did not keep.
			logger.Error(err, "could not delete the restart reserve's records: delete them before running with --restart-reserve again without leader election",
				"command", fmt.Sprintf("kubectl -n %s delete configmap -l %s", k.rs.opts.Namespace, reserveLabel))
		}
		return nil
	}
	select {
	case <-k.rebuilt:
	case <-ctx.Done():
		return nil
	}
	k.rs.mu.Lock()
	active := k.rs.active
	k.rs.mu.Unlock()
	if !active {
		// The rebuild did not load the reserve (no leader epoch, or the
		// marker could not be written): try once more now.
		if _, err := k.rs.load(ctx, nil); err != nil {
			logger.Error(err, "restart reserve off until the next restart")
			return nil
		}
	}
	t := time.NewTicker(keepInterval)
	defer t.Stop()
	failed := map[string]string{}
	for {
		k.rs.st.mu.Lock()
		nets := slices.Clone(k.rs.st.whole)
		k.rs.st.mu.Unlock()
		for _, n := range nets {
			if err := k.rs.keep(ctx, n); err != nil {
				if ctx.Err() != nil {
					return nil
				}
				if failed[n.served.Name] != err.Error() {
					logger.Error(err, "restart reserve not kept", "network", n.served.Name)
				}
				failed[n.served.Name] = err.Error()
				continue
			}
			delete(failed, n.served.Name)
		}
		select {
		case <-t.C:
		case <-ctx.Done():
			return nil
		}
	}
}
