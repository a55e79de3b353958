// Package macpool runs kvnet's MAC pool (KubeMacPool semantics) in
// kvnet-controller: every MAC a VM gets is reserved in the API, the range
// is read from a ConfigMap and reloaded live, MACs are released when a VM
// or one of its interfaces goes, allocations the API never committed are
// cleaned up, and MAC collisions among running VMIs are reported.
//
// Every replica answers the VM webhook. What makes that safe is the
// reservation: a coordination.k8s.io Lease in kvnet's namespace, named
// after the MAC (mac-02000000000a) and holding the VM ("namespace/name")
// in spec.holderIdentity. The API server creates an object of a given name
// once, so two replicas admitting two VMs at the same moment can never both
// reserve one MAC: the second create fails with AlreadyExists and that
// replica moves on to the next MAC. Each replica keeps an index of held
// MACs (from the reservations and the VMs it watches) to pick candidates
// without asking the API for each; the reservation, not the index, decides.
//
// The leader keeps the reservations true: it adopts the MACs of VMs that
// have none (VMs admitted before reservations existed, or written past the
// webhook), hands generateName admissions' reservations to the VMs that
// carry them, and deletes the reservations of deleted VMs, of dropped
// interfaces and of admissions whose VM never reached the API.
package macpool

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	kubevirtv1 "kvnet.io/kvnet/api/kubevirt/v1"
	"kvnet.io/kvnet/internal/macpool"
)

// ConfigMap keys of the range, as KubeMacPool's.
const (
	KeyRangeStart = "RANGE_START"
	KeyRangeEnd   = "RANGE_END"
	// TransactionAnnotation is set on VMs the webhook assigned MACs to.
	TransactionAnnotation = "kubemacpool.io/transaction-timestamp"
	// OptOutLabel on a namespace set to "ignore" keeps the webhook out.
	OptOutLabel = "mutatevirtualmachines.kubemacpool.io"
	// ReservationLabel marks the Leases that reserve MACs.
	ReservationLabel = "kvnet.io/mac-reservation"
	// reservationPrefix starts the name of a MAC's reservation.
	reservationPrefix = "mac-"
)

// Field indexes of the manager's cache.
const (
	vmMACIndex     = "kvnet.macpool.macs"   // VirtualMachine -> its explicit MACs
	reservedHolder = "kvnet.macpool.holder" // reservation Lease -> its holder
)

// Default range when the ConfigMap is missing (KubeMacPool's default).
var (
	DefaultStart = net.HardwareAddr{0x02, 0, 0, 0, 0, 0}
	DefaultEnd   = net.HardwareAddr{0x02, 0xff, 0xff, 0xff, 0xff, 0xff}
)

// Options configures the pool.
type Options struct {
	// ConfigMap holding RANGE_START and RANGE_END.
	ConfigMap types.NamespacedName
	// Namespace of the reservations; default ConfigMap.Namespace.
	Namespace string
	// PendingTimeout after which a reservation whose VM never appeared (the
	// VM write failed after the webhook answered) or no longer carries its
	// MAC is deleted. Younger reservations are left alone: their admission
	// may still be on its way to the API. Default 60 s.
	PendingTimeout time.Duration
	// SkipNameValidation allows registering the controllers again in one
	// process (tests that restart the controller).
	SkipNameValidation bool
}

// Manager owns this replica's view of the pool. It is safe for concurrent
// use.
type Manager struct {
	// Pool indexes the MACs held as this replica knows them; candidates
	// come from it, and the reservations in the API decide.
	Pool   *macpool.Pool
	opts   Options
	ready  chan struct{}
	reader client.Reader // the API, not the cache
	cache  client.Reader
	writer client.Client

	mu       sync.Mutex        // guards following
	inflight map[string]holdAt // MAC -> reservation this replica made that its cache may not show yet
}

type holdAt struct {
	owner string
	at    time.Time
}

// Owner is the pool owner key of a VM.
func Owner(namespace, name string) string { return namespace + "/" + name }

// provisionalMark starts the name part of a provisional owner.
const provisionalMark = "generateName:"

// ProvisionalOwner is the owner key of MACs given to a VM created with
// generateName: at admission it has no name yet, so the MACs are held under
// the admission request's UID until the leader sees the created VM carry
// them and hands them to it.
func ProvisionalOwner(namespace, requestUID string) string {
	return Owner(namespace, provisionalMark+requestUID)
}

