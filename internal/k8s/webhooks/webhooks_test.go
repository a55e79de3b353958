package webhooks_test

// Webhook tests on the real apiserver: the webhook configuration kvnet
// ships is installed (pointing at the controller on 127.0.0.1, with the
// caBundle kvnet patches itself), so every request goes through admission,
// and kube-controller-manager's garbage collector runs, so owner references
// act as in a cluster.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	nadv1 "kvnet.io/kvnet/api/k8scni/v1"
	kubevirtv1 "kvnet.io/kvnet/api/kubevirt/v1"
	udnv1 "kvnet.io/kvnet/api/udn/v1"
	macpoolctl "kvnet.io/kvnet/internal/k8s/controllers/macpool"
	"kvnet.io/kvnet/internal/k8s/manager"
	"kvnet.io/kvnet/internal/kubevirt/launcher"
	"kvnet.io/kvnet/internal/multus"
	"kvnet.io/kvnet/internal/testenv"
)

var (
	env *testenv.Env
	c   client.Client
	ctl *testenv.Controller
)

// timeout bounds every wait for the system to converge.
const timeout = 30 * time.Second

func TestMain(m *testing.M) {
	os.Exit(testenv.Main(m, testenv.Options{}, func(e *testenv.Env) (manager.Options, error) {
		c = e.Client
		return e.WebhookOptions(context.Background())
	}, &env, &ctl))
}

func create(t testing.TB, o client.Object) {
	t.Helper()
	testenv.Create(t, c, o)
}

func mkNS(t testing.TB, name string, labels map[string]string) {
	t.Helper()
	create(t, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}})
}

func mkUDN(t testing.TB, ns, name string, role udnv1.NetworkRole, subnet udnv1.CIDR) {
	t.Helper()
	create(t, &udnv1.UserDefinedNetwork{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: udnv1.UserDefinedNetworkSpec{Topology: udnv1.NetworkTopologyLayer2, Layer2: &udnv1.Layer2Config{
			Role: role, Subnets: udnv1.DualStackCIDRs{subnet}, IPAM: &udnv1.IPAMConfig{Lifecycle: udnv1.IPAMLifecyclePersistent},
		}},
	})
	testenv.Eventually(t, timeout, "NAD "+ns+"/"+name, func() error {
		return c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &nadv1.NetworkAttachmentDefinition{})
	})
}

func launcherPod(ns, vmi string, annotations map[string]string) *corev1.Pod {
	ann := map[string]string{kubevirtv1.DomainAnnotation: vmi}
	for k, v := range annotations {
		ann[k] = v
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, GenerateName: "virt-launcher-" + vmi + "-", Annotations: ann,
			Labels: map[string]string{kubevirtv1.AppLabel: kubevirtv1.VirtLauncherValue, kubevirtv1.VMNameLabel: vmi}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "compute", Image: "virt-launcher"}}},
	}
}

func TestLauncherPodSecondary(t *testing.T) {
	mkNS(t, "lp-sec", nil)
	mkUDN(t, "lp-sec", "blue", udnv1.NetworkRoleSecondary, "192.168.10.0/24")
	vmi := blueVMI("lp-sec", "02:aa:00:00:00:01")
	create(t, vmi)
	// The annotations a virt-controller would template.
	ann, err := launcher.Annotations(vmi, nil)
	if err != nil {
		t.Fatal(err)
	}
	pod := launcherPod("lp-sec", "vm1", ann)
	create(t, pod)
	elems, err := multus.ParseSelection(multus.NetworksAnnotation, pod.Annotations[multus.NetworksAnnotation], "lp-sec")
	if err != nil {
		t.Fatal(err)
	}
	if len(elems) != 1 || elems[0].IPAMClaimReference != "vm1.blue-net" || elems[0].MacRequest != "02:aa:00:00:00:01" || elems[0].InterfaceRequest != launcher.PodInterfaceName("blue-net") {
		t.Fatalf("networks annotation after admission: %+v", elems)
	}
	if _, ok := pod.Annotations[multus.DefaultNetworkAnnotation]; ok {
		t.Fatal("default-network set for a VM without a primary UDN")
	}
}

