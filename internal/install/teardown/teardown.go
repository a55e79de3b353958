// Package teardown removes kvnet from a cluster's nodes: it refuses while
// user-defined networks exist, then runs `kvnet-node --cleanup` on every
// node kvnet-node ran on. kvnet uninstall runs it before deleting kvnet's
// objects, and so does the Helm chart's pre-delete hook
// (`kvnet-controller --pre-delete`), which is why it is a package of its
// own: kvnet-controller links it without kustomize.
package teardown

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// NodeDaemonSet is the name of kvnet-node's DaemonSet, and
// NodeCleanupDaemonSet the one Uninstall runs `kvnet-node --cleanup` with
// on every node, next to it in the same namespace.
const (
	NodeDaemonSet        = "kvnet-node"
	NodeCleanupDaemonSet = "kvnet-node-cleanup"
)

// DefaultNodeCleanupTimeout is how long Uninstall waits by default for
// the node cleanup to be done on every node.
const DefaultNodeCleanupTimeout = 5 * time.Minute

// Options tune PreDelete and CleanNodes (and kvnet uninstall).
type Options struct {
	// CRDs also deletes kvnet's CRDs (kvnet uninstall --crds; unused
	// here).
	CRDs bool
	// SkipNodeCleanup leaves kvnet's state on the nodes (for nodes that
	// are gone for good).
	SkipNodeCleanup bool
	// NodeCleanupTimeout bounds the wait for the node cleanup (and, before
	// it, for kvnet-node's pods to be gone); 0 is
	// DefaultNodeCleanupTimeout.
	NodeCleanupTimeout time.Duration
	// Poll is the interval of those waits; 0 is two seconds.
	Poll time.Duration
}

// ErrNodeCleanup is returned (wrapped) by Uninstall when the node cleanup
// was not done on every node in time; nothing but kvnet-node is deleted
// then.
var ErrNodeCleanup = errors.New("kvnet's node cleanup not done")

// PreDelete does what Uninstall does before it deletes kvnet's objects,
// for an uninstall that deletes them itself (the Helm chart's pre-delete
// hook, `kvnet-controller --pre-delete`): it refuses while user-defined
// networks exist (ErrNetworksExist), then removes kvnet's state from every
// node where kvnet-node runs in namespace ns (CleanNodes), unless
// opts.SkipNodeCleanup.
func PreDelete(ctx context.Context, c client.Client, ns string, opts Options, log io.Writer) error {
	if err := NoNetworks(ctx, c); err != nil {
		return err
	}
	if opts.SkipNodeCleanup {
		fmt.Fprintln(log, "skipped the node cleanup: kvnet's links, nftables tables and files stay on the nodes")
		return nil
	}
	return CleanNodes(ctx, c, ns, opts, log)
}

