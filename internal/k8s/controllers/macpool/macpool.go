// Package macpool runs kvnet's MAC pool (KubeMacPool semantics) in
// kvnet-controller: the pool state rebuilt from VirtualMachines at start,
// the range read from a ConfigMap and reloaded live, MACs released when a
// VM or one of its interfaces goes, allocations the API never committed
// cleaned up, and MAC collisions among running VMIs reported.
//
// The pool lives in the leader only. Two replicas each handing out MACs
// from their own pool would hand out the same MAC twice, so the rebuild and
// every pool controller are leader-elected, and a replica answers the VM
// webhook only once it is the leader and has rebuilt the pool from the API.
// Until then its /readyz fails, so the webhook Service (which only routes
// to Ready pods) sends no admission to a standby; one that reaches it
// anyway is refused with a retryable error, never answered from a stale
// pool.
package macpool

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

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
	// PendingTimeout after which an allocation whose VM never appeared is
	// released (the VM write failed after the webhook answered). Default 60 s.
	PendingTimeout time.Duration
	// SkipNameValidation allows registering the controllers again in one
	// process (tests that restart the controller).
	SkipNameValidation bool
}

// Manager owns the pool. It is safe for concurrent use.
type Manager struct {
	Pool   *macpool.Pool
	opts   Options
	ready  chan struct{}
	reader client.Reader // the API, not the cache

	mu      sync.Mutex           // guards following
	pending map[string]time.Time // VM owner -> time of its oldest uncommitted allocation
}

// Owner is the pool owner key of a VM.
func Owner(namespace, name string) string { return namespace + "/" + name }

// provisionalMark starts the name part of a provisional owner.
const provisionalMark = "generateName:"

// ProvisionalOwner is the owner key of MACs given to a VM created with
// generateName: at admission it has no name yet, so the MACs are held under
// the admission request's UID until the VM reconciler sees the created VM
// carry them and hands them to it.
func ProvisionalOwner(namespace, requestUID string) string {
	return Owner(namespace, provisionalMark+requestUID)
}

func isProvisionalIn(owner, namespace string) bool {
	return strings.HasPrefix(owner, namespace+"/"+provisionalMark)
}

// Ready reports whether the pool was rebuilt and may serve.
func (m *Manager) Ready() bool {
	select {
	case <-m.ready:
		return true
	default:
		return false
	}
}

// MarkPending notes that owner got MACs its VM does not show yet.
func (m *Manager) MarkPending(owner string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.pending[owner]; !ok {
		m.pending[owner] = time.Now()
	}
}

// ReleaseIfGone releases the MACs of holder when its VM is not in the API
// and no admission of it is pending, and reports whether it did. The
// webhook calls it before refusing a MAC, so a VM whose deletion the
// controller has not seen yet (a slow watch, a restart) never keeps its
// MACs from being reused.
func (m *Manager) ReleaseIfGone(ctx context.Context, holder string) bool {
	m.mu.Lock()
	_, pending := m.pending[holder]
	m.mu.Unlock()
	if pending {
		return false
	}
	ns, name, _ := strings.Cut(holder, "/")
	var vm metav1.PartialObjectMetadata
	vm.SetGroupVersionKind(kubevirtv1.GroupVersion.WithKind("VirtualMachine"))
	if err := m.reader.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &vm); !apierrors.IsNotFound(err) {
		return false
	}
	m.Pool.ReleaseOwner(holder)
	log.FromContext(ctx).Info("released the MACs of a VM that is gone", "vm", holder)
	return true
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

// Setup registers the pool's controllers and start-up rebuild and returns
// the manager the VM webhook uses.
func Setup(mgr ctrl.Manager, opts Options) (*Manager, error) {
	if opts.PendingTimeout == 0 {
		opts.PendingTimeout = time.Minute
	}
	pool, err := macpool.New(DefaultStart, DefaultEnd)
	if err != nil {
		return nil, err
	}
	m := &Manager{Pool: pool, opts: opts, ready: make(chan struct{}), reader: mgr.GetAPIReader(), pending: map[string]time.Time{}}
	if err := mgr.Add(&rebuilder{m: m, cache: mgr.GetCache(), reader: mgr.GetAPIReader()}); err != nil {
		return nil, err
	}
	c := mgr.GetClient()
	err = ctrl.NewControllerManagedBy(mgr).
		Named("macpool-vms").
		For(&kubevirtv1.VirtualMachine{}).
		WithOptions(controller.Options{MaxConcurrentReconciles: 4, SkipNameValidation: &opts.SkipNameValidation}).
		Complete(&vmReconciler{m: m, client: c, recorder: mgr.GetEventRecorder("kvnet-macpool")})
	if err != nil {
		return nil, err
	}
	err = ctrl.NewControllerManagedBy(mgr).
		Named("macpool-range").
		For(&corev1.ConfigMap{}, builder.WithPredicates(predicate.NewPredicateFuncs(func(o client.Object) bool {
			return o.GetNamespace() == opts.ConfigMap.Namespace && o.GetName() == opts.ConfigMap.Name
		}))).
		WithOptions(controller.Options{SkipNameValidation: &opts.SkipNameValidation}).
		Complete(&rangeReconciler{m: m, client: c, recorder: mgr.GetEventRecorder("kvnet-macpool")})
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
	if err := mgr.Add(&pendingCleaner{m: m, reader: mgr.GetAPIReader()}); err != nil {
		return nil, err
	}
	return m, nil
}