// blueVMI is VMI vm1 in ns: masquerade on the pod network and a bridge
// interface (MAC mac, if set) on the secondary network of NAD "blue".
func blueVMI(ns, mac string) *kubevirtv1.VirtualMachineInstance {
	return &kubevirtv1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "vm1"},
		Spec: kubevirtv1.VirtualMachineInstanceSpec{
			Domain: kubevirtv1.DomainSpec{Devices: kubevirtv1.Devices{Interfaces: []kubevirtv1.Interface{
				{Name: "default", Masquerade: &kubevirtv1.InterfaceMasquerade{}},
				{Name: "blue-net", Bridge: &kubevirtv1.InterfaceBridge{}, MacAddress: mac},
			}}},
			Networks: []kubevirtv1.Network{
				{Name: "default", Pod: &kubevirtv1.PodNetwork{}},
				{Name: "blue-net", Multus: &kubevirtv1.MultusNetwork{NetworkName: "blue"}},
			},
		},
	}
}

func primaryVMI(ns, name, mac string, addresses string) *kubevirtv1.VirtualMachineInstance {
	vmi := &kubevirtv1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: kubevirtv1.VirtualMachineInstanceSpec{
			Domain: kubevirtv1.DomainSpec{Devices: kubevirtv1.Devices{Interfaces: []kubevirtv1.Interface{
				{Name: "podnet", Binding: &kubevirtv1.PluginBinding{Name: "l2bridge"}, MacAddress: mac},
			}}},
			Networks: []kubevirtv1.Network{{Name: "podnet", Pod: &kubevirtv1.PodNetwork{}}},
		},
	}
	if addresses != "" {
		vmi.Annotations = map[string]string{kubevirtv1.AddressesAnnotation: addresses}
	}
	return vmi
}

func TestLauncherPodPrimary(t *testing.T) {
	mkNS(t, "lp-prim", map[string]string{"k8s.ovn.org/primary-user-defined-network": ""})
	mkUDN(t, "lp-prim", "tenant", udnv1.NetworkRolePrimary, "10.100.0.0/16")
	create(t, primaryVMI("lp-prim", "vm2", "02:bb:00:00:00:02", `{"podnet":["10.100.0.50"]}`))
	pod := launcherPod("lp-prim", "vm2", nil)
	create(t, pod)
	if got := pod.Annotations["k8s.ovn.org/primary-udn-ipamclaim"]; got != "vm2.podnet" {
		t.Fatalf("legacy claim annotation %q", got)
	}
	var elems []multus.NetworkSelectionElement
	if err := json.Unmarshal([]byte(pod.Annotations[multus.DefaultNetworkAnnotation]), &elems); err != nil {
		t.Fatalf("default-network %q: %v", pod.Annotations[multus.DefaultNetworkAnnotation], err)
	}
	want := multus.NetworkSelectionElement{Name: "default", Namespace: "ovn-kubernetes", IPAMClaimReference: "vm2.podnet", MacRequest: "02:bb:00:00:00:02", IPRequest: []string{"10.100.0.50/16"}}
	if len(elems) != 1 || fmt.Sprint(elems[0]) != fmt.Sprint(want) {
		t.Fatalf("default-network element %+v, want %+v", elems, want)
	}

	// An update of an admitted pod is allowed: only a CREATE that already
	// names a default network is refused.
	before := pod.DeepCopy()
	pod.Labels["updated"] = "yes"
	if err := c.Patch(context.Background(), pod, client.MergeFrom(before)); err != nil {
		t.Fatalf("update of an admitted launcher pod: %v", err)
	}
	// A launcher pod that already names a default network is refused.
	create(t, primaryVMI("lp-prim", "vm3", "", ""))
	err := c.Create(context.Background(), launcherPod("lp-prim", "vm3", map[string]string{multus.DefaultNetworkAnnotation: "other"}))
	if err == nil || !strings.Contains(err.Error(), "pod already has annotation v1.multus-cni.io/default-network") {
		t.Fatalf("err = %v, want the default-network denial", err)
	}
	// A requested IP outside the network is refused, naming it.
	create(t, primaryVMI("lp-prim", "vm4", "", `{"podnet":["192.0.2.1"]}`))
	err = c.Create(context.Background(), launcherPod("lp-prim", "vm4", nil))
	if err == nil || !strings.Contains(err.Error(), "192.0.2.1 is not in the network's subnets") {
		t.Fatalf("err = %v, want the address denial", err)
	}
}

