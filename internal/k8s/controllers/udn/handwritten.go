package udn

import (
	"context"
	"fmt"
	"strconv"
	"sync"

	corev1 "k8s.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	nadv1 "kvnet.io/kvnet/api/k8scni/v1"
	"kvnet.io/kvnet/internal/netconf"
	"kvnet.io/kvnet/internal/udn"
)

// handwrittenReconciler gives network IDs to NADs of type kvnet-cni that
// no UDN or CUDN rendered (written by hand, as the docs' secondary-network
// NADs are), as OVN-Kubernetes' cluster manager does for every NAD: the
// node agents need the ID (the VXLAN VNI) to build the network. NADs with
// the same network name share the ID; it is freed with the last of them.
type handwrittenReconciler struct {
	*networks

	mu    sync.Mutex
	names map[string]bool // network names whose ID this reconciler holds
}

func setupHandwritten(mgr ctrl.Manager, n *networks, opts Options) error {
	r := &handwrittenReconciler{networks: n, names: map[string]bool{}}
	return ctrl.NewControllerManagedBy(mgr).
		Named("handwritten-nads").
		For(&nadv1.NetworkAttachmentDefinition{}, builder.WithPredicates(predicate.NewPredicateFuncs(func(o client.Object) bool {
			_, rendered := o.GetLabels()[udn.NADLabel]
			return !rendered
		}))).
		WithOptions(controller.Options{SkipNameValidation: &opts.SkipNameValidation}).
		Complete(r)
}

func (r *handwrittenReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	if err := r.init(ctx); err != nil {
		return ctrl.Result{}, err
	}
	var nad nadv1.NetworkAttachmentDefinition
	err := r.client.Get(ctx, req.NamespacedName, &nad)
	if client.IgnoreNotFound(err) != nil {
		return ctrl.Result{}, err
	}
	if err != nil || nad.DeletionTimestamp != nil {
		return ctrl.Result{}, r.releaseUnused(ctx)
	}
	if err := r.notServed(ctx, &nad); err != nil {
		return ctrl.Result{}, err
	}
	conf, err := netconf.Parse(nad.Spec.Config)
	if err != nil || conf == nil {
		return ctrl.Result{}, nil // not ours, or invalid (the allocator reports that on pods)
	}
	logger := log.FromContext(ctx).WithValues("network", conf.Name)
	id, err := r.ids.Allocate(conf.Name)
	if err != nil {
		r.recorder.Eventf(&nad, nil, corev1.EventTypeWarning, "NetworkIDUnavailable", "AllocateNetworkID", "%v", err)
		return ctrl.Result{}, err
	}
	r.mu.Lock()
	r.names[conf.Name] = true
	r.mu.Unlock()
	want := strconv.Itoa(id)
	if nad.Annotations[udn.NetworkIDAnnotation] == want && nad.Annotations[udn.NetworkNameAnnotation] == conf.Name {
		return ctrl.Result{}, nil
	}
	patch := client.MergeFrom(nad.DeepCopy())
	if nad.Annotations == nil {
		nad.Annotations = map[string]string{}
	}
	nad.Annotations[udn.NetworkIDAnnotation] = want
	nad.Annotations[udn.NetworkNameAnnotation] = conf.Name
	if err := r.client.Patch(ctx, &nad, patch); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	logger.Info("gave a hand-written NetworkAttachmentDefinition its network ID", "nad", req.String(), "id", id)
	return ctrl.Result{}, nil
}

// notServedMessage is what a NAD written for OVN-Kubernetes is told.
const notServedMessage = `spec.config has "type": "` + netconf.OVNOverlayType + `" (OVN-Kubernetes); kvnet serves this network only with "type": "` + netconf.PluginType + `": change that field, the rest of the configuration stays; until then no pod gets an interface on it`

// notServed marks a NAD written for OVN-Kubernetes (type
// ovn-k8s-cni-overlay), which no kvnet component serves, with
// NotServedAnnotation and a warning event naming the one-line change, so
// that it never passes in silence; it removes the mark once the type
// changed. The event goes out when the mark is set, not on every resync.
func (r *handwrittenReconciler) notServed(ctx context.Context, nad *nadv1.NetworkAttachmentDefinition) error {
	foreign := netconf.ForeignOverlay(nad.Spec.Config)
	have, marked := nad.Annotations[udn.NotServedAnnotation]
	if foreign == marked && (!foreign || have == notServedMessage) {
		return nil
	}
	patch := client.MergeFrom(nad.DeepCopy())
	if foreign {
		if nad.Annotations == nil {
			nad.Annotations = map[string]string{}
		}
		nad.Annotations[udn.NotServedAnnotation] = notServedMessage
	} else {
		delete(nad.Annotations, udn.NotServedAnnotation)
	}
	if err := r.client.Patch(ctx, nad, patch); err != nil {
		return client.IgnoreNotFound(err)
	}
	if foreign {
		r.recorder.Eventf(nad, nil, corev1.EventTypeWarning, "NotServed", "Serve", "%s", notServedMessage)
		log.FromContext(ctx).Info("a NetworkAttachmentDefinition written for OVN-Kubernetes is not served", "nad", client.ObjectKeyFromObject(nad).String())
	}
	return nil
}

// releaseUnused frees the IDs of hand-written networks none of whose NADs
// is left.
func (r *handwrittenReconciler) releaseUnused(ctx context.Context) error {
	var list nadv1.NetworkAttachmentDefinitionList
	if err := r.client.List(ctx, &list); err != nil {
		return fmt.Errorf("list NetworkAttachmentDefinitions: %w", err)
	}
	live := map[string]bool{}
	for _, nad := range list.Items {
		if nad.DeletionTimestamp != nil {
			continue
		}
		if conf, err := netconf.Parse(nad.Spec.Config); err == nil && conf != nil {
			live[conf.Name] = true
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for name := range r.names {
		if !live[name] {
			r.ids.Release(name)
			delete(r.names, name)
			log.FromContext(ctx).Info("released the network ID of a hand-written network", "network", name)
		}
	}
	return nil
}
