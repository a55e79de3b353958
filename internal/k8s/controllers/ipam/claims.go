package ipam

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	ipamclaimv1alpha1 "kvnet.io/kvnet/api/k8scni/v1alpha1"
)

// claimReconciler frees a claim's IPs once the claim is deleted: the only
// event that frees a persistent IP. A claim left in a namespace that no
// longer exists (the namespace controller finished a deletion without it,
// as can happen across an API server restart) is deleted first, so its
// IPs do not stay held forever.
type claimReconciler struct {
	client    client.Client // cached: claims as metadata
	apiReader client.Reader
	st        *state
	ready     <-chan struct{}
}

func (r *claimReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	select {
	case <-r.ready:
	case <-ctx.Done():
		return ctrl.Result{}, ctx.Err()
	}
	claim := &metav1.PartialObjectMetadata{}
	claim.SetGroupVersionKind(ipamclaimv1alpha1.GroupVersion.WithKind("IPAMClaim"))
	err := r.client.Get(ctx, req.NamespacedName, claim)
	if err == nil {
		return ctrl.Result{}, r.deleteIfOrphaned(ctx, claim)
	}
	if !apierrors.IsNotFound(err) {
		return ctrl.Result{}, err
	}
	// Gone from the cache; the API server confirms, so a claim the cache
	// has not seen yet (created after its list) keeps its IPs.
	err = r.apiReader.Get(ctx, req.NamespacedName, claim)
	if apierrors.IsNotFound(err) {
		if nets := r.st.releaseClaim(req.NamespacedName); len(nets) > 0 {
			log.FromContext(ctx).Info("released IPs of deleted IPAMClaim", "claim", req.NamespacedName.String(), "networks", nets)
		}
		return ctrl.Result{}, nil
	}
	return ctrl.Result{}, err
}

// deleteIfOrphaned deletes claim when its namespace does not exist (asked
// of the API server, not the cache); its delete event then frees its IPs.
func (r *claimReconciler) deleteIfOrphaned(ctx context.Context, claim *metav1.PartialObjectMetadata) error {
	if claim.DeletionTimestamp != nil {
		// Already being deleted: a finalizer holds it, and asking again
		// changes nothing (in a namespace that is gone, nothing can
		// remove the finalizer: kvnet audit reports it as Orphaned).
		return nil
	}
	var ns corev1.Namespace
	err := r.apiReader.Get(ctx, client.ObjectKey{Name: claim.Namespace}, &ns)
	if err == nil || !apierrors.IsNotFound(err) {
		return err
	}
	if err := r.client.Delete(ctx, claim); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete IPAMClaim %s/%s of deleted namespace: %w", claim.Namespace, claim.Name, err)
	}
	log.FromContext(ctx).Info("deleted IPAMClaim left in a deleted namespace", "claim", claim.Namespace+"/"+claim.Name)
	return nil
}

// claimsIn maps a deleted namespace to the claims in it: those the cache
// still has (holding IPs or not) and those holding IPs.
func (r *claimReconciler) claimsIn(ctx context.Context, o client.Object) []reconcile.Request {
	seen := map[types.NamespacedName]struct{}{}
	for _, k := range r.st.claimKeys() {
		if k.Namespace == o.GetName() {
			seen[k] = struct{}{}
		}
	}
	list := &metav1.PartialObjectMetadataList{}
	list.SetGroupVersionKind(ipamclaimv1alpha1.GroupVersion.WithKind("IPAMClaimList"))
	if err := r.client.List(ctx, list, client.InNamespace(o.GetName()), client.UnsafeDisableDeepCopy); err != nil {
		log.FromContext(ctx).Error(err, "list IPAMClaims of a deleted namespace from the cache", "namespace", o.GetName())
	}
	for i := range list.Items {
		seen[types.NamespacedName{Namespace: list.Items[i].Namespace, Name: list.Items[i].Name}] = struct{}{}
	}
	reqs := make([]reconcile.Request, 0, len(seen))
	for k := range seen {
		reqs = append(reqs, reconcile.Request{NamespacedName: k})
	}
	return reqs
}

// sweep queues the claims holding IPs that the just-synced claim cache
// does not have: deleted after the rebuild read them but before the watch
// started, they will send no delete event.
func (r *claimReconciler) sweep(ctx context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	list := &metav1.PartialObjectMetadataList{}
	list.SetGroupVersionKind(ipamclaimv1alpha1.GroupVersion.WithKind("IPAMClaimList"))
	// Keys before the list: a claim allocated later is not even queued
	// (queued ones are confirmed gone by the API server anyway).
	keys := r.st.claimKeys()
	if err := r.client.List(ctx, list, client.UnsafeDisableDeepCopy); err != nil {
		log.FromContext(ctx).Error(err, "list IPAMClaims from the cache; deleted claims keep their IPs until the next restart")
		return
	}
	present := make(map[types.NamespacedName]struct{}, len(list.Items))
	for i := range list.Items {
		present[types.NamespacedName{Namespace: list.Items[i].Namespace, Name: list.Items[i].Name}] = struct{}{}
	}
	queued := 0
	for _, k := range keys {
		if _, ok := present[k]; !ok {
			q.Add(reconcile.Request{NamespacedName: k})
			queued++
		}
	}
	// A namespace deleted while kvnet-controller was down sends no event:
	// every claim still stored in one, holding IPs or not, is looked at
	// now.
	gone := map[string]bool{}
	orphans := 0
	for k := range present {
		g, ok := gone[k.Namespace]
		if !ok {
			err := r.client.Get(ctx, client.ObjectKey{Name: k.Namespace}, &corev1.Namespace{})
			g = apierrors.IsNotFound(err)
			gone[k.Namespace] = g
		}
		if g {
			q.Add(reconcile.Request{NamespacedName: k})
			orphans++
		}
	}
	log.FromContext(ctx).Info("IPAMClaim watch synced", "claimsHoldingIPs", len(keys), "goneSinceRebuild", queued, "inDeletedNamespaces", orphans)
}
