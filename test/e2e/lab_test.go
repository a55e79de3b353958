package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"kvnet.io/kvnet/internal/testenv"
)

// buildKvnet builds kvnet and the lab's binaries (testenv.BuildLab) and
// returns the repository root and a runner of kvnet-lab that fails the
// test on a non-zero exit.
func buildKvnet(t testing.TB) (string, func(args ...string) string) {
	t.Helper()
	root, _, run := testenv.BuildLab(t)
	return root, run
}

// buildKvnetIn is buildKvnet that also returns the directory of the
// binaries.
func buildKvnetIn(t testing.TB) (string, string, func(args ...string) string) {
	t.Helper()
	return testenv.BuildLab(t)
}

// showLabLogOnFailure logs the end of the lab's log in dir when the test
// fails, so that a lab that stopped by itself says why.
func showLabLogOnFailure(t *testing.T, dir string) {
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		b, err := os.ReadFile(filepath.Join(dir, "lab.log"))
		if err != nil {
			t.Logf("no lab log: %v", err)
			return
		}
		if len(b) > 8000 {
			b = b[len(b)-8000:]
		}
		t.Logf("end of the lab's log:\n%s", b)
	})
}

// demoTrafficChecks are lines the demo prints only when the traffic it
// checks is right (it fails by itself otherwise; these prove it ran).
var demoTrafficChecks = []string{
	`reached\s+udn-demo/web-1 \(node-1\)\s+-> udn-demo/web-2 10\.0\.0\.\d+ \(node-2\)`,
	`reached\s+red-namespace/red-1 \(node-2\)\s+-> blue-namespace/blue-1 203\.203\.0\.\d+ \(node-3\)`,
	`reached\s+udn-demo/web-1 \(node-1\)\s+-> 198\.51\.100\.1`,
	`reached\s+l3-demo/app-1 \(node-1\)\s+-> l3-demo/app-2 10\.128\.\d+\.\d+ \(node-2\)`,
	`blocked\s+l3-demo/app-1 \(node-1\)\s+-> udn-demo/web-2`,
	`reached\s+udn-demo/web-1 \(node-1\)\s+-> udn-demo/web-2 [0-9.]+ \(node-2, udn-demo_udn-secondary\)`,
	`blocked\s+tenant-b/db-1 \(node-1\)\s+-> udn-demo/web-\d 10\.0\.0\.\d+`,
	// A NetworkPolicy on a primary UDN: admitted, not selected, isolated.
	`reached\s+policy-demo/frontend \(node-2\)\s+-> policy-demo/api 10\.50\.0\.\d+ \(node-1\)`,
	`reached\s+policy-demo/intruder \(node-2\)\s+-> policy-demo/frontend 10\.50\.0\.\d+ \(node-2\)`,
	`blocked\s+policy-demo/intruder \(node-2\)\s+-> policy-demo/api 10\.50\.0\.\d+ \(node-1\)`,
	`live migration vm-a-migration-\w+: node-\d -> node-\d`,
	`reached udn-demo/web-1 \(node-1\) -> vm-a 10\.0\.0\.\d+`,
	// The guest itself: its lease, and a connection across the
	// live migration.
	`guest DHCP lease eth0 10\.0\.0\.\d+/24 router 10\.0\.0\.1 .* = IPAMClaim vm-a\.podnet`,
	// Its IPv6 address (the demo's UDN is dual-stack): leased by DHCPv6,
	// reached over IPv6 before and after the live migration.
	`guest DHCPv6 lease eth0 2001:db8::[0-9a-f]+/128 router fe80::[0-9a-f:]+ .* = IPAMClaim vm-a\.podnet`,
	`reached udn-demo/web-1 \(node-1\) -> vm-a \[2001:db8::[0-9a-f]+\]:7 \(node-\d; TCP echo in the guest, over IPv6\)`,
	`kept its open TCP connection from udn-demo/web-1`,
	`blocked tenant-b/db-1 \(node-1\) -> vm-a`,
	// The VM's Service: cluster IP, and node ports on every node.
	`reached udn-demo/web-1 \(node-\d\) -> http://10\.96\.\d+\.\d+:80/: the guest answered "vm-a"`,
	`EndpointSlice kvnet-vm-a-web-\w+ \(network udn-demo_udn-l2-net\) lists 10\.0\.0\.\d+, VM vm-a's UDN address`,
	`guest vm-a resolved vm-a-web\.udn-demo\.svc\.cluster\.local to 10\.96\.\d+\.\d+ through the cluster DNS 10\.96\.0\.10 \(from DHCP, search udn-demo\.svc\.cluster\.local svc\.cluster\.local cluster\.local\)`,
	`reached node node-1 -> http://192\.168\.100\.3:\d+/ \(node port of node-3\): the guest answered "vm-a"`,
	`blocked tenant-b/db-1 -> http://192\.168\.100\.1:\d+/ \(another tenant, through the node port\)`,
	// The masquerade VM: the forwarded port through the pod address.
	`the guest answered "vm-m"`,
	`guest DHCP lease eth0 10\.0\.2\.2/24 router 10\.0\.2\.1`,
	`blocked udn-demo/web-1 -> 10\.0\.0\.\d+:7 \(not in ports`,
}

