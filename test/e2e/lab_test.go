package e2e

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"kvnet.io/kvnet/internal/controlplane"
)

func TestLabDemo(t *testing.T) {
	root, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "kvnet")
	build := exec.Command("go", "build", "-o", bin, "./cmd/kvnet")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build kvnet: %v\n%s", err, out)
	}
	dir := t.TempDir()
	run := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(bin, args...)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), controlplane.BinDirEnv+"="+filepath.Join(root, ".cache", "bin"))
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			t.Fatalf("kvnet %s: %v\n%s", strings.Join(args, " "), err, out.String())
		}
		return out.String()
	}
	run("lab", "up", "--dir", dir)
	defer run("lab", "down", "--dir", dir)
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
		"NetworkAttachmentDefinitions rendered by kvnet (5)",
		"applied  VirtualMachine udn-demo/vm-a",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("demo output lacks %q:\n%s", want, out)
		}
	}
	// As root the lab has simulated nodes, and the demo pings between pods
	// (it fails by itself when traffic is wrong; these lines prove it ran).
	if os.Geteuid() == 0 {
		for _, re := range []string{
			`reached\s+udn-demo/web-1 \(node-1\)\s+-> udn-demo/web-2 10\.0\.0\.\d+ \(node-2\)`,
			`reached\s+red-namespace/red-1 \(node-2\)\s+-> blue-namespace/blue-1 203\.203\.0\.\d+ \(node-3\)`,
			`reached\s+udn-demo/web-1 \(node-1\)\s+-> 198\.51\.100\.1`,
			`reached\s+udn-demo/web-1 \(node-1\)\s+-> udn-demo/web-2 [0-9.]+ \(node-2, udn-demo_udn-secondary\)`,
			`blocked\s+tenant-b/db-1 \(node-1\)\s+-> udn-demo/web-\d 10\.0\.0\.\d+`,
			`live migration vm-a-migration-\w+: node-\d -> node-\d`,
			`reached udn-demo/web-1 \(node-1\) -> vm-a 10\.0\.0\.\d+`,
		} {
			if !regexp.MustCompile(re).MatchString(out) {
				t.Errorf("demo output lacks /%s/:\n%s", re, out)
			}
		}
	}
	if !regexp.MustCompile(`udn-demo/vm-a\s+secondary\s+bridge\s+02:[0-9a-f:]{14}`).MatchString(out) {
		t.Errorf("demo output lacks a pool MAC for vm-a's secondary interface:\n%s", out)
	}
	// Running the demo again is idempotent.
	macRE := regexp.MustCompile(`udn-demo/vm-a\s+secondary\s+bridge\s+(02:[0-9a-f:]{14})`)
	again := run("demo", "--kubeconfig", filepath.Join(dir, "kubeconfig"), "--examples", filepath.Join(root, "examples"))
	if !strings.Contains(again, "(5)") {
		t.Errorf("second demo run differs:\n%s", again)
	}
	// Re-applying the VM manifest (which names no MAC) keeps its MAC.
	if m1, m2 := macRE.FindStringSubmatch(out), macRE.FindStringSubmatch(again); m1 == nil || m2 == nil || m1[1] != m2[1] {
		t.Errorf("vm-a's MAC changed on re-apply: %v -> %v", m1, m2)
	}
}