// rebuilder restores the pool from every VM once this replica is elected,
// before the webhook serves.
type rebuilder struct {
	m      *Manager
	cache  cache.Cache
	reader client.Reader
}

// NeedLeaderElection: the pool is the leader's.
func (b *rebuilder) NeedLeaderElection() bool { return true }

func (b *rebuilder) Start(ctx context.Context) error {
	logger := log.FromContext(ctx).WithName("macpool-rebuild")
	// The range first, so rebuilt MACs are counted in it.
	var cm corev1.ConfigMap
	if err := b.reader.Get(ctx, b.m.opts.ConfigMap, &cm); err == nil {
		if err := b.m.applyRange(&cm); err != nil {
			logger.Error(err, "bad MAC range; keeping the default", "configmap", b.m.opts.ConfigMap.String())
		}
	} else if !apierrors.IsNotFound(err) {
		return err
	}
	if !b.cache.WaitForCacheSync(ctx) {
		return errors.New("macpool rebuild: caches did not sync")
	}
	// From the API server, not the cache: a VM the previous leader admitted
	// a moment ago may not have reached this replica's watch yet, and its
	// MACs must be held before this replica hands out any.
	var vms kubevirtv1.VirtualMachineList
	if err := b.reader.List(ctx, &vms); err != nil {
		return fmt.Errorf("macpool rebuild: list VirtualMachines: %w", err)
	}
	start, dups := time.Now(), 0
	for i := range vms.Items {
		vm := &vms.Items[i]
		owner := Owner(vm.Namespace, vm.Name)
		for iface, s := range VMMACs(vm) {
			mac, err := net.ParseMAC(s)
			if err != nil {
				continue
			}
			if err := b.m.Pool.Reserve(owner, mac); err != nil {
				dups++
				duplicateMACs.Inc()
				logger.Error(err, "duplicate MAC among VMs", "vm", owner, "interface", iface)
			}
		}
	}
	close(b.m.ready)
	size, used := b.m.Pool.Stats()
	poolSize.Set(float64(size))
	poolUsed.Set(float64(used))
	logger.Info("MAC pool rebuilt from VMs", "vms", len(vms.Items), "duplicates", dups, "duration", time.Since(start).String())
	<-ctx.Done()
	return nil
}

