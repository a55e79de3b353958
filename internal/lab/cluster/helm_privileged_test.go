//go:build cluster

package cluster

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"kvnet.io/kvnet/internal/install"
	"kvnet.io/kvnet/internal/lab/controlplane"
	"kvnet.io/kvnet/internal/repo"
	"kvnet.io/kvnet/internal/testenv"
)

// helmRelease and helmNamespace name the release testHelm installs; the
// release lives outside kvnet-system, which the chart creates.
const (
	helmRelease   = "kvnet"
	helmNamespace = "kube-system"
)

// testHelm proves the Helm chart on the real cluster against kvnet
// install, which installed kvnet before it:
//
//  1. kvnet uninstall, and what it leaves (kvnetLeftovers: kvnet's
//     objects, ClusterRoles and bindings named kvnet, kvnet's state on
//     every node);
//  2. helm install --wait of deploy/helm/kvnet with the registry's images:
//     kvnet-controller and kvnet-node ready, kvnet check without a
//     missing line, as after kvnet install;
//  3. an edit of the create-only ConfigMap kvnet-node-config, then helm
//     upgrade --wait to a new tag (the same images pushed again with
//     another digest): every kvnet pod replaced by one running the new
//     tag, the edit kept, kvnet check as before;
//  4. helm uninstall --wait (its pre-delete hook cleans the nodes): it
//     leaves exactly what kvnet uninstall left.
//
// kvnet is not installed after it; its CRDs are, as after kvnet
// uninstall without --crds.
func testHelm(ctx context.Context, t *testing.T, c *Cluster, kvnet func(args ...string) (string, error)) {
	helm := helmCLI(t, c)
	chart := filepath.Join(repoRootT(t), install.ChartDir)
	cl, err := client.New(c.CP.Config, client.Options{})
	if err != nil {
		t.Fatal(err)
	}

	// The scenarios before delete their networks; their finalizers may
	// still be running.
	testenv.Eventually(t, 2*time.Minute, "no user-defined network left by the scenarios", func() error {
		out, err := kvnet("uninstall")
		if err != nil {
			return fmt.Errorf("kvnet uninstall: %v\n%s", err, out)
		}
		t.Logf("kvnet uninstall:\n%s", out)
		return nil
	})
	want := kvnetLeftovers(ctx, t, c, cl)
	t.Logf("kvnet uninstall leaves: %s", strings.Join(want, ", "))

	registry := c.Registry + "/kvnet"
	out, err := helm("install", helmRelease, chart, "--namespace", helmNamespace,
		"--set", "image.registry="+registry, "--set", "image.tag="+KvnetTag, "--wait", "--timeout", "5m")
	t.Logf("helm install:\n%s", out)
	if err != nil {
		t.Fatalf("helm install: %v", err)
	}
	waitKvnetReady(ctx, t, c)
	checkKvnet(t, kvnet)

	// A setting the admin changed stays through an upgrade, as with
	// kvnet install.
	cm, err := c.Client.CoreV1().ConfigMaps("kvnet-system").Get(ctx, "kvnet-node-config", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cm.Data["cluster-domain"] = "cluster.local"
	if _, err := c.Client.CoreV1().ConfigMaps("kvnet-system").Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	newTag := KvnetTag + "-helm"
	for _, im := range install.Images {
		if _, err := pushRolled(ctx, registry+"/"+im+":"+KvnetTag, registry+"/"+im+":"+newTag); err != nil {
			t.Fatalf("push %s:%s: %v", im, newTag, err)
		}
	}
	start := time.Now()
	out, err = helm("upgrade", helmRelease, chart, "--namespace", helmNamespace, "--reuse-values",
		"--set", "image.tag="+newTag, "--wait", "--timeout", "5m")
	t.Logf("helm upgrade:\n%s", out)
	if err != nil {
		t.Fatalf("helm upgrade: %v", err)
	}
	testenv.Eventually(t, 3*time.Minute, "every kvnet pod replaced by one running tag "+newTag, func() error {
		return kvnetRolledTo(ctx, c, newTag)
	})
	t.Logf("helm upgrade to %s: every kvnet pod replaced and ready %s after it started", newTag, time.Since(start).Round(time.Second))
	cm, err = c.Client.CoreV1().ConfigMaps("kvnet-system").Get(ctx, "kvnet-node-config", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := cm.Data["cluster-domain"]; got != "cluster.local" {
		t.Errorf("helm upgrade changed kvnet-node-config cluster-domain to %q: the create-only ConfigMap must keep the admin's value", got)
	}
	checkKvnet(t, kvnet)

	out, err = helm("uninstall", helmRelease, "--namespace", helmNamespace, "--wait", "--timeout", "5m")
	t.Logf("helm uninstall:\n%s", out)
	if err != nil {
		t.Fatalf("helm uninstall: %v", err)
	}
	if got := kvnetLeftovers(ctx, t, c, cl); !slices.Equal(got, want) {
		t.Errorf("helm uninstall leaves %s\nkvnet uninstall left %s", strings.Join(got, ", "), strings.Join(want, ", "))
	}
}

// kvnetLeftovers waits until namespace kvnet-system is gone, then lists
// what of kvnet is left in the cluster: the objects of config/default
// that exist, every ClusterRole and ClusterRoleBinding whose name has
// "kvnet" (the lab's own aside), and kvnet's state on each node; sorted.
func kvnetLeftovers(ctx context.Context, t *testing.T, c *Cluster, cl client.Client) []string {
	t.Helper()
	testenv.Eventually(t, 3*time.Minute, "namespace kvnet-system gone", func() error {
		_, err := c.Client.CoreV1().Namespaces().Get(ctx, "kvnet-system", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("namespace kvnet-system: %v", err)
	})
	objs, err := install.RenderObjects(install.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, u := range objs {
		cur := &unstructured.Unstructured{}
		cur.SetGroupVersionKind(u.GroupVersionKind())
		switch err := cl.Get(ctx, client.ObjectKeyFromObject(u), cur); {
		case err == nil:
			left = append(left, u.GetKind()+" "+client.ObjectKeyFromObject(u).String())
		case !apierrors.IsNotFound(err):
			t.Fatalf("read %s %s: %v", u.GetKind(), u.GetName(), err)
		}
	}
	crs, err := c.Client.RbacV1().ClusterRoles().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range crs.Items {
		if strings.Contains(r.Name, "kvnet") && !strings.HasPrefix(r.Name, "kvnet-lab:") {
			left = append(left, "ClusterRole "+r.Name)
		}
	}
	crbs, err := c.Client.RbacV1().ClusterRoleBindings().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range crbs.Items {
		if strings.Contains(r.Name, "kvnet") && !strings.HasPrefix(r.Name, "kvnet-lab:") {
			left = append(left, "ClusterRoleBinding "+r.Name)
		}
	}
	for i := range c.Nodes {
		state, err := c.kvnetNodeState(i + 1)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range state {
			left = append(left, c.Nodes[i]+": "+s)
		}
	}
	slices.Sort(left)
	return slices.Compact(left)
}

// kvnetRolledTo says what is not yet rolled to tag: kvnet-controller's
// Deployment and kvnet-node's DaemonSet done with their rollouts, and
// every one of their pods running an image of that tag, Ready.
func kvnetRolledTo(ctx context.Context, c *Cluster, tag string) error {
	d, err := c.Client.AppsV1().Deployments("kvnet-system").Get(ctx, "kvnet-controller", metav1.GetOptions{})
	if err != nil {
		return err
	}
	if !deploymentAvailable(d) || d.Status.Replicas != *d.Spec.Replicas {
		return fmt.Errorf("kvnet-controller rolling: %+v", d.Status)
	}
	ds, err := c.Client.AppsV1().DaemonSets("kvnet-system").Get(ctx, "kvnet-node", metav1.GetOptions{})
	if err != nil {
		return err
	}
	if !daemonSetRolled(ds) {
		return fmt.Errorf("kvnet-node rolling: %+v", ds.Status)
	}
	pods, err := c.Client.CoreV1().Pods("kvnet-system").List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	n := 0
	for _, p := range pods.Items {
		name := p.Labels["app.kubernetes.io/name"]
		if name != "kvnet-controller" && name != "kvnet-node" {
			continue
		}
		n++
		for _, ct := range p.Spec.Containers {
			if !strings.HasSuffix(ct.Image, ":"+tag) {
				return fmt.Errorf("pod %s runs %s", p.Name, ct.Image)
			}
		}
		if !PodReady(&p) {
			return fmt.Errorf("pod %s not ready", p.Name)
		}
	}
	if want := int(*d.Spec.Replicas) + len(c.Nodes); n != want {
		return fmt.Errorf("%d kvnet pods, want %d", n, want)
	}
	return nil
}

// daemonSetRolled reports whether ds's rolling update is done: every
// scheduled pod updated, ready and available.
func daemonSetRolled(ds *appsv1.DaemonSet) bool {
	s := ds.Status
	return s.ObservedGeneration >= ds.Generation && s.UpdatedNumberScheduled == s.DesiredNumberScheduled &&
		s.NumberReady == s.DesiredNumberScheduled && s.NumberAvailable == s.DesiredNumberScheduled && s.DesiredNumberScheduled > 0
}

// helmCLI returns a function running hack/build-tools.sh's helm
// ($KVNET_BIN_DIR, else .cache/bin) against the cluster, with its own
// cache and configuration directories.
func helmCLI(t *testing.T, c *Cluster) func(args ...string) (string, error) {
	t.Helper()
	bin, err := controlplane.Tool("helm")
	if err != nil {
		t.Fatal(err)
	}
	home := t.TempDir()
	return func(args ...string) (string, error) {
		cmd := exec.Command(bin, append(args, "--kubeconfig", c.Kubeconfig)...)
		cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+home+"/cache", "HELM_CONFIG_HOME="+home+"/config", "HELM_DATA_HOME="+home+"/data")
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		return out.String(), err
	}
}

func repoRootT(t *testing.T) string {
	t.Helper()
	root, err := repo.Root()
	if err != nil {
		t.Fatal(err)
	}
	return root
}
