package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"kvnet.io/kvnet/internal/lab/cli/lab"
	"kvnet.io/kvnet/internal/node"
	"kvnet.io/kvnet/internal/testenv"
)

// TestTwoLabsAtOnce: two labs in different directories run side by side
// (free ports, namespaces of their own), as a lab left running by make
// demo does next to the labs of make test; stopping one leaves the other
// serving.
func TestTwoLabsAtOnce(t *testing.T) {
	testenv.NeedsRoot(t)
	_, run := buildKvnet(t)
	dirs := []string{t.TempDir(), t.TempDir()}
	for _, dir := range dirs {
		showLabLogOnFailure(t, dir)
		run("up", "--dir", dir, "--nodes", "1")
		t.Cleanup(func() { run("down", "--dir", dir) })
	}
	hosts := map[string]bool{}
	prefixes := map[string]bool{}
	for i, dir := range dirs {
		cfg, err := clientcmd.BuildConfigFromFlags("", filepath.Join(dir, lab.KubeconfigFile))
		if err != nil {
			t.Fatal(err)
		}
		hosts[cfg.Host] = true
		prefixes[labNetnsPrefix(t, dir)] = true
		// Each lab's API server holds its own objects.
		c := labClient(t, dir)
		if err := c.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("lab-%d", i)}}); err != nil {
			t.Fatal(err)
		}
	}
	if len(hosts) != 2 || len(prefixes) != 2 {
		t.Fatalf("the labs share an API server address or namespace prefix: %v %v", hosts, prefixes)
	}
	for i, dir := range dirs {
		c := labClient(t, dir)
		var other corev1.Namespace
		if err := c.Get(context.Background(), client.ObjectKey{Name: fmt.Sprintf("lab-%d", 1-i)}, &other); !apierrors.IsNotFound(err) {
			t.Errorf("lab %d: the other lab's namespace: %v, want NotFound", i, err)
		}
		testenv.Eventually(t, time.Minute, fmt.Sprintf("lab %d's kvnet-node published its node", i), func() error {
			var n corev1.Node
			if err := c.Get(context.Background(), client.ObjectKey{Name: lab.NodeName(1)}, &n); err != nil {
				return err
			}
			if n.Annotations[node.VTEPAnnotation] == "" {
				return fmt.Errorf("node %s has no %s", n.Name, node.VTEPAnnotation)
			}
			return nil
		})
	}
	// Stopping the first leaves the second running.
	run("down", "--dir", dirs[0])
	pid := readPID(t, filepath.Join(dirs[1], "lab.pid"))
	if err := syscall.Kill(pid, 0); err != nil {
		t.Fatalf("the second lab (pid %d) stopped with the first: %v", pid, err)
	}
	if _, err := os.Stat(filepath.Join("/run/netns", labNetnsPrefix(t, dirs[1])+"-"+lab.NodeName(1))); err != nil {
		t.Fatalf("the second lab's node namespace: %v", err)
	}
	var ns corev1.Namespace
	if err := labClient(t, dirs[1]).Get(context.Background(), client.ObjectKey{Name: "lab-1"}, &ns); err != nil {
		t.Fatalf("the second lab's API server after the first stopped: %v", err)
	}
}
