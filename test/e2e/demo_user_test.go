package e2e

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kvnet.io/kvnet/internal/testenv"
)

// TestLabDemoIgnoresUserObjects runs the demo in a lab where a user has
// experimented first (as `make demo` after other work): a VM of their own
// in a namespace of their own, and a pod bound to a node that does not
// exist, which never runs. The demo waits for and checks only what it
// applied, and passes.
func TestLabDemoIgnoresUserObjects(t *testing.T) {
	testenv.NeedsRoot(t)
	root, run := buildKvnet(t)
	dir := t.TempDir()
	showLabLogOnFailure(t, dir)
	run("up", "--dir", dir)
	t.Cleanup(func() { run("down", "--dir", dir) })
	c := labClient(t, dir)
	ctx := context.Background()
	const ns = "bar-kv"
	primaryUDN(t, c, ns, "10.52.0.0/24")
	if err := c.Create(ctx, l2bridgeVM(ns, "bar")); err != nil {
		t.Fatal(err)
	}
	stuck := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "stuck"},
		Spec: corev1.PodSpec{NodeName: "node-404", Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}
	if err := c.Create(ctx, stuck); err != nil {
		t.Fatal(err)
	}
	out := run("demo", "--kubeconfig", filepath.Join(dir, "kubeconfig"), "--examples", filepath.Join(root, "examples"))
	for _, want := range []string{"live migration vm-a-migration-", "kept its open TCP connection from udn-demo/web-1"} {
		if !strings.Contains(out, want) {
			t.Errorf("demo output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "bar-kv/stuck") {
		t.Errorf("the demo looked at the user's pod bar-kv/stuck:\n%s", out)
	}
}
