package node

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"

	nadv1 "kvnet.io/kvnet/api/k8scni/v1"
	kubevirtv1 "kvnet.io/kvnet/api/kubevirt/v1"
)

// The scheme knows every object the agent watches, lists or patches.
func TestNewScheme(t *testing.T) {
	s, err := newScheme()
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range []runtime.Object{
		&corev1.Pod{}, &corev1.PodList{}, &corev1.Node{}, &corev1.NodeList{},
		&nadv1.NetworkAttachmentDefinition{}, &nadv1.NetworkAttachmentDefinitionList{},
		&kubevirtv1.VirtualMachineInstance{}, &kubevirtv1.VirtualMachineInstanceList{},
	} {
		if _, _, err := s.ObjectKinds(o); err != nil {
			t.Errorf("scheme lacks %T: %v", o, err)
		}
	}
}