func isProvisional(owner string) bool {
	_, name, _ := strings.Cut(owner, "/")
	return strings.HasPrefix(name, provisionalMark)
}

// ReservationName is the name of the Lease that reserves mac.
func ReservationName(mac net.HardwareAddr) string {
	return reservationPrefix + strings.ReplaceAll(mac.String(), ":", "")
}

// reservedMAC returns the MAC a reservation name stands for.
func reservedMAC(name string) (net.HardwareAddr, bool) {
	hex, ok := strings.CutPrefix(name, reservationPrefix)
	if !ok || len(hex) != 12 {
		return nil, false
	}
	var b strings.Builder
	for i := 0; i < 12; i += 2 {
		if i > 0 {
			b.WriteByte(':')
		}
		b.WriteString(hex[i : i+2])
	}
	mac, err := net.ParseMAC(b.String())
	return mac, err == nil
}

func holderOf(l *coordinationv1.Lease) string {
	if l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}

// reservationAge is how long ago the reservation was made.
func reservationAge(l *coordinationv1.Lease) time.Duration {
	if l.Spec.AcquireTime != nil {
		return time.Since(l.Spec.AcquireTime.Time)
	}
	return time.Since(l.CreationTimestamp.Time)
}

// Ready reports whether the index was built and the webhook may serve.
func (m *Manager) Ready() bool {
	select {
	case <-m.ready:
		return true
	default:
		return false
	}
}

// VMMACs returns the explicit MACs of the considered interfaces of vm.
func VMMACs(vm *kubevirtv1.VirtualMachine) map[string]string {
	out := map[string]string{}
	if vm.Spec.Template == nil {
		return out
	}
	spec := vm.Spec.Template.Spec
	for _, iface := range spec.Domain.Devices.Interfaces {
		if iface.MacAddress != "" && macpool.Considered(iface, spec.Networks) {
			out[iface.Name] = iface.MacAddress
		}
	}
	return out
}

// specMACs returns the explicit MACs of vm, canonical.
func specMACs(vm *kubevirtv1.VirtualMachine) map[string]bool {
	out := map[string]bool{}
	for _, s := range VMMACs(vm) {
		if mac, err := net.ParseMAC(s); err == nil && len(mac) == 6 {
			out[mac.String()] = true
		}
	}
	return out
}