// A launcher pod in a namespace labelled for a primary UDN whose NAD does
// not exist yet (manifests applied together: namespace, UDN, VM) is
// refused until the NAD exists; admitted without the claim reference, the
// VM's IP would not persist.
func TestLauncherPodWaitsForPrimaryNAD(t *testing.T) {
	const ns = "lp-early"
	mkNS(t, ns, map[string]string{"k8s.ovn.org/primary-user-defined-network": ""})
	create(t, primaryVMI(ns, "vm1", "", ""))
	err := c.Create(context.Background(), launcherPod(ns, "vm1", nil))
	if err == nil || !strings.Contains(err.Error(), "namespace lp-early is labelled k8s.ovn.org/primary-user-defined-network but has no primary network yet") {
		t.Fatalf("err = %v, want the no-primary-network denial", err)
	}
	mkUDN(t, ns, "tenant", udnv1.NetworkRolePrimary, "10.101.0.0/16")
	pod := launcherPod(ns, "vm1", nil)
	testenv.Eventually(t, timeout, "launcher pod admitted once the NAD exists", func() error {
		return c.Create(context.Background(), pod)
	})
	if got := pod.Annotations["k8s.ovn.org/primary-udn-ipamclaim"]; got != "vm1.podnet" {
		t.Fatalf("legacy claim annotation %q, want vm1.podnet", got)
	}
}

// A launcher pod of a VM on a network whose NAD has a subnet kvnet cannot
// parse is denied, naming the NAD, the field and the value.
func TestLauncherPodBadSubnetDenied(t *testing.T) {
	mkNS(t, "lp-bad", nil)
	create(t, &nadv1.NetworkAttachmentDefinition{
		ObjectMeta: metav1.ObjectMeta{Namespace: "lp-bad", Name: "broken"},
		Spec: nadv1.NetworkAttachmentDefinitionSpec{Config: `{"cniVersion":"1.1.0","type":"kvnet-cni","name":"lp-bad_broken",` +
			`"topology":"layer2","role":"secondary","allowPersistentIPs":true,"subnets":"10.1.0.0/33","netAttachDefName":"lp-bad/broken"}`},
	})
	create(t, &kubevirtv1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{Namespace: "lp-bad", Name: "vm1"},
		Spec: kubevirtv1.VirtualMachineInstanceSpec{
			Domain:   kubevirtv1.DomainSpec{Devices: kubevirtv1.Devices{Interfaces: []kubevirtv1.Interface{{Name: "sec", Bridge: &kubevirtv1.InterfaceBridge{}}}}},
			Networks: []kubevirtv1.Network{{Name: "sec", Multus: &kubevirtv1.MultusNetwork{NetworkName: "broken"}}},
		},
	})
	err := c.Create(context.Background(), launcherPod("lp-bad", "vm1", nil))
	for _, want := range []string{"NAD lp-bad/broken", `"subnets" value "10.1.0.0/33"`} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("err = %v, want a denial naming %s", err, want)
		}
	}
}

// A VM on a Layer3 primary network (subnets "<cidr>/<hostSubnet>", no
// persistent IPs) gets no claim; its launcher pod is admitted unchanged.
func TestLauncherPodLayer3Primary(t *testing.T) {
	mkNS(t, "lp-l3", map[string]string{"k8s.ovn.org/primary-user-defined-network": ""})
	create(t, &udnv1.UserDefinedNetwork{
		ObjectMeta: metav1.ObjectMeta{Namespace: "lp-l3", Name: "tenant"},
		Spec: udnv1.UserDefinedNetworkSpec{Topology: udnv1.NetworkTopologyLayer3, Layer3: &udnv1.Layer3Config{
			Role: udnv1.NetworkRolePrimary, Subnets: []udnv1.Layer3Subnet{{CIDR: "10.104.0.0/16", HostSubnet: 24}},
		}},
	})
	testenv.Eventually(t, timeout, "NAD lp-l3/tenant", func() error {
		return c.Get(context.Background(), client.ObjectKey{Namespace: "lp-l3", Name: "tenant"}, &nadv1.NetworkAttachmentDefinition{})
	})
	create(t, primaryVMI("lp-l3", "vm1", "02:bb:00:00:00:05", ""))
	pod := launcherPod("lp-l3", "vm1", nil)
	create(t, pod)
	if len(pod.Annotations) != 1 {
		t.Fatalf("launcher pod on a Layer3 primary network mutated: %v", pod.Annotations)
	}
}