func (m *Manager) applyRange(cm *corev1.ConfigMap) error {
	start, end, err := macpool.ParseRange(cm.Data[KeyRangeStart], cm.Data[KeyRangeEnd])
	if err != nil {
		return fmt.Errorf("configmap %s/%s: %w", cm.Namespace, cm.Name, err)
	}
	if err := m.Pool.SetRange(start, end); err != nil {
		return fmt.Errorf("configmap %s/%s: %w", cm.Namespace, cm.Name, err)
	}
	size, used := m.Pool.Stats()
	poolSize.Set(float64(size))
	poolUsed.Set(float64(used))
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

// vmReconciler commits a VM's MACs once the API has it, releases the MACs
// of interfaces it dropped, and all of them when it is gone.
type vmReconciler struct {
	m        *Manager
	client   client.Client
	recorder events.EventRecorder
}

func (r *vmReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	select {
	case <-r.m.ready:
	case <-ctx.Done():
		return ctrl.Result{}, ctx.Err()
	}
	owner := Owner(req.Namespace, req.Name)
	var vm kubevirtv1.VirtualMachine
	if err := r.client.Get(ctx, req.NamespacedName, &vm); err != nil {
		if apierrors.IsNotFound(err) {
			held := len(r.m.Pool.MACs(owner))
			r.m.Pool.ReleaseOwner(owner)
			r.m.commit(owner)
			log.FromContext(ctx).V(1).Info("released the MACs of a deleted VM", "vm", owner, "macs", held)
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, err
	}
	inSpec := map[string]bool{}
	for _, s := range VMMACs(&vm) {
		if mac, err := net.ParseMAC(s); err == nil {
			inSpec[mac.String()] = true
		}
	}
	r.m.mu.Lock()
	_, pending := r.m.pending[owner]
	r.m.mu.Unlock()
	for _, mac := range r.m.Pool.MACs(owner) {
		// While an allocation is pending, a MAC missing from this (maybe
		// older) copy of the VM may be the one being written now.
		if !inSpec[mac.String()] && !pending {
			r.m.Pool.Release(owner, mac)
		}
	}
	// A MAC on a VM that nobody holds came by another way than this
	// replica's webhook (an opted-out namespace, the webhook of a leader
	// that just stepped down): hold it, so it is never handed out again.
	// A MAC held provisionally (the VM was admitted with generateName) is
	// handed to the VM that now carries it.
	for s := range inSpec {
		mac := mustMAC(s)
		h, held := r.m.Pool.Holder(mac)
		if held && isProvisionalIn(h, req.Namespace) && r.m.Pool.Transfer(h, owner, mac) {
			continue
		}
		if held && h == owner {
			continue
		}
		err := r.m.Pool.Reserve(owner, mac)
		var ce *macpool.ConflictError
		if errors.As(err, &ce) {
			// Two VMs carry one MAC (written past the webhook, or admitted
			// by a leader that had stepped down): nothing kvnet can undo,
			// so say so where the owner looks.
			duplicateMACs.Inc()
			r.recorder.Eventf(&vm, nil, corev1.EventTypeWarning, "DuplicateMAC", "Reserve",
				"MAC %s of this VM is also used by VM %s", mac, ce.Holder)
			log.FromContext(ctx).Error(err, "MAC seen on VM is held by another", "vm", owner)
		} else if err != nil {
			log.FromContext(ctx).Error(err, "hold MAC seen on VM", "vm", owner)
		}
	}
	all := true
	for mac := range inSpec {
		if h, ok := r.m.Pool.Holder(mustMAC(mac)); !ok || h != owner {
			all = false
		}
	}
	if all {
		r.m.commit(owner)
	}
	size, used := r.m.Pool.Stats()
	poolUsed.Set(float64(used))
	poolSize.Set(float64(size))
	return ctrl.Result{}, nil
}

func mustMAC(s string) net.HardwareAddr {
	m, _ := net.ParseMAC(s)
	return m
}

func (m *Manager) commit(owner string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.pending, owner)
}

// pendingCleaner releases allocations whose VM never reached the API.
type pendingCleaner struct {
	m      *Manager
	reader client.Reader
}

// NeedLeaderElection: the pool is the leader's.
func (p *pendingCleaner) NeedLeaderElection() bool { return true }

func (p *pendingCleaner) Start(ctx context.Context) error {
	interval := p.m.opts.PendingTimeout / 4
	t := time.NewTicker(interval)
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
	p.m.mu.Lock()
	var stale []string
	for owner, since := range p.m.pending {
		if time.Since(since) > p.m.opts.PendingTimeout {
			stale = append(stale, owner)
		}
	}
	p.m.mu.Unlock()
	for _, owner := range stale {
		ns, name, _ := strings.Cut(owner, "/")
		if strings.HasPrefix(name, provisionalMark) {
			if err := p.settleProvisional(ctx, ns, owner); err != nil {
				log.FromContext(ctx).Error(err, "settle MACs of a generateName VM admission", "owner", owner)
				continue
			}
			p.m.commit(owner)
			continue
		}
		var vm kubevirtv1.VirtualMachine
		err := p.reader.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &vm)
		switch {
		case apierrors.IsNotFound(err):
			p.m.Pool.ReleaseOwner(owner)
			abandonedTotal.Inc()
			log.FromContext(ctx).Info("released MACs of an abandoned VM admission", "vm", owner)
		case err != nil:
			continue
		default:
			inSpec := map[string]bool{}
			for _, s := range VMMACs(&vm) {
				inSpec[strings.ToLower(s)] = true
			}
			for _, mac := range p.m.Pool.MACs(owner) {
				if !inSpec[mac.String()] {
					p.m.Pool.Release(owner, mac)
					abandonedTotal.Inc()
				}
			}
		}
		p.m.commit(owner)
	}
}

// settleProvisional ends a generateName admission's hold: MACs a VM of the
// namespace carries (the VM reconciler has not seen it yet) go to that VM,
// the rest belong to an admission that never reached the API and are freed.
// The VMs are read from the API server, so a late watch frees nothing in use.
func (p *pendingCleaner) settleProvisional(ctx context.Context, namespace, owner string) error {
	held := p.m.Pool.MACs(owner)
	if len(held) == 0 {
		return nil
	}
	var vms kubevirtv1.VirtualMachineList
	if err := p.reader.List(ctx, &vms, client.InNamespace(namespace)); err != nil {
		return err
	}
	carrier := map[string]string{} // MAC -> owner of the VM carrying it
	for i := range vms.Items {
		for _, s := range VMMACs(&vms.Items[i]) {
			if mac, err := net.ParseMAC(s); err == nil {
				carrier[mac.String()] = Owner(vms.Items[i].Namespace, vms.Items[i].Name)
			}
		}
	}
	for _, mac := range held {
		if to, ok := carrier[mac.String()]; ok && p.m.Pool.Transfer(owner, to, mac) {
			continue
		}
		p.m.Pool.Release(owner, mac)
		abandonedTotal.Inc()
		log.FromContext(ctx).Info("released a MAC of an abandoned VM admission", "owner", owner, "mac", mac.String())
	}
	return nil
}