// CleanNodes removes kvnet's state from every node where kvnet-node runs
// (DaemonSet NodeDaemonSet in namespace ns):
//
//  1. it reads kvnet-node's DaemonSet, for its image, service account,
//     tolerations, node selection and /run/netns and CNI bin mounts, and
//     the nodes its pods are on;
//  2. it deletes that DaemonSet and waits until its pods are gone, since
//     a running kvnet-node makes its state again;
//  3. it creates DaemonSet NodeCleanupDaemonSet from it, whose pods run
//     `kvnet-node --cleanup` as an init container (the kubelet retries it
//     until it succeeds) and then `kvnet-node --idle`, so that a pod is
//     Ready once its node is clean;
//  4. it waits until a Ready cleanup pod runs on every node kvnet-node ran
//     on and every node the cleanup DaemonSet scheduled, then deletes the
//     cleanup DaemonSet.
//
// Each wait is bounded by opts.NodeCleanupTimeout; the error names the
// nodes not done and why (ErrNodeCleanup). Run again after a failure, it
// goes on from where it stopped: without kvnet-node's DaemonSet it uses
// the cleanup DaemonSet left from the earlier run. With neither, there is
// nothing to clean.
func CleanNodes(ctx context.Context, c client.Client, ns string, opts Options, log io.Writer) error {
	timeout, poll := opts.NodeCleanupTimeout, opts.Poll
	if timeout == 0 {
		timeout = DefaultNodeCleanupTimeout
	}
	if poll == 0 {
		poll = 2 * time.Second
	}
	cleanup := &appsv1.DaemonSet{}
	var nodes []string // where kvnet-node ran
	nodeDS := &appsv1.DaemonSet{}
	switch err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: NodeDaemonSet}, nodeDS); {
	case apierrors.IsNotFound(err):
		switch err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: NodeCleanupDaemonSet}, cleanup); {
		case apierrors.IsNotFound(err):
			fmt.Fprintf(log, "no DaemonSet %s/%s: no node to clean up\n", ns, NodeDaemonSet)
			return nil
		case err != nil:
			return fmt.Errorf("read DaemonSet %s/%s: %w", ns, NodeCleanupDaemonSet, err)
		}
	case err != nil:
		return fmt.Errorf("read DaemonSet %s/%s: %w", ns, NodeDaemonSet, err)
	default:
		want, err := NodeCleanupDaemonSetFor(nodeDS)
		if err != nil {
			return err
		}
		if nodes, err = podNodes(ctx, c, nodeDS); err != nil {
			return err
		}
		if err := c.Delete(ctx, nodeDS, client.PropagationPolicy(metav1.DeletePropagationBackground)); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete DaemonSet %s/%s: %w", ns, NodeDaemonSet, err)
		}
		fmt.Fprintf(log, "deleted DaemonSet %s/%s; waiting up to %s for its pods to stop on %d node(s)\n", ns, NodeDaemonSet, timeout, len(nodes))
		var left []string
		// The reads use ctx, not the wait's: one cut short by the wait's
		// deadline would hide the last answer.
		err = wait.PollUntilContextTimeout(ctx, poll, timeout, true, func(context.Context) (bool, error) {
			now, err := podNodes(ctx, c, nodeDS)
			if err != nil {
				return false, err
			}
			left = now
			return len(left) == 0, nil
		})
		if err != nil && !wait.Interrupted(err) {
			return err
		}
		if err != nil {
			return fmt.Errorf("%w: kvnet-node still runs after %s on node(s) %s: %w", ErrNodeCleanup, timeout, strings.Join(left, ", "), err)
		}
		switch err := c.Create(ctx, want); {
		case apierrors.IsAlreadyExists(err):
			if err := c.Get(ctx, client.ObjectKeyFromObject(want), cleanup); err != nil {
				return fmt.Errorf("read DaemonSet %s/%s: %w", ns, NodeCleanupDaemonSet, err)
			}
		case err != nil:
			return fmt.Errorf("create DaemonSet %s/%s: %w", ns, NodeCleanupDaemonSet, err)
		default:
			cleanup = want
			fmt.Fprintf(log, "created DaemonSet %s/%s (image %s)\n", ns, NodeCleanupDaemonSet, want.Spec.Template.Spec.InitContainers[0].Image)
		}
	}

	fmt.Fprintf(log, "waiting up to %s for the node cleanup on every node\n", timeout)
	why := "not checked yet"
	err := wait.PollUntilContextTimeout(ctx, poll, timeout, true, func(context.Context) (bool, error) {
		now, err := cleanupNotDone(ctx, c, cleanup, nodes)
		if err != nil {
			return false, err
		}
		why = now
		return why == "", nil
	})
	if err != nil && !wait.Interrupted(err) {
		return err
	}
	if err != nil {
		return fmt.Errorf("%w after %s: %s; kvnet-node is stopped, kvnet's other objects are kept: see `kubectl -n %s logs ds/%s -c cleanup`, then run kvnet uninstall again",
			ErrNodeCleanup, timeout, why, ns, NodeCleanupDaemonSet)
	}
	fmt.Fprintf(log, "node cleanup done on every node\n")
	if err := c.Delete(ctx, cleanup, client.PropagationPolicy(metav1.DeletePropagationBackground)); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete DaemonSet %s/%s: %w", ns, NodeCleanupDaemonSet, err)
	}
	fmt.Fprintf(log, "deleted DaemonSet %s/%s\n", ns, NodeCleanupDaemonSet)
	return nil
}

