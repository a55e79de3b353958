package udn

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log"

	nadv1 "kvnet.io/kvnet/api/k8scni/v1"
	"kvnet.io/kvnet/internal/netconf"
	"kvnet.io/kvnet/internal/reserved"
	"kvnet.io/kvnet/internal/udn"
)

// errNetworkInUse is returned while pods still use a network being deleted.
type errNetworkInUse struct{ pods []string }

func (e *errNetworkInUse) Error() string {
	return fmt.Sprintf("network in use by the following pods: %v", e.pods)
}

// userError is a sync error only a user can fix (a missing namespace label, a
// foreign NAD, a second primary network). It is reported in status and
// retried slowly rather than with hot back-off.
type userError struct{ err error }

func (e *userError) Error() string { return e.err.Error() }
func (e *userError) Unwrap() error { return e.err }

func userErrorf(format string, args ...any) error {
	return &userError{err: fmt.Errorf(format, args...)}
}

// userErrorRetry is how often a network failing on a user error is retried.
const userErrorRetry = 30 * time.Second

// resultFor maps a sync error to a controller result: user errors are
// retried slowly and not logged as controller failures.
func resultFor(err error) (ctrl.Result, error) {
	var ue *userError
	if errors.As(err, &ue) {
		return ctrl.Result{RequeueAfter: userErrorRetry}, nil
	}
	return ctrl.Result{}, err
}

// networks is the state shared by the UDN and CUDN reconcilers: the network
// ID allocator and the per-namespace primary network claims. Both must be
// shared, since a UDN and a CUDN may compete for the same namespace.
type networks struct {
	client    client.Client
	apiReader client.Reader
	recorder  events.EventRecorder
	ids       *udn.IDAllocator
	// namespaces says which namespaces a network may serve; reserved
	// are the cluster's reserved subnets. Both are set once, at setup.
	namespaces udn.NamespaceRule
	reserved   reserved.Subnets

	initMu sync.Mutex // guards following
	inited bool

	createMu sync.Mutex              // serializes primary checks with NAD creation; guards following
	primary  map[string]primaryClaim // namespace -> primary network holding it
}

type primaryClaim struct {
	nadName  string
	ownerUID types.UID
}

func newNetworks(c client.Client, apiReader client.Reader, rec events.EventRecorder) *networks {
	return &networks{
		client:    c,
		apiReader: apiReader,
		recorder:  rec,
		ids:       udn.NewIDAllocator(),
		primary:   map[string]primaryClaim{},
		reserved:  reserved.Default(),
	}
}

// init rebuilds network IDs and primary claims from the NADs in the API, so
// IDs survive controller restarts. It runs once, before the first reconcile
// does anything, reading from the API server rather than the cache.
func (n *networks) init(ctx context.Context) error {
	n.initMu.Lock()
	defer n.initMu.Unlock()
	if n.inited {
		return nil
	}
	var list nadv1.NetworkAttachmentDefinitionList
	// Every NAD: rendered ones and hand-written kvnet-cni ones (which
	// handwrittenReconciler gives IDs) share one ID space.
	if err := n.apiReader.List(ctx, &list); err != nil {
		return fmt.Errorf("list NetworkAttachmentDefinitions to restore network IDs: %w", err)
	}
	logger := log.FromContext(ctx)
	for i := range list.Items {
		nad := &list.Items[i]
		id, name := udn.NetworkIDOf(nad), nad.Annotations[udn.NetworkNameAnnotation]
		if _, rendered := nad.Labels[udn.NADLabel]; !rendered {
			if conf, err := netconf.Parse(nad.Spec.Config); err == nil && conf != nil {
				name = conf.Name
			} else {
				continue
			}
		}
		if id == 0 || name == "" {
			continue
		}
		if err := n.ids.Reserve(name, id); err != nil {
			// Two networks claim one ID (hand edits): the second gets a new
			// one on its next reconcile.
			logger.Error(err, "network ID conflict", "nad", client.ObjectKeyFromObject(nad))
		}
		if conf, err := netconf.Parse(nad.Spec.Config); err == nil && conf != nil && conf.IsPrimary() {
			if owner := metav1.GetControllerOf(nad); owner != nil {
				n.primary[nad.Namespace] = primaryClaim{nadName: nad.Name, ownerUID: owner.UID}
			}
		}
	}
	n.inited = true
	logger.Info("restored network IDs", "networks", len(list.Items))
	return nil
}

