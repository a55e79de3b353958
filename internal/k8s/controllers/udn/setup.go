package udn

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	nadv1 "kvnet.io/kvnet/api/k8scni/v1"
	udnv1 "kvnet.io/kvnet/api/udn/v1"
	"kvnet.io/kvnet/internal/k8s/handlers"
	"kvnet.io/kvnet/internal/netconf"
	"kvnet.io/kvnet/internal/physnet"
	"kvnet.io/kvnet/internal/podnetworks"
	"kvnet.io/kvnet/internal/reserved"
	"kvnet.io/kvnet/internal/udn"
)

// Options configures the UDN controllers.
type Options struct {
	// MaxConcurrentReconciles per controller; 0 means 16. Reconciles wait on
	// API writes, not CPU, so more workers than cores pays off.
	MaxConcurrentReconciles int
	// SkipNameValidation allows registering the controllers again in one
	// process (tests that restart the controller).
	SkipNameValidation bool
	// GlobalNamespaces no UDN or CUDN may serve, besides default and
	// openshift-* (udn.NamespaceRule); nil means
	// udn.DefaultGlobalNamespaces.
	GlobalNamespaces []string
	// Reserved are the cluster's reserved subnets; zero means the
	// defaults.
	Reserved reserved.Subnets
}

// Setup registers the UserDefinedNetwork and ClusterUserDefinedNetwork
// controllers with mgr.
func Setup(mgr ctrl.Manager, opts Options) error {
	if opts.MaxConcurrentReconciles == 0 {
		opts.MaxConcurrentReconciles = 16
	}
	n := newNetworks(mgr.GetClient(), mgr.GetAPIReader(), mgr.GetEventRecorder("kvnet-udn-controller"))
	n.namespaces = udn.NamespaceRule{Global: opts.GlobalNamespaces}
	if opts.GlobalNamespaces == nil {
		n.namespaces.Global = udn.DefaultGlobalNamespaces
	}
	n.reserved = opts.Reserved
	if len(n.reserved.Masquerade) == 0 {
		n.reserved = reserved.Default()
	}
	c := mgr.GetClient()

	err := ctrl.NewControllerManagedBy(mgr).
		Named("userdefinednetwork").
		Watches(&udnv1.UserDefinedNetwork{}, handlers.DeletingFirst(), builder.WithPredicates(specOrMetaChanged)).
		// A NAD change concerns the UDN of the same name (its own NAD, or a
		// foreign one in the way); a primary NAD change may also unblock
		// another primary UDN of the namespace waiting for it to go.
		Watches(&nadv1.NetworkAttachmentDefinition{}, handler.EnqueueRequestsFromMapFunc(
			func(ctx context.Context, o client.Object) []reconcile.Request {
				reqs := []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: o.GetName()}}}
				if nad, ok := o.(*nadv1.NetworkAttachmentDefinition); ok && isPrimaryNAD(nad) {
					reqs = append(reqs, blockedUDNsIn(ctx, c, o.GetNamespace())...)
				}
				return reqs
			})).
		// A pod that goes may unblock a UDN waiting on it: one being
		// deleted, or one whose deleted NAD the pod held.
		Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(
			func(ctx context.Context, o client.Object) []reconcile.Request {
				return blockedUDNsIn(ctx, c, o.GetNamespace())
			}), builder.WithPredicates(podGone)).
		WithOptions(controller.Options{MaxConcurrentReconciles: opts.MaxConcurrentReconciles, SkipNameValidation: &opts.SkipNameValidation}).
		Complete(&udnReconciler{networks: n})
	if err != nil {
		return err
	}
	if err := setupHandwritten(mgr, n, opts); err != nil {
		return err
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("clusteruserdefinednetwork").
		Watches(&udnv1.ClusterUserDefinedNetwork{}, handlers.DeletingFirst(), builder.WithPredicates(specOrMetaChanged)).
		Watches(&nadv1.NetworkAttachmentDefinition{}, handler.EnqueueRequestsFromMapFunc(
			func(_ context.Context, o client.Object) []reconcile.Request {
				name := o.GetName()
				if ref := metav1.GetControllerOf(o); ref != nil && ref.Kind == "ClusterUserDefinedNetwork" {
					name = ref.Name
				}
				return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: name}}}
			})).
		Watches(&corev1.Namespace{}, handler.EnqueueRequestsFromMapFunc(
			func(ctx context.Context, _ client.Object) []reconcile.Request {
				return cudns(ctx, c, false)
			})).
		Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(
			func(ctx context.Context, _ client.Object) []reconcile.Request {
				return cudns(ctx, c, true)
			}), builder.WithPredicates(podGone)).
		// Bridge mappings and kernel features decide whether a localnet
		// network can be attached.
		Watches(&corev1.Node{}, handler.EnqueueRequestsFromMapFunc(
			func(ctx context.Context, _ client.Object) []reconcile.Request {
				return localnetCUDNs(ctx, c)
			}), builder.WithPredicates(nodeNetworkChanged)).
		WithOptions(controller.Options{MaxConcurrentReconciles: opts.MaxConcurrentReconciles, SkipNameValidation: &opts.SkipNameValidation}).
		Complete(&cudnReconciler{networks: n})
}

