// Package policyevents reports, as Warning events on the policy, every
// NetworkPolicy and MultiNetworkPolicy kvnet cannot enforce, so that none
// is silently ignored:
//
//   - a NetworkPolicy in a namespace labelled for a primary UDN
//     (k8s.ovn.org/primary-user-defined-network) whose primary network
//     kvnet does not serve: no primary NAD, one of another plugin, or one
//     kvnet-controller refused (kvnet.io/network-conflict);
//   - a MultiNetworkPolicy whose k8s.v1.cni.cncf.io/policy-for is missing
//     or names a NAD that does not exist, is not kvnet's (type other than
//     kvnet-cni), does not parse, is a primary network (NetworkPolicies
//     police those) or has no subnets (no addresses to enforce on);
//   - a part of a policy the compiler (package policy) cannot use: its
//     error names the field and value and what kvnet-node enforces
//     instead (it fails closed: the selected pods stay isolated, the
//     unusable rule admits nothing).
//
// Policies are re-evaluated when they change and when NADs change. The
// event recorder deduplicates repeated events into a series. Fine
// policies get no event. It only reads policies, namespaces and NADs.
package policyevents

import (
	"context"
	"fmt"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	nadv1 "kvnet.io/kvnet/api/k8scni/v1"
	mnpv1beta1 "kvnet.io/kvnet/api/k8scni/v1beta1"
	"kvnet.io/kvnet/internal/netconf"
	"kvnet.io/kvnet/internal/policy"
	"kvnet.io/kvnet/internal/udn"
)

// Reasons of the Warning events.
const (
	// PrimaryNetworkNotServed: a NetworkPolicy in a namespace labelled
	// for a primary UDN whose primary network kvnet does not serve.
	PrimaryNetworkNotServed = "PrimaryNetworkNotServed"
	// PolicyForMissing: a MultiNetworkPolicy without policy-for.
	PolicyForMissing = "PolicyForMissing"
	// PolicyForNADNotFound: policy-for names a NAD that does not exist.
	PolicyForNADNotFound = "PolicyForNADNotFound"
	// PolicyForNotKvnet: policy-for names a NAD of another plugin.
	PolicyForNotKvnet = "PolicyForNotKvnet"
	// PolicyForNADInvalid: policy-for names a kvnet NAD that does not parse.
	PolicyForNADInvalid = "PolicyForNADInvalid"
	// PolicyForPrimaryNetwork: policy-for names a primary network's NAD,
	// which NetworkPolicies police.
	PolicyForPrimaryNetwork = "PolicyForPrimaryNetwork"
	// PolicyForNoSubnets: policy-for names a network without subnets.
	PolicyForNoSubnets = "PolicyForNoSubnets"
	// PolicyInvalid: the compiler cannot use part of the policy, which
	// fails closed.
	PolicyInvalid = "PolicyInvalid"
)

// action is the events' action.
const action = "Enforce"

// Options configures the controllers.
type Options struct {
	// SkipNameValidation allows registering them again in one process.
	SkipNameValidation bool
}

