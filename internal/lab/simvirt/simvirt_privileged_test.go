package simvirt_test

// simvirt end to end on one machine: a real API server with kvnet-controller
// (IPAM, IPAMClaims, webhooks), three simulated nodes (internal/lab/simnet) each
// with a kvnet-node agent and a simulated kubelet running the real kvnet-cni,
// and simvirt starting, stopping and migrating a VM on a primary Layer2 UDN
// with persistent IPs. Traffic is checked with busybox ping. Needs root.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nadv1 "kvnet.io/kvnet/api/k8scni/v1"
	ipamclaimv1alpha1 "kvnet.io/kvnet/api/k8scni/v1alpha1"
	kubevirtv1 "kvnet.io/kvnet/api/kubevirt/v1"
	udnv1 "kvnet.io/kvnet/api/udn/v1"
	"kvnet.io/kvnet/internal/ipam"
	"kvnet.io/kvnet/internal/lab/simcluster"
	"kvnet.io/kvnet/internal/lab/simvirt"
	"kvnet.io/kvnet/internal/podnetworks"
	"kvnet.io/kvnet/internal/testenv"
	"kvnet.io/kvnet/internal/testenv/nstest"
)

var (
	env        *testenv.Env
	c          client.Client
	binDir     string // holds the kvnet-cni built for the test
	kubeconfig string
	apiAddr    string // the API server's host:port (on 127.0.0.1)
	tmpDir     string
)

func TestMain(m *testing.M) {
	if !testenv.Privileged() {
		// The unit tests still run; the privileged one skips.
		testenv.ReportPrivilegedNotRun("kvnet.io/kvnet/internal/lab/simvirt")
		os.Exit(m.Run())
	}
	os.Exit(testenv.WithFixture(testenv.FixtureOptions{Webhooks: true, Build: map[string]string{"kvnet-cni": "kvnet.io/kvnet/cmd/kvnet-cni"}}, func(fx *testenv.Fixture) int {
		env, c, tmpDir, kubeconfig, apiAddr, binDir = fx.Env, fx.Env.Client, fx.Dir, fx.Kubeconfig, fx.APIAddr, fx.BinDir
		return m.Run()
	}))
}

// waitTimeout bounds every wait for the lab to converge.
const waitTimeout = 60 * time.Second

// lab is the simulated cluster of internal/lab/simcluster, the one the
// lab runs: kvnet-node and a simulated kubelet on each node, and simvirt.
type lab struct{ *simcluster.Cluster }

func newLab(t *testing.T, names ...string) *lab {
	t.Helper()
	cl, err := simcluster.Start(context.Background(), simcluster.Config{
		Nodes:         names,
		Admin:         env.Config,
		APIAddr:       apiAddr,
		Agent:         env.Config,
		Resync:        5 * time.Second,
		StateDir:      filepath.Join(tmpDir, t.Name()),
		CNIBinDir:     filepath.Join(tmpDir, t.Name(), "cni-bin"),
		CNIBinary:     filepath.Join(binDir, "kvnet-cni"),
		CNIKubeconfig: kubeconfig,
		Kubelets:      true,
		Virt:          true,
		Log:           testr.New(t),
	})
	if cl != nil {
		t.Cleanup(func() {
			if err := cl.Close(); err != nil {
				t.Error(err)
			}
		})
	}
	if err != nil {
		t.Fatal(err)
	}
	return &lab{cl}
}

// podNetNS returns the name of the pod's network namespace.
func (l *lab) podNetNS(t *testing.T, pod *corev1.Pod) string {
	t.Helper()
	ns, err := l.PodNetNS(pod)
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Base(ns)
}

func get(o client.Object, ns, name string) error {
	return c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, o)
}

// launcherPods lists the namespace's launcher pods.
func launcherPods(t *testing.T, ns string) []corev1.Pod {
	t.Helper()
	var l corev1.PodList
	if err := c.List(context.Background(), &l, client.InNamespace(ns), client.MatchingLabels{kubevirtv1.AppLabel: kubevirtv1.VirtLauncherValue}); err != nil {
		t.Fatal(err)
	}
	return l.Items
}

