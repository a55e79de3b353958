//go:build cluster && kubevirt

package cluster

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"

	"kvnet.io/kvnet/internal/repo"
	"kvnet.io/kvnet/internal/testenv"
)

// previousKvnet is the earlier kvnet the upgrade test installs with VMs
// running and upgrades from: the last commit CI landed before this test
// existed. Move it forward to the last landed commit from time to time.
const previousKvnet = "d7bdb5374e05952ab0368a0ca22116f125866ade"

// previousTag tags the earlier kvnet's images in the cluster's registry.
var previousTag = "prev-" + previousKvnet[:7]

// buildPreviousKvnet checks previousKvnet out of the repository (git
// archive), builds its images as `make images` did there (its own
// hack/images), pushes them under previousTag and builds its kvnet CLI.
// It returns a function running that CLI against the cluster.
func buildPreviousKvnet(ctx context.Context, t *testing.T, c *Cluster) func(args ...string) (string, error) {
	t.Helper()
	root, err := repo.Root()
	if err != nil {
		fatalf(t, "%v", err)
	}
	src := t.TempDir()
	if err := exec.CommandContext(ctx, "git", "-C", root, "cat-file", "-e", previousKvnet+"^{commit}").Run(); err != nil {
		// A shallow clone: what it has is the current tree, installed
		// under the previous tag (a rollout of both components to a new
		// image, not a change of version). Said loudly.
		t.Logf("WARNING: kvnet %s is not in this clone (shallow?): the rollback and upgrade install the current tree under tag %s", previousKvnet[:7], previousTag)
		src = root
	} else {
		archive := exec.CommandContext(ctx, "sh", "-c", `git -C "$1" archive "$2" | tar -x -C "$3"`, "sh", root, previousKvnet, src)
		if out, err := archive.CombinedOutput(); err != nil {
			fatalf(t, "check out kvnet %s: %v\n%s", previousKvnet, err, out)
		}
	}
	out := filepath.Join(t.TempDir(), "images")
	build := exec.CommandContext(ctx, "go", "run", "./hack/images", "--out", out, "--registry", c.Registry+"/kvnet", "--tag", previousTag)
	build.Dir = src
	if b, err := build.CombinedOutput(); err != nil {
		fatalf(t, "kvnet %s: make images: %v\n%s", previousKvnet[:7], err, b)
	}
	refs, err := PushLayouts(ctx, out, c.Registry+"/kvnet", previousTag)
	if err != nil {
		fatalf(t, "%v", err)
	}
	t.Logf("kvnet %s's images: %v", previousKvnet[:7], refs)
	bin := filepath.Join(t.TempDir(), "kvnet-previous")
	cli := testenv.GoBuild(src, "-o", bin, "./cmd/kvnet")
	if b, err := cli.CombinedOutput(); err != nil {
		fatalf(t, "kvnet %s: go build ./cmd/kvnet: %v\n%s", previousKvnet[:7], err, b)
	}
	return func(args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, bin, append(args, "--kubeconfig", c.Kubeconfig)...)
		b, err := cmd.CombinedOutput()
		return string(b), err
	}
}

