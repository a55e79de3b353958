package install_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"kvnet.io/kvnet/internal/install"
	"kvnet.io/kvnet/internal/testenv"
)

// The control plane here runs no controller manager and no kubelet: the
// tests play the DaemonSet controller, the garbage collector and the
// kubelet for the node cleanup, on made-up nodes.

const testImage = "registry.test/kvnet/kvnet-node:t2"

// nodeObjects renders config/default's kvnet-node DaemonSet, its
// ServiceAccount and its namespace, moved to namespace ns (kvnet-system
// of the other tests stays Terminating without a namespace controller).
func nodeObjects(t *testing.T, ns string) []*unstructured.Unstructured {
	t.Helper()
	objs, err := install.RenderObjects(install.Options{Registry: "registry.test/kvnet", Tag: "t2"})
	if err != nil {
		t.Fatal(err)
	}
	var out []*unstructured.Unstructured
	for _, u := range objs {
		switch {
		case u.GetKind() == "Namespace" && u.GetName() == "kvnet-system":
			u.SetName(ns)
		case u.GetKind() == "ServiceAccount" && u.GetName() == "kvnet-node", u.GetKind() == "DaemonSet" && u.GetName() == install.NodeDaemonSet:
			u.SetNamespace(ns)
		default:
			continue
		}
		out = append(out, u)
	}
	if len(out) != 3 {
		t.Fatalf("rendered %d of namespace, kvnet-node ServiceAccount and DaemonSet", len(out))
	}
	return out
}

// runs numbers the namespaces of the tests (with -count, a namespace of an
// earlier run is still Terminating).
var runs atomic.Int32

func uniqueNS(base string) string { return fmt.Sprintf("%s-%d", base, runs.Add(1)) }

// daemonPod creates a pod of DaemonSet ds on node, as the DaemonSet
// controller does; with ready, the kubelet reports it Ready.
func daemonPod(t *testing.T, ds *appsv1.DaemonSet, node string, ready bool, status func(*corev1.PodStatus)) *corev1.Pod {
	t.Helper()
	ctx := context.Background()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ds.Namespace, Name: ds.Name + "-" + node, Labels: ds.Spec.Selector.MatchLabels,
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(ds, appsv1.SchemeGroupVersion.WithKind("DaemonSet"))}},
		Spec: corev1.PodSpec{NodeName: node, ServiceAccountName: "kvnet-node", Containers: []corev1.Container{{Name: "c", Image: testImage}}},
	}
	testenv.Create(t, c, p)
	st := corev1.ConditionFalse
	if ready {
		st = corev1.ConditionTrue
	}
	p.Status.Phase = corev1.PodRunning
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: st}}
	if status != nil {
		status(&p.Status)
	}
	if err := c.Status().Update(ctx, p); err != nil {
		t.Fatal(err)
	}
	return p
}

// runUninstall starts Uninstall of objs and returns its result's channel.
func runUninstall(objs []*unstructured.Unstructured, timeout time.Duration, log *testenv.Buffer) <-chan error {
	done := make(chan error, 1)
	go func() {
		done <- install.Uninstall(context.Background(), c, objs, install.UninstallOptions{NodeCleanupTimeout: timeout, Poll: 50 * time.Millisecond}, log)
	}()
	return done
}

// stopNodePods waits for kvnet-node's DaemonSet to be deleted, checks that
// no cleanup runs while its pods do, and deletes the pods (the garbage
// collector's and the kubelet's part). It returns the cleanup DaemonSet
// once created.
func stopNodePods(t *testing.T, ns string, pods []*corev1.Pod, log *testenv.Buffer) *appsv1.DaemonSet {
	t.Helper()
	ctx := context.Background()
	testenv.Eventually(t, 30*time.Second, "kvnet-node DaemonSet deleted", func() error {
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: install.NodeDaemonSet}, &appsv1.DaemonSet{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("still there (%v)", err)
		}
		return nil
	})
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: install.NodeCleanupDaemonSet}, &appsv1.DaemonSet{}); !apierrors.IsNotFound(err) {
		t.Fatalf("cleanup DaemonSet while kvnet-node's pods run: %v, want not found\n%s", err, log.String())
	}
	for _, p := range pods {
		if err := c.Delete(ctx, p, client.GracePeriodSeconds(0)); err != nil {
			t.Fatal(err)
		}
	}
	cleanup := &appsv1.DaemonSet{}
	testenv.Eventually(t, 30*time.Second, "cleanup DaemonSet created", func() error {
		return c.Get(ctx, client.ObjectKey{Namespace: ns, Name: install.NodeCleanupDaemonSet}, cleanup)
	})
	return cleanup
}

