package testenv

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"kvnet.io/kvnet/internal/lab/controlplane"
	"kvnet.io/kvnet/internal/repo"
)

// BuildLab builds kvnet, kvnet-lab, kvnet-node, kvnet-cni and the CNI
// plugins the lab runs into one directory, as make build does (the lab
// runs the shipped kvnet-node and kvnet-cni found next to kvnet-lab),
// and returns the repository root, that directory and a runner of
// kvnet-lab (in the repository, with the control plane's binaries of
// .cache/bin) that fails the test on a non-zero exit and returns its
// combined output.
func BuildLab(t testing.TB) (root, binDir string, run func(args ...string) string) {
	t.Helper()
	root, err := repo.Root()
	if err != nil {
		t.Fatal(err)
	}
	binDir = t.TempDir()
	build := GoBuild(root, "-o", binDir+"/", "./cmd/kvnet", "./cmd/kvnet-lab", "./cmd/kvnet-node", "./cmd/kvnet-cni",
		"github.com/containernetworking/plugins/plugins/main/macvlan", "github.com/containernetworking/plugins/plugins/main/bridge",
		"github.com/containernetworking/plugins/plugins/ipam/host-local")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build kvnet: %v\n%s", err, out)
	}
	run = func(args ...string) string {
		t.Helper()
		cmd := exec.Command(filepath.Join(binDir, "kvnet-lab"), args...)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), controlplane.BinDirEnv+"="+filepath.Join(root, ".cache", "bin"))
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			t.Fatalf("kvnet-lab %s: %v\n%s", strings.Join(args, " "), err, out.String())
		}
		return out.String()
	}
	return root, binDir, run
}
