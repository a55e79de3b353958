package node

import (
	"go/build"
	"path/filepath"
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
// controllers and webhooks, the control plane or the lab's stand-ins. The
// module's own packages that cmd/kvnet-node imports, directly or not, are
// walked with go/build (no go command, no module cache).
func TestKvnetNodeDoesNotLinkController(t *testing.T) {
	const module = "kvnet.io/kvnet"
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	queue := []string{module + "/cmd/kvnet-node"}
	for len(queue) > 0 {
		pkg := queue[0]
		queue = queue[1:]
		if seen[pkg] {
			continue
		}
		seen[pkg] = true
		for _, banned := range []string{"/internal/k8s/manager", "/internal/k8s/controllers", "/internal/k8s/webhooks", "/internal/controlplane", "/internal/sim/"} {
			if strings.HasPrefix(pkg+"/", module+banned) {
				t.Errorf("kvnet-node links %s", pkg)
			}
		}
		bp, err := build.ImportDir(filepath.Join(root, strings.TrimPrefix(pkg, module)), 0)
		if err != nil {
			t.Fatalf("read package %s: %v", pkg, err)
		}
		for _, imp := range bp.Imports {
			if imp == module || strings.HasPrefix(imp, module+"/") {
				queue = append(queue, imp)
			}
		}
	}
	if !seen[module+"/internal/node"] {
		t.Fatalf("walked %d packages from cmd/kvnet-node without reaching internal/node", len(seen))
	}
}
