package ipam

import (
	"context"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	ipamclaimv1alpha1 "kvnet.io/kvnet/api/k8scni/v1alpha1"
)

// claimReconciler frees a claim's IPs once the claim is deleted: the only
// event that frees a persistent IP.
type claimReconciler struct {
	client client.Client
	st     *state
	ready  <-chan struct{}
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
	if apierrors.IsNotFound(err) {
		if nets := r.st.releaseClaim(req.NamespacedName); len(nets) > 0 {
			log.FromContext(ctx).Info("released IPs of deleted IPAMClaim", "claim", req.NamespacedName.String(), "networks", nets)
		}
		return ctrl.Result{}, nil
	}
	return ctrl.Result{}, err
}