// Setup registers the pool's controllers and start-up index and returns
// the manager the VM webhook uses. The manager's cache must watch Leases
// only with ReservationLabel (CacheOptions).
func Setup(mgr ctrl.Manager, opts Options) (*Manager, error) {
	if opts.PendingTimeout == 0 {
		opts.PendingTimeout = time.Minute
	}
	if opts.Namespace == "" {
		opts.Namespace = opts.ConfigMap.Namespace
	}
	pool, err := macpool.New(DefaultStart, DefaultEnd)
	if err != nil {
		return nil, err
	}
	m := &Manager{Pool: pool, opts: opts, ready: make(chan struct{}), reader: mgr.GetAPIReader(),
		cache: mgr.GetClient(), writer: mgr.GetClient(), inflight: map[string]holdAt{}}
	ctx := context.Background()
	if err := mgr.GetFieldIndexer().IndexField(ctx, &kubevirtv1.VirtualMachine{}, vmMACIndex, func(o client.Object) []string {
		return slices.Collect(func(yield func(string) bool) {
			for mac := range specMACs(o.(*kubevirtv1.VirtualMachine)) {
				if !yield(mac) {
					return
				}
			}
		})
	}); err != nil {
		return nil, err
	}
	if err := mgr.GetFieldIndexer().IndexField(ctx, &coordinationv1.Lease{}, reservedHolder, func(o client.Object) []string {
		if h := holderOf(o.(*coordinationv1.Lease)); h != "" {
			return []string{h}
		}
		return nil
	}); err != nil {
		return nil, err
	}
	if err := mgr.Add(&indexer{m: m, cache: mgr.GetCache()}); err != nil {
		return nil, err
	}
	ours := builder.WithPredicates(predicate.NewPredicateFuncs(func(o client.Object) bool {
		return o.GetNamespace() == opts.Namespace && o.GetLabels()[ReservationLabel] == "true"
	}))
	everyReplica := controller.Options{SkipNameValidation: &opts.SkipNameValidation, NeedLeaderElection: ptr.To(false), MaxConcurrentReconciles: 4}
	c := mgr.GetClient()
	// This replica's index, on every replica: the VMs and reservations as
	// they change.
	err = ctrl.NewControllerManagedBy(mgr).
		Named("macpool-index").
		For(&kubevirtv1.VirtualMachine{}).
		Watches(&coordinationv1.Lease{}, handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
			mac, ok := reservedMAC(o.GetName())
			if !ok {
				return nil
			}
			// A reservation is queued under its MAC in the namespace
			// "": no VM lives there.
			return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: mac.String()}}}
		}), ours).
		WithOptions(everyReplica).
		Complete(&indexReconciler{m: m})
	if err != nil {
		return nil, err
	}
	err = ctrl.NewControllerManagedBy(mgr).
		Named("macpool-range").
		For(&corev1.ConfigMap{}, builder.WithPredicates(predicate.NewPredicateFuncs(func(o client.Object) bool {
			return o.GetNamespace() == opts.ConfigMap.Namespace && o.GetName() == opts.ConfigMap.Name
		}))).
		WithOptions(controller.Options{SkipNameValidation: &opts.SkipNameValidation, NeedLeaderElection: ptr.To(false)}).
		Complete(&rangeReconciler{m: m, client: c, recorder: mgr.GetEventRecorder("kvnet-macpool")})
	if err != nil {
		return nil, err
	}
	// The reservations' upkeep, on the leader.
	err = ctrl.NewControllerManagedBy(mgr).
		Named("macpool-vms").
		For(&kubevirtv1.VirtualMachine{}).
		WithOptions(controller.Options{MaxConcurrentReconciles: 4, SkipNameValidation: &opts.SkipNameValidation}).
		Complete(&vmReconciler{m: m, recorder: mgr.GetEventRecorder("kvnet-macpool")})
	if err != nil {
		return nil, err
	}
	err = ctrl.NewControllerManagedBy(mgr).
		Named("macpool-collisions").
		For(&kubevirtv1.VirtualMachineInstance{}).
		WithOptions(controller.Options{SkipNameValidation: &opts.SkipNameValidation}).
		Complete(newCollisionReconciler(c, mgr.GetEventRecorder("kvnet-macpool")))
	if err != nil {
		return nil, err
	}
	if err := mgr.Add(&pendingCleaner{m: m}); err != nil {
		return nil, err
	}
	return m, nil
}

// CacheOptions restricts the manager's cache of Leases to the
// reservations in namespace: kvnet-controller never reads other Leases
// through it, may list Leases in its own namespace only (RBAC), and node
// heartbeats would otherwise flow through every replica.
func CacheOptions(byObject map[client.Object]cache.ByObject, namespace string) {
	sel, _ := metav1.LabelSelectorAsSelector(&metav1.LabelSelector{MatchLabels: map[string]string{ReservationLabel: "true"}})
	byObject[&coordinationv1.Lease{}] = cache.ByObject{Label: sel, Namespaces: map[string]cache.Config{namespace: {}}}
}

// indexer builds this replica's index once the caches synced, before the
// webhook serves. Every replica runs it.
type indexer struct {
	m     *Manager
	cache cache.Cache
}

// NeedLeaderElection: every replica answers admissions.
func (*indexer) NeedLeaderElection() bool { return false }

