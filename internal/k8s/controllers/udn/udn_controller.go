package udn

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log"

	udnv1 "kvnet.io/kvnet/api/udn/v1"
	"kvnet.io/kvnet/internal/udn"
)

// inUseRetry is how soon a deletion blocked by pods is retried; pod events
// also retrigger it, this is the backstop.
const inUseRetry = 5 * time.Second

// udnReconciler reconciles UserDefinedNetworks.
type udnReconciler struct {
	*networks
}

func (r *udnReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	if err := r.init(ctx); err != nil {
		return ctrl.Result{}, err
	}
	var u udnv1.UserDefinedNetwork
	if err := r.client.Get(ctx, req.NamespacedName, &u); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	ctx = log.IntoContext(ctx, log.FromContext(ctx).WithValues("network", udn.NetworkName(u.Namespace, u.Name)))
	owner := udn.Owner{Object: &u, GVK: udnv1.GroupVersion.WithKind("UserDefinedNetwork")}
	spec := udn.SpecOfUDN(&u)
	netName := udn.NetworkName(u.Namespace, u.Name)

	if u.DeletionTimestamp != nil {
		if !controllerutil.ContainsFinalizer(&u, udn.Finalizer) {
			return ctrl.Result{}, nil
		}
		err := r.deleteNAD(ctx, &u, spec, u.Namespace)
		if err != nil {
			if _, serr := r.setCondition(ctx, &u, &u.Status.Conditions, falseCondition(ReasonSyncError, err.Error())); serr != nil {
				return ctrl.Result{}, serr
			}
			if isInUse(err) {
				r.recorder.Eventf(&u, nil, corev1.EventTypeWarning, "NetworkInUse", "Delete", "%s", err.Error())
				log.FromContext(ctx).Info("deletion waits for pods", "reason", err.Error())
				return ctrl.Result{RequeueAfter: inUseRetry}, nil
			}
			return ctrl.Result{}, err
		}
		r.ids.Release(netName)
		if _, err := r.setCondition(ctx, &u, &u.Status.Conditions, falseCondition(ReasonNADDeleted, messageNADIsDeleting)); err != nil {
			return ctrl.Result{}, err
		}
		controllerutil.RemoveFinalizer(&u, udn.Finalizer)
		if err := r.client.Update(ctx, &u); err != nil {
			return ctrl.Result{}, client.IgnoreNotFound(err)
		}
		log.FromContext(ctx).Info("network deleted; finalizer removed")
		return ctrl.Result{}, nil
	}

	if !controllerutil.ContainsFinalizer(&u, udn.Finalizer) {
		controllerutil.AddFinalizer(&u, udn.Finalizer)
		if err := r.client.Update(ctx, &u); err != nil {
			return ctrl.Result{}, err
		}
	}
	nad, err := r.ensureNAD(ctx, owner, spec, netName, u.Namespace)
	cond := networkCreated(nad, err)
	if serr := r.reportSync(ctx, &u, &u.Status.Conditions, cond); serr != nil {
		return ctrl.Result{}, serr
	}
	if cond.Reason == ReasonNADDeleted {
		// The NAD waits for the pods using it to go; their events bring us
		// back, and this is the backstop.
		return ctrl.Result{RequeueAfter: inUseRetry}, nil
	}
	return resultFor(err)
}
