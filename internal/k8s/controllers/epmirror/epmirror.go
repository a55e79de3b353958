// Package epmirror mirrors EndpointSlices into primary user-defined
// networks, as OVN-Kubernetes' EndpointSlice mirror controller does: the
// default EndpointSlice controller lists the pods of a Service with their
// cluster default network addresses (status.podIPs), which pods on a
// primary UDN keep only for kubelet probes; for every such slice in a
// namespace with a primary network kvnet serves, this controller keeps a
// copy whose endpoints carry the pods' addresses on that network (from
// kvnet.io/pod-networks), under OVN-Kubernetes' labels and annotations, so
// that `kubectl get endpointslices` and tools written for OVN-Kubernetes
// show where a Service's traffic goes. kvnet-node load-balances from the
// same pod annotations.
package epmirror

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	nadv1 "kvnet.io/kvnet/api/k8scni/v1"
	"kvnet.io/kvnet/internal/netconf"
	"kvnet.io/kvnet/internal/podnetworks"
)

// OVN-Kubernetes' names for mirrored slices, kept so that manifests and
// tools written for it select kvnet's mirrors unchanged.
const (
	// DefaultController manages the slices mirrored (the value of
	// discoveryv1.LabelManagedBy).
	DefaultController = "endpointslice-controller.k8s.io"
	// MirrorController manages the mirrors.
	MirrorController = "endpointslice-mirror-controller.k8s.ovn.org"
	// ServiceNameLabel names a mirror's Service; not
	// kubernetes.io/service-name, so Service proxies of the default
	// network ignore mirrors.
	ServiceNameLabel = "k8s.ovn.org/service-name"
	// SourceVersionLabel is the resource version of the source slice last
	// mirrored.
	SourceVersionLabel = "k8s.ovn.org/source-endpointslice-version"
	// NetworkAnnotation names the network of a mirror's addresses.
	NetworkAnnotation = "k8s.ovn.org/endpointslice-network"
	// SourceAnnotation names a mirror's source slice.
	SourceAnnotation = "k8s.ovn.org/source-endpointslice"
)

// Options configures the controller.
type Options struct {
	// SkipNameValidation allows registering it again in one process.
	SkipNameValidation bool
}

// Setup registers the EndpointSlice mirror controller with mgr. Requests
// name source slices.
func Setup(mgr ctrl.Manager, opts Options) error {
	r := &reconciler{client: mgr.GetClient()}
	c := mgr.GetClient()
	// A slice maps to itself if it is a source, to its source if it is a
	// mirror.
	sliceToSource := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
		switch o.GetLabels()[discoveryv1.LabelManagedBy] {
		case DefaultController:
			return []reconcile.Request{{NamespacedName: client.ObjectKeyFromObject(o)}}
		case MirrorController:
			if src := o.GetAnnotations()[SourceAnnotation]; src != "" {
				return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: src}}}
			}
		}
		return nil
	})
	// A pod or NAD maps to the source slices of its namespace (the pod's:
	// those naming it).
	sourcesIn := func(ctx context.Context, ns string, pod string) []reconcile.Request {
		var list discoveryv1.EndpointSliceList
		if err := c.List(ctx, &list, client.InNamespace(ns), client.MatchingLabels{discoveryv1.LabelManagedBy: DefaultController}); err != nil {
			return nil
		}
		var out []reconcile.Request
		for i := range list.Items {
			s := &list.Items[i]
			if pod == "" || slices.ContainsFunc(s.Endpoints, func(e discoveryv1.Endpoint) bool {
				return e.TargetRef != nil && e.TargetRef.Kind == "Pod" && e.TargetRef.Name == pod
			}) {
				out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(s)})
			}
		}
		return out
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("endpointslice-mirror").
		Watches(&discoveryv1.EndpointSlice{}, sliceToSource).
		Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
			return sourcesIn(ctx, o.GetNamespace(), o.GetName())
		})).
		Watches(&nadv1.NetworkAttachmentDefinition{}, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
			return sourcesIn(ctx, o.GetNamespace(), "")
		})).
		WithOptions(controller.Options{SkipNameValidation: &opts.SkipNameValidation}).
		Complete(r)
}