func (b *indexer) Start(ctx context.Context) error {
	logger := log.FromContext(ctx).WithName("macpool-index")
	// The range first, so indexed MACs are counted in it.
	var cm corev1.ConfigMap
	if err := b.m.reader.Get(ctx, b.m.opts.ConfigMap, &cm); err == nil {
		if err := b.m.applyRange(&cm); err != nil {
			logger.Error(err, "bad MAC range; keeping the default", "configmap", b.m.opts.ConfigMap.String())
		}
	} else if !apierrors.IsNotFound(err) {
		return err
	}
	// Informers for both kinds, synced: from here on the index
	// reconciler sees every change.
	for _, o := range []client.Object{&kubevirtv1.VirtualMachine{}, &coordinationv1.Lease{}} {
		if _, err := b.cache.GetInformer(ctx, o); err != nil {
			return fmt.Errorf("macpool index: %w", err)
		}
	}
	if !b.cache.WaitForCacheSync(ctx) {
		return errors.New("macpool index: caches did not sync")
	}
	start := time.Now()
	var vms kubevirtv1.VirtualMachineList
	if err := b.m.cache.List(ctx, &vms); err != nil {
		return fmt.Errorf("macpool index: list VirtualMachines: %w", err)
	}
	var leases coordinationv1.LeaseList
	if err := b.m.cache.List(ctx, &leases, client.InNamespace(b.m.opts.Namespace), client.MatchingLabels{ReservationLabel: "true"}); err != nil {
		return fmt.Errorf("macpool index: list reservations: %w", err)
	}
	for i := range vms.Items {
		owner := Owner(vms.Items[i].Namespace, vms.Items[i].Name)
		for s := range specMACs(&vms.Items[i]) {
			mac, _ := net.ParseMAC(s)
			_ = b.m.Pool.Reserve(owner, mac) // a duplicate is the leader's to report
		}
	}
	for i := range leases.Items {
		if mac, ok := reservedMAC(leases.Items[i].Name); ok && holderOf(&leases.Items[i]) != "" {
			b.m.Pool.Set(holderOf(&leases.Items[i]), mac)
		}
	}
	close(b.m.ready)
	b.m.updateGauges()
	logger.Info("MAC pool indexed", "vms", len(vms.Items), "reservations", len(leases.Items), "duration", time.Since(start).String())
	return nil
}

func (m *Manager) updateGauges() {
	size, used := m.Pool.Stats()
	poolSize.Set(float64(size))
	poolUsed.Set(float64(used))
}

// resync sets the index entry of mac from what this replica knows: the
// reservation if there is one, else a VM that carries it, else a
// reservation this replica just made.
func (m *Manager) resync(ctx context.Context, mac net.HardwareAddr) error {
	key := mac.String()
	var l coordinationv1.Lease
	err := m.cache.Get(ctx, client.ObjectKey{Namespace: m.opts.Namespace, Name: ReservationName(mac)}, &l)
	switch {
	case err == nil && holderOf(&l) != "":
		m.mu.Lock()
		delete(m.inflight, key)
		m.mu.Unlock()
		m.Pool.Set(holderOf(&l), mac)
		return nil
	case err != nil && !apierrors.IsNotFound(err):
		return err
	}
	var vms kubevirtv1.VirtualMachineList
	if err := m.cache.List(ctx, &vms, client.MatchingFields{vmMACIndex: key}); err != nil {
		return err
	}
	if len(vms.Items) > 0 {
		owners := make([]string, 0, len(vms.Items))
		for i := range vms.Items {
			owners = append(owners, Owner(vms.Items[i].Namespace, vms.Items[i].Name))
		}
		if h, held := m.Pool.Holder(mac); held && slices.Contains(owners, h) {
			return nil
		}
		slices.Sort(owners)
		m.Pool.Set(owners[0], mac)
		return nil
	}
	m.mu.Lock()
	f, ok := m.inflight[key]
	if ok && time.Since(f.at) > 2*m.opts.PendingTimeout {
		delete(m.inflight, key)
		ok = false
	}
	m.mu.Unlock()
	if ok {
		m.Pool.Set(f.owner, mac)
		return nil
	}
	m.Pool.Forget(mac)
	return nil
}

// indexReconciler keeps this replica's index: a request in a namespace is
// a VM, one in the namespace "" is a reservation named by its MAC.
type indexReconciler struct{ m *Manager }