// waitKvnetRolled waits until kvnet-controller and kvnet-node run only
// images tagged tag, every replica and node Ready.
func waitKvnetRolled(ctx context.Context, t *testing.T, c *Cluster, tag string) {
	t.Helper()
	testenv.Eventually(recapTB{t}, 10*time.Minute, "kvnet rolled to tag "+tag, func() error {
		d, err := c.Client.AppsV1().Deployments(KvnetNamespace).Get(ctx, "kvnet-controller", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if d.Status.ObservedGeneration < d.Generation || !deploymentAvailable(d) || d.Status.UpdatedReplicas != d.Status.Replicas {
			return fmt.Errorf("kvnet-controller: %+v", d.Status)
		}
		ds, err := c.Client.AppsV1().DaemonSets(KvnetNamespace).Get(ctx, "kvnet-node", metav1.GetOptions{})
		if err != nil {
			return err
		}
		st := ds.Status
		if st.ObservedGeneration < ds.Generation || st.UpdatedNumberScheduled != st.DesiredNumberScheduled || st.NumberReady != st.DesiredNumberScheduled || st.DesiredNumberScheduled != int32(len(c.Nodes)) {
			return fmt.Errorf("kvnet-node: %+v", st)
		}
		pods, err := c.Client.CoreV1().Pods(KvnetNamespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		for _, p := range pods.Items {
			if p.DeletionTimestamp != nil {
				return fmt.Errorf("pod %s terminating", p.Name)
			}
			for _, ctr := range p.Spec.Containers {
				if !strings.HasSuffix(ctr.Image, ":"+tag) {
					return fmt.Errorf("pod %s runs %s", p.Name, ctr.Image)
				}
			}
			if !PodReady(&p) {
				return fmt.Errorf("pod %s not Ready", p.Name)
			}
		}
		return nil
	})
}

// streams are the echo clients the VM scenarios left running (pod →
// what it talks to), which the upgrade must not break.
var streams = []string{"echo", "echo-vm-d1", "echo-vm-d2", "echo-pod"}

// upgradeWithVMs: with the VM scenarios' VMs running and their echo
// streams open, kvnet is rolled back to the previous release's images and
// manifests (that release's kvnet install) and upgraded again to the
// current ones (this one's): after each, every stream goes on in order,
// every VM of the persistent UDN keeps its IP, MAC and claim, and kvnet
// check reports nothing missing.
func upgradeWithVMs(ctx context.Context, t *testing.T, c *Cluster, current func(args ...string) (string, error)) {
	dyn, err := dynamic.NewForConfig(c.CP.Config)
	if err != nil {
		fatalf(t, "%v", err)
	}
	s := &vmScenarios{scenarios: &scenarios{t: c.ScenarioTarget(), dyn: dyn, out: os.Stderr, pods: map[string]*scenarioPod{}}}
	type vmState struct{ ip, mac, node string }
	vms := func() map[string]vmState {
		t.Helper()
		out := map[string]vmState{}
		for _, name := range append([]string{"vm-m"}, drainVMs...) {
			vmi, err := dyn.Resource(vmiGVR).Namespace(nsVM).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				fatalf(t, "%v", err)
			}
			claim, err := s.claimIP(ctx, nsVM, name+".default")
			if err != nil {
				fatalf(t, "%v", err)
			}
			mac, node, err := vmiClaimIP(vmi, claim)
			if err != nil {
				fatalf(t, "%v", err)
			}
			out[name] = vmState{claim.String(), mac, node}
		}
		return out
	}
	lines := map[string]int{}
	for _, e := range streams {
		n, err := s.waitEchoGrows(ctx, nsVM, e, 0)
		if err != nil {
			fatalf(t, "echo stream %s before the upgrades: %v", e, err)
		}
		lines[e] = n
	}
	before := vms()
	step := func(what, tag string, kvnet func(args ...string) (string, error)) {
		t.Helper()
		start := time.Now()
		out, err := kvnet("install", "--registry", c.Registry+"/kvnet", "--tag", tag)
		if err != nil {
			fatalf(t, "%s: kvnet install: %v\n%s", what, err, out)
		}
		waitKvnetRolled(ctx, t, c, tag)
		took := time.Since(start)
		for _, e := range streams {
			n, err := s.waitEchoGrows(ctx, nsVM, e, lines[e])
			if err != nil {
				failf(t, "%s: echo stream %s: %v", what, e, err)
				continue
			}
			gap, _ := s.echoGap(ctx, nsVM, e, lines[e])
			t.Logf("%s: echo stream %s: lines %d -> %d in order, longest pause %s", what, e, lines[e], n, gap)
			lines[e] = n
		}
		if after := vms(); fmt.Sprint(after) != fmt.Sprint(before) {
			failf(t, "%s: VMs (IP, MAC, node) %v, before %v", what, after, before)
		}
		out, err = current("check")
		for _, l := range strings.Split(out, "\n") {
			if strings.HasPrefix(l, "missing") {
				failf(t, "%s: kvnet check: %s", what, l)
			}
		}
		if err != nil {
			failf(t, "%s: kvnet check: %v\n%s", what, err, out)
		}
		t.Logf("%s: kvnet install to rolled out in %s; VMs kept %v", what, took.Round(time.Second), before)
	}
	previous := buildPreviousKvnet(ctx, t, c)
	step("rollback to kvnet "+previousKvnet[:7], previousTag, previous)
	step("upgrade to this kvnet", KvnetTag, current)
}