// scheduled sets ds's status as the DaemonSet controller does once it has
// scheduled it on n nodes.
func scheduled(t *testing.T, ds *appsv1.DaemonSet, n int32) {
	t.Helper()
	ds.Status.ObservedGeneration = ds.Generation
	ds.Status.DesiredNumberScheduled = n
	ds.Status.CurrentNumberScheduled = n
	if err := c.Status().Update(context.Background(), ds); err != nil {
		t.Fatal(err)
	}
}

// installedNode applies kvnet's objects into a fresh namespace named
// after prefix and returns it, the objects and the kvnet-node DaemonSet
// as the API server stored it.
func installedNode(t *testing.T, prefix string) (string, []*unstructured.Unstructured, *appsv1.DaemonSet) {
	t.Helper()
	ctx := context.Background()
	ns := uniqueNS(prefix)
	objs := nodeObjects(t, ns)
	if err := install.Apply(ctx, c, objs, io.Discard, install.ApplyOptions{}); err != nil {
		t.Fatal(err)
	}
	node := &appsv1.DaemonSet{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: install.NodeDaemonSet}, node); err != nil {
		t.Fatal(err)
	}
	return ns, objs, node
}

// TestUninstallCleansNodes: uninstall stops kvnet-node, then runs the
// cleanup DaemonSet, made from the installed kvnet-node DaemonSet (its
// image, service account, tolerations), on its nodes; once a Ready
// cleanup pod runs on every node, it deletes the cleanup DaemonSet and
// then kvnet's objects.
func TestUninstallCleansNodes(t *testing.T) {
	ctx := context.Background()
	ns, objs, node := installedNode(t, "kvnet-uninstall-a")
	var log testenv.Buffer
	running := []*corev1.Pod{daemonPod(t, node, "node-a", true, nil), daemonPod(t, node, "node-b", true, nil)}

	done := runUninstall(objs, 30*time.Second, &log)
	cleanup := stopNodePods(t, ns, running, &log)

	ps := cleanup.Spec.Template.Spec
	if len(ps.InitContainers) != 1 || ps.InitContainers[0].Image != testImage || !slices.Contains(ps.InitContainers[0].Args, "--cleanup") {
		t.Errorf("cleanup init containers %+v, want one running %s --cleanup", ps.InitContainers, testImage)
	}
	if len(ps.Containers) != 1 || ps.Containers[0].Image != testImage {
		t.Errorf("cleanup containers %+v, want one of image %s", ps.Containers, testImage)
	}
	if np := node.Spec.Template.Spec; ps.ServiceAccountName != np.ServiceAccountName || len(ps.Tolerations) == 0 ||
		fmt.Sprint(ps.Tolerations) != fmt.Sprint(np.Tolerations) || !ps.HostNetwork {
		t.Errorf("cleanup pod: service account %q, tolerations %v, host network %v; want kvnet-node's (%q, %v, true)",
			ps.ServiceAccountName, ps.Tolerations, ps.HostNetwork, np.ServiceAccountName, np.Tolerations)
	}
	for _, m := range []string{"/run/netns", "/host/opt/cni/bin", "/host/run", "/host/etc/cni/net.d", "/host/var/lib/cni"} {
		if !slices.ContainsFunc(ps.InitContainers[0].VolumeMounts, func(v corev1.VolumeMount) bool { return v.MountPath == m }) {
			t.Errorf("cleanup container mounts %+v: nothing at %s", ps.InitContainers[0].VolumeMounts, m)
		}
	}

	// (That uninstall waits for every node is TestUninstallNodeCleanupTimeout's.)
	scheduled(t, cleanup, 2)
	daemonPod(t, cleanup, "node-a", true, nil)
	daemonPod(t, cleanup, "node-b", true, nil)
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("uninstall: %v\n%s", err, log.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("uninstall did not return\n%s", log.String())
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(cleanup), &appsv1.DaemonSet{}); !apierrors.IsNotFound(err) {
		t.Errorf("cleanup DaemonSet after uninstall: %v, want not found\n%s", err, log.String())
	}
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "kvnet-node"}, &corev1.ServiceAccount{}); !apierrors.IsNotFound(err) {
		t.Errorf("kvnet-node ServiceAccount after uninstall: %v, want not found", err)
	}
	if !strings.Contains(log.String(), "created DaemonSet "+ns+"/"+install.NodeCleanupDaemonSet+" (image "+testImage+")") {
		t.Errorf("uninstall log does not name the cleanup image:\n%s", log.String())
	}
}