func (r *indexReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	select {
	case <-r.m.ready:
	case <-ctx.Done():
		return ctrl.Result{}, ctx.Err()
	}
	defer r.m.updateGauges()
	if req.Namespace == "" {
		mac, err := net.ParseMAC(req.Name)
		if err != nil {
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, r.m.resync(ctx, mac)
	}
	owner := Owner(req.Namespace, req.Name)
	macs := map[string]bool{}
	var vm kubevirtv1.VirtualMachine
	switch err := r.m.cache.Get(ctx, req.NamespacedName, &vm); {
	case err == nil:
		macs = specMACs(&vm)
	case !apierrors.IsNotFound(err):
		return ctrl.Result{}, err
	}
	for _, mac := range r.m.Pool.MACs(owner) {
		macs[mac.String()] = true
	}
	for s := range macs {
		mac, _ := net.ParseMAC(s)
		if err := r.m.resync(ctx, mac); err != nil {
			return ctrl.Result{}, err
		}
	}
	return ctrl.Result{}, nil
}

// Claim reserves mac for owner in the API and in the index. It succeeds
// when owner already holds the reservation (a retry, an UPDATE), and
// reports in created whether this call made it. A MAC another VM holds is
// a *macpool.ConflictError naming it; a reservation whose VM is gone (and
// which is older than PendingTimeout, so no admission can still be on its
// way) is taken over.
func (m *Manager) Claim(ctx context.Context, owner string, mac net.HardwareAddr) (created bool, err error) {
	if h, held := m.Pool.Holder(mac); !held || h != owner {
		// Not this owner's before the call: an error leaves it as it was.
		defer func() {
			var ce *macpool.ConflictError
			if err != nil && !errors.As(err, &ce) {
				m.Pool.Release(owner, mac)
			}
		}()
	}
	if err := m.Pool.Reserve(owner, mac); err != nil {
		var ce *macpool.ConflictError
		if !errors.As(err, &ce) {
			return false, err
		}
		// The index says another VM uses it; a VM that carries the MAC
		// without a reservation (the leader has not adopted it yet) is
		// only in the index.
		if carrier, err := m.carriedBy(ctx, mac, owner); err != nil || carrier != "" {
			if err != nil {
				return false, err
			}
			return false, &macpool.ConflictError{MAC: mac, Holder: carrier}
		}
	}
	for range 4 {
		l := &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Namespace: m.opts.Namespace, Name: ReservationName(mac), Labels: map[string]string{ReservationLabel: "true"}},
			Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To(owner), AcquireTime: ptr.To(metav1.NowMicro())},
		}
		err := m.writer.Create(ctx, l)
		if err == nil {
			m.mu.Lock()
			m.inflight[mac.String()] = holdAt{owner: owner, at: time.Now()}
			m.mu.Unlock()
			m.Pool.Set(owner, mac)
			reservationsCreated.Inc()
			return true, nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return false, fmt.Errorf("reserve MAC %s: %w", mac, err)
		}
		var cur coordinationv1.Lease
		if err := m.reader.Get(ctx, client.ObjectKeyFromObject(l), &cur); err != nil {
			if apierrors.IsNotFound(err) {
				continue // released meanwhile: try again
			}
			return false, fmt.Errorf("read reservation of MAC %s: %w", mac, err)
		}
		holder := holderOf(&cur)
		if holder == owner {
			m.Pool.Set(owner, mac)
			return false, nil
		}
		gone, err := m.holderGone(ctx, &cur, mac)
		if err != nil {
			return false, err
		}
		if !gone {
			m.Pool.Set(holder, mac)
			return false, &macpool.ConflictError{MAC: mac, Holder: holder}
		}
		if err := m.deleteReservation(ctx, &cur); err != nil {
			return false, err
		}
		log.FromContext(ctx).Info("took over the reservation of a VM that is gone", "mac", mac.String(), "vm", holder, "for", owner)
	}
	return false, fmt.Errorf("reserve MAC %s: the reservation kept changing; retry", mac)
}

// HeldBy returns who other than owner holds mac, reading the reservation
// from the API, without reserving anything: a dry run's answer. A
// reservation whose VM is gone holds nothing.
func (m *Manager) HeldBy(ctx context.Context, owner string, mac net.HardwareAddr) (string, error) {
	var l coordinationv1.Lease
	err := m.reader.Get(ctx, client.ObjectKey{Namespace: m.opts.Namespace, Name: ReservationName(mac)}, &l)
	switch {
	case apierrors.IsNotFound(err):
		return m.carriedBy(ctx, mac, owner)
	case err != nil:
		return "", err
	}
	if h := holderOf(&l); h != owner {
		gone, err := m.holderGone(ctx, &l, mac)
		if err != nil || gone {
			return "", err
		}
		return h, nil
	}
	return "", nil
}

// carriedBy returns a VM other than owner that carries mac, as the API
// says (the cache only nominates).
func (m *Manager) carriedBy(ctx context.Context, mac net.HardwareAddr, owner string) (string, error) {
	var vms kubevirtv1.VirtualMachineList
	if err := m.cache.List(ctx, &vms, client.MatchingFields{vmMACIndex: mac.String()}); err != nil {
		return "", err
	}
	for i := range vms.Items {
		o := Owner(vms.Items[i].Namespace, vms.Items[i].Name)
		if o == owner {
			continue
		}
		var vm kubevirtv1.VirtualMachine
		err := m.reader.Get(ctx, client.ObjectKeyFromObject(&vms.Items[i]), &vm)
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return "", err
		}
		if specMACs(&vm)[mac.String()] {
			return o, nil
		}
	}
	return "", nil
}