// waitVMIRunning waits until VMI ns/name (other than UID notUID) runs with
// an address, and returns it.
func waitVMIRunning(t *testing.T, ns, name, notUID string) *kubevirtv1.VirtualMachineInstance {
	t.Helper()
	var vmi kubevirtv1.VirtualMachineInstance
	testenv.Eventually(t, waitTimeout, "VMI "+ns+"/"+name+" Running with an address", func() error {
		if err := get(&vmi, ns, name); err != nil {
			return err
		}
		if string(vmi.UID) == notUID {
			return errors.New("still the previous VMI")
		}
		if vmi.Status.Phase != simvirt.PhaseRunning || len(vmi.Status.Interfaces) != 1 || vmi.Status.Interfaces[0].IP == "" {
			return fmt.Errorf("phase %q, interfaces %+v, reason %q", vmi.Status.Phase, vmi.Status.Interfaces, vmi.Annotations[simvirt.FailureReasonAnnotation])
		}
		return nil
	})
	return &vmi
}

func setRunStrategy(t *testing.T, ns, name, rs string) {
	t.Helper()
	var vm kubevirtv1.VirtualMachine
	if err := get(&vm, ns, name); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(vm.DeepCopy())
	vm.Spec.RunStrategy = &rs
	if err := c.Patch(context.Background(), &vm, patch); err != nil {
		t.Fatal(err)
	}
}

func waitVMStatus(t *testing.T, ns, name string, want kubevirtv1.VirtualMachineStatus) {
	t.Helper()
	testenv.Eventually(t, waitTimeout, fmt.Sprintf("VM %s/%s status %+v", ns, name, want), func() error {
		var vm kubevirtv1.VirtualMachine
		if err := get(&vm, ns, name); err != nil {
			return err
		}
		if vm.Status != want {
			return fmt.Errorf("status %+v", vm.Status)
		}
		return nil
	})
}

// registerL2Bridge creates KubeVirt's CR, registering the l2bridge binding
// (managedTap), which VMs on a primary UDN use; without it virt-controller
// templates no pod. It is left for the tests that follow.
func registerL2Bridge(t *testing.T) {
	t.Helper()
	for _, o := range []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "kubevirt"}},
		&kubevirtv1.KubeVirt{
			ObjectMeta: metav1.ObjectMeta{Namespace: "kubevirt", Name: "kubevirt"},
			Spec: kubevirtv1.KubeVirtSpec{Configuration: kubevirtv1.KubeVirtConfiguration{NetworkConfiguration: &kubevirtv1.NetworkConfiguration{
				Binding: map[string]kubevirtv1.InterfaceBindingPlugin{"l2bridge": {DomainAttachmentType: "managedTap"}},
			}}},
		},
	} {
		if err := c.Create(context.Background(), o); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("create %T %s: %v", o, o.GetName(), err)
		}
	}
}

