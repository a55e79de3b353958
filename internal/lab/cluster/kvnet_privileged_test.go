//go:build cluster

package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"kvnet.io/kvnet/internal/lab/controlplane"
	"kvnet.io/kvnet/internal/manifests"
	"kvnet.io/kvnet/internal/repo"
	"kvnet.io/kvnet/internal/testenv"
)

// kvnetCLI builds cmd/kvnet and returns a function running it against the
// cluster, as a user runs it.
func kvnetCLI(t *testing.T, c *Cluster) func(args ...string) (string, error) {
	t.Helper()
	root, err := repo.Root()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "kvnet")
	build := exec.Command("go", "build", "-o", bin, "./cmd/kvnet")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/kvnet: %v\n%s", err, out)
	}
	return func(args ...string) (string, error) {
		cmd := exec.Command(bin, append(args, "--kubeconfig", c.Kubeconfig)...)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		return out.String(), err
	}
}

// testKvnet installs kvnet from the registry's images with kvnet install,
// as a user does, checks it with kvnet check, runs pods of a primary
// Layer2 UDN on two nodes through real Multus and kvnet-cni, and
// uninstalls it again.
func testKvnet(ctx context.Context, t *testing.T, c *Cluster) {
	kvnet := kvnetCLI(t, c)
	// No KubeVirt on this cluster yet: kvnet-controller serves pods
	// without it.
	out, err := kvnet("install", "--registry", c.Registry+"/kvnet", "--tag", KvnetTag)
	t.Logf("kvnet install:\n%s", out)
	if err != nil {
		t.Fatalf("kvnet install: %v", err)
	}
	testenv.Eventually(t, 3*time.Minute, "kvnet-controller available and kvnet-node ready on every node", func() error {
		d, err := c.Client.AppsV1().Deployments("kvnet-system").Get(ctx, "kvnet-controller", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if !deploymentAvailable(d) {
			return fmt.Errorf("kvnet-controller: %+v", d.Status)
		}
		ds, err := c.Client.AppsV1().DaemonSets("kvnet-system").Get(ctx, "kvnet-node", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if n := int32(len(c.Nodes)); ds.Status.NumberReady != n {
			return fmt.Errorf("kvnet-node: %d of %d ready", ds.Status.NumberReady, n)
		}
		return nil
	})
	out, err = kvnet("check")
	t.Logf("kvnet check:\n%s", out)
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "missing") {
			t.Errorf("kvnet check: %s", l)
		}
	}
	if err != nil {
		t.Errorf("kvnet check: %v", err)
	}

	t.Run("PrimaryUDN", func(t *testing.T) { testPrimaryUDN(ctx, t, c) })

	// The Multus test's NAD goes first: uninstall keeps the NAD CRD
	// Multus installed, and kvnet's NADs must be gone with the UDNs.
	dyn, err := dynamic.NewForConfig(c.CP.Config)
	if err != nil {
		t.Fatal(err)
	}
	if err := dyn.Resource(nadGVR).Namespace("cluster-e2e").Delete(ctx, "extra", metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}

	out, err = kvnet("uninstall", "--crds")
	t.Logf("kvnet uninstall --crds:\n%s", out)
	if err != nil {
		t.Fatalf("kvnet uninstall: %v", err)
	}
	testKvnetGone(ctx, t, c)
}

var (
	udnGVR = schema.GroupVersionResource{Group: "k8s.ovn.org", Version: "v1", Resource: "userdefinednetworks"}
	nadGVR = schema.GroupVersionResource{Group: "k8s.cni.cncf.io", Version: "v1", Resource: "network-attachment-definitions"}
)