// holderGone reports whether the reservation l of mac may be taken over:
// it is older than PendingTimeout and its VM does not carry the MAC (or
// is gone). A generateName admission's reservation is gone when no VM of
// its namespace carries the MAC.
func (m *Manager) holderGone(ctx context.Context, l *coordinationv1.Lease, mac net.HardwareAddr) (bool, error) {
	if reservationAge(l) < m.opts.PendingTimeout {
		return false, nil
	}
	holder := holderOf(l)
	ns, name, _ := strings.Cut(holder, "/")
	if isProvisional(holder) {
		var vms kubevirtv1.VirtualMachineList
		if err := m.reader.List(ctx, &vms, client.InNamespace(ns)); err != nil {
			return false, err
		}
		for i := range vms.Items {
			if specMACs(&vms.Items[i])[mac.String()] {
				return false, nil
			}
		}
		return true, nil
	}
	var vm kubevirtv1.VirtualMachine
	err := m.reader.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &vm)
	if apierrors.IsNotFound(err) {
		return true, nil
	}
	if err != nil {
		return false, err
	}
	return !specMACs(&vm)[mac.String()], nil
}

// deleteReservation deletes l if it is still the object that was read.
func (m *Manager) deleteReservation(ctx context.Context, l *coordinationv1.Lease) error {
	err := m.writer.Delete(ctx, l, client.Preconditions{UID: &l.UID, ResourceVersion: &l.ResourceVersion})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return fmt.Errorf("delete reservation %s: %w", l.Name, err)
	}
	if mac, ok := reservedMAC(l.Name); ok {
		m.Pool.Release(holderOf(l), mac)
	}
	return nil
}

// Allocate reserves the next free MAC for owner. With dryRun it only says
// which MAC that would be.
func (m *Manager) Allocate(ctx context.Context, owner string, dryRun bool) (net.HardwareAddr, error) {
	for range 64 {
		mac, err := m.Pool.Allocate(owner)
		if err != nil {
			return nil, err
		}
		if dryRun {
			m.Pool.Release(owner, mac)
			return mac, nil
		}
		_, err = m.Claim(ctx, owner, mac)
		var ce *macpool.ConflictError
		switch {
		case err == nil:
			return mac, nil
		case errors.As(err, &ce):
			// Another replica reserved it a moment ago: the index now
			// says so, and the next candidate follows.
			allocationConflicts.Inc()
			continue
		default:
			m.Pool.Release(owner, mac)
			return nil, err
		}
	}
	return nil, errors.New("no MAC could be reserved after 64 candidates: other replicas reserved each first; retry")
}

// Unclaim undoes a Claim or Allocate of an admission that failed: the
// reservation, if owner still holds it, and the index entry.
func (m *Manager) Unclaim(ctx context.Context, owner string, mac net.HardwareAddr) {
	m.mu.Lock()
	delete(m.inflight, mac.String())
	m.mu.Unlock()
	var l coordinationv1.Lease
	err := m.reader.Get(ctx, client.ObjectKey{Namespace: m.opts.Namespace, Name: ReservationName(mac)}, &l)
	if err == nil && holderOf(&l) == owner {
		if err := m.deleteReservation(ctx, &l); err != nil {
			log.FromContext(ctx).Error(err, "release the reservation of a failed admission; the leader deletes it after the pending timeout", "mac", mac.String())
		}
	}
	m.Pool.Release(owner, mac)
}

func (m *Manager) applyRange(cm *corev1.ConfigMap) error {
	start, end, err := macpool.ParseRange(cm.Data[KeyRangeStart], cm.Data[KeyRangeEnd])
	if err != nil {
		return fmt.Errorf("configmap %s/%s: %w", cm.Namespace, cm.Name, err)
	}
	if err := m.Pool.SetRange(start, end); err != nil {
		return fmt.Errorf("configmap %s/%s: %w", cm.Namespace, cm.Name, err)
	}
	m.updateGauges()
	return nil
}

