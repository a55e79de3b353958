// Package hostsubnets gives every node its host subnets of every Layer3
// network (see package hostsubnet): it plans from all NADs and nodes at
// once and writes each node's kvnet.io/node-subnets annotation. The
// annotations are the only record, so assignments survive controller
// restarts, and a deleted node's subnets are free for the next node.
//
// With dynamic allocation (Options.Dynamic, as OVN-Kubernetes'
// --enable-dynamic-udn-allocation) a node holds a network's host subnets
// only while it uses the network: while a scheduled pod that has not
// ended attaches to it there, and for a grace period after the last one
// (Options.Grace), so that a pod deleted and created again does not move
// the node to another subnet. A new Layer3 network then writes no Node
// until its first pod is scheduled, and a Node carries only its own
// networks.
package hostsubnets

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	nadv1 "kvnet.io/kvnet/api/k8scni/v1"
	"kvnet.io/kvnet/internal/hostsubnet"
	"kvnet.io/kvnet/internal/ipam"
	"kvnet.io/kvnet/internal/k8s/nads"
	"kvnet.io/kvnet/internal/netconf"
)

// Annotation is the node annotation this controller writes.
const Annotation = hostsubnet.Annotation

// Options configures the controller.
type Options struct {
	// SkipNameValidation allows registering it again in one process.
	SkipNameValidation bool
	// Dynamic gives a node host subnets of a network only while pods of
	// the network run there (and for Grace after).
	Dynamic bool
	// Grace is how long a node keeps a network's host subnets after its
	// last pod of the network ended; zero means DefaultGrace.
	Grace time.Duration
}

// DefaultGrace is Options.Grace's default, OVN-Kubernetes' for dynamic
// UDN allocation.
const DefaultGrace = 120 * time.Second

// writers is how many node writes a pass makes at once.
const writers = 16

// all is the request of node events: they replan every node.
var all = reconcile.Request{NamespacedName: types.NamespacedName{Name: "all-nodes"}}

// nadsChanged is the request of NAD events: with dynamic allocation, a NAD
// also decides which pods attach to a network, so it counts them again.
var nadsChanged = reconcile.Request{NamespacedName: types.NamespacedName{Name: "nads"}}

// pods is the request of pod events (dynamic allocation): it replans every
// node only when the nodes that use a network changed.
var pods = reconcile.Request{NamespacedName: types.NamespacedName{Name: "pods"}}

// Setup registers the host subnet controller with mgr.
func Setup(mgr ctrl.Manager, opts Options) error {
	r := &reconciler{client: mgr.GetClient(), apiReader: mgr.GetAPIReader(), now: time.Now}
	if opts.Dynamic {
		r.dynamic = &dynamic{grace: cmp.Or(opts.Grace, DefaultGrace), seen: map[string]map[string]time.Time{}, use: newUsage()}
	}
	toAll := handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request {
		return []reconcile.Request{all}
	})
	// Kubelets update node status every few seconds; only a new or deleted
	// node or changed annotations matter here.
	nodeChanges := predicate.Or(predicate.AnnotationChangedPredicate{}, predicate.Funcs{
		CreateFunc: func(event.CreateEvent) bool { return true },
		DeleteFunc: func(event.DeleteEvent) bool { return true },
		UpdateFunc: func(event.UpdateEvent) bool { return false },
	})
	b := ctrl.NewControllerManagedBy(mgr).
		Named("host-subnets").
		Watches(&corev1.Node{}, toAll, builder.WithPredicates(nodeChanges)).
		Watches(&nadv1.NetworkAttachmentDefinition{}, handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request {
			return []reconcile.Request{nadsChanged}
		}))
	if opts.Dynamic {
		b = b.Watches(&corev1.Pod{}, r.dynamic.use.handler(r.client), builder.WithPredicates(podPlacement))
	}
	return b.WithOptions(controller.Options{MaxConcurrentReconciles: 1, SkipNameValidation: &opts.SkipNameValidation}).
		Complete(r)
}

