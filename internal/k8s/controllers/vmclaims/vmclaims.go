// Package vmclaims creates the IPAMClaims of KubeVirt VMs (the
// ipam-extensions role) and releases them only when the VM is really gone:
// a claim "<vm>.<network>" per VM network whose NAD allows persistent IPs,
// owned by the VM (or the VMI when standalone), with the finalizer
// kubevirt.io/persistent-ipam so stopping a VM keeps its IPs.
package vmclaims

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	nadv1 "kvnet.io/kvnet/api/k8scni/v1"
	ipamclaimv1alpha1 "kvnet.io/kvnet/api/k8scni/v1alpha1"
	kubevirtv1 "kvnet.io/kvnet/api/kubevirt/v1"
	"kvnet.io/kvnet/internal/k8s/handlers"
	"kvnet.io/kvnet/internal/k8s/nads"
	"kvnet.io/kvnet/internal/netconf"
	"kvnet.io/kvnet/internal/vmclaims"
)

// Options configures the controller.
type Options struct {
	// After, if set, holds back every IPAMClaim read until it is closed:
	// the IPAM controller's Started.Rebuilt.
	After              <-chan struct{}
	SkipNameValidation bool
}

// Setup registers the VM claims controller. It reconciles per VM name: the
// VM and its VMI share a name, so one key covers both.
//
// With Options.After set to the IPAM controller's Started.Rebuilt, this
// controller reads no IPAMClaim (neither watches them nor reconciles)
// until the IPAM allocators are rebuilt: the rebuild reads every claim and is on the
// critical path of the first allocation after a restart, and a claim
// informer syncing at the same time would make the API server serialize
// every claim twice. Claims are only created for VMIs, whose launcher pods
// cannot be served before the rebuild anyway.
func Setup(mgr ctrl.Manager, opts Options) error {
	r := &reconciler{client: mgr.GetClient(), apiReader: mgr.GetAPIReader(), recorder: mgr.GetEventRecorder("kvnet-vmclaims"),
		after: opts.After}
	// A claim being deleted (its namespace going) waits for this
	// controller to drop its finalizer: ahead of other work, or under churn
	// with restarts it may never get its turn (handlers.DeletingFirst).
	byVMLabel := handlers.DeletingFirstBy(func(o client.Object) []reconcile.Request {
		if vm := o.GetLabels()[kubevirtv1.VirtualMachineLabel]; vm != "" {
			return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: vm}}}
		}
		return nil
	})
	// A NAD that appears (VM and network applied together) gives the VMIs
	// of its namespace the claims they could not have without it.
	c := mgr.GetClient()
	vmisOfNamespace := handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
		var list kubevirtv1.VirtualMachineInstanceList
		if err := c.List(ctx, &list, client.InNamespace(o.GetNamespace())); err != nil {
			return nil
		}
		out := make([]reconcile.Request, 0, len(list.Items))
		for _, vmi := range list.Items {
			out = append(out, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: vmi.Namespace, Name: vmi.Name}})
		}
		return out
	})
	// Metadata only: labels, owners and finalizers are all this controller
	// reads of claims, and full claims are not cached.
	claim := &metav1.PartialObjectMetadata{}
	claim.SetGroupVersionKind(ipamclaimv1alpha1.GroupVersion.WithKind("IPAMClaim"))
	var claims source.Source = source.Kind(mgr.GetCache(), client.Object(claim), byVMLabel)
	if r.after != nil {
		claims = &afterSource{after: r.after, src: claims}
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("vmclaims").
		// A VMI being deleted releases its claims: ahead of other work.
		Watches(&kubevirtv1.VirtualMachineInstance{}, handlers.DeletingFirst()).
		Watches(&kubevirtv1.VirtualMachine{}, handlers.DeletingFirst()).
		Watches(&nadv1.NetworkAttachmentDefinition{}, vmisOfNamespace, builder.WithPredicates(predicate.Funcs{
			CreateFunc: func(event.CreateEvent) bool { return true },
			UpdateFunc: func(event.UpdateEvent) bool { return false },
			DeleteFunc: func(event.DeleteEvent) bool { return false },
		})).
		WatchesRawSource(claims).
		WithOptions(controller.Options{MaxConcurrentReconciles: 8, SkipNameValidation: &opts.SkipNameValidation}).
		Complete(r)
}

// afterSource starts src once after is closed. It is no
// source.SyncingSource, so the controller's workers do not wait for src;
// the reconciler waits for after itself, and its cached reads of claims
// wait for the claim cache to sync.
type afterSource struct {
	after <-chan struct{}
	src   source.Source
}

