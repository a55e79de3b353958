package node

import (
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"

	nadv1 "kvnet.io/kvnet/api/k8scni/v1"
	mnpv1beta1 "kvnet.io/kvnet/api/k8scni/v1beta1"
	kubevirtv1 "kvnet.io/kvnet/api/kubevirt/v1"
)

// newScheme returns the scheme of the APIs kvnet-node reads and writes:
// the Kubernetes built-ins (Pods, Nodes), NetworkAttachmentDefinitions,
// MultiNetworkPolicies and KubeVirt VirtualMachineInstances. It is built here, not taken from
// internal/k8s/manager, so that kvnet-node does not link kvnet-controller
// (its controllers, webhooks and their dependencies).
func newScheme() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{
		clientgoscheme.AddToScheme, nadv1.AddToScheme, mnpv1beta1.AddToScheme, kubevirtv1.AddToScheme,
	} {
		if err := add(s); err != nil {
			return nil, err
		}
	}
	return s, nil
}
