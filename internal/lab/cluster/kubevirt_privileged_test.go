//go:build cluster && kubevirt

package cluster

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kvnet.io/kvnet/internal/testenv"
)

// TestClusterKubeVirt installs KubeVirt v1.7.0 on the real cluster as a
// user does (its images built by the repository and pushed to the
// cluster's registry, virt-operator from its release manifest, a KubeVirt
// CR with useEmulation and the l2bridge binding): Up returns once the CR
// says Deployed; then virt-handler runs on every node, virt-api and
// virt-controller are available, and the env file names the guest's
// containerDisk.
func TestClusterKubeVirt(t *testing.T) {
	testenv.NeedsRoot(t)
	binDir := buildTools(t)
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Minute)
	defer cancel()
	c, err := Up(ctx, Config{Dir: t.TempDir(), BinDir: binDir, Nodes: 3, KvnetImages: true, KubeVirt: true, Log: testLog{t},
		WaitForLock: true})
	if err != nil {
		t.Fatalf("up: %v", err)
	}
	defer func() {
		if err := c.Down(); err != nil {
			t.Errorf("down: %v", err)
		}
	}()
	ds, err := c.Client.AppsV1().DaemonSets(KubeVirtNamespace).Get(ctx, "virt-handler", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ds.Status.NumberReady != int32(len(c.Nodes)) {
		t.Errorf("virt-handler ready on %d nodes, want %d", ds.Status.NumberReady, len(c.Nodes))
	}
	for _, name := range []string{"virt-api", "virt-controller", "virt-operator"} {
		d, err := c.Client.AppsV1().Deployments(KubeVirtNamespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if !deploymentAvailable(d) {
			t.Errorf("Deployment %s not available: %+v", name, d.Status)
		}
	}
	env, err := os.ReadFile(filepath.Join(c.Dir, EnvFile))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(env), "GUEST_IMAGE="+c.Registry+"/kvnet-lab/guest:lab\n") {
		t.Errorf("env file lacks GUEST_IMAGE:\n%s", env)
	}
}
