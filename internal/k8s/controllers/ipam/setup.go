package ipam

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	nadv1 "kvnet.io/kvnet/api/k8scni/v1"
	ipamclaimv1alpha1 "kvnet.io/kvnet/api/k8scni/v1alpha1"
	"kvnet.io/kvnet/internal/ipam"
	"kvnet.io/kvnet/internal/k8s/predicates"
	"kvnet.io/kvnet/internal/multus"
	"kvnet.io/kvnet/internal/podnetworks"
	"kvnet.io/kvnet/internal/udn"
)

// Options configures the allocation controller.
type Options struct {
	// MaxConcurrentReconciles of the pod controller; 0 means 16.
	MaxConcurrentReconciles int
	// SkipNameValidation allows registering the controllers again in one
	// process (tests that restart the controller).
	SkipNameValidation bool
	// Reserve configures the restart reserve (see reserveSet); a zero
	// Size turns it off.
	Reserve ReserveOptions
	// HoldRebuild, if set, holds the rebuild after the restart reserve is
	// loaded until it is closed (tests).
	HoldRebuild <-chan struct{}
}

// Started is what Setup returns.
type Started struct {
	// Ready fails until the allocators are rebuilt or new pods are
	// served from the restart reserve; add it as a readiness check.
	Ready healthz.Checker
	// Rebuilt is closed once the allocators are rebuilt. Other controllers
	// that read every IPAMClaim at start (vmclaims) wait for it, so that
	// the rebuild, on the critical path of the first allocation, has the
	// API server to itself.
	Rebuilt <-chan struct{}
}

