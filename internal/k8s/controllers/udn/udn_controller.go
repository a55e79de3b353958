package udn

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
			cond := metav1.Condition{Type: ConditionNetworkCreated, Status: metav1.ConditionFalse, Reason: ReasonSyncError, Message: err.Error()}
			if serr := r.setUDNCondition(ctx, &u, cond); serr != nil {
				return ctrl.Result{}, serr
			}
			if isInUse(err) {
				r.recorder.Eventf(&u, nil, corev1.EventTypeWarning, "NetworkInUse", "Delete", "%s", err.Error())
				return ctrl.Result{RequeueAfter: inUseRetry}, nil
			}
			return ctrl.Result{}, err
		}
		r.ids.Release(netName)
		cond := metav1.Condition{Type: ConditionNetworkCreated, Status: metav1.ConditionFalse, Reason: ReasonNADDeleted, Message: messageNADIsDeleting}
		if err := r.setUDNCondition(ctx, &u, cond); err != nil && !apierrors.IsNotFound(err) {
			return ctrl.Result{}, err
		}
		controllerutil.RemoveFinalizer(&u, udn.Finalizer)
		return ctrl.Result{}, client.IgnoreNotFound(r.client.Update(ctx, &u))
	}

	if !controllerutil.ContainsFinalizer(&u, udn.Finalizer) {
		controllerutil.AddFinalizer(&u, udn.Finalizer)
		if err := r.client.Update(ctx, &u); err != nil {
			return ctrl.Result{}, err
		}
	}
	_, err := r.ensureNAD(ctx, owner, spec, netName, u.Namespace)
	cond := metav1.Condition{Type: ConditionNetworkCreated, Status: metav1.ConditionTrue, Reason: ReasonNADCreated, Message: messageNADCreated}
	if err != nil {
		cond = metav1.Condition{Type: ConditionNetworkCreated, Status: metav1.ConditionFalse, Reason: ReasonSyncError, Message: err.Error()}
	}
	changed := !conditionHolds(u.Status.Conditions, cond)
	if serr := r.setUDNCondition(ctx, &u, cond); serr != nil {
		return ctrl.Result{}, serr
	}
	if changed {
		if err != nil {
			r.recorder.Eventf(&u, nil, corev1.EventTypeWarning, ReasonSyncError, "Sync", "%s", err.Error())
		} else {
			r.recorder.Eventf(&u, nil, corev1.EventTypeNormal, ReasonNADCreated, "Sync", "%s %s/%s", messageNADCreated, u.Namespace, u.Name)
		}
	}
	return resultFor(err)
}

func (r *udnReconciler) setUDNCondition(ctx context.Context, u *udnv1.UserDefinedNetwork, cond metav1.Condition) error {
	if conditionHolds(u.Status.Conditions, cond) {
		return nil
	}
	patch := client.MergeFrom(u.DeepCopy())
	meta.SetStatusCondition(&u.Status.Conditions, cond)
	return r.client.Status().Patch(ctx, u, patch)
}

// conditionHolds reports whether conds already has cond's status, reason and
// message, so that a reconcile without change writes nothing.
func conditionHolds(conds []metav1.Condition, cond metav1.Condition) bool {
	c := meta.FindStatusCondition(conds, cond.Type)
	return c != nil && c.Status == cond.Status && c.Reason == cond.Reason && c.Message == cond.Message
}