// podNodes returns the sorted nodes of ds's pods.
func podNodes(ctx context.Context, c client.Client, ds *appsv1.DaemonSet) ([]string, error) {
	pods, err := ownedPods(ctx, c, ds)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, p := range pods {
		out = append(out, podNode(&p))
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

func podNode(p *corev1.Pod) string {
	if p.Spec.NodeName == "" {
		return "(unscheduled pod " + p.Name + ")"
	}
	return p.Spec.NodeName
}

// ownedPods lists the pods of ds: its selector's, controlled by it.
func ownedPods(ctx context.Context, c client.Client, ds *appsv1.DaemonSet) ([]corev1.Pod, error) {
	var pods corev1.PodList
	if err := c.List(ctx, &pods, client.InNamespace(ds.Namespace), client.MatchingLabels(ds.Spec.Selector.MatchLabels)); err != nil {
		return nil, fmt.Errorf("list pods of DaemonSet %s/%s: %w", ds.Namespace, ds.Name, err)
	}
	var out []corev1.Pod
	for _, p := range pods.Items {
		if ref := metav1.GetControllerOf(&p); ref != nil && ref.UID == ds.UID {
			out = append(out, p)
		}
	}
	return out, nil
}

// cleanupNotDone says which nodes the cleanup is not done on yet and why,
// "" once it is done everywhere: on every node of nodes, and on as many
// nodes as the DaemonSet scheduled.
func cleanupNotDone(ctx context.Context, c client.Client, ds *appsv1.DaemonSet, nodes []string) (string, error) {
	cur := &appsv1.DaemonSet{}
	if err := c.Get(ctx, client.ObjectKeyFromObject(ds), cur); err != nil {
		return "", fmt.Errorf("read DaemonSet %s/%s: %w", ds.Namespace, ds.Name, err)
	}
	pods, err := ownedPods(ctx, c, cur)
	if err != nil {
		return "", err
	}
	done := map[string]bool{}
	notDone := map[string]string{} // node -> why
	for _, p := range pods {
		if isReady(&p) && p.Spec.NodeName != "" {
			done[p.Spec.NodeName] = true
			continue
		}
		notDone[podNode(&p)] = cleanupState(&p)
	}
	for _, n := range nodes {
		if !done[n] && notDone[n] == "" {
			notDone[n] = "no cleanup pod"
		}
	}
	for n := range done {
		delete(notDone, n)
	}
	var parts []string
	for n, why := range notDone {
		parts = append(parts, n+" ("+why+")")
	}
	sort.Strings(parts)
	switch desired := int(cur.Status.DesiredNumberScheduled); {
	case cur.Status.ObservedGeneration < cur.Generation:
		parts = append(parts, "the DaemonSet controller has not scheduled the cleanup yet")
	case len(done) < desired && len(parts) == 0:
		parts = append(parts, fmt.Sprintf("done on %d of the %d nodes scheduled", len(done), desired))
	}
	if len(parts) == 0 {
		return "", nil
	}
	return "not done on node(s) " + strings.Join(parts, ", "), nil
}

func isReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// cleanupState describes the cleanup init container of pod p, for an
// error: its waiting reason and its last failure's message.
func cleanupState(p *corev1.Pod) string {
	for _, s := range p.Status.InitContainerStatuses {
		if s.Name != cleanupContainer {
			continue
		}
		var out []string
		switch {
		case s.State.Waiting != nil:
			out = append(out, "cleanup "+s.State.Waiting.Reason)
		case s.State.Running != nil:
			out = append(out, "cleanup running")
		case s.State.Terminated != nil && s.State.Terminated.ExitCode == 0:
			out = append(out, "cleaned up, pod not ready yet")
		}
		if t := s.LastTerminationState.Terminated; t != nil && t.ExitCode != 0 {
			msg := strings.TrimSpace(t.Message)
			if i := strings.LastIndexByte(msg, '\n'); i >= 0 {
				msg = msg[i+1:]
			}
			out = append(out, fmt.Sprintf("last run exited %d: %s", t.ExitCode, msg))
		}
		if len(out) > 0 {
			return strings.Join(out, "; ")
		}
	}
	if p.Status.Phase == "" || p.Status.Phase == corev1.PodPending {
		return "pod pending"
	}
	return "pod " + strings.ToLower(string(p.Status.Phase))
}

// Container names of the cleanup DaemonSet's pods.
const (
	cleanupContainer = "cleanup"
	idleContainer    = "done"
)

// Mount paths in the cleanup pod: kvnet-node's own for /run/netns and the
// CNI bin directory (from its DaemonSet), and the parents of kvnet's
// directories on the node, whose kvnet entries --cleanup removes under
// --host-root.
const (
	cleanupHostRoot = "/host"
	netnsMountPath  = "/run/netns"
)

// hostDirs are the node directories the cleanup pod mounts under
// cleanupHostRoot: the parents of /run/kvnet, /etc/cni/net.d/kvnet.d and
// /var/lib/cni/kvnet.
var hostDirs = []struct{ volume, path string }{
	{"host-run", "/run"},
	{"host-cni-conf", "/etc/cni/net.d"},
	{"host-cni-cache", "/var/lib/cni"},
}

// NodeCleanupDaemonSetFor returns the cleanup DaemonSet for kvnet-node's
// DaemonSet node: the same image (of its container "node", else its
// first), pull secrets, service account (without a token), host network,
// priority, node selection and tolerations, so that it runs where
// kvnet-node ran; and its /run/netns and CNI bin directory volumes (found
// by where the container mounts them; the bin directory by its
// --cni-bin-dir).
func NodeCleanupDaemonSetFor(node *appsv1.DaemonSet) (*appsv1.DaemonSet, error) {
	ps := node.Spec.Template.Spec
	if len(ps.Containers) == 0 {
		return nil, fmt.Errorf("DaemonSet %s/%s: no container", node.Namespace, node.Name)
	}
	ctr := ps.Containers[0]
	for _, c := range ps.Containers {
		if c.Name == "node" {
			ctr = c
		}
	}
	args := []string{"--cleanup", "--host-root=" + cleanupHostRoot}
	binDir := ""
	for _, a := range ctr.Args {
		if v, ok := strings.CutPrefix(a, "--cni-bin-dir="); ok {
			binDir = v
		}
		if strings.HasPrefix(a, "--router-netns-prefix=") {
			args = append(args, a)
		}
	}
	var mounts []corev1.VolumeMount
	var vols []corev1.Volume
	for _, path := range []string{netnsMountPath, binDir} {
		if path == "" {
			continue
		}
		i := slices.IndexFunc(ctr.VolumeMounts, func(m corev1.VolumeMount) bool { return m.MountPath == path })
		if i < 0 {
			return nil, fmt.Errorf("DaemonSet %s/%s: container %s mounts nothing at %s", node.Namespace, node.Name, ctr.Name, path)
		}
		m := ctr.VolumeMounts[i]
		j := slices.IndexFunc(ps.Volumes, func(v corev1.Volume) bool { return v.Name == m.Name })
		if j < 0 {
			return nil, fmt.Errorf("DaemonSet %s/%s: no volume %q", node.Namespace, node.Name, m.Name)
		}
		mounts, vols = append(mounts, m), append(vols, ps.Volumes[j])
	}
	if binDir != "" {
		args = append(args, "--cni-bin-dir="+binDir)
	}
	for _, d := range hostDirs {
		typ := corev1.HostPathDirectoryOrCreate
		if d.path == "/run" {
			typ = corev1.HostPathDirectory
		}
		vols = append(vols, corev1.Volume{Name: d.volume, VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: d.path, Type: &typ}}})
		mounts = append(mounts, corev1.VolumeMount{Name: d.volume, MountPath: cleanupHostRoot + d.path})
	}
	labels := map[string]string{"app.kubernetes.io/name": NodeCleanupDaemonSet}
	ds := &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: node.Namespace, Name: NodeCleanupDaemonSet, Labels: labels},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					ServiceAccountName:            ps.ServiceAccountName,
					AutomountServiceAccountToken:  ptr.To(false),
					HostNetwork:                   ps.HostNetwork,
					PriorityClassName:             ps.PriorityClassName,
					NodeSelector:                  ps.NodeSelector,
					Affinity:                      ps.Affinity,
					Tolerations:                   ps.Tolerations,
					ImagePullSecrets:              ps.ImagePullSecrets,
					TerminationGracePeriodSeconds: ptr.To[int64](5),
					InitContainers: []corev1.Container{{
						Name: cleanupContainer, Image: ctr.Image, ImagePullPolicy: ctr.ImagePullPolicy,
						Args: args, Env: nodeNameEnv, SecurityContext: ctr.SecurityContext, VolumeMounts: mounts,
						TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
					}},
					Containers: []corev1.Container{{
						Name: idleContainer, Image: ctr.Image, ImagePullPolicy: ctr.ImagePullPolicy,
						Args: []string{"--idle"},
					}},
					Volumes: vols,
				},
			},
		},
	}
	return ds, nil
}