func TestNonVMPodsUntouched(t *testing.T) {
	mkNS(t, "lp-plain", map[string]string{"k8s.ovn.org/primary-user-defined-network": ""})
	mkUDN(t, "lp-plain", "tenant", udnv1.NetworkRolePrimary, "10.101.0.0/16")
	plain := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "lp-plain", Name: "web", Annotations: map[string]string{multus.DefaultNetworkAnnotation: "x"}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "nginx"}}},
	}
	create(t, plain)
	if len(plain.Annotations) != 1 || plain.Annotations[multus.DefaultNetworkAnnotation] != "x" {
		t.Fatalf("non-VM pod mutated: %v", plain.Annotations)
	}
	// Labelled virt-launcher but without a domain: allowed as is.
	p := launcherPod("lp-plain", "x", nil)
	delete(p.Annotations, kubevirtv1.DomainAnnotation)
	create(t, p)
	if len(p.Annotations) != 0 {
		t.Fatalf("pod without domain mutated: %v", p.Annotations)
	}
}

func vm(ns, name string, ifaces ...kubevirtv1.Interface) *kubevirtv1.VirtualMachine {
	var nets []kubevirtv1.Network
	for _, i := range ifaces {
		if i.Masquerade != nil {
			nets = append(nets, kubevirtv1.Network{Name: i.Name, Pod: &kubevirtv1.PodNetwork{}})
		} else {
			nets = append(nets, kubevirtv1.Network{Name: i.Name, Multus: &kubevirtv1.MultusNetwork{NetworkName: "blue"}})
		}
	}
	halted := "Halted"
	return &kubevirtv1.VirtualMachine{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: kubevirtv1.VirtualMachineSpec{RunStrategy: &halted, Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{
			Spec: kubevirtv1.VirtualMachineInstanceSpec{Domain: kubevirtv1.DomainSpec{Devices: kubevirtv1.Devices{Interfaces: ifaces}}, Networks: nets},
		}},
	}
}

func masq() kubevirtv1.Interface {
	return kubevirtv1.Interface{Name: "default", Masquerade: &kubevirtv1.InterfaceMasquerade{}}
}

func bridge(name, mac string) kubevirtv1.Interface {
	return kubevirtv1.Interface{Name: name, Bridge: &kubevirtv1.InterfaceBridge{}, MacAddress: mac}
}

func macs(v *kubevirtv1.VirtualMachine) []string {
	var out []string
	for _, i := range v.Spec.Template.Spec.Domain.Devices.Interfaces {
		out = append(out, i.MacAddress)
	}
	return out
}

func TestMACPoolThousandVMs(t *testing.T) {
	mkNS(t, "mac-many", nil)
	const n = 1000
	var mu sync.Mutex
	seen := map[string]string{}
	var wg sync.WaitGroup
	sem := make(chan struct{}, 32)
	for i := range n {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			v := vm("mac-many", fmt.Sprintf("vm-%04d", i), masq(), bridge("sec", ""))
			if err := c.Create(context.Background(), v); err != nil {
				t.Errorf("create %s: %v", v.Name, err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			for _, m := range macs(v) {
				hw, err := net.ParseMAC(m)
				if err != nil || hw[0]&1 != 0 || m == "02:00:00:00:00:00" {
					t.Errorf("VM %s got MAC %q", v.Name, m)
				}
				if other, dup := seen[m]; dup {
					t.Errorf("MAC %s given to %s and %s", m, other, v.Name)
				}
				seen[m] = v.Name
			}
		})
	}
	wg.Wait()
	if len(seen) != 2*n {
		t.Fatalf("%d unique MACs for %d interfaces", len(seen), 2*n)
	}
}

