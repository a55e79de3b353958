package udn

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	nadv1 "kvnet.io/kvnet/api/k8scni/v1"
	"kvnet.io/kvnet/internal/netconf"
	"kvnet.io/kvnet/internal/physnet"
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
	c := mgr.GetClient()
	return ctrl.NewControllerManagedBy(mgr).
		Named("handwritten-nads").
		// A NAD's own events, and those of every NAD that can change
		// whether a hand-written NAD agrees with the first of its network.
		Watches(&nadv1.NetworkAttachmentDefinition{}, handler.EnqueueRequestsFromMapFunc(
			func(ctx context.Context, o client.Object) []reconcile.Request {
				return sameNetworkHandwritten(ctx, c, o)
			})).
		WithOptions(controller.Options{SkipNameValidation: &opts.SkipNameValidation}).
		Complete(r)
}

func rendered(o client.Object) bool {
	_, ok := o.GetLabels()[udn.NADLabel]
	return ok
}

// sameNetworkHandwritten returns requests for o, when hand-written, and
// for the hand-written NADs that may have to be refused or served again
// after o changed: those naming o's network (the network-name annotation
// this reconciler writes) and those refused now.
func sameNetworkHandwritten(ctx context.Context, c client.Client, o client.Object) []reconcile.Request {
	var reqs []reconcile.Request
	if !rendered(o) {
		reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(o)})
	}
	name := o.GetAnnotations()[udn.NetworkNameAnnotation]
	if nad, ok := o.(*nadv1.NetworkAttachmentDefinition); ok {
		if conf, err := netconf.Parse(nad.Spec.Config); err == nil && conf != nil {
			name = conf.Name
		}
	}
	// The cache's NADs, not copies (only read here): this runs for every
	// NAD event, and copying every NAD of the cluster for each made the
	// creation of 1,000 networks quadratic in copies.
	var list nadv1.NetworkAttachmentDefinitionList
	if err := c.List(ctx, &list, client.UnsafeDisableDeepCopy); err != nil {
		return reqs
	}
	for i := range list.Items {
		other := &list.Items[i]
		if rendered(other) || other.UID == o.GetUID() {
			continue
		}
		_, refused := other.Annotations[udn.NetworkConflictAnnotation]
		if refused || (name != "" && other.Annotations[udn.NetworkNameAnnotation] == name) {
			reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(other)})
		}
	}
	return reqs
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
	if rendered(&nad) {
		return ctrl.Result{}, nil
	}
	if err := r.notServed(ctx, &nad); err != nil {
		return ctrl.Result{}, err
	}
	conf, err := netconf.Parse(nad.Spec.Config)
	if err != nil || conf == nil {
		return ctrl.Result{}, nil // not ours, or invalid (the allocator reports that on pods)
	}
	if refused, err := r.agree(ctx, &nad, conf); err != nil || refused {
		return ctrl.Result{}, err
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
	if conf.Topology == netconf.TopologyLocalnet {
		return ctrl.Result{}, r.checkBridgeMapping(ctx, &nad, conf)
	}
	return ctrl.Result{}, nil
}

// ReasonNetworkConfigMismatch is the reason of the Warning event on a
// hand-written NAD refused because an earlier NAD of its network defines
// the network differently.
const ReasonNetworkConfigMismatch = "NetworkConfigMismatch"