// rangeReconciler reloads the range when its ConfigMap changes.
type rangeReconciler struct {
	m        *Manager
	client   client.Client
	recorder events.EventRecorder
}

func (r *rangeReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var cm corev1.ConfigMap
	if err := r.client.Get(ctx, req.NamespacedName, &cm); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if err := r.m.applyRange(&cm); err != nil {
		r.recorder.Eventf(&cm, nil, corev1.EventTypeWarning, "InvalidMACRange", "Reload", "%v", err)
		return ctrl.Result{}, nil
	}
	log.FromContext(ctx).Info("MAC range reloaded", "start", cm.Data[KeyRangeStart], "end", cm.Data[KeyRangeEnd])
	return ctrl.Result{}, nil
}

// vmReconciler, on the leader, makes a VM's reservations match its spec:
// it adopts MACs without a reservation, takes over its generateName
// admission's, deletes those of interfaces it dropped, and all of them
// when it is gone.
type vmReconciler struct {
	m        *Manager
	recorder events.EventRecorder
}

func (r *vmReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	select {
	case <-r.m.ready:
	case <-ctx.Done():
		return ctrl.Result{}, ctx.Err()
	}
	owner := Owner(req.Namespace, req.Name)
	var held coordinationv1.LeaseList
	if err := r.m.cache.List(ctx, &held, client.InNamespace(r.m.opts.Namespace), client.MatchingFields{reservedHolder: owner}); err != nil {
		return ctrl.Result{}, err
	}
	var vm kubevirtv1.VirtualMachine
	inSpec := map[string]bool{}
	err := r.m.cache.Get(ctx, req.NamespacedName, &vm)
	switch {
	case err == nil:
		inSpec = specMACs(&vm)
	case !apierrors.IsNotFound(err):
		return ctrl.Result{}, err
	}
	var retry time.Duration
	for i := range held.Items {
		l := &held.Items[i]
		mac, ok := reservedMAC(l.Name)
		if !ok || inSpec[mac.String()] {
			continue
		}
		if age := reservationAge(l); age < r.m.opts.PendingTimeout {
			// The admission that reserved it may still be on its way.
			retry = max(retry, r.m.opts.PendingTimeout-age)
			continue
		}
		// The cache may be behind the API: ask it before letting go.
		gone, err := r.m.holderGone(ctx, l, mac)
		if err != nil {
			return ctrl.Result{}, err
		}
		if gone {
			if err := r.m.deleteReservation(ctx, l); err != nil {
				return ctrl.Result{}, err
			}
			log.FromContext(ctx).V(1).Info("released a MAC", "vm", owner, "mac", mac.String())
		}
	}
	if apierrors.IsNotFound(err) {
		return ctrl.Result{RequeueAfter: retry}, nil
	}
	for s := range inSpec {
		mac, _ := net.ParseMAC(s)
		if err := r.adopt(ctx, &vm, owner, mac); err != nil {
			return ctrl.Result{}, err
		}
	}
	return ctrl.Result{RequeueAfter: retry}, nil
}

// adopt makes sure the VM's MAC has a reservation naming it.
func (r *vmReconciler) adopt(ctx context.Context, vm *kubevirtv1.VirtualMachine, owner string, mac net.HardwareAddr) error {
	var l coordinationv1.Lease
	key := client.ObjectKey{Namespace: r.m.opts.Namespace, Name: ReservationName(mac)}
	err := r.m.cache.Get(ctx, key, &l)
	if apierrors.IsNotFound(err) {
		// A VM carrying a MAC nobody reserved: admitted before kvnet
		// reserved MACs, in an opted-out namespace, or past the webhook.
		err = r.m.reader.Get(ctx, key, &l)
		if apierrors.IsNotFound(err) {
			created, err := r.m.Claim(ctx, owner, mac)
			var ce *macpool.ConflictError
			if errors.As(err, &ce) {
				r.duplicate(ctx, vm, owner, mac, ce.Holder)
				return nil
			}
			if created {
				log.FromContext(ctx).Info("reserved a MAC a VM carried without a reservation", "vm", owner, "mac", mac.String())
			}
			return err
		}
	}
	if err != nil {
		return err
	}
	holder := holderOf(&l)
	switch {
	case holder == owner:
		return nil
	case isProvisional(holder) && strings.HasPrefix(holder, vm.Namespace+"/"):
		// The generateName admission that reserved it created this VM.
		l.Spec.HolderIdentity = ptr.To(owner)
		if err := r.m.writer.Update(ctx, &l); err != nil {
			if apierrors.IsConflict(err) {
				return err // requeued with the new version
			}
			return fmt.Errorf("hand reservation %s to VM %s: %w", l.Name, owner, err)
		}
		r.m.Pool.Set(owner, mac)
		return nil
	}
	if gone, err := r.m.holderGone(ctx, &l, mac); err != nil || gone {
		if err != nil {
			return err
		}
		if err := r.m.deleteReservation(ctx, &l); err != nil {
			return err
		}
		_, err := r.m.Claim(ctx, owner, mac)
		return err
	}
	r.duplicate(ctx, vm, owner, mac, holder)
	return nil
}