func TestMACPoolConflictsRestartAndUpdates(t *testing.T) {
	ctx := context.Background()
	mkNS(t, "mac-conf", nil)
	a := vm("mac-conf", "vm-a", masq(), bridge("sec", "02:00:00:00:aa:01"))
	create(t, a)
	if got := macs(a); got[1] != "02:00:00:00:aa:01" || got[0] == "" {
		t.Fatalf("VM a MACs %v", got)
	}
	if a.Annotations["kubemacpool.io/transaction-timestamp"] == "" {
		t.Error("no transaction annotation")
	}
	const msg = `MAC 02:00:00:00:aa:01 of interface "sec" is already used by VM mac-conf/vm-a`
	err := c.Create(ctx, vm("mac-conf", "vm-b", bridge("sec", "02:00:00:00:AA:01")))
	if err == nil || !strings.Contains(err.Error(), msg) {
		t.Fatalf("err = %v, want %q", err, msg)
	}
	// A dry run (kubectl apply --dry-run=server) says so too, and
	// reserves nothing.
	err = c.Create(ctx, vm("mac-conf", "vm-b", bridge("sec", "02:00:00:00:AA:01")), client.DryRunAll)
	if err == nil || !strings.Contains(err.Error(), msg) {
		t.Fatalf("dry run: err = %v, want %q", err, msg)
	}
	if err := c.Create(ctx, vm("mac-conf", "vm-dry", bridge("sec", "02:00:00:00:aa:02")), client.DryRunAll); err != nil {
		t.Fatalf("dry run with a free MAC: %v", err)
	}
	var dry coordinationv1.Lease
	free, _ := net.ParseMAC("02:00:00:00:aa:02")
	if err := c.Get(ctx, client.ObjectKey{Namespace: "kvnet-system", Name: macpoolctl.ReservationName(free)}, &dry); !apierrors.IsNotFound(err) {
		t.Fatalf("a dry run reserved 02:00:00:00:aa:02: %v", err)
	}
	// An update keeps the VM's MACs.
	keep := macs(a)
	a.Spec.Template.Spec.Hostname = "renamed"
	if err := c.Update(ctx, a); err != nil {
		t.Fatal(err)
	}
	if got := macs(a); fmt.Sprint(got) != fmt.Sprint(keep) {
		t.Fatalf("MACs changed on update: %v -> %v", keep, got)
	}

	// Restart: the pool is rebuilt from VMs, so the conflict still shows.
	ctl.Restart(t)
	testenv.Eventually(t, timeout, "conflict after restart", func() error {
		err := c.Create(ctx, vm("mac-conf", "vm-c", bridge("sec", keep[0])))
		if err == nil {
			return fmt.Errorf("VM with a taken MAC %s admitted after restart", keep[0])
		}
		if !strings.Contains(err.Error(), "is already used by VM mac-conf/vm-a") {
			return err
		}
		return nil
	})

	// Deleting the VM releases its MACs.
	if err := c.Delete(ctx, a); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, timeout, "MAC released", func() error {
		d := vm("mac-conf", fmt.Sprintf("vm-d-%d", time.Now().UnixNano()), bridge("sec", "02:00:00:00:aa:01"))
		return c.Create(ctx, d)
	})
}

func TestMACPoolRangeReload(t *testing.T) {
	ctx := context.Background()
	mkNS(t, "mac-range", nil)
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: "kvnet-system", Name: "kvnet-mac-range-config"},
		Data:       map[string]string{"RANGE_START": "0a:bc:00:00:00:00", "RANGE_END": "0a:bc:00:00:00:ff"},
	}
	create(t, cm)
	testenv.Eventually(t, timeout, "new range used", func() error {
		v := vm("mac-range", fmt.Sprintf("vm-%d", time.Now().UnixNano()), masq())
		if err := c.Create(ctx, v); err != nil {
			return err
		}
		if m := macs(v)[0]; !strings.HasPrefix(m, "0a:bc:00:00:00:") {
			return fmt.Errorf("MAC %s outside the reloaded range", m)
		}
		return nil
	})
	// A bad range is refused and the good one kept.
	cm.Data = map[string]string{"RANGE_START": "0a:bc:00:00:00:ff", "RANGE_END": "0a:bc:00:00:00:00"}
	if err := c.Update(ctx, cm); err != nil {
		t.Fatal(err)
	}
	// The controller has processed this very update once it reported it:
	// the event's object reference carries the update's resourceVersion.
	testenv.Eventually(t, timeout, "InvalidMACRange event for the bad range", func() error {
		var evs corev1.EventList
		if err := c.List(ctx, &evs, client.InNamespace(cm.Namespace)); err != nil {
			return err
		}
		var seen []string
		for _, e := range evs.Items {
			o := e.InvolvedObject
			if e.Reason != "InvalidMACRange" {
				continue
			}
			if e.Type == corev1.EventTypeWarning && o.Kind == "ConfigMap" && o.Namespace == cm.Namespace && o.Name == cm.Name &&
				o.UID == cm.UID && o.ResourceVersion == cm.ResourceVersion && strings.Contains(e.Message, "is after range end") {
				return nil
			}
			seen = append(seen, fmt.Sprintf("%s %s %s/%s/%s rv %s: %s", e.Type, e.Reason, o.Kind, o.Namespace, o.Name, o.ResourceVersion, e.Message))
		}
		return fmt.Errorf("no Warning InvalidMACRange event on ConfigMap %s/%s at resourceVersion %s; seen %v", cm.Namespace, cm.Name, cm.ResourceVersion, seen)
	})
	v := vm("mac-range", "after-bad", masq())
	create(t, v)
	if m := macs(v)[0]; !strings.HasPrefix(m, "0a:bc:00:00:00:") {
		t.Fatalf("after a bad range update got %s", m)
	}
	_ = c.Delete(ctx, cm)
}