// agree refuses a hand-written NAD that names a network an earlier NAD
// (the oldest by creation, then by namespace/name; a refused NAD does not
// count) defines differently, as OVN-Kubernetes does: it marks it with
// NetworkConflictAnnotation, naming the first NAD and every field that
// differs, and records a Warning event; the first NAD keeps working. A NAD
// that agrees (again) loses the mark. It reports whether nad is refused.
func (r *handwrittenReconciler) agree(ctx context.Context, nad *nadv1.NetworkAttachmentDefinition, conf *netconf.NetConf) (bool, error) {
	var list nadv1.NetworkAttachmentDefinitionList
	if err := r.client.List(ctx, &list); err != nil {
		return false, fmt.Errorf("list NetworkAttachmentDefinitions: %w", err)
	}
	var first *nadv1.NetworkAttachmentDefinition
	var firstConf *netconf.NetConf
	for i := range list.Items {
		o := &list.Items[i]
		if o.DeletionTimestamp != nil || o.UID == nad.UID || !earlier(o, nad) {
			continue
		}
		if _, refused := o.Annotations[udn.NetworkConflictAnnotation]; refused {
			continue
		}
		oc, err := netconf.Parse(o.Spec.Config)
		if err != nil || oc == nil || oc.Name != conf.Name {
			continue
		}
		if first == nil || earlier(o, first) {
			first, firstConf = o, oc
		}
	}
	msg := ""
	if first != nil {
		if d := netconf.Diff(firstConf, conf); len(d) > 0 {
			msg = fmt.Sprintf("NAD %s/%s CNI config does not match that of network %s, which NAD %s/%s defined first: %s; "+
				"kvnet serves the network as %s/%s defines it, and no pod gets an interface from this NAD until it agrees",
				nad.Namespace, nad.Name, conf.Name, first.Namespace, first.Name, strings.Join(d, ", "), first.Namespace, first.Name)
		}
	}
	have, marked := nad.Annotations[udn.NetworkConflictAnnotation]
	if (msg == "" && !marked) || (msg != "" && have == msg) {
		return msg != "", nil
	}
	patch := client.MergeFrom(nad.DeepCopy())
	if msg != "" {
		if nad.Annotations == nil {
			nad.Annotations = map[string]string{}
		}
		nad.Annotations[udn.NetworkConflictAnnotation] = msg
	} else {
		delete(nad.Annotations, udn.NetworkConflictAnnotation)
	}
	if err := r.client.Patch(ctx, nad, patch); err != nil {
		return msg != "", client.IgnoreNotFound(err)
	}
	if msg != "" {
		r.recorder.Eventf(nad, nil, corev1.EventTypeWarning, ReasonNetworkConfigMismatch, "Serve", "%s", msg)
		log.FromContext(ctx).Info("refused a NetworkAttachmentDefinition that disagrees with its network's first", "nad", client.ObjectKeyFromObject(nad).String(), "reason", msg)
	}
	return msg != "", nil
}

// earlier orders NADs by creation, then namespace/name.
func earlier(a, b *nadv1.NetworkAttachmentDefinition) bool {
	if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
		return a.CreationTimestamp.Before(&b.CreationTimestamp)
	}
	return a.Namespace+"/"+a.Name < b.Namespace+"/"+b.Name
}

// checkBridgeMapping records a Warning NoBridgeMapping event on a
// hand-written localnet NAD, when it is first served, if no node maps its
// physical network (its physicalNetworkName, else its network name) to a
// bridge: kvnet-node attaches it nowhere until one does.
func (r *handwrittenReconciler) checkBridgeMapping(ctx context.Context, nad *nadv1.NetworkAttachmentDefinition, conf *netconf.NetConf) error {
	var nodes corev1.NodeList
	if err := r.client.List(ctx, &nodes); err != nil {
		return fmt.Errorf("list nodes for their bridge mappings: %w", err)
	}
	for i := range nodes.Items {
		if m, err := physnet.ParseBridgeMappings(nodes.Items[i].Annotations[physnet.BridgeMappingsAnnotation]); err == nil && m[conf.PhysicalNetworkName] != "" {
			return nil
		}
	}
	r.recorder.Eventf(nad, nil, corev1.EventTypeWarning, ReasonNoBridgeMapping, "Serve",
		"no node maps physical network %q to a bridge: annotate the nodes on that network with %s=%s:<bridge>",
		conf.PhysicalNetworkName, physnet.BridgeMappingsAnnotation, conf.PhysicalNetworkName)
	return nil
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