// ensureNAD creates or repairs the NAD of a network in namespace.
func (n *networks) ensureNAD(ctx context.Context, owner udn.Owner, spec udn.Spec, netName, namespace string) (*nadv1.NetworkAttachmentDefinition, error) {
	if err := n.namespaces.Check(namespace); err != nil {
		// A NAD rendered there before the rule applied (a changed
		// --global-namespaces) goes, unless pods still use it.
		if derr := n.deleteNAD(ctx, owner.Object, spec, namespace); derr != nil && !isInUse(derr) {
			return nil, derr
		}
		return nil, &userError{err: err}
	}
	if spec.IsPrimary() {
		var ns corev1.Namespace
		if err := n.client.Get(ctx, client.ObjectKey{Name: namespace}, &ns); err != nil {
			return nil, fmt.Errorf("failed to get namespace %q: %w", namespace, err)
		}
		if _, ok := ns.Labels[udn.PrimaryNamespaceLabel]; !ok {
			return nil, userErrorf("invalid primary network state for namespace %q: a valid primary user defined network or network attachment definition custom resource, and required namespace label %q must both be present", namespace, udn.PrimaryNamespaceLabel)
		}
	}
	conf, err := udn.RenderReserved(spec, netName, namespace+"/"+owner.GetName(), n.reserved)
	if err != nil {
		return nil, &userError{fmt.Errorf("failed to generate NetworkAttachmentDefinition: %w", err)}
	}

	var existing *nadv1.NetworkAttachmentDefinition
	var cur nadv1.NetworkAttachmentDefinition
	switch err := n.client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: owner.GetName()}, &cur); {
	case err == nil:
		existing = &cur
	case !apierrors.IsNotFound(err):
		return nil, fmt.Errorf("failed to get NetworkAttachmentDefinition %s/%s: %w", namespace, owner.GetName(), err)
	}
	if existing != nil {
		if !metav1.IsControlledBy(existing, owner) {
			return nil, userErrorf("foreign NetworkAttachmentDefinition with the desired name already exist [%s/%s]", namespace, owner.GetName())
		}
		if spec.IsPrimary() {
			n.createMu.Lock()
			n.primary[namespace] = primaryClaim{nadName: existing.Name, ownerUID: owner.GetUID()}
			n.createMu.Unlock()
		}
		if existing.DeletionTimestamp != nil {
			return n.terminatingNAD(ctx, existing, spec)
		}
		if id := udn.NetworkIDOf(existing); id != 0 {
			if err := n.ids.Reserve(netName, id); err != nil {
				// Hand-edited or conflicting: the allocator's ID wins and
				// the NAD is repaired below.
				log.FromContext(ctx).Info("ignoring network ID on NAD", "nad", namespace+"/"+owner.GetName(), "reason", err.Error())
			}
		}
	}
	id, err := n.ids.Allocate(netName)
	if err != nil {
		return nil, fmt.Errorf("allocate network ID for %q: %w", netName, err)
	}
	desired, err := udn.DesiredNAD(owner, namespace, conf, id, existing)
	if err != nil {
		return nil, err
	}
	if existing == nil {
		return n.createNAD(ctx, owner, spec.IsPrimary(), desired)
	}
	if nadUpToDate(existing, desired) {
		return existing, nil
	}
	updated := existing.DeepCopy()
	updated.Spec.Config = desired.Spec.Config
	updated.Labels = desired.Labels
	updated.Annotations = desired.Annotations
	controllerutil.AddFinalizer(updated, udn.Finalizer)
	if err := n.client.Update(ctx, updated); err != nil {
		return nil, fmt.Errorf("failed to update NetworkAttachmentDefinition: %w", err)
	}
	log.FromContext(ctx).Info("reverted NetworkAttachmentDefinition to its rendered state", "nad", namespace+"/"+updated.Name)
	return updated, nil
}