func TestMACPoolOptOut(t *testing.T) {
	mkNS(t, "mac-ignored", map[string]string{"mutatevirtualmachines.kubemacpool.io": "ignore"})
	v := vm("mac-ignored", "vm", masq(), bridge("sec", ""))
	create(t, v)
	if got := macs(v); got[0] != "" || got[1] != "" {
		t.Fatalf("opted-out namespace got MACs %v", got)
	}
	if _, ok := v.Annotations["kubemacpool.io/transaction-timestamp"]; ok {
		t.Fatal("opted-out VM annotated")
	}
}

// BenchmarkAdmission50ConcurrentVMs creates 50 VMs at once through the MAC
// pool webhook, b.N times (run it with -benchtime=10x for 500 samples).
func BenchmarkAdmission50ConcurrentVMs(b *testing.B) {
	ns := fmt.Sprintf("bench-vm-%d", time.Now().UnixNano())
	mkNS(b, ns, nil)
	benchAdmission(b, "virtualmachine", func(iter, i int) client.Object {
		return vm(ns, fmt.Sprintf("vm-%d-%d", iter, i), masq(), bridge("sec", ""))
	})
}

// BenchmarkAdmission50ConcurrentLauncherPods creates 50 launcher pods at
// once through the launcher-pod webhook (primary UDN with persistent IPs,
// the webhook's longest path: VMI read, default-network element, IPs).
func BenchmarkAdmission50ConcurrentLauncherPods(b *testing.B) {
	ns := fmt.Sprintf("bench-lp-%d", time.Now().UnixNano())
	mkNS(b, ns, map[string]string{"k8s.ovn.org/primary-user-defined-network": ""})
	mkUDN(b, ns, "tenant", udnv1.NetworkRolePrimary, "10.103.0.0/16")
	for i := range 50 {
		create(b, primaryVMI(ns, fmt.Sprintf("vm-%d", i), fmt.Sprintf("02:bb:00:00:01:%02x", i), ""))
	}
	benchAdmission(b, "launcher-pod", func(iter, i int) client.Object {
		return launcherPod(ns, fmt.Sprintf("vm-%d", i), nil)
	})
}

// benchAdmission creates 50 objects concurrently, b.N times, and reports
// the p50 and p99 of the create calls as the client sees them (API server,
// etcd and webhook) and the webhook's own mean time per admission, read
// from its kvnet_webhook_admission_duration_seconds histogram (the
// controller runs in this process).
func benchAdmission(b *testing.B, webhook string, obj func(iter, i int) client.Object) {
	ctx := context.Background()
	sum0, n0 := histogram(b, webhook)
	var lat []time.Duration
	b.ResetTimer()
	for iter := range b.N {
		var mu sync.Mutex
		var wg sync.WaitGroup
		for i := range 50 {
			wg.Go(func() {
				o := obj(iter, i)
				start := time.Now()
				if err := c.Create(ctx, o); err != nil {
					b.Error(err)
				}
				d := time.Since(start)
				mu.Lock()
				lat = append(lat, d)
				mu.Unlock()
			})
		}
		wg.Wait()
	}
	b.StopTimer()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
	if sum1, n1 := histogram(b, webhook); n1 > n0 {
		b.ReportMetric((sum1-sum0)/float64(n1-n0)*1000, "webhook-mean-ms")
	}
}

