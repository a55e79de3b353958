package cluster

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"kvnet.io/kvnet/internal/lab/controlplane"
	"kvnet.io/kvnet/internal/lab/kvimages"
	"kvnet.io/kvnet/internal/manifests"
)

// KubeVirt as a user installs it (docs/kubevirt.md): the images the
// repository builds from KubeVirt's Go module and Debian packages
// (internal/lab/kvimages), pushed to the cluster's registry; virt-operator
// from KubeVirt's release manifest, rendered by KubeVirt's own
// manifest-templator with the registry's images
// (hack/render-kubevirt-manifests.sh); and a KubeVirt CR, which
// virt-operator turns into virt-api, virt-controller and virt-handler.

// KubeVirtNamespace is where KubeVirt runs.
const KubeVirtNamespace = "kubevirt"

var kubeVirtGVR = schema.GroupVersionResource{Group: "kubevirt.io", Version: "v1", Resource: "kubevirts"}

// kubeVirtCR is the cluster's KubeVirt CR: QEMU under TCG (these machines
// have no usable KVM), evictionStrategy LiveMigrate, and the l2bridge binding that VMs on a primary
// user-defined network use (as kvnet check asks for it).
//
// Its customizeComponents shorten the readiness probes of virt-api,
// virt-controller and virt-handler (KubeVirt's: first after 15 s, then
// every 10 s, every 20 s for virt-handler) to a first probe after 2 s
// and one every 3 s, as an admin may patch them: a component is Ready
// within seconds of serving, not up to 35 s later. What they probe is
// unchanged. virt-operator rolls virt-handler out one node at a time
// (when the VM scenarios give it the migration network), so these
// seconds count three times there.
func kubeVirtCR() *unstructured.Unstructured {
	probe := func(container string) string {
		return fmt.Sprintf(`{"spec":{"template":{"spec":{"containers":[{"name":%q,"readinessProbe":{"initialDelaySeconds":2,"periodSeconds":3}}]}}}}`, container)
	}
	var patches []any
	for _, c := range []struct{ kind, name string }{
		{"Deployment", "virt-api"}, {"Deployment", "virt-controller"}, {"DaemonSet", "virt-handler"},
	} {
		patches = append(patches, map[string]any{
			"resourceType": c.kind, "resourceName": c.name, "type": "strategic", "patch": probe(c.name),
		})
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "kubevirt.io/v1", "kind": "KubeVirt",
		"metadata": map[string]any{"name": "kubevirt", "namespace": KubeVirtNamespace},
		"spec": map[string]any{
			"imagePullPolicy":     "IfNotPresent",
			"customizeComponents": map[string]any{"patches": patches},
			"configuration": map[string]any{
				"developerConfiguration": map[string]any{"useEmulation": true},
				// A drained node's VMs live-migrate away, as OpenShift
				// Virtualization configures it.
				"evictionStrategy": "LiveMigrate",
				"network": map[string]any{"binding": map[string]any{
					"l2bridge": map[string]any{"domainAttachmentType": "managedTap", "migration": map[string]any{}},
				}},
			},
		},
	}}
}