// nodeNameEnv gives kvnet-node --cleanup its node's name, for its errors.
var nodeNameEnv = []corev1.EnvVar{{Name: "NODE_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}}}

// ErrNetworksExist is returned by NoNetworks (and so by kvnet
// uninstall and PreDelete) when it would remove kvnet-controller while user-defined networks exist: their finalizers
// need it, so they and their namespaces would stay Terminating for good.
var ErrNetworksExist = errors.New("user-defined networks exist")

// NoNetworks returns ErrNetworksExist naming the user-defined networks
// of the cluster, nil when there are none (or their CRDs are not served).
func NoNetworks(ctx context.Context, c client.Client) error {
	var names []string
	for _, kind := range []string{"UserDefinedNetworkList", "ClusterUserDefinedNetworkList"} {
		list := &unstructured.UnstructuredList{}
		list.SetAPIVersion("k8s.ovn.org/v1")
		list.SetKind(kind)
		switch err := c.List(ctx, list); {
		case meta.IsNoMatchError(err) || apierrors.IsNotFound(err):
			continue
		case err != nil:
			return fmt.Errorf("list %ss: %w", strings.TrimSuffix(kind, "List"), err)
		}
		for _, u := range list.Items {
			names = append(names, strings.TrimSuffix(kind, "List")+" "+objName(&u))
		}
	}
	if len(names) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s; delete them first (kvnet-controller removes their finalizers, so without it they and their namespaces would stay Terminating), then uninstall",
		ErrNetworksExist, strings.Join(names, ", "))
}

func objName(u *unstructured.Unstructured) string {
	if u.GetNamespace() != "" {
		return u.GetNamespace() + "/" + u.GetName()
	}
	return u.GetName()
}