// duplicate says that two VMs carry one MAC (written past the webhook):
// nothing kvnet can undo, so it says so where the owner looks.
func (r *vmReconciler) duplicate(ctx context.Context, vm *kubevirtv1.VirtualMachine, owner string, mac net.HardwareAddr, holder string) {
	duplicateMACs.Inc()
	r.recorder.Eventf(vm, nil, corev1.EventTypeWarning, "DuplicateMAC", "Reserve",
		"MAC %s of this VM is also used by VM %s", mac, holder)
	log.FromContext(ctx).Error(&macpool.ConflictError{MAC: mac, Holder: holder}, "MAC seen on VM is held by another", "vm", owner)
}

// pendingCleaner, on the leader, deletes reservations older than
// PendingTimeout whose VM never reached the API or no longer carries the
// MAC, and hands generateName admissions' reservations to their VMs.
type pendingCleaner struct{ m *Manager }

// NeedLeaderElection: the reservations' upkeep is the leader's.
func (p *pendingCleaner) NeedLeaderElection() bool { return true }

func (p *pendingCleaner) Start(ctx context.Context) error {
	select {
	case <-p.m.ready:
	case <-ctx.Done():
		return nil
	}
	t := time.NewTicker(p.m.opts.PendingTimeout / 4)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		p.sweep(ctx)
	}
}

func (p *pendingCleaner) sweep(ctx context.Context) {
	var leases coordinationv1.LeaseList
	if err := p.m.cache.List(ctx, &leases, client.InNamespace(p.m.opts.Namespace), client.MatchingLabels{ReservationLabel: "true"}); err != nil {
		return
	}
	for i := range leases.Items {
		l := &leases.Items[i]
		mac, ok := reservedMAC(l.Name)
		if !ok || reservationAge(l) < p.m.opts.PendingTimeout {
			continue
		}
		holder := holderOf(l)
		ns, name, _ := strings.Cut(holder, "/")
		if !isProvisional(holder) {
			// The common case, answered by the cache: the VM carries it.
			var vm kubevirtv1.VirtualMachine
			if err := p.m.cache.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &vm); err == nil && specMACs(&vm)[mac.String()] {
				continue
			}
		} else if carrier := p.provisionalCarrier(ctx, ns, mac); carrier != "" {
			l.Spec.HolderIdentity = ptr.To(carrier)
			if err := p.m.writer.Update(ctx, l); err != nil {
				log.FromContext(ctx).Error(err, "hand a generateName admission's MAC to its VM", "mac", mac.String(), "vm", carrier)
			}
			continue
		}
		gone, err := p.m.holderGone(ctx, l, mac)
		if err != nil || !gone {
			continue
		}
		if err := p.m.deleteReservation(ctx, l); err != nil {
			log.FromContext(ctx).Error(err, "release an abandoned reservation", "mac", mac.String())
			continue
		}
		abandonedTotal.Inc()
		log.FromContext(ctx).Info("released the MAC of a VM admission that never reached the API, or of a VM that dropped it", "mac", mac.String(), "holder", holder)
	}
}

// provisionalCarrier returns the VM of namespace carrying mac, from the cache.
func (p *pendingCleaner) provisionalCarrier(ctx context.Context, namespace string, mac net.HardwareAddr) string {
	var vms kubevirtv1.VirtualMachineList
	if err := p.m.cache.List(ctx, &vms, client.InNamespace(namespace), client.MatchingFields{vmMACIndex: mac.String()}); err != nil || len(vms.Items) == 0 {
		return ""
	}
	return Owner(vms.Items[0].Namespace, vms.Items[0].Name)
}