func (s *afterSource) Start(ctx context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request]) error {
	go func() {
		select {
		case <-s.after:
		case <-ctx.Done():
			return
		}
		if err := s.src.Start(ctx, q); err != nil {
			log.FromContext(ctx).Error(err, "start IPAMClaim watch")
		}
	}()
	return nil
}

func (s *afterSource) String() string { return fmt.Sprintf("after IPAM rebuild: %v", s.src) }

type reconciler struct {
	client    client.Client
	apiReader client.Reader
	recorder  events.EventRecorder
	after     <-chan struct{} // nil: no wait
}

func (r *reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	if r.after != nil {
		select {
		case <-r.after:
		case <-ctx.Done():
			return ctrl.Result{}, ctx.Err()
		}
	}
	var vm *kubevirtv1.VirtualMachine
	var vmi *kubevirtv1.VirtualMachineInstance
	{
		var o kubevirtv1.VirtualMachine
		switch err := r.client.Get(ctx, req.NamespacedName, &o); {
		case err == nil:
			vm = &o
		case !apierrors.IsNotFound(err):
			return ctrl.Result{}, err
		}
		var i kubevirtv1.VirtualMachineInstance
		switch err := r.client.Get(ctx, req.NamespacedName, &i); {
		case err == nil:
			vmi = &i
		case !apierrors.IsNotFound(err):
			return ctrl.Result{}, err
		}
	}
	if vmi != nil && vmi.DeletionTimestamp == nil {
		if err := r.ensureClaims(ctx, vm, vmi); err != nil {
			return ctrl.Result{}, err
		}
	}
	return ctrl.Result{}, r.releaseIfGone(ctx, req.NamespacedName, vm, vmi)
}

// claimOwner is who owns vmi's claims: its VM, so that the claims (and
// IPs) outlive the VMI across stop/start; the VMI itself only when no VM
// controls it. A VMI controlled by a VM the cache has not seen yet (just
// created) names its VM in its controller reference, and that is enough:
// owning by the VMI then would hand the claims to garbage collection at
// the next stop.
func claimOwner(vm *kubevirtv1.VirtualMachine, vmi *kubevirtv1.VirtualMachineInstance) (metav1.Object, schema.GroupVersionKind) {
	vmKind := kubevirtv1.GroupVersion.WithKind("VirtualMachine")
	if vm != nil {
		return vm, vmKind
	}
	if ref := metav1.GetControllerOf(vmi); ref != nil && ref.Kind == vmKind.Kind && ref.APIVersion == vmKind.GroupVersion().String() {
		return &metav1.ObjectMeta{Namespace: vmi.Namespace, Name: ref.Name, UID: ref.UID}, vmKind
	}
	return vmi, kubevirtv1.GroupVersion.WithKind("VirtualMachineInstance")
}