// TestUninstallNodeCleanupTimeout: a node whose cleanup fails and a node
// where no cleanup pod runs keep uninstall from going on; after the
// timeout it fails naming both, and kvnet's other objects stay.
func TestUninstallNodeCleanupTimeout(t *testing.T) {
	ctx := context.Background()
	ns, objs, node := installedNode(t, "kvnet-uninstall-b")
	var log testenv.Buffer
	running := []*corev1.Pod{daemonPod(t, node, "node-a", true, nil), daemonPod(t, node, "node-b", true, nil), daemonPod(t, node, "node-c", true, nil)}

	done := runUninstall(objs, 10*time.Second, &log)
	cleanup := stopNodePods(t, ns, running, &log)
	scheduled(t, cleanup, 3)
	daemonPod(t, cleanup, "node-a", true, nil)
	daemonPod(t, cleanup, "node-b", false, func(s *corev1.PodStatus) {
		s.Phase = corev1.PodPending
		s.InitContainerStatuses = []corev1.ContainerStatus{{Name: "cleanup", Image: testImage,
			State:                corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}},
			LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1, Message: "clean up node \"node-b\": delete link \"kvbr7\": busy"}}}}
	})
	var err error
	select {
	case err = <-done:
	case <-time.After(30 * time.Second):
		t.Fatalf("uninstall did not return\n%s", log.String())
	}
	want := []string{`node-b (cleanup CrashLoopBackOff; last run exited 1: clean up node "node-b": delete link "kvbr7": busy)`, "node-c (no cleanup pod)"}
	if !errors.Is(err, install.ErrNodeCleanup) || !strings.Contains(err.Error(), want[0]) || !strings.Contains(err.Error(), want[1]) || strings.Contains(err.Error(), "node-a") {
		t.Fatalf("uninstall with the cleanup failing: %v\nwant ErrNodeCleanup naming %q", err, want)
	}
	t.Logf("uninstall: %v", err)
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "kvnet-node"}, &corev1.ServiceAccount{}); err != nil {
		t.Errorf("kvnet-node ServiceAccount after a failed node cleanup: %v, want kept", err)
	}

	// Run again, it goes on with the cleanup DaemonSet left.
	done = runUninstall(objs, 30*time.Second, &log)
	daemonPod(t, cleanup, "node-c", true, nil)
	p := &corev1.Pod{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: cleanup.Name + "-node-b"}, p); err != nil {
		t.Fatal(err)
	}
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	if err := c.Status().Update(ctx, p); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("second uninstall: %v\n%s", err, log.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("second uninstall did not return\n%s", log.String())
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(cleanup), &appsv1.DaemonSet{}); !apierrors.IsNotFound(err) {
		t.Errorf("cleanup DaemonSet after uninstall: %v, want not found", err)
	}
}