// testPrimaryUDN: pods of a namespace with a primary Layer2 UDN, on two
// nodes, get ovn-udn1 (the webhook names it, Multus calls kvnet-cni) and
// reach each other at their ovn-udn1 addresses.
func testPrimaryUDN(ctx context.Context, t *testing.T, c *Cluster) {
	const ns = "udn-e2e"
	nsObj := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{"k8s.ovn.org/primary-user-defined-network": ""}}}
	if _, err := c.Client.CoreV1().Namespaces().Create(ctx, nsObj, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(c.CP.Config)
	if err != nil {
		t.Fatal(err)
	}
	udn := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "k8s.ovn.org/v1", "kind": "UserDefinedNetwork",
		"metadata": map[string]any{"name": "l2", "namespace": ns},
		"spec": map[string]any{"topology": "Layer2", "layer2": map[string]any{
			"role": "Primary", "subnets": []any{"10.100.0.0/24"},
		}},
	}}
	if _, err := dyn.Resource(udnGVR).Namespace(ns).Create(ctx, udn, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, time.Minute, "NAD of UDN "+ns+"/l2 and ServiceAccount default", func() error {
		if _, err := c.Client.CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{}); err != nil {
			return err
		}
		_, err := dyn.Resource(nadGVR).Namespace(ns).Get(ctx, "l2", metav1.GetOptions{})
		return err
	})
	for i, name := range []string{"udn-1", "udn-2"} {
		p := webPod(ns, name, NodeName(i+1), c.Images["busybox"])
		testenv.Eventually(t, time.Minute, "create pod "+ns+"/"+name, func() error {
			_, err := c.Client.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				return nil
			}
			return err
		})
	}
	addr := map[string]netip.Addr{}
	podIP := map[string]string{}
	for _, name := range []string{"udn-1", "udn-2"} {
		p := waitPodReady(ctx, t, c, ns, name)
		podIP[name] = p.Status.PodIP
		t.Logf("pod %s: networks %s; default-network %s; network-status %s", name, p.Annotations["k8s.v1.cni.cncf.io/networks"],
			p.Annotations["v1.multus-cni.io/default-network"], p.Annotations["k8s.v1.cni.cncf.io/network-status"])
		checkPrimaryDefault(t, p)
		var statuses []networkStatus
		if err := json.Unmarshal([]byte(p.Annotations["k8s.v1.cni.cncf.io/network-status"]), &statuses); err != nil {
			t.Fatalf("pod %s: network-status: %v", name, err)
		}
		for _, s := range statuses {
			if s.Interface == "ovn-udn1" && len(s.IPs) > 0 {
				addr[name], _ = netip.ParseAddr(s.IPs[0])
			}
		}
		if !addr[name].IsValid() || !netip.MustParsePrefix("10.100.0.0/24").Contains(addr[name]) {
			t.Fatalf("pod %s: no ovn-udn1 address in 10.100.0.0/24 in network-status %+v", name, statuses)
		}
		got := execIn(ctx, t, c, ns, name, "ip", "-4", "addr", "show", "dev", "ovn-udn1")
		if !strings.Contains(got, "inet "+addr[name].String()+"/") {
			t.Errorf("pod %s: ovn-udn1 lacks %s:\n%s", name, addr[name], got)
		}
	}
	url := fmt.Sprintf("http://%s:8080/", addr["udn-2"])
	testenv.Eventually(t, time.Minute, "udn-1 fetches "+url+" (udn-2's ovn-udn1)", func() error {
		out, errOut, err := execOut(ctx, c, ns, "udn-1", "httpget", url)
		if err != nil {
			return fmt.Errorf("%v: %s", err, errOut)
		}
		if strings.TrimSpace(out) != "hello from udn-2" {
			return fmt.Errorf("got %q", out)
		}
		return nil
	})
	if err := c.Client.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 2*time.Minute, "namespace "+ns+" gone", func() error {
		_, err := c.Client.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("still there (%v)", err)
	})
	for i, name := range []string{"udn-1", "udn-2"} {
		checkLeaseReleased(t, c, i+1, podIP[name])
	}
}

// testKvnetGone checks that kvnet uninstall --crds left no kvnet object:
// its namespace, webhook configurations, cluster roles, CRDs (but the
// NAD CRD, which Multus installed) and NADs; and nothing of kvnet on any
// node (kvnetNodeState).
func testKvnetGone(ctx context.Context, t *testing.T, c *Cluster) {
	testenv.Eventually(t, 2*time.Minute, "kvnet's objects gone", func() error {
		var left []string
		if _, err := c.Client.CoreV1().Namespaces().Get(ctx, "kvnet-system", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			left = append(left, fmt.Sprintf("namespace kvnet-system (%v)", err))
		}
		whs, err := c.Client.AdmissionregistrationV1().MutatingWebhookConfigurations().List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		for _, w := range whs.Items {
			if strings.Contains(w.Name, "kvnet") {
				left = append(left, "MutatingWebhookConfiguration "+w.Name)
			}
		}
		vwhs, err := c.Client.AdmissionregistrationV1().ValidatingWebhookConfigurations().List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		for _, w := range vwhs.Items {
			if strings.Contains(w.Name, "kvnet") {
				left = append(left, "ValidatingWebhookConfiguration "+w.Name)
			}
		}
		crs, err := c.Client.RbacV1().ClusterRoles().List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		for _, r := range crs.Items {
			if strings.Contains(r.Name, "kvnet") {
				left = append(left, "ClusterRole "+r.Name)
			}
		}
		crbs, err := c.Client.RbacV1().ClusterRoleBindings().List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		for _, r := range crbs.Items {
			if strings.Contains(r.Name, "kvnet") && !strings.HasPrefix(r.Name, "kvnet-lab:") {
				left = append(left, "ClusterRoleBinding "+r.Name)
			}
		}
		dyn, err := dynamic.NewForConfig(c.CP.Config)
		if err != nil {
			return err
		}
		nads, err := dyn.Resource(nadGVR).List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		for _, n := range nads.Items {
			left = append(left, "NAD "+n.GetNamespace()+"/"+n.GetName())
		}
		if _, err := dyn.Resource(udnGVR).List(ctx, metav1.ListOptions{}); err == nil || !apierrors.IsNotFound(err) {
			left = append(left, "CRD userdefinednetworks.k8s.ovn.org (listing UDNs works)")
		}
		for i := range c.Nodes {
			state, err := c.kvnetNodeState(i + 1)
			if err != nil {
				return err
			}
			for _, s := range state {
				left = append(left, c.Nodes[i]+": "+s)
			}
		}
		if len(left) > 0 {
			return fmt.Errorf("left: %s", strings.Join(left, ", "))
		}
		return nil
	})
}

// applyFiles server-side applies the objects in YAML files.
func applyFiles(ctx context.Context, c *Cluster, paths ...string) error {
	cl, err := client.New(c.CP.Config, client.Options{})
	if err != nil {
		return err
	}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		objs, err := manifests.Decode(b)
		if err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		for _, o := range objs {
			if err := controlplane.Apply(ctx, cl, o); err != nil {
				return fmt.Errorf("%s: apply %s %s: %w", p, o.GetKind(), o.GetName(), err)
			}
		}
	}
	return nil
}