// ensureClaims creates the claims vmi needs that do not exist yet.
func (r *reconciler) ensureClaims(ctx context.Context, vm *kubevirtv1.VirtualMachine, vmi *kubevirtv1.VirtualMachineInstance) error {
	primaryKey, err := r.primaryNAD(ctx, vmi.Namespace)
	if err != nil {
		return err
	}
	claims, err := vmclaims.Claims(vmi, vmi.Name, primaryKey, r.lookup(ctx))
	if errors.Is(err, vmclaims.ErrClaimName) {
		// The VM's networks cannot have claims (their names are not
		// usable): say so on the VMI and VM; retrying cannot help, a
		// change of the VMI reconciles again.
		msg := err.Error()
		r.recorder.Eventf(vmi, nil, corev1.EventTypeWarning, "InvalidIPAMClaimName", "CreateIPAMClaim", "%s", msg)
		if vm != nil {
			r.recorder.Eventf(vm, nil, corev1.EventTypeWarning, "InvalidIPAMClaimName", "CreateIPAMClaim", "%s", msg)
		}
		log.FromContext(ctx).Info(msg)
		return nil
	}
	if err != nil {
		return err
	}
	owner, gvk := claimOwner(vm, vmi)
	t := true
	for _, cl := range claims {
		claim := &ipamclaimv1alpha1.IPAMClaim{
			ObjectMeta: metav1.ObjectMeta{
				Namespace:  vmi.Namespace,
				Name:       cl.Name,
				Labels:     map[string]string{kubevirtv1.VirtualMachineLabel: vmi.Name},
				Finalizers: []string{vmclaims.Finalizer},
				OwnerReferences: []metav1.OwnerReference{{
					APIVersion: gvk.GroupVersion().String(), Kind: gvk.Kind, Name: owner.GetName(), UID: owner.GetUID(),
					Controller: &t, BlockOwnerDeletion: &t,
				}},
			},
			Spec: ipamclaimv1alpha1.IPAMClaimSpec{Network: cl.Network},
		}
		err := r.client.Create(ctx, claim)
		if err == nil {
			log.FromContext(ctx).Info("created IPAMClaim", "claim", vmi.Namespace+"/"+cl.Name, "network", cl.Network)
			continue
		}
		if !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create IPAMClaim %s/%s: %w", vmi.Namespace, cl.Name, err)
		}
		var cur ipamclaimv1alpha1.IPAMClaim
		if err := r.apiReader.Get(ctx, client.ObjectKeyFromObject(claim), &cur); err != nil {
			return err
		}
		if !ownedBy(&cur, owner.GetUID()) {
			msg := fmt.Sprintf("leaked IPAMClaim found: %s/%s exists but is not owned by %s %s (UID %s)", cur.Namespace, cur.Name, gvk.Kind, owner.GetName(), owner.GetUID())
			r.recorder.Eventf(vmi, nil, corev1.EventTypeWarning, "LeakedIPAMClaim", "CreateIPAMClaim", "%s", msg)
			if vm != nil {
				r.recorder.Eventf(vm, nil, corev1.EventTypeWarning, "LeakedIPAMClaim", "CreateIPAMClaim", "%s", msg)
			}
			log.FromContext(ctx).Info(msg)
		}
	}
	return nil
}

func ownedBy(o metav1.Object, uid types.UID) bool {
	refs := o.GetOwnerReferences()
	return len(refs) == 1 && refs[0].UID == uid
}

// releaseIfGone drops the finalizer of the VM's claims once they may go, as
// ipam-extensions does: with a VM, only when the VMI is gone and the VM is
// gone or being deleted (so stop/start keeps the IPs); for a standalone
// VMI, when it is gone or being deleted with no active pods. Garbage
// collection (the owner reference) then deletes the claims.
func (r *reconciler) releaseIfGone(ctx context.Context, key types.NamespacedName, vm *kubevirtv1.VirtualMachine, vmi *kubevirtv1.VirtualMachineInstance) error {
	list := &metav1.PartialObjectMetadataList{}
	list.SetGroupVersionKind(ipamclaimv1alpha1.GroupVersion.WithKind("IPAMClaimList"))
	if err := r.client.List(ctx, list, client.InNamespace(key.Namespace), client.MatchingLabels{kubevirtv1.VirtualMachineLabel: key.Name}); err != nil {
		return err
	}
	for i := range list.Items {
		cl := &list.Items[i]
		if !controllerutil.ContainsFinalizer(cl, vmclaims.Finalizer) {
			continue
		}
		ref := metav1.GetControllerOf(cl)
		release := false
		switch {
		case ref != nil && ref.Kind == "VirtualMachine":
			vmGone := vm == nil || vm.UID != ref.UID || vm.DeletionTimestamp != nil
			release = vmi == nil && vmGone
		case ref != nil && ref.Kind == "VirtualMachineInstance":
			vmiGone := vmi == nil || vmi.UID != ref.UID
			release = vmiGone || vmi.DeletionTimestamp != nil && len(vmi.Status.ActivePods) == 0
		}
		if !release {
			continue
		}
		patch := client.MergeFrom(cl.DeepCopy())
		controllerutil.RemoveFinalizer(cl, vmclaims.Finalizer)
		if err := r.client.Patch(ctx, cl, patch); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("remove finalizer of IPAMClaim %s/%s: %w", cl.Namespace, cl.Name, err)
		}
		log.FromContext(ctx).Info("released IPAMClaim to garbage collection", "claim", cl.Namespace+"/"+cl.Name)
	}
	return nil
}

func (r *reconciler) primaryNAD(ctx context.Context, namespace string) (string, error) {
	_, key, err := nads.Primary(ctx, r.client, namespace)
	return key, err
}

func (r *reconciler) lookup(ctx context.Context) vmclaims.NADLookup {
	return func(key string) (*netconf.Served, bool, error) {
		s, found, err := nads.Lookup(ctx, r.client, key)
		if err != nil && found {
			// A NAD kvnet cannot read gets no claims.
			return nil, true, nil
		}
		return s, found, err
	}
}