// TestLabDemo runs the demo in a new lab, checks what it shows, and runs
// it again after a user's experiments in the lab.
func TestLabDemo(t *testing.T) {
	// The demo's traffic checks need the simulated nodes, hence root; a
	// skip is a failure under KVNET_REQUIRE_PRIVILEGED=1.
	testenv.NeedsRoot(t)
	root, run := buildKvnet(t)
	dir := t.TempDir()
	showLabLogOnFailure(t, dir)
	run("up", "--dir", dir)
	defer run("down", "--dir", dir)
	if _, err := os.Stat(filepath.Join(dir, "kubeconfig")); err != nil {
		t.Fatalf("no kubeconfig: %v", err)
	}
	out := run("demo", "--kubeconfig", filepath.Join(dir, "kubeconfig"), "--examples", filepath.Join(root, "examples"))
	for _, want := range []string{
		"applied  UserDefinedNetwork udn-demo/udn-l2-net",
		"REJECTED UserDefinedNetwork udn-demo/no-subnets",
		"Subnets is required with ipam.mode is Enabled or unset",
		"NetworkAttachmentDefinition has been created in following namespaces: [blue-namespace, red-namespace]",
		`"name": "udn-demo_udn-l2-net"`,
		`"allowPersistentIPs": true`,
		"NetworkAttachmentDefinitions rendered by kvnet (7)",
		"applied  UserDefinedNetwork l3-demo/l3-net",
		"applied  VirtualMachine udn-demo/vm-a",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("demo output lacks %q:\n%s", want, out)
		}
	}
	// The lab has simulated nodes, and the demo pings between pods (it
	// fails by itself when traffic is wrong; these lines prove it ran).
	for _, re := range demoTrafficChecks {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("demo output lacks /%s/:\n%s", re, out)
		}
	}
	if strings.Contains(out, "NOT CHECKED") {
		t.Errorf("the demo left isolation checks unchecked:\n%s", out)
	}
	if !regexp.MustCompile(`udn-demo/vm-a\s+secondary\s+bridge\s+02:[0-9a-f:]{14}`).MatchString(out) {
		t.Errorf("demo output lacks a pool MAC for vm-a's secondary interface:\n%s", out)
	}
	// Running the demo again is idempotent, also after a user has
	// experimented in the lab (as `make demo` after other work): a VM of
	// their own in a namespace of their own, and a pod bound to a node
	// that does not exist, which never runs. The demo waits for and
	// checks only what it applied, and passes.
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
	macRE := regexp.MustCompile(`udn-demo/vm-a\s+secondary\s+bridge\s+(02:[0-9a-f:]{14})`)
	again := run("demo", "--kubeconfig", filepath.Join(dir, "kubeconfig"), "--examples", filepath.Join(root, "examples"))
	// The demo's 7 and the user's primary UDN's.
	for _, want := range []string{"NetworkAttachmentDefinitions rendered by kvnet (8)", "live migration vm-a-migration-", "kept its open TCP connection from udn-demo/web-1"} {
		if !strings.Contains(again, want) {
			t.Errorf("second demo run, after the user's objects, lacks %q:\n%s", want, again)
		}
	}
	if strings.Contains(again, "bar-kv/stuck") {
		t.Errorf("the demo looked at the user's pod bar-kv/stuck:\n%s", again)
	}
	// Re-applying the VM manifest (which names no MAC) keeps its MAC.
	if m1, m2 := macRE.FindStringSubmatch(out), macRE.FindStringSubmatch(again); m1 == nil || m2 == nil || m1[1] != m2[1] {
		t.Errorf("vm-a's MAC changed on re-apply: %v -> %v", m1, m2)
	}
}

