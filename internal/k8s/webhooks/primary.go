package webhooks

import (
	"context"
	"fmt"
	"net/http"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	udnv1 "kvnet.io/kvnet/api/udn/v1"
	"kvnet.io/kvnet/internal/multus"
	"kvnet.io/kvnet/internal/udn"
)

// PrimaryPodPath is where the primary-network pod mutator is served.
const PrimaryPodPath = "/mutate-pod-primary-network"

// PrimaryPodMutator attaches a namespace's primary user-defined network to
// its pods through Multus: it adds an element selecting the primary NAD as
// interface ovn-udn1 to the pod's k8s.v1.cni.cncf.io/networks annotation.
// Multus then calls the cluster default network for eth0 (which stays, for
// the kubelet) and kvnet-cni for ovn-udn1, whose default route replaces
// eth0's. It is registered for pods in namespaces labelled
// k8s.ovn.org/primary-user-defined-network; when Multus is false (the
// cluster's default network plugin attaches primary networks itself, as
// OVN-Kubernetes does) it changes nothing.
//
// With AsDefaultNetwork (and Multus) it names the primary NAD in the pod's
// v1.multus-cni.io/default-network annotation instead, with the cni-arg
// multus.AttachDefaultNetworkArg: Multus then calls kvnet-cni as the pod's
// default network, which runs the cluster default network for eth0 itself
// and returns eth0 and ovn-udn1 in one result, ovn-udn1 holding the
// gateway; so Multus's own network-status marks ovn-udn1 default, with no
// second writer racing it.
type PrimaryPodMutator struct {
	Reader           client.Reader
	Cache            client.Reader
	Decoder          admission.Decoder
	Multus           bool
	AsDefaultNetwork bool
}

// Handle implements admission.Handler.
func (m *PrimaryPodMutator) Handle(ctx context.Context, req admission.Request) admission.Response {
	start := time.Now()
	defer func() { admissionSeconds.WithLabelValues("primary-pod").Observe(time.Since(start).Seconds()) }()
	if !m.Multus {
		return admission.Allowed("primary networks are attached by the cluster's default network plugin")
	}
	var pod corev1.Pod
	if err := m.Decoder.Decode(req, &pod); err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	if pod.Namespace == "" {
		pod.Namespace = req.Namespace
	}
	if pod.Spec.HostNetwork {
		return admission.Allowed("host network pod")
	}
	l := &LauncherPodMutator{Reader: m.Reader, Cache: m.Cache}
	labelled, primaryKey, err := l.primary(ctx, pod.Namespace)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	if !labelled {
		return admission.Allowed("namespace has no primary network")
	}
	if primaryKey == "" {
		// Applied together with its network (kubectl apply -f dir/), the pod
		// may come before kvnet made the NAD: select the NAD the namespace's
		// primary UDN or CUDN will get (named after it). Multus then fails
		// the pod's sandbox until the NAD exists, and kubelet retries, as
		// upstream keeps such a pod pending.
		if primaryKey, err = m.pendingPrimary(ctx, pod.Namespace); err != nil {
			return admission.Errored(http.StatusInternalServerError, err)
		}
	}
	if primaryKey == "" {
		return admission.Denied(fmt.Sprintf("namespace %s is labelled %s but no primary UserDefinedNetwork or ClusterUserDefinedNetwork serves it: pod %s is refused until one does, so that it is not started on the cluster default network alone",
			pod.Namespace, udn.PrimaryNamespaceLabel, podName(&pod)))
	}
	key, with := multus.NetworksAnnotation, multus.WithPrimaryElement
	if m.AsDefaultNetwork {
		if err := notInNetworks(pod.Annotations[multus.NetworksAnnotation], pod.Namespace, primaryKey); err != nil {
			return admission.Denied(fmt.Sprintf("pod %s: %v", podName(&pod), err))
		}
		key, with = multus.DefaultNetworkAnnotation, multus.WithPrimaryDefaultNetwork
	}
	v, changed, err := with(pod.Annotations[key], pod.Namespace, primaryKey, nil)
	if err != nil {
		return admission.Denied(fmt.Sprintf("pod %s: %v", podName(&pod), err))
	}
	if !changed {
		return admission.Allowed("primary network already selected")
	}
	ann := map[string]string{}
	for k, val := range pod.Annotations {
		ann[k] = val
	}
	ann[key] = v
	return patchAnnotations(req.Object.Raw, ann)
}

func podName(p *corev1.Pod) string {
	if p.Name == "" {
		return p.Namespace + "/" + p.GenerateName + "*"
	}
	return p.Namespace + "/" + p.Name
}

// pendingPrimary returns "<namespace>/<name>" of the NAD the namespace's
// primary network will have: its primary UserDefinedNetwork's, else that
// of a primary ClusterUserDefinedNetwork selecting it; "" if there is
// none. The NAD is named after the UDN or CUDN.
func (m *PrimaryPodMutator) pendingPrimary(ctx context.Context, namespace string) (string, error) {
	var udns udnv1.UserDefinedNetworkList
	if err := m.Reader.List(ctx, &udns, client.InNamespace(namespace)); err != nil {
		return "", fmt.Errorf("list UserDefinedNetworks of namespace %s: %w", namespace, err)
	}
	for i := range udns.Items {
		if u := &udns.Items[i]; u.DeletionTimestamp == nil && udn.SpecOfUDN(u).IsPrimary() {
			return namespace + "/" + u.Name, nil
		}
	}
	var ns corev1.Namespace
	if err := m.Reader.Get(ctx, client.ObjectKey{Name: namespace}, &ns); err != nil {
		return "", fmt.Errorf("read namespace %s: %w", namespace, err)
	}
	var cudns udnv1.ClusterUserDefinedNetworkList
	if err := m.Reader.List(ctx, &cudns); err != nil {
		return "", fmt.Errorf("list ClusterUserDefinedNetworks: %w", err)
	}
	for i := range cudns.Items {
		cu := &cudns.Items[i]
		if cu.DeletionTimestamp != nil || !udn.SpecOfCUDN(cu).IsPrimary() {
			continue
		}
		sel, err := metav1.LabelSelectorAsSelector(&cu.Spec.NamespaceSelector)
		if err != nil {
			continue // the CUDN controller reports it
		}
		if sel.Matches(labels.Set(ns.Labels)) {
			return namespace + "/" + cu.Name, nil
		}
	}
	return "", nil
}

// notInNetworks refuses a networks annotation that selects the primary
// network primaryKey when kvnet attaches it as the default network: Multus
// would attach it a second time.
func notInNetworks(value, podNamespace, primaryKey string) error {
	elems, err := multus.ParseSelection(multus.NetworksAnnotation, value, podNamespace)
	if err != nil {
		return err
	}
	for i, e := range elems {
		if e.Key() == primaryKey {
			return fmt.Errorf("%w: annotation %s element %d selects the namespace's primary network %s, which kvnet attaches as the pod's default network (interface %s): remove the element",
				multus.ErrInvalidSelection, multus.NetworksAnnotation, i, primaryKey, multus.PrimaryInterface)
		}
	}
	return nil
}