type reconciler struct {
	client client.Client
}

// MirrorName is the name of the mirror of source slice src: "kvnet-" and
// src, with a hash instead of its end when that would be too long.
func MirrorName(src string) string {
	name := "kvnet-" + src
	if len(name) <= 253 {
		return name
	}
	sum := sha256.Sum256([]byte(src))
	return name[:240] + "-" + hex.EncodeToString(sum[:6])
}

func (r *reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	mirrorKey := types.NamespacedName{Namespace: req.Namespace, Name: MirrorName(req.Name)}
	var src discoveryv1.EndpointSlice
	err := r.client.Get(ctx, req.NamespacedName, &src)
	if apierrors.IsNotFound(err) || err == nil && (src.DeletionTimestamp != nil || src.Labels[discoveryv1.LabelManagedBy] != DefaultController) {
		return reconcile.Result{}, r.deleteMirror(ctx, mirrorKey)
	}
	if err != nil {
		return reconcile.Result{}, err
	}
	network, err := r.primaryNetwork(ctx, req.Namespace)
	if err != nil {
		return reconcile.Result{}, err
	}
	if network == "" {
		return reconcile.Result{}, r.deleteMirror(ctx, mirrorKey)
	}
	var pods corev1.PodList
	if err := r.client.List(ctx, &pods, client.InNamespace(req.Namespace)); err != nil {
		return reconcile.Result{}, err
	}
	byName := make(map[string]*corev1.Pod, len(pods.Items))
	for i := range pods.Items {
		byName[pods.Items[i].Name] = &pods.Items[i]
	}
	want := Mirror(&src, network, func(name string) *corev1.Pod { return byName[name] })
	want.Name = mirrorKey.Name

	var have discoveryv1.EndpointSlice
	switch err := r.client.Get(ctx, mirrorKey, &have); {
	case apierrors.IsNotFound(err):
		if err := r.client.Create(ctx, want); err != nil && !apierrors.IsAlreadyExists(err) {
			return reconcile.Result{}, fmt.Errorf("create EndpointSlice %s: %w", mirrorKey, err)
		}
		log.FromContext(ctx).V(1).Info("mirrored EndpointSlice", "mirror", mirrorKey.Name, "network", network, "endpoints", len(want.Endpoints))
		return reconcile.Result{}, nil
	case err != nil:
		return reconcile.Result{}, err
	}
	if have.Labels[discoveryv1.LabelManagedBy] != MirrorController {
		return reconcile.Result{}, fmt.Errorf("EndpointSlice %s exists and is not a mirror kvnet made (label %s=%q)", mirrorKey, discoveryv1.LabelManagedBy, have.Labels[discoveryv1.LabelManagedBy])
	}
	if equality.Semantic.DeepEqual(have.Labels, want.Labels) && equality.Semantic.DeepEqual(have.Annotations, want.Annotations) &&
		equality.Semantic.DeepEqual(have.Endpoints, want.Endpoints) && equality.Semantic.DeepEqual(have.Ports, want.Ports) &&
		have.AddressType == want.AddressType && equality.Semantic.DeepEqual(have.OwnerReferences, want.OwnerReferences) {
		return reconcile.Result{}, nil
	}
	have.Labels, have.Annotations, have.OwnerReferences = want.Labels, want.Annotations, want.OwnerReferences
	have.Endpoints, have.Ports = want.Endpoints, want.Ports
	if err := r.client.Update(ctx, &have); err != nil {
		return reconcile.Result{}, fmt.Errorf("update EndpointSlice %s: %w", mirrorKey, err)
	}
	return reconcile.Result{}, nil
}