func nadUpToDate(cur, want *nadv1.NetworkAttachmentDefinition) bool {
	if cur.Spec.Config != want.Spec.Config || !controllerutil.ContainsFinalizer(cur, udn.Finalizer) {
		return false
	}
	if len(cur.Labels) != len(want.Labels) || len(cur.Annotations) != len(want.Annotations) {
		return false
	}
	for k, v := range want.Labels {
		if cv, ok := cur.Labels[k]; !ok || cv != v {
			return false
		}
	}
	for k, v := range want.Annotations {
		if cv, ok := cur.Annotations[k]; !ok || cv != v {
			return false
		}
	}
	return true
}

func (n *networks) createNAD(ctx context.Context, owner udn.Owner, primary bool, nad *nadv1.NetworkAttachmentDefinition) (*nadv1.NetworkAttachmentDefinition, error) {
	n.createMu.Lock()
	defer n.createMu.Unlock()
	ns := nad.Namespace
	if primary {
		if claim, ok := n.primary[ns]; ok && claim.ownerUID != owner.GetUID() {
			return nil, userErrorf("primary network already exist in namespace %q: %q", ns, claim.nadName)
		}
		var list nadv1.NetworkAttachmentDefinitionList
		if err := n.apiReader.List(ctx, &list, client.InNamespace(ns)); err != nil {
			return nil, fmt.Errorf("failed to list NetworkAttachmentDefinition: %w", err)
		}
		for i := range list.Items {
			other := &list.Items[i]
			conf, err := netconf.Parse(other.Spec.Config)
			if err != nil || conf == nil || !conf.IsPrimary() || metav1.IsControlledBy(other, owner) {
				continue
			}
			return nil, userErrorf("primary network already exist in namespace %q: %q", ns, other.Name)
		}
	}
	if err := n.client.Create(ctx, nad); err != nil {
		if !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("failed to create NetworkAttachmentDefinition: %w", err)
		}
		// The cache had not seen our own earlier create yet: read it back
		// and check that it is ours.
		var cur nadv1.NetworkAttachmentDefinition
		if err := n.apiReader.Get(ctx, client.ObjectKeyFromObject(nad), &cur); err != nil {
			return nil, fmt.Errorf("failed to get NetworkAttachmentDefinition %s/%s: %w", ns, nad.Name, err)
		}
		if !metav1.IsControlledBy(&cur, owner) {
			return nil, userErrorf("foreign NetworkAttachmentDefinition with the desired name already exist [%s/%s]", ns, nad.Name)
		}
		return &cur, nil
	}
	if primary {
		n.primary[ns] = primaryClaim{nadName: nad.Name, ownerUID: owner.GetUID()}
	}
	log.FromContext(ctx).Info("created NetworkAttachmentDefinition", "nad", ns+"/"+nad.Name)
	return nad, nil
}

// terminatingNAD handles a NAD of ours that someone deleted, and returns
// it. Our finalizer holds it while pods use it; once they are
// gone it is let go, and its deletion event brings the network back to
// ensureNAD to create it anew, with the same network ID and primary claim.
func (n *networks) terminatingNAD(ctx context.Context, nad *nadv1.NetworkAttachmentDefinition, spec udn.Spec) (*nadv1.NetworkAttachmentDefinition, error) {
	err := n.releaseNAD(ctx, nad.DeepCopy(), spec)
	// A conflict or not-found means the cache is behind; the event that
	// catches it up reconciles again.
	if err != nil && !isInUse(err) && !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
		return nil, err
	}
	return nad, nil
}