// histogram returns the sum and count of the admission histogram of one
// webhook.
func histogram(b *testing.B, webhook string) (sum float64, count uint64) {
	families, err := metrics.Registry.Gather()
	if err != nil {
		b.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != "kvnet_webhook_admission_duration_seconds" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "webhook" && l.GetValue() == webhook {
					return m.GetHistogram().GetSampleSum(), m.GetHistogram().GetSampleCount()
				}
			}
		}
	}
	return 0, 0
}

func TestMACPoolAbandonedAdmissionReleased(t *testing.T) {
	ctx := context.Background()
	mkNS(t, "mac-abandon", nil)
	// A policy that refuses some VMs after kvnet's webhook admitted them:
	// the MAC was taken for a VM that never reaches the API.
	create(t, &admissionregistrationv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "deny-doomed-vms"},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
				RuleWithOperations: admissionregistrationv1.RuleWithOperations{
					Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
					Rule:       admissionregistrationv1.Rule{APIGroups: []string{"kubevirt.io"}, APIVersions: []string{"v1"}, Resources: []string{"virtualmachines"}},
				},
			}}},
			Validations: []admissionregistrationv1.Validation{{Expression: "!object.metadata.name.startsWith('doomed')", Message: "doomed"}},
		},
	})
	create(t, &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "deny-doomed-vms"},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName: "deny-doomed-vms", ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny},
			MatchResources: &admissionregistrationv1.MatchResources{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": "mac-abandon"}}},
		},
	})
	// Wait until the policy is in force, with VMs that hold no chosen MAC
	// (one admitted before that is deleted again).
	testenv.Eventually(t, timeout, "policy denies", func() error {
		probe := vm("mac-abandon", fmt.Sprintf("doomed-probe-%d", time.Now().UnixNano()), masq())
		err := c.Create(ctx, probe)
		if err == nil {
			_ = c.Delete(ctx, probe)
			return errors.New("policy not in force yet")
		}
		if !strings.Contains(err.Error(), "deny-doomed-vms") {
			return err
		}
		return nil
	})
	err := c.Create(ctx, vm("mac-abandon", "doomed-1", bridge("sec", "02:00:00:00:dd:01")))
	if err == nil || !strings.Contains(err.Error(), "deny-doomed-vms") {
		t.Fatalf("doomed VM: err = %v, want the policy's denial", err)
	}
	// The MAC is held by the doomed VM's admission for a while, then freed.
	testenv.Eventually(t, timeout, "abandoned MAC released", func() error {
		return c.Create(ctx, vm("mac-abandon", fmt.Sprintf("ok-%d", time.Now().UnixNano()), bridge("sec", "02:00:00:00:dd:01")))
	})
}

func TestMACCollisionReported(t *testing.T) {
	ctx := context.Background()
	mkNS(t, "mac-collide", map[string]string{"mutatevirtualmachines.kubemacpool.io": "ignore"})
	for _, name := range []string{"vmi-1", "vmi-2"} {
		vmi := &kubevirtv1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: "mac-collide", Name: name}}
		create(t, vmi)
		vmi.Status = kubevirtv1.VirtualMachineInstanceStatus{Phase: "Running", Interfaces: []kubevirtv1.VirtualMachineInstanceNetworkInterface{{Name: "default", MAC: "02:00:00:00:cc:01"}}}
		if err := c.Status().Update(ctx, vmi); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, timeout, "MACCollision events", func() error {
		var evs corev1.EventList
		if err := c.List(ctx, &evs, client.InNamespace("mac-collide")); err != nil {
			return err
		}
		on := map[string]bool{}
		for _, e := range evs.Items {
			if e.Reason == "MACCollision" && strings.Contains(e.Message, "MAC 02:00:00:00:cc:01 is used by 2 running VMIs") {
				on[e.InvolvedObject.Name] = true
			}
		}
		if !on["vmi-1"] || !on["vmi-2"] {
			return fmt.Errorf("MACCollision on %v", on)
		}
		return nil
	})
	if got := gaugeValue(t, "kvnet_mac_collisions", "mac", "02:00:00:00:cc:01"); got != 2 {
		t.Fatalf("kvnet_mac_collisions{mac=02:00:00:00:cc:01} = %v, want 2", got)
	}
}

// gaugeValue reads a gauge of the controller's metrics registry (the
// controller runs in this process) by one label.
func gaugeValue(t *testing.T, name, label, value string) float64 {
	t.Helper()
	families, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	t.Fatalf("no %s{%s=%q}", name, label, value)
	return 0
}