func TestVMLifecycle(t *testing.T) {
	testenv.NeedsRoot(t)
	if env == nil {
		t.Fatal("running as root, but TestMain did not set up the simulated cluster")
	}
	l := newLab(t, "n1", "n2", "n3")
	n1, n2, n3 := l.NodeName("n1"), l.NodeName("n2"), l.NodeName("n3")

	registerL2Bridge(t)
	const ns = "sv"
	subnet := netip.MustParsePrefix("10.50.0.0/24")
	testenv.Create(t, c, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns,
		Labels: map[string]string{"k8s.ovn.org/primary-user-defined-network": ""}}})
	testenv.Create(t, c, &udnv1.UserDefinedNetwork{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "udn"},
		Spec: udnv1.UserDefinedNetworkSpec{Topology: udnv1.NetworkTopologyLayer2, Layer2: &udnv1.Layer2Config{
			Role: udnv1.NetworkRolePrimary, Subnets: udnv1.DualStackCIDRs{udnv1.CIDR(subnet.String())},
			IPAM: &udnv1.IPAMConfig{Lifecycle: udnv1.IPAMLifecyclePersistent}}},
	})
	testenv.Eventually(t, waitTimeout, "NAD "+ns+"/udn", func() error { return get(&nadv1.NetworkAttachmentDefinition{}, ns, "udn") })

	// The peer, on the node the VM will not use.
	testenv.Create(t, c, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "peer"},
		Spec:       corev1.PodSpec{NodeName: n3, Containers: []corev1.Container{{Name: "c", Image: "busybox"}}},
	})
	var peer corev1.Pod
	testenv.Eventually(t, waitTimeout, "peer Running", func() error {
		if err := get(&peer, ns, "peer"); err != nil {
			return err
		}
		if peer.Status.Phase != corev1.PodRunning {
			return fmt.Errorf("phase %q", peer.Status.Phase)
		}
		return nil
	})
	peerNS := l.podNetNS(t, &peer)

	always := simvirt.RunStrategyAlways
	testenv.Create(t, c, &kubevirtv1.VirtualMachine{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "vm1"},
		Spec: kubevirtv1.VirtualMachineSpec{RunStrategy: &always, Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{
			Spec: kubevirtv1.VirtualMachineInstanceSpec{
				Domain: kubevirtv1.DomainSpec{Devices: kubevirtv1.Devices{Interfaces: []kubevirtv1.Interface{
					{Name: "default", Binding: &kubevirtv1.PluginBinding{Name: "l2bridge"}},
				}}},
				Networks: []kubevirtv1.Network{{Name: "default", Pod: &kubevirtv1.PodNetwork{}}},
			},
		}},
	})

	vmi := waitVMIRunning(t, ns, "vm1", "")
	addr := vmi.Status.Interfaces[0]
	ip := netip.MustParseAddr(addr.IP)
	if !subnet.Contains(ip) || addr.MAC == "" || addr.Name != "default" || addr.InfoSource != simvirt.InfoSource {
		t.Fatalf("VMI interface %+v: want an address in %s and a MAC", addr, subnet)
	}
	if vmi.Status.NodeName != n1 {
		t.Fatalf("VMI on %q, want %s (no launcher pods anywhere: the first node)", vmi.Status.NodeName, n1)
	}
	pods := launcherPods(t, ns)
	if len(pods) != 1 || pods[0].Spec.NodeName != n1 || vmi.Status.ActivePods[string(pods[0].UID)] != n1 {
		t.Fatalf("launcher pods %d (activePods %v)", len(pods), vmi.Status.ActivePods)
	}
	// kvnet's webhook put the claim on the pod, and the IPAM used it.
	src := pods[0]
	if got := src.Annotations[ipam.LegacyPrimaryClaimAnnotation]; got != "vm1.default" {
		t.Fatalf("launcher pod annotation %s = %q, want vm1.default (webhook)", ipam.LegacyPrimaryClaimAnnotation, got)
	}
	nets, err := podnetworks.Parse(src.Annotations[podnetworks.Annotation])
	if err != nil {
		t.Fatal(err)
	}
	if a := nets[ns+"/udn"]; a.IPAMClaim != "vm1.default" || a.MACAddress != addr.MAC {
		t.Fatalf("allocation %+v, VMI interface %+v", a, addr)
	}
	waitVMStatus(t, ns, "vm1", kubevirtv1.VirtualMachineStatus{PrintableStatus: "Running", Ready: true, Created: true})
	testenv.Eventually(t, waitTimeout, "peer pings the VM on "+n1, func() error { return nstest.Ping(peerNS, addr.IP) })

	t.Run("stop and start keep IP and MAC", func(t *testing.T) {
		setRunStrategy(t, ns, "vm1", simvirt.RunStrategyHalted)
		testenv.Eventually(t, waitTimeout, "VMI and launcher pod gone", func() error {
			err := get(&kubevirtv1.VirtualMachineInstance{}, ns, "vm1")
			if !apierrors.IsNotFound(err) {
				return fmt.Errorf("VMI still there (err %v)", err)
			}
			if n := len(launcherPods(t, ns)); n > 0 {
				return fmt.Errorf("%d launcher pods left", n)
			}
			return nil
		})
		waitVMStatus(t, ns, "vm1", kubevirtv1.VirtualMachineStatus{PrintableStatus: "Stopped"})
		var claim ipamclaimv1alpha1.IPAMClaim
		if err := get(&claim, ns, "vm1.default"); err != nil || len(claim.Status.IPs) != 1 || !strings.HasPrefix(claim.Status.IPs[0], addr.IP+"/") {
			t.Fatalf("IPAMClaim after stop: %+v (err %v)", claim.Status, err)
		}

		setRunStrategy(t, ns, "vm1", simvirt.RunStrategyAlways)
		again := waitVMIRunning(t, ns, "vm1", string(vmi.UID))
		if got := again.Status.Interfaces[0]; got.IP != addr.IP || got.MAC != addr.MAC {
			t.Fatalf("after restart %s/%s, before %s/%s", got.IP, got.MAC, addr.IP, addr.MAC)
		}
		vmi = again
		testenv.Eventually(t, waitTimeout, "peer pings the restarted VM", func() error { return nstest.Ping(peerNS, addr.IP) })
	})

	t.Run("launcher pod loss restarts the VM", func(t *testing.T) {
		pods := launcherPods(t, ns)
		if len(pods) != 1 {
			t.Fatalf("%d launcher pods", len(pods))
		}
		// Force deletion: the pod is gone at once, as when a node dies.
		if err := c.Delete(context.Background(), &pods[0], client.GracePeriodSeconds(0)); err != nil {
			t.Fatal(err)
		}
		again := waitVMIRunning(t, ns, "vm1", string(vmi.UID))
		if got := again.Status.Interfaces[0]; got.IP != addr.IP || got.MAC != addr.MAC {
			t.Fatalf("after the restart %s/%s, before %s/%s", got.IP, got.MAC, addr.IP, addr.MAC)
		}
		vmi = again
		testenv.Eventually(t, waitTimeout, "peer pings the VM started anew", func() error { return nstest.Ping(peerNS, addr.IP) })
	})

	t.Run("live migration", func(t *testing.T) {
		source := vmi.Status.NodeName
		target := n1 // the first node other than the source: none runs a launcher pod
		if source == n1 {
			target = n2
		}
		pods := launcherPods(t, ns)
		if len(pods) != 1 {
			t.Fatalf("%d launcher pods before migrating", len(pods))
		}
		srcPod := pods[0]
		testenv.Create(t, c, &kubevirtv1.VirtualMachineInstanceMigration{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "mig1"},
			Spec:       kubevirtv1.VirtualMachineInstanceMigrationSpec{VMIName: "vm1"},
		})
		testenv.Eventually(t, waitTimeout, "migration Succeeded", func() error {
			var m kubevirtv1.VirtualMachineInstanceMigration
			if err := get(&m, ns, "mig1"); err != nil {
				return err
			}
			if m.Status.Phase == simvirt.PhaseFailed {
				t.Fatalf("migration failed: %s", m.Annotations[simvirt.FailureReasonAnnotation])
			}
			if m.Status.Phase != simvirt.PhaseSucceeded {
				return fmt.Errorf("phase %q", m.Status.Phase)
			}
			return nil
		})
		var moved kubevirtv1.VirtualMachineInstance
		if err := get(&moved, ns, "vm1"); err != nil {
			t.Fatal(err)
		}
		ms := moved.Status.MigrationState
		if moved.Status.NodeName != target || ms == nil || !ms.Completed ||
			ms.SourceNode != source || ms.SourcePod != srcPod.Name || ms.TargetNode != target {
			t.Fatalf("after migration: node %q (from %s), migrationState %+v", moved.Status.NodeName, source, ms)
		}
		if got := moved.Status.Interfaces[0]; got.IP != addr.IP || got.MAC != addr.MAC {
			t.Fatalf("after migration %s/%s, before %s/%s", got.IP, got.MAC, addr.IP, addr.MAC)
		}
		testenv.Eventually(t, waitTimeout, "source launcher pod deleted", func() error {
			if err := get(&corev1.Pod{}, ns, srcPod.Name); !apierrors.IsNotFound(err) {
				return fmt.Errorf("source pod %s still there (err %v)", srcPod.Name, err)
			}
			return nil
		})
		pods = launcherPods(t, ns)
		if len(pods) != 1 || pods[0].Name != ms.TargetPod || pods[0].Spec.NodeName != target || pods[0].Labels[simvirt.MigrationJobUIDLabel] == "" {
			t.Fatalf("launcher pods after migration: %d (target %s)", len(pods), ms.TargetPod)
		}
		testenv.Eventually(t, waitTimeout, "peer pings the VM on "+target, func() error { return nstest.Ping(peerNS, addr.IP) })
	})
}

