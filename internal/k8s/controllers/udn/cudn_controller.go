package udn

import (
	"context"
	"errors"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log"

	nadv1 "kvnet.io/kvnet/api/k8scni/v1"
	udnv1 "kvnet.io/kvnet/api/udn/v1"
	"kvnet.io/kvnet/internal/udn"
)

// cudnReconciler reconciles ClusterUserDefinedNetworks.
type cudnReconciler struct {
	*networks
}

func (r *cudnReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	if err := r.init(ctx); err != nil {
		return ctrl.Result{}, err
	}
	var c udnv1.ClusterUserDefinedNetwork
	if err := r.client.Get(ctx, req.NamespacedName, &c); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	netName := udn.ClusterNetworkName(c.Name)
	ctx = log.IntoContext(ctx, log.FromContext(ctx).WithValues("network", netName))
	spec := udn.SpecOfCUDN(&c)

	owned, err := r.ownedNADs(ctx, &c)
	if err != nil {
		return ctrl.Result{}, err
	}
	if c.DeletionTimestamp != nil {
		if !controllerutil.ContainsFinalizer(&c, udn.Finalizer) {
			return ctrl.Result{}, nil
		}
		var errs []error
		for _, nad := range owned {
			if err := r.deleteNAD(ctx, &c, spec, nad.Namespace); err != nil {
				errs = append(errs, err)
			}
		}
		if err := errors.Join(errs...); err != nil {
			if _, serr := r.setCondition(ctx, &c, &c.Status.Conditions, falseCondition(ReasonCUDNSyncError, err.Error())); serr != nil {
				return ctrl.Result{}, serr
			}
			if allInUse(errs) {
				r.recorder.Eventf(&c, nil, corev1.EventTypeWarning, "NetworkInUse", "Delete", "%s", err.Error())
				log.FromContext(ctx).Info("deletion waits for pods", "reason", err.Error())
				return ctrl.Result{RequeueAfter: inUseRetry}, nil
			}
			return ctrl.Result{}, err
		}
		r.ids.Release(netName)
		controllerutil.RemoveFinalizer(&c, udn.Finalizer)
		if err := r.client.Update(ctx, &c); err != nil {
			return ctrl.Result{}, client.IgnoreNotFound(err)
		}
		log.FromContext(ctx).Info("network deleted; finalizer removed")
		return ctrl.Result{}, nil
	}

	if !controllerutil.ContainsFinalizer(&c, udn.Finalizer) {
		controllerutil.AddFinalizer(&c, udn.Finalizer)
		if err := r.client.Update(ctx, &c); err != nil {
			return ctrl.Result{}, err
		}
	}
	selected, err := r.selectedNamespaces(ctx, &c)
	if err != nil {
		// A bad selector is a user error; the API server validated its
		// syntax, so this is rare.
		err = &userError{err: fmt.Errorf("invalid namespaceSelector: %w", err)}
		if _, serr := r.setCondition(ctx, &c, &c.Status.Conditions, falseCondition(ReasonCUDNSyncError, err.Error())); serr != nil {
			// The condition did not reach the API server: retry soon
			// rather than at the user-error pace.
			return ctrl.Result{}, fmt.Errorf("%w; writing its status: %v", err, serr)
		}
		return resultFor(err)
	}
	owner := udn.Owner{Object: &c, GVK: udnv1.GroupVersion.WithKind("ClusterUserDefinedNetwork")}
	var errs []error
	var nads []*nadv1.NetworkAttachmentDefinition // of the selected namespaces
	for _, ns := range selected {
		nad, err := r.ensureNAD(ctx, owner, spec, netName, ns)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		nads = append(nads, nad)
	}
	// NADs in namespaces no longer selected go, unless pods use them.
	for _, nad := range owned {
		if slices.Contains(selected, nad.Namespace) {
			continue
		}
		if err := r.deleteNAD(ctx, &c, spec, nad.Namespace); err != nil {
			errs = append(errs, err)
		}
	}
	err = errors.Join(errs...)
	cond := clusterNetworkCreated(nads, err)
	if spec.Topology == udnv1.NetworkTopologyLocalnet {
		var nodes corev1.NodeList
		if err := r.client.List(ctx, &nodes); err != nil {
			return ctrl.Result{}, fmt.Errorf("list nodes for their bridge mappings: %w", err)
		}
		cond = attachableLocalnet(cond, spec, nodes.Items)
	}
	if serr := r.reportSync(ctx, &c, &c.Status.Conditions, cond); serr != nil {
		return ctrl.Result{}, serr
	}
	// Waits on pods (NADs they hold) and user errors are retried slowly;
	// pod and namespace events bring us back sooner.
	if cond.Reason == ReasonNADDeleted || (err != nil && allUserOrInUse(errs)) {
		return ctrl.Result{RequeueAfter: inUseRetry}, nil
	}
	return ctrl.Result{}, err
}

// selectedNamespaces returns the sorted names of live namespaces the CUDN
// selects.
func (r *cudnReconciler) selectedNamespaces(ctx context.Context, c *udnv1.ClusterUserDefinedNetwork) ([]string, error) {
	sel, err := metav1.LabelSelectorAsSelector(&c.Spec.NamespaceSelector)
	if err != nil {
		return nil, err
	}
	var list corev1.NamespaceList
	if err := r.client.List(ctx, &list, client.MatchingLabelsSelector{Selector: sel}); err != nil {
		return nil, err
	}
	var out []string
	for _, ns := range list.Items {
		if ns.DeletionTimestamp == nil {
			out = append(out, ns.Name)
		}
	}
	slices.Sort(out)
	return out, nil
}

func allInUse(errs []error) bool {
	for _, err := range errs {
		if !isInUse(err) {
			return false
		}
	}
	return true
}

func allUserOrInUse(errs []error) bool {
	for _, err := range errs {
		var ue *userError
		if !isInUse(err) && !errors.As(err, &ue) {
			return false
		}
	}
	return true
}