// TestLabReportsNodeFailure kills one simulated node's kvnet-node after the
// lab is up: the lab must say which component failed and why, stop
// entirely (no process, no network namespace left) and report the failure
// again on "lab down".
func TestLabReportsNodeFailure(t *testing.T) {
	testenv.NeedsRoot(t)
	_, run := buildKvnet(t)
	dir := t.TempDir()
	showLabLogOnFailure(t, dir)
	run("up", "--dir", dir, "--nodes", "2")
	t.Cleanup(func() { run("down", "--dir", dir) })
	labPID := readPID(t, filepath.Join(dir, "lab.pid"))
	nodePID := readPID(t, filepath.Join(dir, "nodes", "node-2", "kvnet-node.pid"))
	if err := syscall.Kill(nodePID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, time.Minute, "lab process exits", func() error {
		if syscall.Kill(labPID, 0) == nil {
			return fmt.Errorf("lab (pid %d) still running", labPID)
		}
		return nil
	})
	log, err := os.ReadFile(filepath.Join(dir, "lab.log"))
	if err != nil {
		t.Fatal(err)
	}
	if want := "kvnet-lab: stopping: kvnet-node on node-2: signal: killed"; !strings.Contains(string(log), want) {
		t.Errorf("lab log lacks %q:\n%s", want, log)
	}
	out, err := exec.Command("ip", "netns", "list").CombinedOutput()
	if err != nil {
		t.Fatal(err)
	}
	prefix := labNetnsPrefix(t, dir)
	if strings.Contains(string(out), prefix) {
		t.Errorf("the stopped lab left network namespaces %s*:\n%s", prefix, out)
	}
	if down := run("down", "--dir", dir); !strings.Contains(down, "stopped by itself after a failure: kvnet-node on node-2") {
		t.Errorf("lab down does not report the failure:\n%s", down)
	}
}

func readPID(t *testing.T, path string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return pid
}

// labNetnsPrefix is the lab's namespace prefix: every namespace a lab in
// dir makes starts with it.
func labNetnsPrefix(t testing.TB, dir string) string {
	t.Helper()
	kubelet, err := os.ReadFile(filepath.Join(dir, "netns-prefix"))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(kubelet))
}

// TestLabDemoMultus runs the demo in a lab whose kubelets behave like
// stock Multus over a stand-in cluster default network (kvnet lab up
// --multus): primary networks come through kvnet's webhook and Multus, the
// pods keep eth0, and every traffic check of the demo passes as in the
// default lab. kvnet-node marks the primary attachment default in the
// network-status Multus wrote, where KubeVirt looks for the pod network.
func TestLabDemoMultus(t *testing.T) {
	testenv.NeedsRoot(t)
	root, run := buildKvnet(t)
	dir := t.TempDir()
	showLabLogOnFailure(t, dir)
	run("up", "--dir", dir, "--multus")
	defer run("down", "--dir", dir)
	kubeconfig := filepath.Join(dir, "kubeconfig")
	out := run("demo", "--kubeconfig", kubeconfig, "--examples", filepath.Join(root, "examples"))
	for _, re := range demoTrafficChecks {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("demo output lacks /%s/:\n%s", re, out)
		}
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var statuses []struct {
		Name, Interface string
		Default         bool
	}
	testenv.Eventually(t, time.Minute, "web-1's network-status marks ovn-udn1 default", func() error {
		pod, err := cs.CoreV1().Pods("udn-demo").Get(context.Background(), "web-1", metav1.GetOptions{})
		if err != nil {
			return err
		}
		v := pod.Annotations["k8s.v1.cni.cncf.io/network-status"]
		if err := json.Unmarshal([]byte(v), &statuses); err != nil {
			return fmt.Errorf("network-status %q: %w", v, err)
		}
		got := map[string]bool{}
		for _, s := range statuses {
			got[s.Interface] = s.Default
		}
		if d, ok := got["eth0"]; !ok || d || !got["ovn-udn1"] {
			return fmt.Errorf("network-status %s: want eth0 (not default) and ovn-udn1 (default)", v)
		}
		return nil
	})
}
