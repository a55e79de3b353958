package simvirt

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	nadv1 "kvnet.io/kvnet/api/k8scni/v1"
	kubevirtv1 "kvnet.io/kvnet/api/kubevirt/v1"
	"kvnet.io/kvnet/internal/multus"
	"kvnet.io/kvnet/internal/podnetworks"
)

// virt-handler stand-ins: one pod per node in the KubeVirt CR's namespace,
// carrying the dedicated migration network (spec.configuration.migrations
// .network) as interface MigrationInterface when one is configured, as
// KubeVirt's virt-handler DaemonSet pods do.
const (
	// HandlerValue is the kubevirt.io label value of handler pods.
	HandlerValue = "virt-handler"
	// MigrationInterface is the handler pod's interface on the migration
	// network.
	MigrationInterface = "migration0"
	// handlerNetworkAnnotation records which NAD a handler pod was made for.
	handlerNetworkAnnotation = "simvirt.kvnet.io/migration-network"
	// TargetAddressAnnotation on a migration target pod is the address its
	// node's handler receives the migration on (the VMI's
	// migrationState.targetNodeAddress).
	TargetAddressAnnotation = "simvirt.kvnet.io/target-node-address"
)

// HandlerPodName is the name of node's virt-handler stand-in pod.
func HandlerPodName(node string) string { return "virt-handler-" + node }

// handlers keeps one handler pod per node, matching the KubeVirt CR's
// migration network (a pod made for another network is replaced).
type handlers struct {
	client client.Client
	reader client.Reader
	nodes  []string
}

func (h *handlers) Reconcile(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
	kv, err := oldestKubeVirt(ctx, h.reader)
	if err != nil || kv == nil {
		return reconcile.Result{}, err
	}
	network := ""
	if mc := kv.Spec.Configuration.MigrationConfiguration; mc != nil && mc.Network != nil {
		network = *mc.Network
	}
	requeue := false
	for _, node := range h.nodes {
		var pod corev1.Pod
		err := h.reader.Get(ctx, types.NamespacedName{Namespace: kv.Namespace, Name: HandlerPodName(node)}, &pod)
		switch {
		case apierrors.IsNotFound(err):
			if err := h.client.Create(ctx, handlerPod(kv.Namespace, node, network)); err != nil && !apierrors.IsAlreadyExists(err) {
				return reconcile.Result{}, fmt.Errorf("create handler pod on %s: %w", node, err)
			}
		case err != nil:
			return reconcile.Result{}, err
		case pod.Annotations[handlerNetworkAnnotation] != network:
			// virt-operator rolls virt-handler when the network changes.
			if pod.DeletionTimestamp == nil {
				if err := h.client.Delete(ctx, &pod); err != nil && !apierrors.IsNotFound(err) {
					return reconcile.Result{}, err
				}
				log.FromContext(ctx).Info("replacing handler pod for the migration network", "node", node, "network", network)
			}
			requeue = true
		}
	}
	if requeue {
		return reconcile.Result{RequeueAfter: time.Second}, nil
	}
	return reconcile.Result{}, nil
}

func handlerPod(namespace, node, network string) *corev1.Pod {
	ann := map[string]string{handlerNetworkAnnotation: network}
	if network != "" {
		b, _ := json.Marshal([]multus.NetworkSelectionElement{{Name: network, Namespace: namespace, InterfaceRequest: MigrationInterface}})
		ann[multus.NetworksAnnotation] = string(b)
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: HandlerPodName(node),
			Labels: map[string]string{kubevirtv1.AppLabel: HandlerValue}, Annotations: ann},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "virt-handler", Image: "quay.io/kubevirt/virt-handler:simvirt"}}},
	}
}

func oldestKubeVirt(ctx context.Context, r client.Reader) (*kubevirtv1.KubeVirt, error) {
	var l kubevirtv1.KubeVirtList
	if err := r.List(ctx, &l); err != nil {
		return nil, fmt.Errorf("list KubeVirt CRs: %w", err)
	}
	var kvs []*kubevirtv1.KubeVirt
	for i := range l.Items {
		if l.Items[i].DeletionTimestamp == nil {
			kvs = append(kvs, &l.Items[i])
		}
	}
	if len(kvs) == 0 {
		return nil, nil
	}
	slices.SortFunc(kvs, byAge)
	return kvs[0], nil
}

// migrationAddress is where node receives migrations: "" without a
// dedicated migration network (the pod network); otherwise the IPv4
// address of its handler pod on it. A missing or unusable NAD is a
// permanentError naming it; a handler not ready yet is a plain error
// (retried).
func (r *reconciler) migrationAddress(ctx context.Context, node string) (string, error) {
	kv, err := oldestKubeVirt(ctx, r.reader)
	if err != nil || kv == nil {
		return "", err
	}
	mc := kv.Spec.Configuration.MigrationConfiguration
	if mc == nil || mc.Network == nil || *mc.Network == "" {
		return "", nil
	}
	key := kv.Namespace + "/" + *mc.Network
	what := fmt.Sprintf("migration network %s (spec.configuration.migrations.network of KubeVirt %s/%s)", key, kv.Namespace, kv.Name)
	var nad nadv1.NetworkAttachmentDefinition
	if err := r.reader.Get(ctx, types.NamespacedName{Namespace: kv.Namespace, Name: *mc.Network}, &nad); err != nil {
		if apierrors.IsNotFound(err) {
			return "", permanentError{fmt.Errorf("%s: NetworkAttachmentDefinition %s not found", what, key)}
		}
		return "", err
	}
	var conf struct {
		Type string          `json:"type"`
		IPAM json.RawMessage `json:"ipam"`
	}
	if err := json.Unmarshal([]byte(nad.Spec.Config), &conf); err != nil || conf.Type == "" {
		return "", permanentError{fmt.Errorf("%s: NetworkAttachmentDefinition %s has an invalid config (%v)", what, key, err)}
	}
	if len(conf.IPAM) == 0 || string(conf.IPAM) == "{}" {
		return "", permanentError{fmt.Errorf("%s: NetworkAttachmentDefinition %s has no ipam: the handlers get no address on it", what, key)}
	}
	var pod corev1.Pod
	if err := r.reader.Get(ctx, types.NamespacedName{Namespace: kv.Namespace, Name: HandlerPodName(node)}, &pod); err != nil {
		return "", fmt.Errorf("%s: handler pod of node %s: %w", what, node, err)
	}
	nets, err := podnetworks.Parse(pod.Annotations[podnetworks.Annotation])
	if err != nil || pod.Status.Phase != corev1.PodRunning || pod.Annotations[handlerNetworkAnnotation] != *mc.Network {
		return "", fmt.Errorf("%s: handler pod of node %s is not running on it yet", what, node)
	}
	a, ok := nets[key]
	if !ok {
		return "", fmt.Errorf("%s: handler pod of node %s has no address on it yet", what, node)
	}
	for _, ip := range a.Addrs() {
		if ip.Is4() {
			return ip.String(), nil
		}
	}
	return "", fmt.Errorf("%s: handler pod of node %s has no IPv4 address on it", what, node)
}

// setupHandlers registers the handler-pod controller.
func setupHandlers(mgr ctrl.Manager, nodes []string) error {
	h := &handlers{client: mgr.GetClient(), reader: mgr.GetAPIReader(), nodes: slices.Clone(nodes)}
	skip := true
	return ctrl.NewControllerManagedBy(mgr).Named("simvirt-handlers").For(&kubevirtv1.KubeVirt{}).
		WithOptions(controller.Options{SkipNameValidation: &skip}).Complete(h)
}
