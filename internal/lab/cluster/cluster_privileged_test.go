//go:build cluster

// The real-cluster test builds kubelet, kube-scheduler, kube-proxy and the
// registry on its first run (minutes on 2 cores; cached after, see
// hack/build-cluster-tools.sh), so it is not part of make test yet: it
// carries the build tag "cluster" and runs with make cluster-test.

package cluster

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/remotecommand"

	"kvnet.io/kvnet/internal/repo"
	"kvnet.io/kvnet/internal/testenv"
)

// buildTools runs hack/build-cluster-tools.sh and returns the directory it
// prints.
func buildTools(t *testing.T) string {
	t.Helper()
	root, err := repo.Root()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(root, "hack", "build-cluster-tools.sh"))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("hack/build-cluster-tools.sh: %v\n%s", err, stderr.String())
	}
	return strings.TrimSpace(stdout.String())
}

// errorLines returns the last n lines of a klog or logrus log that report
// errors.
func errorLines(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "E") || strings.Contains(l, "level=error") {
			out = append(out, l)
		}
	}
	if len(out) > n {
		out = out[len(out)-n:]
	}
	return strings.Join(out, "\n")
}

type testLog struct{ t *testing.T }

func (l testLog) Write(p []byte) (int, error) {
	l.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// TestClusterPodsReachEachOther brings a 3-node cluster up and, through
// the Kubernetes API only, checks the nodes (Ready, containerd), runs a
// busybox pod from the cluster's registry on each of two nodes with an
// HTTP readiness probe, and execs into one to fetch the other's page by
// pod IP.
func TestClusterPodsReachEachOther(t *testing.T) {
	testenv.NeedsRoot(t)
	binDir := buildTools(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	c, err := Up(ctx, Config{Dir: t.TempDir(), BinDir: binDir, Nodes: 3, Log: testLog{t}})
	if err != nil {
		t.Fatalf("up: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			// The node logs go with Down: show their errors first.
			for _, n := range c.Nodes[:2] {
				for _, f := range []string{"kubelet.log", "containerd.log"} {
					t.Logf("%s %s (errors, last 20):\n%s", n, f, errorLines(filepath.Join(c.Dir, "nodes", n, "logs", f), 20))
				}
			}
		}
		if err := c.Down(); err != nil {
			t.Errorf("down: %v", err)
		}
	})
	cs := c.Client

	// kubectl get nodes: three, Ready, on containerd.
	nodes, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(nodes.Items) != 3 {
		t.Fatalf("nodes: got %d, want 3", len(nodes.Items))
	}
	for _, n := range nodes.Items {
		if !NodeReady(&n) {
			t.Errorf("node %s not Ready: %+v", n.Name, n.Status.Conditions)
		}
		if rv := n.Status.NodeInfo.ContainerRuntimeVersion; !strings.HasPrefix(rv, "containerd://") {
			t.Errorf("node %s: containerRuntimeVersion %q, want containerd://…", n.Name, rv)
		}
		t.Logf("node %s: %s, kubelet %s, podCIDR %s", n.Name, n.Status.NodeInfo.ContainerRuntimeVersion, n.Status.NodeInfo.KubeletVersion, n.Spec.PodCIDR)
	}

	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "cluster-e2e"}}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := func(name, node string) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns.Name},
			Spec: corev1.PodSpec{
				NodeSelector: map[string]string{corev1.LabelHostname: node},
				Containers: []corev1.Container{{
					Name:  "web",
					Image: c.Images["busybox"],
					Command: []string{"sh", "-c",
						"mkdir -p /tmp/www && echo hello from " + name + " > /tmp/www/index.html && exec httpd -f -p 8080 -h /tmp/www"},
					ReadinessProbe: &corev1.Probe{
						ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/", Port: intstr.FromInt32(8080)}},
						PeriodSeconds: 1,
					},
				}},
			},
		}
	}
	for _, p := range []*corev1.Pod{pod("web-1", NodeName(1)), pod("web-2", NodeName(2))} {
		if _, err := cs.CoreV1().Pods(ns.Name).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	ready := map[string]*corev1.Pod{}
	for _, name := range []string{"web-1", "web-2"} {
		testenv.Eventually(t, 3*time.Minute, "pod "+name+" Ready", func() error {
			p, err := cs.CoreV1().Pods(ns.Name).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			for _, cond := range p.Status.Conditions {
				if cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue {
					ready[name] = p
					return nil
				}
			}
			return fmt.Errorf("phase %s, conditions %+v, containers %+v", p.Status.Phase, p.Status.Conditions, p.Status.ContainerStatuses)
		})
	}
	for name, p := range ready {
		// Pulled from the cluster's registry, not imported behind the
		// kubelet's back: the image ID is the registry's digest.
		if id := p.Status.ContainerStatuses[0].ImageID; !strings.HasPrefix(id, c.Registry+"/kvnet-lab/busybox@sha256:") {
			t.Errorf("pod %s: image ID %q, want one pulled from %s", name, id, c.Registry)
		}
	}
	if a, b := ready["web-1"].Spec.NodeName, ready["web-2"].Spec.NodeName; a == b {
		t.Fatalf("both pods on node %s", a)
	}

	// kubectl exec web-1 -- httpget http://<web-2's IP>:8080/
	url := fmt.Sprintf("http://%s:8080/", ready["web-2"].Status.PodIP)
	req := cs.CoreV1().RESTClient().Post().Resource("pods").Namespace(ns.Name).Name("web-1").SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{Container: "web", Command: []string{"httpget", url}, Stdout: true, Stderr: true}, scheme.ParameterCodec)
	exec, err := remotecommand.NewSPDYExecutor(c.CP.Config, "POST", req.URL())
	if err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	if err := exec.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: &stdout, Stderr: &stderr}); err != nil {
		t.Fatalf("exec web-1 -- httpget %s: %v (stderr %q)", url, err, stderr.String())
	}
	if got, want := strings.TrimSpace(stdout.String()), "hello from web-2"; got != want {
		t.Errorf("web-1 fetching %s: got %q, want %q", url, got, want)
	}
}
