package udn

import (
	"maps"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	nadv1 "kvnet.io/kvnet/api/k8scni/v1"
	"kvnet.io/kvnet/internal/multus"
	"kvnet.io/kvnet/internal/netconf"
	"kvnet.io/kvnet/internal/podnetworks"
)

// Owner is the UDN or CUDN a NAD is rendered from.
type Owner struct {
	metav1.Object
	GVK schema.GroupVersionKind
}

// DesiredNAD returns the NAD to hold conf in namespace, owned by owner and
// carrying networkID. existing, when not nil, is the NAD in the cluster: its
// k8s.ovn.org/* annotations and PoolExhaustedAnnotation are kept (other
// writers own them).
func DesiredNAD(owner Owner, namespace string, conf *netconf.NetConf, networkID int, existing *nadv1.NetworkAttachmentDefinition) (*nadv1.NetworkAttachmentDefinition, error) {
	cfg, err := conf.Marshal()
	if err != nil {
		return nil, err
	}
	labels := map[string]string{}
	maps.Copy(labels, owner.GetLabels())
	labels[NADLabel] = ""

	annotations := map[string]string{}
	for k, v := range owner.GetAnnotations() {
		if !strings.HasPrefix(k, reservedAnnotationPrefix) && k != PoolExhaustedAnnotation {
			annotations[k] = v
		}
	}
	if existing != nil {
		for k, v := range existing.Annotations {
			if strings.HasPrefix(k, reservedAnnotationPrefix) || k == PoolExhaustedAnnotation {
				annotations[k] = v
			}
		}
	}
	annotations[NetworkIDAnnotation] = strconv.Itoa(networkID)
	annotations[NetworkNameAnnotation] = conf.Name

	t := true
	return &nadv1.NetworkAttachmentDefinition{
		TypeMeta: metav1.TypeMeta{APIVersion: nadv1.GroupVersion.String(), Kind: "NetworkAttachmentDefinition"},
		ObjectMeta: metav1.ObjectMeta{
			Name:        owner.GetName(),
			Namespace:   namespace,
			Labels:      labels,
			Annotations: annotations,
			Finalizers:  []string{Finalizer},
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion:         owner.GVK.GroupVersion().String(),
				Kind:               owner.GVK.Kind,
				Name:               owner.GetName(),
				UID:                owner.GetUID(),
				Controller:         &t,
				BlockOwnerDeletion: &t,
			}},
		},
		Spec: nadv1.NetworkAttachmentDefinitionSpec{Config: cfg},
	}, nil
}

// NetworkIDOf returns the network ID stored on a NAD, or 0.
func NetworkIDOf(nad *nadv1.NetworkAttachmentDefinition) int {
	id, err := strconv.Atoi(nad.Annotations[NetworkIDAnnotation])
	if err != nil || id < 1 || id > MaxNetworkID {
		return 0
	}
	return id
}

// PodsUsing returns "<ns>/<pod>" of every live pod that uses the NAD
// namespace/name: pods selecting it in their networks annotation, and, for a
// primary network in a namespace carrying PrimaryNamespaceLabel, every pod
// of the namespace that is not on the host network. Pods that completed do
// not count. A pod whose annotation does not parse counts as a user, so a
// typo never lets a network in use be deleted.
func PodsUsing(namespace, name string, primary, namespaceLabelled bool, pods []corev1.Pod) []string {
	var users []string
	for i := range pods {
		p := &pods[i]
		if p.Namespace != namespace || podnetworks.Completed(p) {
			continue
		}
		if primary && namespaceLabelled && !p.Spec.HostNetwork {
			users = append(users, p.Namespace+"/"+p.Name)
			continue
		}
		v, ok := p.Annotations[multus.NetworksAnnotation]
		if !ok {
			continue
		}
		elems, err := multus.ParseSelection(multus.NetworksAnnotation, v, p.Namespace)
		if err != nil {
			users = append(users, p.Namespace+"/"+p.Name)
			continue
		}
		for _, e := range elems {
			if e.Namespace == namespace && e.Name == name {
				users = append(users, p.Namespace+"/"+p.Name)
				break
			}
		}
	}
	return users
}