// Setup registers the NetworkPolicy controller with mgr, and the
// MultiNetworkPolicy one when its CRD is installed.
func Setup(mgr ctrl.Manager, opts Options) error {
	r := &reconciler{client: mgr.GetClient(), recorder: mgr.GetEventRecorder("kvnet-policy"), flagged: map[flagKey]bool{}}
	copts := controller.Options{SkipNameValidation: &opts.SkipNameValidation}
	if err := ctrl.NewControllerManagedBy(mgr).
		Named("policy-events").
		For(&networkingv1.NetworkPolicy{}).
		Watches(&nadv1.NetworkAttachmentDefinition{}, handler.EnqueueRequestsFromMapFunc(r.networkPoliciesOf)).
		WithOptions(copts).
		Complete(r.counted("NetworkPolicy", r.reconcileNetworkPolicy)); err != nil {
		return err
	}
	_, err := mgr.GetRESTMapper().RESTMapping(mnpv1beta1.GroupVersion.WithKind("MultiNetworkPolicy").GroupKind(), "v1beta1")
	if meta.IsNoMatchError(err) {
		mgr.GetLogger().Info("the MultiNetworkPolicy CRD is not installed: no MultiNetworkPolicy events")
		return nil
	} else if err != nil {
		return err
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("multi-policy-events").
		For(&mnpv1beta1.MultiNetworkPolicy{}).
		Watches(&nadv1.NetworkAttachmentDefinition{}, handler.EnqueueRequestsFromMapFunc(r.multiPoliciesOf)).
		WithOptions(copts).
		Complete(r.counted("MultiNetworkPolicy", r.reconcileMultiPolicy))
}

type reconciler struct {
	client   client.Client
	recorder events.EventRecorder

	mu      sync.Mutex       // guards following
	flagged map[flagKey]bool // policies with a warning in their latest reconcile
}

type flagKey struct {
	kind string
	key  types.NamespacedName
}

// counted runs reconcile for policies of kind and keeps
// kvnet_policies_not_enforced: a policy counts while its latest
// reconcile warned about it. Reconciles of one policy never overlap.
func (r *reconciler) counted(kind string, f reconcile.Func) reconcile.Func {
	return func(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
		k := flagKey{kind: kind, key: req.NamespacedName}
		r.mu.Lock()
		r.flagged[k] = false
		r.mu.Unlock()
		res, err := f(ctx, req)
		r.mu.Lock()
		defer r.mu.Unlock()
		if !r.flagged[k] {
			delete(r.flagged, k)
		}
		n := 0
		for fk := range r.flagged {
			if fk.kind == kind {
				n++
			}
		}
		notEnforced.WithLabelValues(kind).Set(float64(n))
		return res, err
	}
}

// networkPoliciesOf maps a NAD to the NetworkPolicies of its namespace.
func (r *reconciler) networkPoliciesOf(ctx context.Context, o client.Object) []reconcile.Request {
	var list networkingv1.NetworkPolicyList
	if err := r.client.List(ctx, &list, client.InNamespace(o.GetNamespace())); err != nil {
		log.FromContext(ctx).Error(err, "list NetworkPolicies", "namespace", o.GetNamespace())
		return nil
	}
	out := make([]reconcile.Request, 0, len(list.Items))
	for _, np := range list.Items {
		out = append(out, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: np.Namespace, Name: np.Name}})
	}
	return out
}

// multiPoliciesOf maps a NAD to the MultiNetworkPolicies naming it.
func (r *reconciler) multiPoliciesOf(ctx context.Context, o client.Object) []reconcile.Request {
	var list mnpv1beta1.MultiNetworkPolicyList
	if err := r.client.List(ctx, &list); err != nil {
		log.FromContext(ctx).Error(err, "list MultiNetworkPolicies")
		return nil
	}
	key := o.GetNamespace() + "/" + o.GetName()
	var out []reconcile.Request
	for _, mnp := range list.Items {
		for _, k := range policy.PolicyFor(mnp.Namespace, mnp.Annotations[mnpv1beta1.PolicyForAnnotation]) {
			if k == key {
				out = append(out, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: mnp.Namespace, Name: mnp.Name}})
				break
			}
		}
	}
	return out
}

func (r *reconciler) warn(o client.Object, reason, format string, args ...any) {
	r.recorder.Eventf(o, nil, corev1.EventTypeWarning, reason, action, format, args...)
	kind := "NetworkPolicy"
	if _, multi := o.(*mnpv1beta1.MultiNetworkPolicy); multi {
		kind = "MultiNetworkPolicy"
	}
	r.mu.Lock()
	r.flagged[flagKey{kind: kind, key: client.ObjectKeyFromObject(o)}] = true
	r.mu.Unlock()
}

func (r *reconciler) reconcileNetworkPolicy(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var np networkingv1.NetworkPolicy
	if err := r.client.Get(ctx, req.NamespacedName, &np); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	var ns corev1.Namespace
	if err := r.client.Get(ctx, types.NamespacedName{Name: np.Namespace}, &ns); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if _, labelled := ns.Labels[udn.PrimaryNamespaceLabel]; !labelled {
		return reconcile.Result{}, nil // the cluster default network's: not kvnet's to enforce
	}
	var nads nadv1.NetworkAttachmentDefinitionList
	if err := r.client.List(ctx, &nads, client.InNamespace(np.Namespace)); err != nil {
		return reconcile.Result{}, fmt.Errorf("list NetworkAttachmentDefinitions in %q: %w", np.Namespace, err)
	}
	network, why := primaryNetwork(nads.Items)
	if network == "" {
		r.warn(&np, PrimaryNetworkNotServed,
			"NetworkPolicy %s/%s is not enforced: namespace %q is labelled %s but %s",
			np.Namespace, np.Name, np.Namespace, udn.PrimaryNamespaceLabel, why)
		return reconcile.Result{}, nil
	}
	r.compile(&np, network, &np)
	return reconcile.Result{}, nil
}

