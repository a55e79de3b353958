// Package hostsubnets gives every node its host subnets of every Layer3
// network (see package hostsubnet): it plans from all NADs and nodes at
// once and writes each node's kvnet.io/node-subnets annotation. The
// annotations are the only record, so assignments survive controller
// restarts, and a deleted node's subnets are free for the next node.
package hostsubnets

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
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
	"kvnet.io/kvnet/internal/netconf"
)

// Annotation is the node annotation this controller writes.
const Annotation = hostsubnet.Annotation

// Options configures the controller.
type Options struct {
	// SkipNameValidation allows registering it again in one process.
	SkipNameValidation bool
}

// writers is how many node writes a pass makes at once.
const writers = 16

// all is the one request: every event replans every node.
var all = reconcile.Request{NamespacedName: types.NamespacedName{Name: "all-nodes"}}

// Setup registers the host subnet controller with mgr.
func Setup(mgr ctrl.Manager, opts Options) error {
	r := &reconciler{client: mgr.GetClient(), apiReader: mgr.GetAPIReader()}
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
	return ctrl.NewControllerManagedBy(mgr).
		Named("host-subnets").
		Watches(&corev1.Node{}, toAll, builder.WithPredicates(nodeChanges)).
		Watches(&nadv1.NetworkAttachmentDefinition{}, toAll).
		WithOptions(controller.Options{MaxConcurrentReconciles: 1, SkipNameValidation: &opts.SkipNameValidation}).
		Complete(r)
}

type reconciler struct {
	client    client.Client
	apiReader client.Reader
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

func (r *reconciler) Reconcile(ctx context.Context, _ ctrl.Request) (ctrl.Result, error) {
	logger := log.FromContext(ctx)
	var nads nadv1.NetworkAttachmentDefinitionList
	if err := r.client.List(ctx, &nads); err != nil {
		return ctrl.Result{}, err
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
	plan := hostsubnet.Assign(Networks(nads.Items), nodes)
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
	return ctrl.Result{}, nil
}

// current returns the host subnets node holds (nil if none or unreadable).
func current(node *corev1.Node) (hostsubnet.Subnets, error) {
	v, ok := node.Annotations[Annotation]
	if !ok {
		return nil, nil
	}
	return hostsubnet.Parse(v)
}