// podPlacement passes the pod events that can change which nodes use a
// network: a scheduled pod created, bound, ended or deleted.
var podPlacement = predicate.Funcs{
	CreateFunc: func(e event.CreateEvent) bool {
		p, ok := e.Object.(*corev1.Pod)
		return ok && p.Spec.NodeName != ""
	},
	UpdateFunc: func(e event.UpdateEvent) bool {
		o, ok1 := e.ObjectOld.(*corev1.Pod)
		n, ok2 := e.ObjectNew.(*corev1.Pod)
		return ok1 && ok2 && (o.Spec.NodeName != n.Spec.NodeName || ended(o) != ended(n))
	},
	DeleteFunc: func(event.DeleteEvent) bool { return true },
}

// ended reports whether pod's containers are done for good.
func ended(pod *corev1.Pod) bool {
	return pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed
}

type reconciler struct {
	client    client.Client
	apiReader client.Reader
	now       func() time.Time
	// dynamic is nil unless Options.Dynamic. Reconciles run one at a
	// time, so it needs no lock.
	dynamic *dynamic
}

// dynamic is the state of dynamic allocation.
type dynamic struct {
	grace time.Duration
	// seen[network][node] is when the node last used the network (or,
	// for a node found holding it unused, when that was first seen).
	seen map[string]map[string]time.Time
	// planned are the node sets the last written pass planned with, and
	// held what every node held after it: a pod event whose sets equal
	// planned needs no pass.
	planned map[string]map[string]bool
	held    map[string]hostsubnet.Subnets
	// use counts the pods that use each network on each node.
	use *usage
}

