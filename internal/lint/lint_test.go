// Checks across the whole repository.
package lint

import (
	"encoding/json"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"kvnet.io/kvnet/internal/repo"
)

type pkg struct {
	ImportPath string
	Doc        string
	Deps       []string
	Name       string
}

func listPackages(t *testing.T) []pkg {
	t.Helper()
	root, err := repo.Root()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "list", "-json", "./...")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	var pkgs []pkg
	for dec.More() {
		var p pkg
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		pkgs = append(pkgs, p)
	}
	if len(pkgs) < 10 {
		t.Fatalf("go list found only %d packages", len(pkgs))
	}
	return pkgs
}

func TestPackageDocs(t *testing.T) {
	for _, p := range listPackages(t) {
		if p.Doc == "" {
			t.Errorf("package %s has no package doc", p.ImportPath)
		}
	}
}

// clientFree are core packages that must not depend on Kubernetes clients.
var clientFree = []string{
	"kvnet.io/kvnet/internal/udn",
	"kvnet.io/kvnet/internal/netconf",
	"kvnet.io/kvnet/internal/reserved",
	"kvnet.io/kvnet/internal/multus",
	"kvnet.io/kvnet/internal/ipam",
	"kvnet.io/kvnet/internal/podnetworks",
	"kvnet.io/kvnet/internal/vmclaims",
	"kvnet.io/kvnet/internal/migration",
	"kvnet.io/kvnet/internal/macpool",
	"kvnet.io/kvnet/internal/kubevirt/launcher",
	"kvnet.io/kvnet/internal/datapath",
	"kvnet.io/kvnet/internal/dhcp",
	"kvnet.io/kvnet/internal/cni",
	"kvnet.io/kvnet/internal/portalias",
	"kvnet.io/kvnet/internal/policy",
	"kvnet.io/kvnet/internal/lab/simnet",
}

func TestCorePackagesImportNoClient(t *testing.T) {
	forbidden := []string{"k8s.io/client-go/", "sigs.k8s.io/controller-runtime/pkg/client", "sigs.k8s.io/controller-runtime/pkg/manager"}
	seen := 0
	for _, p := range listPackages(t) {
		for _, core := range clientFree {
			if p.ImportPath != core && !strings.HasPrefix(p.ImportPath, core+"/") {
				continue
			}
			seen++
			for _, d := range p.Deps {
				for _, f := range forbidden {
					if strings.HasPrefix(d, f) {
						t.Errorf("%s depends on %s", p.ImportPath, d)
					}
				}
			}
		}
	}
	if seen < len(clientFree) {
		t.Fatalf("checked %d core packages, want %d", seen, len(clientFree))
	}
}

// labOnly are the module's packages that exist for the lab and the tests:
// everything under internal/lab (the simulated nodes, kubelet and KubeVirt,
// the local control plane, the lab's command line, the demo and chaos) and
// the test helpers.
var labOnly = []string{
	"kvnet.io/kvnet/internal/lab",
	"kvnet.io/kvnet/internal/testenv",
	// controller-runtime's test harness (it starts etcd and an API server).
	"sigs.k8s.io/controller-runtime/pkg/envtest",
}

// controllerCode is what only kvnet-controller may link.
var controllerCode = []string{
	"kvnet.io/kvnet/internal/k8s/manager",
	"kvnet.io/kvnet/internal/k8s/controllers",
	"kvnet.io/kvnet/internal/k8s/webhooks",
}

// shipped maps each binary that runs in a cluster, or that its operators
// run against it, to what it must not link beyond the lab's code:
// kvnet-node and kvnet-cni run on every node and carry no controller code;
// kvnet-cni, run once per pod, not even controller-runtime. kvnet is the
// operator's command line (install, check, get, why, audit).
var shipped = map[string][]string{
	"kvnet.io/kvnet/cmd/kvnet":            nil,
	"kvnet.io/kvnet/cmd/kvnet-controller": nil,
	"kvnet.io/kvnet/cmd/kvnet-node":       controllerCode,
	"kvnet.io/kvnet/cmd/kvnet-cni":        append(slices.Clone(controllerCode), "sigs.k8s.io/controller-runtime"),
}

// The binaries a cluster runs link no lab code and, on nodes, no
// controller code.
func TestShippedBinariesLinkNoLabCode(t *testing.T) {
	under := func(pkg, tree string) bool { return pkg == tree || strings.HasPrefix(pkg, tree+"/") }
	seen := 0
	for _, p := range listPackages(t) {
		extra, ok := shipped[p.ImportPath]
		if !ok {
			continue
		}
		seen++
		for _, d := range p.Deps {
			for _, banned := range append(slices.Clone(labOnly), extra...) {
				if under(d, banned) {
					t.Errorf("%s links %s", p.ImportPath, d)
				}
			}
		}
	}
	if seen != len(shipped) {
		t.Fatalf("found %d of the %d shipped binaries", seen, len(shipped))
	}
}
