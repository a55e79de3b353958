// Package nodeids gives every node a cluster-unique node ID, the
// annotation k8s.ovn.org/node-id as OVN-Kubernetes' cluster manager
// writes it. kvnet-node derives per-node addresses and MACs from it (each
// router's service address on a primary network). IDs are kept in the
// annotations only, so they survive controller restarts, and are freed
// when a node goes.
package nodeids

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"kvnet.io/kvnet/internal/nodeid"
)

// Annotation is the node ID annotation (see package nodeid).
const Annotation = nodeid.Annotation

// MaxID is the largest node ID.
const MaxID = nodeid.MaxID

// Parse returns the node ID a node holds (see nodeid.Parse).
func Parse(node *corev1.Node) (int, bool) { return nodeid.Parse(node) }

// Options configures the controller.
type Options struct {
	// SkipNameValidation allows registering it again in one process.
	SkipNameValidation bool
}

// Setup registers the node ID controller with mgr.
func Setup(mgr ctrl.Manager, opts Options) error {
	r := &reconciler{client: mgr.GetClient(), apiReader: mgr.GetAPIReader(), byNode: map[string]int{}, byID: map[int]string{}}
	return ctrl.NewControllerManagedBy(mgr).
		Named("node-ids").
		For(&corev1.Node{}).
		// One worker: IDs are handed out one at a time.
		WithOptions(controller.Options{MaxConcurrentReconciles: 1, SkipNameValidation: &opts.SkipNameValidation}).
		Complete(r)
}

type reconciler struct {
	client    client.Client
	apiReader client.Reader

	mu     sync.Mutex
	inited bool
	byNode map[string]int // node -> ID it holds
	byID   map[int]string // ID -> node
}

// init records the IDs the nodes hold, from the API server: the first
// node (by name) holding an ID keeps it; a second holder gets a new one
// when reconciled.
func (r *reconciler) init(ctx context.Context) error {
	if r.inited {
		return nil
	}
	var list corev1.NodeList
	if err := r.apiReader.List(ctx, &list); err != nil {
		return fmt.Errorf("list nodes to restore their IDs: %w", err)
	}
	slices.SortFunc(list.Items, func(a, b corev1.Node) int { return strings.Compare(a.Name, b.Name) })
	for i := range list.Items {
		if id, ok := Parse(&list.Items[i]); ok {
			if _, taken := r.byID[id]; !taken {
				r.byID[id], r.byNode[list.Items[i].Name] = list.Items[i].Name, id
			}
		}
	}
	r.inited = true
	log.FromContext(ctx).Info("restored node IDs", "nodes", len(r.byNode))
	return nil
}

func (r *reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.init(ctx); err != nil {
		return ctrl.Result{}, err
	}
	var node corev1.Node
	if err := r.apiReader.Get(ctx, types.NamespacedName{Name: req.Name}, &node); client.IgnoreNotFound(err) != nil {
		return ctrl.Result{}, err
	} else if err != nil || node.DeletionTimestamp != nil {
		r.release(req.Name)
		return ctrl.Result{}, nil
	}
	id, ok := Parse(&node)
	if ok && r.byID[id] == node.Name {
		return ctrl.Result{}, nil
	}
	if ok && r.byID[id] == "" {
		// Written by an earlier controller after this one listed.
		r.release(node.Name)
		r.byID[id], r.byNode[node.Name] = node.Name, id
		return ctrl.Result{}, nil
	}
	// No ID, an invalid one, or one another node holds: a free one.
	r.release(node.Name)
	next := 0
	for candidate := 1; candidate <= MaxID; candidate++ {
		if _, taken := r.byID[candidate]; !taken {
			next = candidate
			break
		}
	}
	if next == 0 {
		return ctrl.Result{}, fmt.Errorf("node %s: all %d node IDs are in use", node.Name, MaxID)
	}
	patch := client.MergeFromWithOptions(node.DeepCopy(), client.MergeFromWithOptimisticLock{})
	if node.Annotations == nil {
		node.Annotations = map[string]string{}
	}
	old := node.Annotations[Annotation]
	node.Annotations[Annotation] = strconv.Itoa(next)
	if err := r.client.Patch(ctx, &node, patch); err != nil {
		return ctrl.Result{}, fmt.Errorf("node %s: write node ID %d: %w", node.Name, next, err)
	}
	r.byID[next], r.byNode[node.Name] = node.Name, next
	log.FromContext(ctx).Info("assigned node ID", "node", node.Name, "id", next, "previous", old)
	return ctrl.Result{}, nil
}

// release frees the ID node holds, if any.
func (r *reconciler) release(node string) {
	if id, ok := r.byNode[node]; ok {
		delete(r.byNode, node)
		if r.byID[id] == node {
			delete(r.byID, id)
		}
	}
}