// Networks returns the Layer3 networks the NADs define, by name; a network
// defined by several NADs (a CUDN's, one per namespace) counts once, as its
// first NAD (by namespace and name) defines it.
func Networks(nads []nadv1.NetworkAttachmentDefinition) []hostsubnet.Network {
	nads = slices.Clone(nads)
	slices.SortFunc(nads, func(a, b nadv1.NetworkAttachmentDefinition) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	seen := map[string]bool{}
	var out []hostsubnet.Network
	for i := range nads {
		if nads[i].DeletionTimestamp != nil {
			continue
		}
		s, err := netconf.ParseServed(nads[i].Spec.Config)
		if err != nil || s == nil || s.Conf == nil || s.Conf.Topology != netconf.TopologyLayer3 || seen[s.Name] {
			continue
		}
		seen[s.Name] = true
		// An invalid network is planned too: Assign reports it.
		subs, _ := netconf.ParseLayer3Subnets(s.Conf.Subnets)
		out = append(out, hostsubnet.Network{Name: s.Name, Subnets: subs})
	}
	return out
}

func (r *reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	logger := log.FromContext(ctx)
	// The cache's NADs, not copies: Networks only reads them (a pass per
	// new network copied every NAD of the cluster: at 1,000 networks,
	// a sixth of the controller's CPU while they were created).
	var nadList nadv1.NetworkAttachmentDefinitionList
	if err := r.client.List(ctx, &nadList, client.UnsafeDisableDeepCopy); err != nil {
		return ctrl.Result{}, err
	}
	networks := Networks(nadList.Items)
	var (
		active map[string]map[string]bool
		wanted map[string]map[string]bool
		result ctrl.Result
	)
	if d := r.dynamic; d != nil {
		// Pod events keep the counts; a NAD event counts again (a NAD
		// decides which pods attach to a network).
		if req == nadsChanged || !d.use.counted() {
			if err := d.use.recount(ctx, r.client); err != nil {
				return ctrl.Result{}, err
			}
		}
		active = d.use.active()
		if req == pods && d.held != nil {
			var next time.Duration
			wanted, next = d.wanted(networks, active, d.held, r.now())
			if equalSets(wanted, d.planned) {
				return ctrl.Result{RequeueAfter: next}, nil
			}
		}
	}
	// Nodes from the API server, not the cache: a node patched by the
	// previous pass but not yet in the cache would look free of its
	// subnets, and they could go to a second node.
	var nodeList corev1.NodeList
	if err := r.apiReader.List(ctx, &nodeList); err != nil {
		return ctrl.Result{}, fmt.Errorf("list nodes: %w", err)
	}
	nodes := make([]hostsubnet.Node, 0, len(nodeList.Items))
	byName := map[string]*corev1.Node{}
	for i := range nodeList.Items {
		n := &nodeList.Items[i]
		if n.DeletionTimestamp != nil {
			continue // its subnets are free once it is gone
		}
		byName[n.Name] = n
		cur, err := current(n)
		if err != nil {
			logger.Info("replacing unreadable host subnets", "node", n.Name, "reason", err.Error())
		}
		nodes = append(nodes, hostsubnet.Node{Name: n.Name, Current: cur})
	}
	if d := r.dynamic; d != nil {
		held := make(map[string]hostsubnet.Subnets, len(nodes))
		for _, n := range nodes {
			held[n.Name] = n.Current
		}
		wanted, result.RequeueAfter = d.wanted(networks, active, held, r.now())
		for i := range networks {
			networks[i].Nodes = wanted[networks[i].Name]
		}
	}
	plan := hostsubnet.Assign(networks, nodes)
	for _, p := range plan.Problems {
		logger.Info("host subnets not assigned", "problem", p)
	}
	// The writes: only this controller writes the annotation (one
	// replica leads; one pass at a time) and the pass planned from the
	// API server's own list, so a plain merge patch of the annotation is
	// safe, and a node's other changes meanwhile (its status heartbeats)
	// no longer fail the pass. Written in parallel: at hundreds of
	// nodes, one at a time made every new Layer3 network (and its pods)
	// wait for a serial pass over all of them.
	var (
		mu   sync.Mutex
		errs []error
		wg   sync.WaitGroup
		sem  = make(chan struct{}, writers)
	)
	for _, n := range nodes {
		want := plan.Nodes[n.Name]
		node := byName[n.Name]
		if v, has := node.Annotations[Annotation]; has == (len(want) > 0) && v == hostsubnet.Format(want) {
			continue
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			patch := client.MergeFrom(node.DeepCopy())
			if len(want) == 0 {
				delete(node.Annotations, Annotation)
			} else {
				if node.Annotations == nil {
					node.Annotations = map[string]string{}
				}
				node.Annotations[Annotation] = hostsubnet.Format(want)
			}
			if err := r.client.Patch(ctx, node, patch); err != nil {
				if apierrors.IsNotFound(err) {
					return // gone: its subnets are free
				}
				mu.Lock()
				errs = append(errs, fmt.Errorf("node %s: write host subnets: %w", node.Name, err))
				mu.Unlock()
				return
			}
			logger.V(1).Info("host subnets", "node", node.Name, "subnets", hostsubnet.Format(want), "previous", n.Current.String())
		})
	}
	wg.Wait()
	if len(errs) > 0 {
		return ctrl.Result{}, errors.Join(errs...)
	}
	if d := r.dynamic; d != nil {
		d.planned, d.held = wanted, plan.Nodes
	}
	return result, nil
}

// usage counts, per Layer3 network and node, the scheduled pods that have
// not ended and attach to the network there. Pod events update it as they
// come, and wake a pass only when a network gains its first pod on a node
// or loses its last: a pass then costs no walk over every pod.
type usage struct {
	mu     sync.Mutex
	pods   map[types.NamespacedName]podUse
	nodes  map[string]map[string]int // network -> node -> pods
	recent bool                      // counted from a full list once
}

// podUse is where one pod uses which Layer3 networks.
type podUse struct {
	node     string
	networks []string
}

func newUsage() *usage {
	return &usage{pods: map[types.NamespacedName]podUse{}, nodes: map[string]map[string]int{}}
}

// counted reports whether the counts were made from a full list once.
func (u *usage) counted() bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.recent
}

