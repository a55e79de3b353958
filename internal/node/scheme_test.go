package node

import (
	"os/exec"
	"strings"
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

// kvnet-node runs on every node: it must not link kvnet-controller, its
// controllers and webhooks, the control plane or the lab's stand-ins.
func TestKvnetNodeDoesNotLinkController(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "kvnet.io/kvnet/cmd/kvnet-node").Output()
	if err != nil {
		t.Fatalf("go list -deps kvnet.io/kvnet/cmd/kvnet-node: %v", err)
	}
	for _, dep := range strings.Fields(string(out)) {
		for _, banned := range []string{"/internal/k8s/manager", "/internal/k8s/controllers", "/internal/k8s/webhooks", "/internal/controlplane", "/internal/sim"} {
			if strings.Contains(dep, "kvnet.io/kvnet"+banned) {
				t.Errorf("kvnet-node links %s", dep)
			}
		}
	}
}