// primaryNetwork returns the name of the primary network kvnet serves
// among a namespace's NADs, or why there is none.
func primaryNetwork(nads []nadv1.NetworkAttachmentDefinition) (network, why string) {
	why = "it has no primary network kvnet serves (no kvnet-cni NAD with role primary: create a primary UserDefinedNetwork, or a ClusterUserDefinedNetwork selecting it)"
	for i := range nads {
		nad := &nads[i]
		key := nad.Namespace + "/" + nad.Name
		conf, err := netconf.Parse(nad.Spec.Config)
		switch {
		case err == nil && conf != nil && conf.IsPrimary():
			if _, refused := nad.Annotations[udn.NetworkConflictAnnotation]; refused {
				why = fmt.Sprintf("its primary NAD %s was refused by kvnet-controller (%s: %s)", key, udn.NetworkConflictAnnotation, nad.Annotations[udn.NetworkConflictAnnotation])
				continue
			}
			return conf.Name, ""
		case err != nil:
			why = fmt.Sprintf("its NAD %s does not parse: %v", key, err)
		case netconf.ForeignOverlay(nad.Spec.Config):
			why = fmt.Sprintf("its NAD %s is not kvnet's (type %q, not %q)", key, netconf.OVNOverlayType, netconf.PluginType)
		}
	}
	return "", why
}

// compile reports the compiler's errors on policy np (owner o) of network.
func (r *reconciler) compile(o client.Object, network string, np *networkingv1.NetworkPolicy) {
	_, errs := policy.Compile(policy.Input{Network: network, Namespaces: map[string]map[string]string{np.Namespace: nil},
		Policies: []*networkingv1.NetworkPolicy{np}})
	for _, err := range errs {
		r.warn(o, PolicyInvalid, "%v", err) // names the field, the value and what kvnet enforces instead
	}
}

func (r *reconciler) reconcileMultiPolicy(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var mnp mnpv1beta1.MultiNetworkPolicy
	if err := r.client.Get(ctx, req.NamespacedName, &mnp); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	name := mnp.Namespace + "/" + mnp.Name
	keys := policy.PolicyFor(mnp.Namespace, mnp.Annotations[mnpv1beta1.PolicyForAnnotation])
	if len(keys) == 0 {
		r.warn(&mnp, PolicyForMissing, "MultiNetworkPolicy %s is not enforced: annotation %s names no NetworkAttachmentDefinition",
			name, mnpv1beta1.PolicyForAnnotation)
	}
	network := ""
	for _, key := range keys {
		var nad nadv1.NetworkAttachmentDefinition
		ns, n, _ := strings.Cut(key, "/")
		err := r.client.Get(ctx, types.NamespacedName{Namespace: ns, Name: n}, &nad)
		if apierrors.IsNotFound(err) || meta.IsNoMatchError(err) {
			r.warn(&mnp, PolicyForNADNotFound, "MultiNetworkPolicy %s: %s names NetworkAttachmentDefinition %s, which does not exist: nothing is enforced for it",
				name, mnpv1beta1.PolicyForAnnotation, key)
			continue
		} else if err != nil {
			return reconcile.Result{}, fmt.Errorf("get NetworkAttachmentDefinition %s: %w", key, err)
		}
		conf, err := netconf.Parse(nad.Spec.Config)
		switch {
		case err != nil:
			r.warn(&mnp, PolicyForNADInvalid, "MultiNetworkPolicy %s: NetworkAttachmentDefinition %s does not parse, so kvnet does not enforce the policy on it: %v", name, key, err)
		case conf == nil:
			r.warn(&mnp, PolicyForNotKvnet, "MultiNetworkPolicy %s: NetworkAttachmentDefinition %s is not kvnet's (its type is not %q): kvnet does not enforce the policy on it",
				name, key, netconf.PluginType)
		case conf.IsPrimary():
			r.warn(&mnp, PolicyForPrimaryNetwork, "MultiNetworkPolicy %s: NetworkAttachmentDefinition %s is primary network %q, which NetworkPolicies police: kvnet does not enforce the MultiNetworkPolicy on it",
				name, key, conf.Name)
		case conf.Subnets == "":
			r.warn(&mnp, PolicyForNoSubnets, "MultiNetworkPolicy %s: network %q of NetworkAttachmentDefinition %s has no subnets, so its pods have no addresses to enforce the policy on",
				name, conf.Name, key)
		default:
			network = conf.Name
		}
	}
	r.compile(&mnp, network, &networkingv1.NetworkPolicy{ObjectMeta: mnp.ObjectMeta, Spec: mnp.Spec})
	return reconcile.Result{}, nil
}