// Setup registers the allocation controllers and the start-up rebuild with
// mgr.
func Setup(mgr ctrl.Manager, opts Options) (Started, error) {
	if opts.MaxConcurrentReconciles == 0 {
		opts.MaxConcurrentReconciles = 16
	}
	st := newState()
	ready := make(chan struct{})
	claimsWatched := make(chan struct{})
	lister, err := newRESTClaimLister(mgr.GetConfig(), mgr.GetScheme(), claimPageSize)
	if err != nil {
		return Started{}, err
	}
	c := mgr.GetClient()
	var (
		rs     *reserveSet
		window chan struct{}
		// serving is closed once new pods are served before the
		// rebuild: the reserve is loaded and new pods are watched.
		serving chan struct{}
	)
	if opts.Reserve.Namespace != "" {
		rs = newReserveSet(opts.Reserve, mgr.GetAPIReader(), c, st)
		window = make(chan struct{})
		serving = make(chan struct{})
		if err := mgr.Add(&keeper{rs: rs, rebuilt: ready}); err != nil {
			return Started{}, err
		}
	}
	if err := mgr.Add(&rebuilder{cache: mgr.GetCache(), claims: lister, st: st, ready: ready,
		claimsWatched: claimsWatched, watchTimeout: 2 * time.Minute,
		reserve: rs, window: window, hold: opts.HoldRebuild}); err != nil {
		return Started{}, err
	}
	pr := &podReconciler{client: c, apiReader: mgr.GetAPIReader(), recorder: mgr.GetEventRecorder("kvnet-ipam"), st: st, ready: ready,
		window: window, reserve: rs}
	// IPAMClaims are watched as metadata only (names are all the mappings
	// need; the rebuild and allocations read claims from the API server),
	// and only after the rebuild, which has read every claim already (see
	// deferredSource).
	nadSource := source.Kind(mgr.GetCache(), client.Object(&nadv1.NetworkAttachmentDefinition{}), handler.EnqueueRequestsFromMapFunc(
		func(ctx context.Context, o client.Object) []reconcile.Request {
			return waitingPods(ctx, c, o.GetNamespace(), "")
		}), predicate.Funcs{DeleteFunc: func(event.DeleteEvent) bool { return false }})
	// A node's new host subnets wake its pods waiting for them.
	nodeSource := source.Kind(mgr.GetCache(), client.Object(&corev1.Node{}), handler.EnqueueRequestsFromMapFunc(
		func(_ context.Context, o client.Object) []reconcile.Request {
			var reqs []reconcile.Request
			for _, p := range st.takeWaiting(nodeWait(o.GetName())) {
				reqs = append(reqs, reconcile.Request{NamespacedName: p})
			}
			return reqs
		}), predicate.AnnotationChangedPredicate{})
	pods := ctrl.NewControllerManagedBy(mgr).Named("ipam-pods")
	if rs != nil && opts.Reserve.Size > 0 {
		// Served from the restart reserve before the rebuild: the workers
		// do not wait for the caches (a Kind source waits for every
		// informer of the cache, the pod cache's initial list included,
		// which the rebuild waits for anyway); the pods without an
		// allocation in that list, and those created since a watch that
		// needs no list began, are served meanwhile (state.markNew).
		watcher, err := client.NewWithWatch(mgr.GetConfig(), client.Options{Scheme: mgr.GetScheme(), Mapper: mgr.GetRESTMapper()})
		if err != nil {
			return Started{}, err
		}
		now := make(chan struct{})
		close(now)
		enqueue := &handler.EnqueueRequestForObject{}
		marking := handler.Funcs{
			CreateFunc: func(ctx context.Context, e event.CreateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
				if p, ok := e.Object.(*corev1.Pod); ok && waitsForAllocation(ctx, c, p) {
					st.markNew(client.ObjectKeyFromObject(p))
				}
				enqueue.Create(ctx, e, q)
			},
			UpdateFunc:  enqueue.Update,
			DeleteFunc:  enqueue.Delete,
			GenericFunc: enqueue.Generic,
		}
		pods = pods.
			WatchesRawSource(&deferredSource{after: now, src: source.Kind(mgr.GetCache(), client.Object(&corev1.Pod{}), handler.EventHandler(marking), podNeedsWork)}).
			WatchesRawSource(&newPodsSource{watcher: watcher, cache: c, window: window, ready: ready, mark: st.markNew, watching: serving}).
			WatchesRawSource(&deferredSource{after: now, src: nadSource}).
			WatchesRawSource(&deferredSource{after: now, src: nodeSource})
	} else {
		pods = pods.For(&corev1.Pod{}, builder.WithPredicates(podNeedsWork)).
			WatchesRawSource(nadSource).
			WatchesRawSource(nodeSource)
	}
	err = pods.
		// A new claim wakes the pods waiting for it. Claims of the initial
		// list wake nobody: every pod is reconciled at start anyway, and
		// one retries every retryMissing while its claim is missing.
		WatchesRawSource(&deferredSource{after: ready, src: source.Kind(mgr.GetCache(), claimMetadata(),
			handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
				return waitingPods(ctx, c, o.GetNamespace(), o.GetName())
			}), predicate.Funcs{
				CreateFunc:  func(e event.CreateEvent) bool { return !e.IsInInitialList },
				UpdateFunc:  func(event.UpdateEvent) bool { return false },
				DeleteFunc:  func(event.DeleteEvent) bool { return false },
				GenericFunc: func(event.GenericEvent) bool { return false },
			})}).
		WatchesRawSource(source.Channel(st.wake, &handler.EnqueueRequestForObject{})).
		WithOptions(controller.Options{MaxConcurrentReconciles: opts.MaxConcurrentReconciles, SkipNameValidation: &opts.SkipNameValidation}).
		Complete(pr)
	if err != nil {
		return Started{}, err
	}
	cr := &claimReconciler{client: c, apiReader: mgr.GetAPIReader(), st: st, ready: ready}
	err = ctrl.NewControllerManagedBy(mgr).
		Named("ipam-claims").
		WatchesRawSource(&deferredSource{after: ready, src: source.Kind(mgr.GetCache(), claimMetadata(),
			&handler.EnqueueRequestForObject{}, predicate.Funcs{
				CreateFunc:  func(event.CreateEvent) bool { return false },
				UpdateFunc:  func(event.UpdateEvent) bool { return false },
				DeleteFunc:  func(event.DeleteEvent) bool { return true },
				GenericFunc: func(event.GenericEvent) bool { return false },
			}),
			synced: func(ctx context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
				cr.sweep(ctx, q)
				close(claimsWatched)
			}}).
		Watches(&corev1.Namespace{}, handler.EnqueueRequestsFromMapFunc(cr.claimsIn), builder.WithPredicates(predicates.Deletes)).
		WithOptions(controller.Options{SkipNameValidation: &opts.SkipNameValidation}).
		Complete(cr)
	if err != nil {
		return Started{}, err
	}
	if err := mgr.Add(&exhaustionMarker{st: st, client: c, interval: time.Second}); err != nil {
		return Started{}, err
	}
	return Started{Rebuilt: ready, Ready: func(*http.Request) error {
		select {
		case <-ready:
			return nil
		case <-serving: // nil without the reserve: never
			return nil
		default:
			return errors.New("ipam allocators not rebuilt yet")
		}
	}}, nil
}