// A VM created with generateName has no name at admission: its MACs are
// held provisionally and handed to the VM once it exists, so they conflict
// in its name and are freed when it is deleted.
func TestMACPoolGenerateName(t *testing.T) {
	ctx := context.Background()
	mkNS(t, "mac-gen", nil)
	v := vm("mac-gen", "", masq(), bridge("sec", ""))
	v.GenerateName = "gen-"
	create(t, v)
	got := macs(v)
	if got[0] == "" || got[1] == "" {
		t.Fatalf("generateName VM got MACs %v", got)
	}
	want := "is already used by VM mac-gen/" + v.Name
	testenv.Eventually(t, timeout, "MAC held in the VM's name", func() error {
		err := c.Create(ctx, vm("mac-gen", "copy", bridge("sec", got[1])))
		if err == nil {
			return fmt.Errorf("a second VM got MAC %s", got[1])
		}
		if !strings.Contains(err.Error(), want) {
			return err
		}
		return nil
	})
	// Past the pending timeout the MACs stay the VM's, not released as an
	// abandoned admission.
	time.Sleep(3 * time.Second)
	if err := c.Create(ctx, vm("mac-gen", "copy", bridge("sec", got[1]))); err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("after the pending timeout: err = %v, want %q", err, want)
	}
	if err := c.Delete(ctx, v); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, timeout, "MAC freed with the VM", func() error {
		return c.Create(ctx, vm("mac-gen", "copy", bridge("sec", got[1])))
	})
}

// A VM that reaches the API carrying a MAC another VM holds (here from a
// namespace the webhook skips) is reported on that VM.
func TestMACPoolDuplicateReported(t *testing.T) {
	ctx := context.Background()
	mkNS(t, "mac-dup", nil)
	mkNS(t, "mac-dup-ignored", map[string]string{"mutatevirtualmachines.kubemacpool.io": "ignore"})
	create(t, vm("mac-dup", "holder", bridge("sec", "02:00:00:00:ee:01")))
	dup := vm("mac-dup-ignored", "copy", bridge("sec", "02:00:00:00:ee:01"))
	create(t, dup)
	testenv.Eventually(t, timeout, "DuplicateMAC event on the copy", func() error {
		var evs corev1.EventList
		if err := c.List(ctx, &evs, client.InNamespace("mac-dup-ignored")); err != nil {
			return err
		}
		for _, e := range evs.Items {
			if e.Reason == "DuplicateMAC" && e.Type == corev1.EventTypeWarning && e.InvolvedObject.Name == "copy" &&
				strings.Contains(e.Message, "MAC 02:00:00:00:ee:01 of this VM is also used by VM mac-dup/holder") {
				return nil
			}
		}
		return errors.New("no DuplicateMAC event yet")
	})
}

// A launcher pod of a VM with a secondary network whose NAD does not exist
// yet (VM and UDN applied together) is refused, naming the NAD, until the
// NAD exists; admitted earlier, it would carry no claim reference for that
// network and the VM's IP there would not persist.
func TestLauncherPodWaitsForSecondaryNAD(t *testing.T) {
	const ns = "lp-sec-early"
	mkNS(t, ns, nil)
	vmi := blueVMI(ns, "")
	create(t, vmi)
	ann, err := launcher.Annotations(vmi, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = c.Create(context.Background(), launcherPod(ns, "vm1", ann))
	if err == nil || !strings.Contains(err.Error(), "NetworkAttachmentDefinition "+ns+"/blue, named by a network of VMI vm1, does not exist (yet)") {
		t.Fatalf("err = %v, want the missing-NAD denial naming %s/blue", err, ns)
	}
	mkUDN(t, ns, "blue", udnv1.NetworkRoleSecondary, "192.168.11.0/24")
	pod := launcherPod(ns, "vm1", ann)
	testenv.Eventually(t, timeout, "launcher pod admitted once the NAD exists", func() error {
		return c.Create(context.Background(), pod)
	})
	elems, err := multus.ParseSelection(multus.NetworksAnnotation, pod.Annotations[multus.NetworksAnnotation], ns)
	if err != nil {
		t.Fatal(err)
	}
	if len(elems) != 1 || elems[0].IPAMClaimReference != "vm1.blue-net" {
		t.Fatalf("networks annotation after admission: %+v, want the claim reference vm1.blue-net", elems)
	}
}