// deleteNAD removes the NAD of owner in namespace unless pods still use it,
// in which case it returns *errNetworkInUse. A missing NAD is not an error.
func (n *networks) deleteNAD(ctx context.Context, owner metav1.Object, spec udn.Spec, namespace string) error {
	var nad nadv1.NetworkAttachmentDefinition
	if err := n.apiReader.Get(ctx, client.ObjectKey{Namespace: namespace, Name: owner.GetName()}, &nad); err != nil {
		if apierrors.IsNotFound(err) {
			n.releasePrimary(owner, namespace)
			return nil
		}
		return fmt.Errorf("failed to get NetworkAttachmentDefinition %s/%s: %w", namespace, owner.GetName(), err)
	}
	if !metav1.IsControlledBy(&nad, owner) {
		return nil
	}
	if err := n.releaseNAD(ctx, &nad, spec); err != nil {
		return err
	}
	if err := n.client.Delete(ctx, &nad); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("failed to delete NetworkAttachmentDefinition %s/%s: %w", namespace, nad.Name, err)
	}
	n.releasePrimary(owner, namespace)
	log.FromContext(ctx).Info("deleted NetworkAttachmentDefinition", "nad", namespace+"/"+nad.Name)
	return nil
}

// releaseNAD removes our finalizer from nad unless pods still use it, in
// which case it returns *errNetworkInUse.
func (n *networks) releaseNAD(ctx context.Context, nad *nadv1.NetworkAttachmentDefinition, spec udn.Spec) error {
	if !controllerutil.ContainsFinalizer(nad, udn.Finalizer) {
		return nil
	}
	var ns corev1.Namespace
	labelled := false
	if err := n.client.Get(ctx, client.ObjectKey{Name: nad.Namespace}, &ns); err == nil {
		_, labelled = ns.Labels[udn.PrimaryNamespaceLabel]
	}
	var pods corev1.PodList
	if err := n.client.List(ctx, &pods, client.InNamespace(nad.Namespace)); err != nil {
		return fmt.Errorf("failed to list pods at target namespace %q: %w", nad.Namespace, err)
	}
	if users := udn.PodsUsing(nad.Namespace, nad.Name, spec.IsPrimary(), labelled, pods.Items); len(users) > 0 {
		return &errNetworkInUse{pods: users}
	}
	controllerutil.RemoveFinalizer(nad, udn.Finalizer)
	if err := n.client.Update(ctx, nad); err != nil {
		return fmt.Errorf("failed to remove NetworkAttachmentDefinition finalizer: %w", err)
	}
	return nil
}

func (n *networks) releasePrimary(owner metav1.Object, namespace string) {
	n.createMu.Lock()
	defer n.createMu.Unlock()
	if c, ok := n.primary[namespace]; ok && c.ownerUID == owner.GetUID() {
		delete(n.primary, namespace)
	}
}

// ownedNADs lists the NADs controlled by owner, in any namespace.
func (n *networks) ownedNADs(ctx context.Context, owner metav1.Object) ([]nadv1.NetworkAttachmentDefinition, error) {
	var list nadv1.NetworkAttachmentDefinitionList
	if err := n.client.List(ctx, &list, client.HasLabels{udn.NADLabel}); err != nil {
		return nil, fmt.Errorf("failed to list NetworkAttachmentDefinitions: %w", err)
	}
	var out []nadv1.NetworkAttachmentDefinition
	for _, nad := range list.Items {
		if metav1.IsControlledBy(&nad, owner) {
			out = append(out, nad)
		}
	}
	slices.SortFunc(out, func(a, b nadv1.NetworkAttachmentDefinition) int {
		return cmp.Compare(a.Namespace, b.Namespace)
	})
	return out, nil
}

// isInUse reports whether err says pods still use a network.
func isInUse(err error) bool {
	var e *errNetworkInUse
	return errors.As(err, &e)
}