// set records pod's use (zero: none) and reports whether a network gained
// its first pod on a node or lost its last.
func (u *usage) set(key types.NamespacedName, use podUse) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	type pair struct{ network, node string }
	old := u.pods[key]
	// left holds the (network, node) pairs whose last pod this was,
	// unless this pod still uses them.
	left := map[pair]bool{}
	for _, nw := range old.networks {
		if u.nodes[nw][old.node]--; u.nodes[nw][old.node] <= 0 {
			delete(u.nodes[nw], old.node)
			if len(u.nodes[nw]) == 0 {
				delete(u.nodes, nw)
			}
			left[pair{nw, old.node}] = true
		}
	}
	changed := false
	for _, nw := range use.networks {
		if u.nodes[nw] == nil {
			u.nodes[nw] = map[string]int{}
		}
		if u.nodes[nw][use.node]++; u.nodes[nw][use.node] == 1 {
			if p := (pair{nw, use.node}); left[p] {
				delete(left, p)
			} else {
				changed = true
			}
		}
	}
	changed = changed || len(left) > 0
	if len(use.networks) == 0 {
		delete(u.pods, key)
	} else {
		u.pods[key] = use
	}
	return changed
}

// active returns the nodes that use each network.
func (u *usage) active() map[string]map[string]bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	out := make(map[string]map[string]bool, len(u.nodes))
	for nw, nodes := range u.nodes {
		set := make(map[string]bool, len(nodes))
		for n := range nodes {
			set[n] = true
		}
		out[nw] = set
	}
	return out
}