// blockedUDNsIn returns requests for the UDNs of a namespace that may wait
// on another object: those being deleted or whose NetworkCreated condition
// is not True.
func blockedUDNsIn(ctx context.Context, c client.Client, namespace string) []reconcile.Request {
	var list udnv1.UserDefinedNetworkList
	if err := c.List(ctx, &list, client.InNamespace(namespace)); err != nil {
		return nil
	}
	var out []reconcile.Request
	for _, u := range list.Items {
		if u.DeletionTimestamp != nil || !meta.IsStatusConditionTrue(u.Status.Conditions, ConditionNetworkCreated) {
			out = append(out, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: u.Namespace, Name: u.Name}})
		}
	}
	return out
}

func isPrimaryNAD(nad *nadv1.NetworkAttachmentDefinition) bool {
	conf, err := netconf.Parse(nad.Spec.Config)
	return err == nil && conf != nil && conf.IsPrimary()
}

// cudns returns requests for all CUDNs; when blockedOnly, only for those
// being deleted or not fully synced (a NAD removal may wait on pods).
func cudns(ctx context.Context, c client.Client, blockedOnly bool) []reconcile.Request {
	var list udnv1.ClusterUserDefinedNetworkList
	if err := c.List(ctx, &list); err != nil {
		return nil
	}
	var out []reconcile.Request
	for _, u := range list.Items {
		if !blockedOnly || u.DeletionTimestamp != nil || !meta.IsStatusConditionTrue(u.Status.Conditions, ConditionNetworkCreated) {
			out = append(out, reconcile.Request{NamespacedName: types.NamespacedName{Name: u.Name}})
		}
	}
	return out
}

// specOrMetaChanged skips status-only and finalizer-only updates (our own
// writes); spec changes and deletion bump the generation, and labels and
// annotations are copied to NADs.
var specOrMetaChanged = predicate.Or(predicate.GenerationChangedPredicate{},
	predicate.LabelChangedPredicate{}, predicate.AnnotationChangedPredicate{})

// podGone passes pod events that can unblock a network deletion: a pod
// deleted, or a pod that just completed.
var podGone = predicate.Funcs{
	CreateFunc:  func(event.CreateEvent) bool { return false },
	GenericFunc: func(event.GenericEvent) bool { return false },
	DeleteFunc:  func(event.DeleteEvent) bool { return true },
	UpdateFunc: func(e event.UpdateEvent) bool {
		o, ok1 := e.ObjectOld.(*corev1.Pod)
		n, ok2 := e.ObjectNew.(*corev1.Pod)
		if !ok1 || !ok2 {
			return false
		}
		return podnetworks.Completed(n) && !podnetworks.Completed(o)
	},
}

// localnetCUDNs returns requests for the Localnet CUDNs.
func localnetCUDNs(ctx context.Context, c client.Client) []reconcile.Request {
	var list udnv1.ClusterUserDefinedNetworkList
	if err := c.List(ctx, &list); err != nil {
		return nil
	}
	var out []reconcile.Request
	for _, u := range list.Items {
		if u.Spec.Network.Topology == udnv1.NetworkTopologyLocalnet {
			out = append(out, reconcile.Request{NamespacedName: types.NamespacedName{Name: u.Name}})
		}
	}
	return out
}

// nodeNetworkChanged passes node events that change what localnet
// networks can attach there: a node added or gone, or its bridge mappings
// or missing kernel features changed.
var nodeNetworkChanged = predicate.Funcs{
	UpdateFunc: func(e event.UpdateEvent) bool {
		for _, k := range []string{physnet.BridgeMappingsAnnotation, physnet.MissingKernelFeaturesAnnotation} {
			if e.ObjectOld.GetAnnotations()[k] != e.ObjectNew.GetAnnotations()[k] {
				return true
			}
		}
		return false
	},
}
