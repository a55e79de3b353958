//go:build cluster && kubevirt

package cluster

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"

	"kvnet.io/kvnet/internal/testenv"
)

// TestClusterKubeVirt installs KubeVirt v1.8.4 on a dual-stack real
// cluster (Config.IPFamily IPFamilyDual) as a user does (its images built by the repository and pushed to the
// cluster's registry, virt-operator from its release manifest, a KubeVirt
// CR with useEmulation and the l2bridge binding): Up returns once the CR
// says Deployed; then virt-handler runs on every node, virt-api and
// virt-controller are available, and the env file names the guest's
// containerDisk. With kvnet installed the VM scenarios (RunVMScenarios,
// with ScenarioVMDualStack) pass, but the l2bridge one, which is Blocked exactly when this
// machine's kernel cannot make dummy links; then, with their VMs running,
// kvnet is rolled back to an earlier release and upgraded again
// (upgradeWithVMs).
func TestClusterKubeVirt(t *testing.T) {
	testenv.NeedsRoot(t)
	binDir := buildTools(t)
	ctx, cancel := context.WithTimeout(context.Background(), 55*time.Minute)
	defer cancel()
	c := upForTest(ctx, t, Config{Dir: t.TempDir(), BinDir: binDir, Nodes: 3, KvnetImages: true, KubeVirt: true, Log: testLog{t},
		IPFamily: IPFamilyDual, WaitForLock: true})
	// Deployed says every component rolled out once; under load a
	// replica may be restarting a moment later (a slow probe), so each
	// is waited for.
	testenv.Eventually(recapTB{t}, 5*time.Minute, "virt-handler ready on every node, virt-api, virt-controller and virt-operator available", func() error {
		ds, err := c.Client.AppsV1().DaemonSets(KubeVirtNamespace).Get(ctx, "virt-handler", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if ds.Status.NumberReady != int32(len(c.Nodes)) {
			return fmt.Errorf("virt-handler ready on %d nodes, want %d", ds.Status.NumberReady, len(c.Nodes))
		}
		for _, name := range []string{"virt-api", "virt-controller", "virt-operator"} {
			d, err := c.Client.AppsV1().Deployments(KubeVirtNamespace).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if !deploymentAvailable(d) {
				return fmt.Errorf("Deployment %s not available: %+v", name, d.Status)
			}
		}
		return nil
	})
	env, err := os.ReadFile(filepath.Join(c.Dir, EnvFile))
	if err != nil {
		fatalf(t, "%v", err)
	}
	if !strings.Contains(string(env), "GUEST_IMAGE="+c.Registry+"/kvnet-lab/guest:lab\n") {
		failf(t, "env file lacks GUEST_IMAGE:\n%s", env)
	}

	installKvnet(ctx, t, c, kvnetCLI(t, c))
	// A real Prometheus scrapes kvnet through the VM scenarios: its
	// migration histograms must count every live migration.
	prom := startPrometheus(ctx, t, c)
	results, err := RunVMScenarios(ctx, c.ScenarioTarget(), testLog{t})
	if err != nil {
		fatalf(t, "%v", err)
	}
	want := append(slices.Clip(VMScenarios), ScenarioVMDualStack)
	if len(results) != len(want) {
		fatalf(t, "%d results, want one per scenario (%d: %v)", len(results), len(want), want)
	}
	noDummy := !kernelHasDummy(t)
	for i, r := range results {
		if r.Name != want[i] {
			failf(t, "result %d is %q, want %q", i, r.Name, want[i])
		}
		switch {
		case r.Name == ScenarioVML2Bridge && noDummy:
			if !r.Blocked || !strings.Contains(r.Detail, "LinkAdd: operation not supported") {
				failf(t, "%s on a kernel without dummy links: want Blocked by KubeVirt's LinkAdd, got %s", r.Name, r)
			}
		case !r.OK:
			failf(t, "%s", r)
		}
	}
	// After the results: a failed migration scenario is named in the
	// recap by its own result, not only as a histogram without counts.
	checkMigrationHistograms(ctx, t, c, prom)
	if t.Failed() {
		return
	}
	upgradeWithVMs(ctx, t, c, kvnetCLI(t, c))
}

// kernelHasDummy reports whether this machine's kernel makes dummy links
// (KubeVirt's bridge and managedTap bindings need one in each launcher
// pod), tried in a scratch network namespace.
func kernelHasDummy(t *testing.T) bool {
	out, err := exec.Command("unshare", "--net", "ip", "link", "add", "kvd0", "type", "dummy").CombinedOutput()
	if err != nil {
		t.Logf("no dummy links on this kernel: ip link add type dummy: %v: %s", err, strings.TrimSpace(string(out)))
		return false
	}
	return true
}

// checkMigrationHistograms wants Prometheus (scraping every kvnet-node
// since before the VM scenarios) to count one observation of
// kvnet_migration_target_wait_seconds per succeeded
// VirtualMachineInstanceMigration of a VM on a primary UDN (each switched
// its VM's network on its target node, by either trigger), and in
// kvnet_migration_switchover_seconds one per switch-over at the guest's
// first frame (kvnet_migration_switchovers_total{trigger="first-frame"}).
// kvnet-node's counters restart with its pods (the scenarios roll it), so
// each pod's series counts at its largest.
func checkMigrationHistograms(ctx context.Context, t *testing.T, c *Cluster, prom *promServer) {
	t.Helper()
	dyn, err := dynamic.NewForConfig(c.CP.Config)
	if err != nil {
		fatalf(t, "%v", err)
	}
	l, err := dyn.Resource(vmimGVR).List(ctx, metav1.ListOptions{})
	if err != nil {
		fatalf(t, "%v", err)
	}
	// Only VMs on kvnet's networks switch a kvnet port: those in
	// namespaces with a primary UDN (the drain also moves a VM of the
	// pod network).
	succeeded := 0
	primary := map[string]bool{}
	for _, m := range l.Items {
		if phase, _, _ := unstructured.NestedString(m.Object, "status", "phase"); phase != "Succeeded" {
			continue
		}
		ns := m.GetNamespace()
		if _, ok := primary[ns]; !ok {
			n, err := c.Client.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
			if err != nil {
				fatalf(t, "%v", err)
			}
			_, primary[ns] = n.Labels["k8s.ovn.org/primary-user-defined-network"]
		}
		if primary[ns] {
			succeeded++
		}
	}
	if succeeded == 0 {
		fatalf(t, "no VirtualMachineInstanceMigration of a VM on a primary UDN succeeded in the VM scenarios")
	}
	sum := func(metric string) string {
		return fmt.Sprintf("sum(max_over_time(%s[3h]))", metric)
	}
	var got map[string]float64
	testenv.Eventually(recapTB{t}, time.Minute, "Prometheus counts every live migration in kvnet's histograms", func() error {
		got = map[string]float64{}
		for _, m := range []string{"kvnet_migration_target_wait_seconds_count", "kvnet_migration_switchover_seconds_count",
			`kvnet_migration_switchovers_total{trigger="first-frame"}`, "kvnet_migration_switchovers_total"} {
			v, err := prom.query(ctx, sum(m), "")
			if err != nil {
				return err
			}
			got[m] = v[""]
		}
		if got["kvnet_migration_target_wait_seconds_count"] != float64(succeeded) || got["kvnet_migration_switchovers_total"] != float64(succeeded) {
			return fmt.Errorf("%d migrations succeeded; Prometheus: %v", succeeded, got)
		}
		if got["kvnet_migration_switchover_seconds_count"] != got[`kvnet_migration_switchovers_total{trigger="first-frame"}`] {
			return fmt.Errorf("first-frame histogram and counter differ: %v", got)
		}
		return nil
	})
	t.Logf("Prometheus: %d migrations succeeded; kvnet's migration metrics at their largest per kvnet-node pod: %v", succeeded, got)
}