// recount counts again from every pod in the cache: the cache's pods,
// not copies (useOf only reads them), and each namespace's primary
// network and each NAD's network read once for all its pods.
func (u *usage) recount(ctx context.Context, c client.Reader) error {
	var list corev1.PodList
	if err := c.List(ctx, &list, client.UnsafeDisableDeepCopy); err != nil {
		return fmt.Errorf("list pods: %w", err)
	}
	res := &resolver{c: c, primary: map[string]primaryOf{}, served: map[string]servedOf{}}
	uses := make(map[types.NamespacedName]podUse, len(list.Items))
	for i := range list.Items {
		use, err := useOf(ctx, res, &list.Items[i])
		if err != nil {
			return err
		}
		if len(use.networks) > 0 {
			uses[client.ObjectKeyFromObject(&list.Items[i])] = use
		}
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	u.pods, u.nodes, u.recent = uses, map[string]map[string]int{}, true
	for _, use := range uses {
		for _, nw := range use.networks {
			if u.nodes[nw] == nil {
				u.nodes[nw] = map[string]int{}
			}
			u.nodes[nw][use.node]++
		}
	}
	return nil
}

// useOf returns the Layer3 networks pod uses on its node: none unless it
// is scheduled, not on the host's network and has not ended. A pod whose
// networks cannot be read uses none (the allocator refuses it too).
func useOf(ctx context.Context, r *resolver, pod *corev1.Pod) (podUse, error) {
	if pod.Spec.NodeName == "" || pod.Spec.HostNetwork || ended(pod) {
		return podUse{}, nil
	}
	labelled, primaryKey, err := r.primaryOf(ctx, pod.Namespace)
	if err != nil {
		return podUse{}, err
	}
	lookup := func(key string) (*netconf.Served, bool, error) { return r.lookup(ctx, key) }
	atts, _ := ipam.PodAttachments(pod, labelled, primaryKey, lookup)
	use := podUse{node: pod.Spec.NodeName}
	for _, a := range atts {
		if a.Network != nil && a.Network.Conf != nil && a.Network.Conf.Topology == netconf.TopologyLayer3 &&
			!slices.Contains(use.networks, a.Network.Name) {
			use.networks = append(use.networks, a.Network.Name)
		}
	}
	return use, nil
}

// resolver answers useOf's questions from c: a namespace's primary
// network (nads.Primary) and a NAD's network (nads.Lookup). With its
// memos (a recount's) each answer is read once: every pod of a
// namespace asks the same.
type resolver struct {
	c       client.Reader
	primary map[string]primaryOf // by namespace; nil: no memo
	served  map[string]servedOf  // by NAD key; nil: no memo
}

type primaryOf struct {
	labelled bool
	key      string
	err      error
}

type servedOf struct {
	s     *netconf.Served
	found bool
	err   error
}

func (r *resolver) primaryOf(ctx context.Context, namespace string) (bool, string, error) {
	if p, ok := r.primary[namespace]; ok {
		return p.labelled, p.key, p.err
	}
	labelled, key, err := nads.Primary(ctx, r.c, namespace)
	if r.primary != nil {
		r.primary[namespace] = primaryOf{labelled, key, err}
	}
	return labelled, key, err
}

func (r *resolver) lookup(ctx context.Context, key string) (*netconf.Served, bool, error) {
	if v, ok := r.served[key]; ok {
		return v.s, v.found, v.err
	}
	s, found, err := nads.Lookup(ctx, r.c, key)
	if r.served != nil {
		r.served[key] = servedOf{s, found, err}
	}
	return s, found, err
}

// handler keeps u current from pod events and asks for a pass when a
// node's use of a network starts or ends. A pod whose namespace cannot be
// read is left to the next full count.
func (u *usage) handler(c client.Reader) handler.EventHandler {
	update := func(ctx context.Context, pod *corev1.Pod, gone bool, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
		var use podUse
		if !gone {
			var err error
			if use, err = useOf(ctx, &resolver{c: c}, pod); err != nil {
				log.FromContext(ctx).Info("pod's networks not read", "pod", client.ObjectKeyFromObject(pod), "reason", err.Error())
				return
			}
		}
		if u.set(client.ObjectKeyFromObject(pod), use) {
			q.Add(pods)
		}
	}
	return handler.Funcs{
		CreateFunc: func(ctx context.Context, e event.CreateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			if p, ok := e.Object.(*corev1.Pod); ok {
				update(ctx, p, false, q)
			}
		},
		UpdateFunc: func(ctx context.Context, e event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			if p, ok := e.ObjectNew.(*corev1.Pod); ok {
				update(ctx, p, false, q)
			}
		},
		DeleteFunc: func(ctx context.Context, e event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			if p, ok := e.Object.(*corev1.Pod); ok {
				update(ctx, p, true, q)
			}
		},
	}
}

// wanted returns, for each network, the nodes that should hold its host
// subnets: those that use it now, and those holding it (held) whose last
// use is less than the grace period ago; and how long until the first of
// those graces ends (0: none), when the plan must be made again.
func (d *dynamic) wanted(networks []hostsubnet.Network, active map[string]map[string]bool, held map[string]hostsubnet.Subnets, now time.Time) (map[string]map[string]bool, time.Duration) {
	out := make(map[string]map[string]bool, len(networks))
	var next time.Duration
	for _, nw := range networks {
		seen := d.seen[nw.Name]
		if seen == nil {
			seen = map[string]time.Time{}
			d.seen[nw.Name] = seen
		}
		set := maps.Clone(active[nw.Name])
		if set == nil {
			set = map[string]bool{}
		}
		for node := range set {
			seen[node] = now
		}
		for node, s := range held {
			if len(s[nw.Name]) == 0 || set[node] {
				continue
			}
			t, ok := seen[node]
			if !ok {
				// Found holding it unused (after a restart, say): the
				// grace starts now.
				t, seen[node] = now, now
			}
			if left := d.grace - now.Sub(t); left > 0 {
				set[node] = true
				if next == 0 || left < next {
					next = left
				}
			}
		}
		for node := range seen {
			if !set[node] && len(held[node][nw.Name]) == 0 {
				delete(seen, node)
			}
		}
		out[nw.Name] = set
	}
	for name := range d.seen {
		if _, ok := out[name]; !ok {
			delete(d.seen, name)
		}
	}
	return out, next
}

// equalSets reports whether a and b hold the same nodes per network.
func equalSets(a, b map[string]map[string]bool) bool {
	return maps.EqualFunc(a, b, func(x, y map[string]bool) bool { return maps.Equal(x, y) })
}

// current returns the host subnets node holds (nil if none or unreadable).
func current(node *corev1.Node) (hostsubnet.Subnets, error) {
	v, ok := node.Annotations[Annotation]
	if !ok {
		return nil, nil
	}
	return hostsubnet.Parse(v)
}