// claimMetadata is an IPAMClaim as metadata only.
func claimMetadata() client.Object {
	md := &metav1.PartialObjectMetadata{}
	md.SetGroupVersionKind(ipamclaimv1alpha1.GroupVersion.WithKind("IPAMClaim"))
	return md
}

// podNeedsWork passes pod events the allocator acts on: new pods, pods
// whose network requests changed or that lack their annotation, pods that
// completed, and deletions.
var podNeedsWork = predicate.Funcs{
	CreateFunc:  func(event.CreateEvent) bool { return true },
	DeleteFunc:  func(event.DeleteEvent) bool { return true },
	GenericFunc: func(event.GenericEvent) bool { return false },
	UpdateFunc: func(e event.UpdateEvent) bool {
		o, ok1 := e.ObjectOld.(*corev1.Pod)
		n, ok2 := e.ObjectNew.(*corev1.Pod)
		if !ok1 || !ok2 {
			return false
		}
		if n.Status.Phase != o.Status.Phase {
			return true
		}
		if _, annotated := n.Annotations[podnetworks.Annotation]; !annotated {
			return true
		}
		if !hasNetworkLabel(n) {
			return true // labels removed (or never written): labelPod
		}
		for _, k := range []string{multus.NetworksAnnotation, multus.DefaultNetworkAnnotation, ipam.LegacyPrimaryClaimAnnotation} {
			if o.Annotations[k] != n.Annotations[k] {
				return true
			}
		}
		return false
	},
}

// hasNetworkLabel reports whether the pod has a network label
// (podnetworks.NetworkLabelPrefix): an annotated pod without any lost them.
func hasNetworkLabel(p *corev1.Pod) bool {
	for k := range p.Labels {
		if strings.HasPrefix(k, podnetworks.NetworkLabelPrefix) {
			return true
		}
	}
	return false
}

// waitsForAllocation reports whether p may wait for kvnet's first
// allocation: it has no kvnet.io/pod-networks annotation yet and selects
// networks through Multus or runs in a namespace with a primary network
// (read from c, a cache). The restart reserve serves only such pods
// before the rebuild; a pod of the cluster default network alone is not
// read from the API server meanwhile.
func waitsForAllocation(ctx context.Context, c client.Reader, p *corev1.Pod) bool {
	if p.Spec.HostNetwork {
		return false
	}
	if _, done := p.Annotations[podnetworks.Annotation]; done {
		return false
	}
	for _, k := range []string{multus.NetworksAnnotation, multus.DefaultNetworkAnnotation, ipam.LegacyPrimaryClaimAnnotation} {
		if p.Annotations[k] != "" {
			return true
		}
	}
	var ns corev1.Namespace
	if err := c.Get(ctx, client.ObjectKey{Name: p.Namespace}, &ns); err != nil {
		return false
	}
	_, primary := ns.Labels[udn.PrimaryNamespaceLabel]
	return primary
}

// waitingPods returns the pods of a namespace without their annotation (and
// referencing claim, when set): a NAD or claim they waited for appeared.
func waitingPods(ctx context.Context, c client.Client, namespace, claim string) []reconcile.Request {
	var pods corev1.PodList
	if err := c.List(ctx, &pods, client.InNamespace(namespace)); err != nil {
		return nil
	}
	var out []reconcile.Request
	for _, p := range pods.Items {
		if _, done := p.Annotations[podnetworks.Annotation]; done || p.Spec.HostNetwork {
			continue
		}
		if claim != "" && !referencesClaim(&p, claim) {
			continue
		}
		out = append(out, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: p.Namespace, Name: p.Name}})
	}
	return out
}

func referencesClaim(p *corev1.Pod, claim string) bool {
	for _, k := range []string{multus.NetworksAnnotation, multus.DefaultNetworkAnnotation, ipam.LegacyPrimaryClaimAnnotation} {
		if strings.Contains(p.Annotations[k], claim) {
			return true
		}
	}
	return false
}