// deleteMirror deletes the mirror at key if kvnet made it.
func (r *reconciler) deleteMirror(ctx context.Context, key types.NamespacedName) error {
	var m discoveryv1.EndpointSlice
	if err := r.client.Get(ctx, key, &m); err != nil {
		return client.IgnoreNotFound(err)
	}
	if m.Labels[discoveryv1.LabelManagedBy] != MirrorController {
		return nil
	}
	return client.IgnoreNotFound(r.client.Delete(ctx, &m, client.Preconditions{UID: &m.UID}))
}

// primaryNetwork returns the name of the primary network kvnet serves in
// namespace ns, or "".
func (r *reconciler) primaryNetwork(ctx context.Context, ns string) (string, error) {
	var nads nadv1.NetworkAttachmentDefinitionList
	if err := r.client.List(ctx, &nads, client.InNamespace(ns)); err != nil {
		return "", err
	}
	var names []string
	for i := range nads.Items {
		nad := &nads.Items[i]
		if nad.DeletionTimestamp != nil {
			continue
		}
		s, err := netconf.ParseServed(nad.Spec.Config)
		if err != nil || s == nil || !s.IsPrimary() {
			continue
		}
		names = append(names, s.Name)
	}
	slices.Sort(names)
	if len(names) == 0 {
		return "", nil
	}
	return names[0], nil
}

// Mirror returns the mirror of src for network: src's endpoints with the
// addresses of src's address type their pods (pod looks them up by name)
// have on network; an endpoint whose pod has none there (not allocated
// yet, or gone) is left out, a host-network pod's keeps its addresses.
// Name is left to the caller.
func Mirror(src *discoveryv1.EndpointSlice, network string, pod func(name string) *corev1.Pod) *discoveryv1.EndpointSlice {
	m := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: src.Namespace,
			Labels: map[string]string{
				discoveryv1.LabelManagedBy: MirrorController,
				ServiceNameLabel:           src.Labels[discoveryv1.LabelServiceName],
				SourceVersionLabel:         src.ResourceVersion,
			},
			Annotations:     map[string]string{NetworkAnnotation: network, SourceAnnotation: src.Name},
			OwnerReferences: ownedLike(src.OwnerReferences),
		},
		AddressType: src.AddressType,
		Ports:       slices.Clone(src.Ports),
	}
	v4 := src.AddressType == discoveryv1.AddressTypeIPv4
	for _, e := range src.Endpoints {
		if e.TargetRef == nil || e.TargetRef.Kind != "Pod" {
			continue
		}
		p := pod(e.TargetRef.Name)
		if p == nil || (e.TargetRef.UID != "" && p.UID != e.TargetRef.UID) {
			continue
		}
		var addrs []string
		if p.Spec.HostNetwork {
			addrs = slices.Clone(e.Addresses)
		} else {
			addrs = networkAddrs(p, network, v4)
		}
		if len(addrs) == 0 {
			continue
		}
		me := *e.DeepCopy()
		me.Addresses = addrs
		m.Endpoints = append(m.Endpoints, me)
	}
	return m
}

// networkAddrs returns pod's addresses of one family on network, from its
// kvnet.io/pod-networks annotation.
func networkAddrs(pod *corev1.Pod, network string, v4 bool) []string {
	nets, err := podnetworks.Parse(pod.Annotations[podnetworks.Annotation])
	if err != nil {
		return nil
	}
	var out []string
	for _, key := range slices.Sorted(maps.Keys(nets)) {
		a := nets[key]
		if a.Network != network {
			continue
		}
		for _, s := range a.IPAddresses {
			if p, err := netip.ParsePrefix(s); err == nil && p.Addr().Is4() == v4 {
				out = append(out, p.Addr().String())
			}
		}
	}
	return out
}

// ownedLike returns refs (the source slice's owner, its Service) without
// blockOwnerDeletion: setting it needs the right to update the owner's
// finalizers where the OwnerReferencesPermissionEnforcement admission
// plugin runs (OpenShift), and the mirror blocks nothing.
func ownedLike(refs []metav1.OwnerReference) []metav1.OwnerReference {
	out := make([]metav1.OwnerReference, 0, len(refs))
	for _, r := range refs {
		r.BlockOwnerDeletion = nil
		out = append(out, r)
	}
	return out
}