// VMIs with bindings the lab cannot run fail with the reason, and get no
// launcher pod; a VM (Always) of one keeps its failed VMI instead of
// starting VMIs in a loop.
func TestUnsupportedBindings(t *testing.T) {
	testenv.NeedsRoot(t)
	if env == nil {
		t.Fatal("running as root, but TestMain did not set up the simulated cluster")
	}
	newLab(t, "n1")
	registerL2Bridge(t)
	const ns = "svbind"
	testenv.Create(t, c, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	spec := func(iface kubevirtv1.Interface) kubevirtv1.VirtualMachineInstanceSpec {
		iface.Name = "default"
		return kubevirtv1.VirtualMachineInstanceSpec{
			Domain:   kubevirtv1.DomainSpec{Devices: kubevirtv1.Devices{Interfaces: []kubevirtv1.Interface{iface}}},
			Networks: []kubevirtv1.Network{{Name: "default", Pod: &kubevirtv1.PodNetwork{}}},
		}
	}
	always := simvirt.RunStrategyAlways
	testenv.Create(t, c, &kubevirtv1.VirtualMachine{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "passt"},
		Spec: kubevirtv1.VirtualMachineSpec{RunStrategy: &always, Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{
			Spec: spec(kubevirtv1.Interface{PasstBinding: &kubevirtv1.InterfacePasstBinding{}}),
		}},
	})
	testenv.Create(t, c, &kubevirtv1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "foo"},
		Spec:       spec(kubevirtv1.Interface{Binding: &kubevirtv1.PluginBinding{Name: "foo"}}),
	})

	failed := func(name, want string) *kubevirtv1.VirtualMachineInstance {
		t.Helper()
		var vmi kubevirtv1.VirtualMachineInstance
		testenv.Eventually(t, waitTimeout, "VMI "+ns+"/"+name+" Failed", func() error {
			if err := get(&vmi, ns, name); err != nil {
				return err
			}
			if vmi.Status.Phase != simvirt.PhaseFailed {
				return fmt.Errorf("phase %q, reason %q", vmi.Status.Phase, vmi.Annotations[simvirt.FailureReasonAnnotation])
			}
			return nil
		})
		if got := vmi.Annotations[simvirt.FailureReasonAnnotation]; got != want {
			t.Errorf("VMI %s reason\n %q\nwant %q", name, got, want)
		}
		// The condition, as the API server keeps it (status.conditions is
		// not a typed field).
		var conds struct {
			Status struct {
				Conditions []map[string]any `json:"conditions"`
			} `json:"status"`
		}
		raw, err := json.Marshal(&vmi)
		if err == nil {
			err = json.Unmarshal(raw, &conds)
		}
		if err != nil {
			t.Fatal(err)
		}
		if cs := conds.Status.Conditions; len(cs) != 1 || cs[0]["type"] != simvirt.ConditionSynchronized || cs[0]["status"] != "False" ||
			cs[0]["reason"] != simvirt.ReasonUnsupportedBinding || cs[0]["message"] != want || cs[0]["lastTransitionTime"] == nil {
			t.Errorf("VMI %s conditions %v", name, cs)
		}
		return &vmi
	}
	const runs = "(it runs bridge, masquerade and managedTap binding plugins)"
	passt := failed("passt", `interface "default": binding "passtBinding": the lab cannot run this binding `+runs)
	failed("foo", `interface "default": binding plugin "foo" is not registered in the KubeVirt CR (spec.configuration.network.binding)`)
	waitVMStatus(t, ns, "passt", kubevirtv1.VirtualMachineStatus{PrintableStatus: "CrashLoopBackOff", Created: true})

	// A while later: still the same failed VMI, and never a launcher pod.
	time.Sleep(3 * time.Second)
	var again kubevirtv1.VirtualMachineInstance
	if err := get(&again, ns, "passt"); err != nil || again.UID != passt.UID || again.DeletionTimestamp != nil {
		t.Fatalf("the VM's failed VMI was replaced or is being deleted (err %v)", err)
	}
	if pods := launcherPods(t, ns); len(pods) != 0 {
		t.Fatalf("%d launcher pods, want none (first %s)", len(pods), pods[0].Name)
	}
	var vm kubevirtv1.VirtualMachine
	if err := get(&vm, ns, "passt"); err != nil || !strings.Contains(vm.Annotations[simvirt.FailureReasonAnnotation], `binding "passtBinding"`) {
		t.Fatalf("VM reason %q (err %v)", vm.Annotations[simvirt.FailureReasonAnnotation], err)
	}
}