// installKubeVirt builds (cached) and pushes KubeVirt's images and the
// guest's containerDisk, installs virt-operator and the KubeVirt CR, and
// waits until the CR says Deployed.
func (c *Cluster) installKubeVirt(ctx context.Context, root string, log io.Writer) error {
	in, err := kvimages.Build(ctx, root, log)
	if err != nil {
		return fmt.Errorf("kubevirt images: %w", err)
	}
	refs, err := kvimages.Push(ctx, c.Registry, in)
	if err != nil {
		return fmt.Errorf("kubevirt images: %w", err)
	}
	for k, v := range refs {
		c.Images[k] = v
	}
	// virt-operator's Deployment requires a control-plane node, as kind
	// and kubeadm label theirs.
	patch := `{"metadata":{"labels":{"node-role.kubernetes.io/control-plane":""}}}`
	if _, err := c.Client.CoreV1().Nodes().Patch(ctx, NodeName(1), types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("label %s control-plane: %w", NodeName(1), err)
	}
	out := filepath.Join(c.Dir, "work", "kubevirt")
	cmd := exec.CommandContext(ctx, filepath.Join(root, "hack", "render-kubevirt-manifests.sh"), c.Registry, out)
	cmd.Stderr = log
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("render KubeVirt's manifests: %w", err)
	}
	b, err := os.ReadFile(filepath.Join(out, "kubevirt-operator.yaml"))
	if err != nil {
		return err
	}
	objs, err := manifests.Decode(b)
	if err != nil {
		return fmt.Errorf("kubevirt-operator.yaml: %w", err)
	}
	cl, err := client.New(c.CP.Config, client.Options{})
	if err != nil {
		return err
	}
	for _, o := range objs {
		if err := controlplane.Apply(ctx, cl, o); err != nil {
			return fmt.Errorf("kubevirt-operator.yaml: apply %s %s: %w", o.GetKind(), o.GetName(), err)
		}
	}
	dyn, err := dynamic.NewForConfig(c.CP.Config)
	if err != nil {
		return err
	}
	// The CRD was applied a moment ago: its kind is served once it is
	// established.
	if err := c.waitFor(ctx, time.Minute, "KubeVirt CR created", func() (bool, error) {
		_, err := dyn.Resource(kubeVirtGVR).Namespace(KubeVirtNamespace).Apply(ctx, "kubevirt", kubeVirtCR(), metav1.ApplyOptions{FieldManager: controlplane.FieldOwner, Force: true})
		return err == nil, err
	}); err != nil {
		return err
	}
	err = c.waitFor(ctx, 20*time.Minute, "KubeVirt CR Deployed", func() (bool, error) {
		kv, err := dyn.Resource(kubeVirtGVR).Namespace(KubeVirtNamespace).Get(ctx, "kubevirt", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		phase, _, _ := unstructured.NestedString(kv.Object, "status", "phase")
		if phase == "Deployed" {
			return true, nil
		}
		conds, _, _ := unstructured.NestedSlice(kv.Object, "status", "conditions")
		return false, fmt.Errorf("phase %q, conditions %v", phase, conds)
	})
	if err != nil {
		c.describePods(ctx, KubeVirtNamespace, log)
	}
	return err
}

// describePods writes what a user would look at first when KubeVirt does
// not come up: each pod of namespace ns with its node, phase and
// containers' states, the tail of the log of every container not ready,
// and the namespace's warning events.
func (c *Cluster) describePods(ctx context.Context, ns string, w io.Writer) {
	pods, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		fmt.Fprintf(w, "describe %s: %v\n", ns, err)
		return
	}
	for _, p := range pods.Items {
		fmt.Fprintf(w, "pod %s/%s on %s: %s\n", ns, p.Name, p.Spec.NodeName, p.Status.Phase)
		statuses := append(append([]corev1.ContainerStatus(nil), p.Status.InitContainerStatuses...), p.Status.ContainerStatuses...)
		for _, cs := range statuses {
			fmt.Fprintf(w, "  container %s ready=%v restarts=%d state=%+v last=%+v\n", cs.Name, cs.Ready, cs.RestartCount, cs.State, cs.LastTerminationState)
			if cs.Ready {
				continue
			}
			tail := int64(25)
			b, err := c.Client.CoreV1().Pods(ns).GetLogs(p.Name, &corev1.PodLogOptions{Container: cs.Name, TailLines: &tail}).DoRaw(ctx)
			if err != nil {
				b, _ = c.Client.CoreV1().Pods(ns).GetLogs(p.Name, &corev1.PodLogOptions{Container: cs.Name, TailLines: &tail, Previous: true}).DoRaw(ctx)
			}
			fmt.Fprintf(w, "  log of %s:\n%s\n", cs.Name, b)
		}
	}
	events, err := c.Client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "type=Warning"})
	if err == nil {
		for _, e := range events.Items {
			fmt.Fprintf(w, "event %s %s: %s: %s\n", e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Reason, e.Message)
		}
	}
}
