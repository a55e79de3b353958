//go:build cluster

package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"kvnet.io/kvnet/internal/testenv"
)

// networkStatus is one element of Multus's k8s.v1.cni.cncf.io/network-status.
type networkStatus struct {
	Name      string   `json:"name"`
	Interface string   `json:"interface"`
	IPs       []string `json:"ips"`
	Default   bool     `json:"default"`
}

// testMultus checks real Multus (thick): its DaemonSet is ready on every
// node, and a pod asking for a NAD of the reference bridge plugin in
// k8s.v1.cni.cncf.io/networks gets the extra interface, with
// network-status listing the default network (Flannel's, on eth0) and it.
func testMultus(ctx context.Context, t *testing.T, c *Cluster, ns string) {
	ds, err := c.Client.AppsV1().DaemonSets("kube-system").Get(ctx, MultusDaemonSet, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if n := int32(len(c.Nodes)); ds.Status.NumberReady != n {
		t.Errorf("DaemonSet %s: %d pods ready, want %d", MultusDaemonSet, ds.Status.NumberReady, n)
	}
	cl, err := client.New(c.CP.Config, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	nad := &unstructured.Unstructured{}
	nad.SetAPIVersion("k8s.cni.cncf.io/v1")
	nad.SetKind("NetworkAttachmentDefinition")
	nad.SetNamespace(ns)
	nad.SetName("extra")
	conf := `{"cniVersion":"0.3.1","name":"extra","type":"bridge","bridge":"extrabr0",` +
		`"ipam":{"type":"host-local","subnet":"192.168.77.0/24"}}`
	if err := unstructured.SetNestedField(nad.Object, conf, "spec", "config"); err != nil {
		t.Fatal(err)
	}
	if err := cl.Create(ctx, nad); err != nil {
		t.Fatal(err)
	}
	p := sleeper(ns, "multi-1", NodeName(1), c.Images["busybox"])
	p.Annotations = map[string]string{"k8s.v1.cni.cncf.io/networks": `[{"name":"extra","interface":"net1"}]`}
	if _, err := c.Client.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	p = waitPodReady(ctx, t, c, ns, "multi-1")
	var statuses []networkStatus
	testenv.Eventually(t, 30*time.Second, "network-status of multi-1 with two networks", func() error {
		got, err := c.Client.CoreV1().Pods(ns).Get(ctx, "multi-1", metav1.GetOptions{})
		if err != nil {
			return err
		}
		p = got
		s := p.Annotations["k8s.v1.cni.cncf.io/network-status"]
		statuses = nil
		if err := json.Unmarshal([]byte(s), &statuses); err != nil {
			return fmt.Errorf("network-status %q: %w", s, err)
		}
		if len(statuses) != 2 {
			return fmt.Errorf("network-status %s: want 2 networks", s)
		}
		return nil
	})
	def, extra := statuses[0], statuses[1]
	if !def.Default || def.Interface != "eth0" || len(def.IPs) == 0 || def.IPs[0] != p.Status.PodIP {
		t.Errorf("network-status[0] %+v: want the default network on eth0 with the pod IP %s", def, p.Status.PodIP)
	}
	if extra.Default || extra.Name != ns+"/extra" || extra.Interface != "net1" || len(extra.IPs) == 0 || !strings.HasPrefix(extra.IPs[0], "192.168.77.") {
		t.Errorf("network-status[1] %+v: want %s/extra on net1 with an address in 192.168.77.0/24", extra, ns)
	}
	out := execIn(ctx, t, c, ns, "multi-1", "ip", "-4", "addr", "show", "dev", "net1")
	if len(extra.IPs) > 0 && !strings.Contains(out, "inet "+extra.IPs[0]+"/24") {
		t.Errorf("multi-1's net1 lacks %s/24:\n%s", extra.IPs[0], out)
	}
	// A pod without the annotation gets the default network alone.
	if s := mustPod(ctx, t, c, ns, "client-3").Annotations["k8s.v1.cni.cncf.io/network-status"]; strings.Contains(s, "net1") {
		t.Errorf("client-3 (no networks annotation) has network-status %s", s)
	}
}

func mustPod(ctx context.Context, t testing.TB, c *Cluster, ns, name string) *corev1.Pod {
	t.Helper()
	p, err := c.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// sleeper is a busybox pod on node that sleeps (a client to exec into).
func sleeper(ns, name, node, image string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{
			NodeSelector:                  map[string]string{corev1.LabelHostname: node},
			TerminationGracePeriodSeconds: ptr.To[int64](0),
			Containers:                    []corev1.Container{{Name: "sleep", Image: image, Command: []string{"sleep", "3600"}}},
		},
	}
}
