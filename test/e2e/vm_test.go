package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kubevirtv1 "kvnet.io/kvnet/api/kubevirt/v1"
	udnv1 "kvnet.io/kvnet/api/udn/v1"
	"kvnet.io/kvnet/internal/k8s/manager"
	"kvnet.io/kvnet/internal/lab/cli/lab"
	"kvnet.io/kvnet/internal/lab/guest"
	"kvnet.io/kvnet/internal/lab/simlauncher"
	"kvnet.io/kvnet/internal/testenv"
)

// labClient is an admin client of the lab in dir.
func labClient(t testing.TB, dir string) client.Client {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", filepath.Join(dir, lab.KubeconfigFile))
	if err != nil {
		t.Fatal(err)
	}
	scheme, err := manager.NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// primaryNamespace makes namespace ns with the primary-UDN label.
func primaryNamespace(t testing.TB, c client.Client, ns string) {
	t.Helper()
	if err := c.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns,
		Labels: map[string]string{"k8s.ovn.org/primary-user-defined-network": ""}}}); err != nil {
		t.Fatal(err)
	}
}

// primaryUDN makes namespace ns with a primary Layer2 UDN with persistent
// IPs on subnet.
func primaryUDN(t testing.TB, c client.Client, ns, subnet string) {
	t.Helper()
	ctx := context.Background()
	primaryNamespace(t, c, ns)
	if err := c.Create(ctx, &udnv1.UserDefinedNetwork{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "net"},
		Spec: udnv1.UserDefinedNetworkSpec{Topology: udnv1.NetworkTopologyLayer2, Layer2: &udnv1.Layer2Config{
			Role: udnv1.NetworkRolePrimary, Subnets: udnv1.DualStackCIDRs{udnv1.CIDR(subnet)},
			IPAM: &udnv1.IPAMConfig{Lifecycle: udnv1.IPAMLifecyclePersistent}}},
	}); err != nil {
		t.Fatal(err)
	}
}

// l2bridgeVM is a VM on the namespace's primary UDN through l2bridge, as
// the docs write it.
func l2bridgeVM(ns, name string) *kubevirtv1.VirtualMachine {
	always := "Always"
	return &kubevirtv1.VirtualMachine{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: kubevirtv1.VirtualMachineSpec{RunStrategy: &always, Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{
			Spec: kubevirtv1.VirtualMachineInstanceSpec{
				Domain: kubevirtv1.DomainSpec{Devices: kubevirtv1.Devices{Interfaces: []kubevirtv1.Interface{
					{Name: "podnet", Binding: &kubevirtv1.PluginBinding{Name: "l2bridge"}}}}},
				Networks: []kubevirtv1.Network{{Name: "podnet", Pod: &kubevirtv1.PodNetwork{}}},
			},
		}},
	}
}

// leases returns every eth0 lease a VM's guests reported on the console,
// in order (one per boot).
func leases(t testing.TB, dir, ns, name string) []guest.Lease {
	t.Helper()
	b, err := os.ReadFile(simlauncher.ConsoleLog(lab.VMsDir(dir), ns, name))
	if err != nil {
		return nil
	}
	var out []guest.Lease
	for _, line := range strings.Split(string(b), "\n") {
		i := strings.Index(line, guest.LeasePrefix)
		if i < 0 {
			continue
		}
		if l, err := guest.ParseLease(line[i:]); err == nil && l.Iface == "eth0" {
			out = append(out, l)
		}
	}
	return out
}

// waitBoot waits until a VM's guests have reported n eth0 leases and
// returns the last.
func waitBoot(t testing.TB, dir, ns, name string, n int) guest.Lease {
	t.Helper()
	var ls []guest.Lease
	testenv.Eventually(t, 3*time.Minute, fmt.Sprintf("boot %d of %s/%s got its lease", n, ns, name), func() error {
		if ls = leases(t, dir, ns, name); len(ls) < n {
			return fmt.Errorf("%d lease(s) on the console", len(ls))
		}
		return nil
	})
	return ls[n-1]
}

// A VM's guest keeps its IP and MAC when the VM is stopped and started,
// and when the whole lab is restarted (make local-down && make local-up):
// each time a new guest boots and gets the same lease from kvnet-node.
func TestLabVMStopStartAndRestart(t *testing.T) {
	testenv.NeedsRoot(t)
	_, run := buildKvnet(t)
	dir := t.TempDir()
	showLabLogOnFailure(t, dir)
	run("up", "--dir", dir, "--nodes", "2")
	t.Cleanup(func() { run("down", "--dir", dir) })
	c := labClient(t, dir)
	ctx := context.Background()
	const ns = "e2e-vm"
	primaryUDN(t, c, ns, "10.50.0.0/24")
	vm := l2bridgeVM(ns, "vm-1")
	if err := c.Create(ctx, vm); err != nil {
		t.Fatal(err)
	}
	first := waitBoot(t, dir, ns, "vm-1", 1)
	if !netipPrefixIn(first.Addr.String(), "10.50.0.") || first.Router.String() != "10.50.0.1" {
		t.Fatalf("first lease %+v, want an address of 10.50.0.0/24 via 10.50.0.1", first)
	}

	// As `kubectl patch` does: a merge patch without a resourceVersion, so
	// the lab's own status writes to the VM cannot make it conflict.
	setRunStrategy := func(rs string) {
		t.Helper()
		patch := []byte(fmt.Sprintf(`{"spec":{"runStrategy":%q}}`, rs))
		if err := c.Patch(ctx, vm, client.RawPatch(types.MergePatchType, patch)); err != nil {
			t.Fatal(err)
		}
		if vm.Spec.RunStrategy == nil || *vm.Spec.RunStrategy != rs {
			t.Fatalf("after the patch the VM's runStrategy is %v, want %s", vm.Spec.RunStrategy, rs)
		}
	}
	setRunStrategy("Halted")
	testenv.Eventually(t, 2*time.Minute, "VMI gone", func() error {
		var vmi kubevirtv1.VirtualMachineInstance
		if err := c.Get(ctx, client.ObjectKeyFromObject(vm), &vmi); err == nil {
			return fmt.Errorf("VMI still there, phase %q", vmi.Status.Phase)
		}
		return nil
	})
	setRunStrategy("Always")
	second := waitBoot(t, dir, ns, "vm-1", 2)
	if second.Addr != first.Addr || second.MAC.String() != first.MAC.String() {
		t.Fatalf("after stop/start the guest got %s MAC %s, before %s MAC %s", second.Addr, second.MAC, first.Addr, first.MAC)
	}

	run("down", "--dir", dir)
	run("up", "--dir", dir, "--nodes", "2")
	third := waitBoot(t, dir, ns, "vm-1", 3)
	if third.Addr != first.Addr || third.MAC.String() != first.MAC.String() {
		t.Fatalf("after a lab restart the guest got %s MAC %s, before %s MAC %s", third.Addr, third.MAC, first.Addr, first.MAC)
	}
}

func netipPrefixIn(addr, prefix string) bool { return strings.HasPrefix(addr, prefix) }
