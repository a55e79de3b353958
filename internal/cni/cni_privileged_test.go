package cni_test

// CNI verbs driven through libcni, as a container runtime does, against
// the real kvnet-cni binary, a real API server with kvnet-controller
// allocating, and real network namespaces. Needs root.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nadv1 "kvnet.io/kvnet/api/k8scni/v1"
	udnv1 "kvnet.io/kvnet/api/udn/v1"
	"kvnet.io/kvnet/internal/cni"
	"kvnet.io/kvnet/internal/nl"
	"kvnet.io/kvnet/internal/podnetworks"
	"kvnet.io/kvnet/internal/testenv"
)

var (
	env    *testenv.Env
	c      client.Client
	binDir string
	cniCfg *libcni.CNIConfig
)

// TestMain builds the fixture (control plane, kvnet-cni) only as root and
// not under "go test -fuzz"; as any other user the unit tests run, the
// privileged ones skip (testenv.NeedsFixture) and one line says so.
func TestMain(m *testing.M) {
	if !testenv.Privileged() || testenv.Fuzzing() {
		testenv.ReportPrivilegedNotRun("kvnet.io/kvnet/internal/cni")
		os.Exit(m.Run())
	}
	os.Exit(testenv.WithFixture(testenv.FixtureOptions{Build: map[string]string{
		"kvnet-cni":  "kvnet.io/kvnet/cmd/kvnet-cni",
		"bridge":     "github.com/containernetworking/plugins/plugins/main/bridge",
		"ptp":        "github.com/containernetworking/plugins/plugins/main/ptp",
		"host-local": "github.com/containernetworking/plugins/plugins/ipam/host-local",
	}}, func(fx *testenv.Fixture) int { return run(m, fx) }))
}

func run(m *testing.M, fx *testenv.Fixture) int {
	env, c, binDir = fx.Env, fx.Env.Client, fx.BinDir
	os.Setenv("KVNET_KUBECONFIG", fx.Kubeconfig)
	if err := os.Link(fx.Bin("kvnet-cni"), fx.Bin("kvnet-ipam")); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	cniCfg = libcni.NewCNIConfigWithCacheDir([]string{binDir}, filepath.Join(fx.Dir, "cache"), nil)
	return m.Run()
}

// waitTimeout bounds every wait for the system to converge.
const waitTimeout = 30 * time.Second

func create(t testing.TB, o client.Object) {
	t.Helper()
	testenv.Create(t, c, o)
}

// network makes a namespace and a secondary Layer2 UDN and returns its NAD.
func network(t testing.TB, ns, subnet string) *nadv1.NetworkAttachmentDefinition {
	t.Helper()
	create(t, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	create(t, &udnv1.UserDefinedNetwork{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "net"},
		Spec: udnv1.UserDefinedNetworkSpec{Topology: udnv1.NetworkTopologyLayer2, Layer2: &udnv1.Layer2Config{
			Role: udnv1.NetworkRoleSecondary, MTU: 1400, Subnets: udnv1.DualStackCIDRs{udnv1.CIDR(subnet)}}},
	})
	var nad nadv1.NetworkAttachmentDefinition
	testenv.Eventually(t, waitTimeout, "NAD", func() error {
		return c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "net"}, &nad)
	})
	return &nad
}

// annotatedPod creates a pod selecting nad and waits for its allocation.
func annotatedPod(t testing.TB, ns, name, selection string) podnetworks.Attachment {
	t.Helper()
	create(t, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: map[string]string{"k8s.v1.cni.cncf.io/networks": selection}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}},
	})
	var a podnetworks.Attachment
	testenv.Eventually(t, waitTimeout, "annotation of "+name, func() error {
		var p corev1.Pod
		if err := c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &p); err != nil {
			return err
		}
		nets, err := podnetworks.Parse(p.Annotations[podnetworks.Annotation])
		if err != nil {
			return err
		}
		for _, v := range nets {
			a = v
			return nil
		}
		return errors.New("no entry")
	})
	return a
}

func netnsFor(t testing.TB) string {
	t.Helper()
	name := fmt.Sprintf("kvcni-%d", time.Now().UnixNano()%1e9)
	path, err := nl.CreateNamedNS(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nl.DeleteNamedNS(name) })
	return path
}

func rt(ns, pod, netnsPath, containerID, ifname string) *libcni.RuntimeConf {
	return &libcni.RuntimeConf{
		ContainerID: containerID, NetNS: netnsPath, IfName: ifname,
		// As Multus passes them.
		Args: [][2]string{{"IgnoreUnknown", "true"}, {"K8S_POD_NAMESPACE", ns}, {"K8S_POD_NAME", pod}},
	}
}

func confList(t testing.TB, config string) *libcni.NetworkConfigList {
	t.Helper()
	conf, err := libcni.ConfFromBytes([]byte(config))
	if err != nil {
		t.Fatal(err)
	}
	list, err := libcni.ConfListFromConf(conf)
	if err != nil {
		t.Fatal(err)
	}
	return list
}

func TestVerbs(t *testing.T) {
	testenv.NeedsFixture(t, cniCfg != nil)
	ctx := context.Background()
	nad := network(t, "cni-verbs", "10.90.0.0/24")
	alloc := annotatedPod(t, "cni-verbs", "p1", "net")
	list := confList(t, nad.Spec.Config)
	nsPath := netnsFor(t)
	r := rt("cni-verbs", "p1", nsPath, "container-1", "net1")

	res, err := cniCfg.AddNetworkList(ctx, list, r)
	if err != nil {
		t.Fatalf("ADD: %v", err)
	}
	got, err := current.NewResultFromResult(res)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.IPs) != 1 || got.IPs[0].Address.String() != alloc.IPAddresses[0] {
		t.Fatalf("ADD result IPs %v, allocation %v", got.IPs, alloc.IPAddresses)
	}
	if len(got.Interfaces) != 2 || got.Interfaces[1].Mac != alloc.MACAddress || got.Interfaces[0].Name != cni.HostIfName("container-1", "net1") {
		t.Fatalf("ADD result interfaces %+v", got.Interfaces)
	}
	h, err := netlink.LinkByName(cni.HostIfName("container-1", "net1"))
	if err != nil {
		t.Fatalf("host end: %v", err)
	}
	if h.Attrs().Alias != "kvnet:cni-verbs/p1:cni-verbs/net" {
		t.Fatalf("host end alias %q", h.Attrs().Alias)
	}
	// The pod side, as the kernel has it.
	if err := nl.Do(nsPath, func() error {
		l, err := netlink.LinkByName("net1")
		if err != nil {
			return err
		}
		if l.Attrs().HardwareAddr.String() != alloc.MACAddress || l.Attrs().MTU != 1400 {
			return fmt.Errorf("net1 MAC %s MTU %d", l.Attrs().HardwareAddr, l.Attrs().MTU)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := cniCfg.CheckNetworkList(ctx, list, r); err != nil {
		t.Fatalf("CHECK after ADD: %v", err)
	}
	// CHECK notices a changed interface.
	if err := nl.Do(nsPath, func() error {
		l, err := netlink.LinkByName("net1")
		if err != nil {
			return err
		}
		addrs, _ := netlink.AddrList(l, netlink.FAMILY_V4)
		for _, a := range addrs {
			if err := netlink.AddrDel(l, &a); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := cniCfg.CheckNetworkList(ctx, list, r); err == nil || !strings.Contains(err.Error(), "lacks address "+alloc.IPAddresses[0]) {
		t.Fatalf("CHECK after removing the address: %v", err)
	}

	// DEL twice, then DEL with the netns gone: all succeed.
	for i := range 2 {
		if err := cniCfg.DelNetworkList(ctx, list, r); err != nil {
			t.Fatalf("DEL #%d: %v", i+1, err)
		}
	}
	if _, err := netlink.LinkByName(cni.HostIfName("container-1", "net1")); err == nil {
		t.Fatal("host end still there after DEL")
	}
	gone := rt("cni-verbs", "p1", "/var/run/netns/does-not-exist", "container-1", "net1")
	if err := cniCfg.DelNetworkList(ctx, list, gone); err != nil {
		t.Fatalf("DEL without netns: %v", err)
	}
}

func TestGC(t *testing.T) {
	testenv.NeedsFixture(t, cniCfg != nil)
	ctx := context.Background()
	nad := network(t, "cni-gc", "10.91.0.0/24")
	annotatedPod(t, "cni-gc", "keep", "net")
	annotatedPod(t, "cni-gc", "stale", "net")
	list := confList(t, nad.Spec.Config)
	for _, p := range []string{"keep", "stale"} {
		if _, err := cniCfg.AddNetworkList(ctx, list, rt("cni-gc", p, netnsFor(t), "ctr-"+p, "net1")); err != nil {
			t.Fatalf("ADD %s: %v", p, err)
		}
	}
	err := cniCfg.GCNetworkList(ctx, list, &libcni.GCArgs{ValidAttachments: []types.GCAttachment{{ContainerID: "ctr-keep", IfName: "net1"}}})
	if err != nil {
		t.Fatalf("GC: %v", err)
	}
	if _, err := netlink.LinkByName(cni.HostIfName("ctr-keep", "net1")); err != nil {
		t.Fatalf("GC removed a valid attachment: %v", err)
	}
	if _, err := netlink.LinkByName(cni.HostIfName("ctr-stale", "net1")); err == nil {
		t.Fatal("GC kept a stale attachment")
	}
	_ = cniCfg.DelNetworkList(ctx, list, rt("cni-gc", "keep", "", "ctr-keep", "net1"))
}

func TestStatus(t *testing.T) {
	testenv.NeedsFixture(t, cniCfg != nil)
	ctx := context.Background()
	dir := t.TempDir()
	statusFile := filepath.Join(dir, "status.json")
	config := fmt.Sprintf(`{"cniVersion":"1.1.0","type":"kvnet-cni","name":"cni-status_net","topology":"layer2","role":"secondary","subnets":"10.92.0.0/30","statusFile":%q}`, statusFile)
	list := confList(t, config)
	code := func() uint {
		err := cniCfg.GetStatusNetworkList(ctx, list)
		if err == nil {
			return 0
		}
		var e *types.Error
		if !errors.As(err, &e) {
			t.Fatalf("STATUS error %v is not a CNI error", err)
		}
		return e.Code
	}
	if got := code(); got != 50 {
		t.Fatalf("STATUS without kvnet-node status: code %d, want 50", got)
	}
	if err := os.WriteFile(statusFile, []byte(`{"ready":true,"exhaustedNetworks":["other"]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := code(); got != 0 {
		t.Fatalf("STATUS ready: code %d", got)
	}
	if err := os.WriteFile(statusFile, []byte(`{"ready":true,"exhaustedNetworks":["cni-status_net"]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := code(); got != 50 {
		t.Fatalf("STATUS on an exhausted pool: code %d, want 50", got)
	}
}

func TestIPAMOnlyUnderBridge(t *testing.T) {
	testenv.NeedsFixture(t, cniCfg != nil)
	ctx := context.Background()
	create(t, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "cni-ipam"}})
	config := `{"cniVersion":"1.0.0","type":"bridge","name":"migration","bridge":"kvtestmig0","isGateway":false,` +
		`"ipam":{"type":"kvnet-ipam","subnets":"10.93.0.0/24","excludeSubnets":"10.93.0.0/28"}}`
	create(t, &nadv1.NetworkAttachmentDefinition{ObjectMeta: metav1.ObjectMeta{Namespace: "cni-ipam", Name: "migration"}, Spec: nadv1.NetworkAttachmentDefinitionSpec{Config: config}})
	alloc := annotatedPod(t, "cni-ipam", "handler", "migration@migration0")
	t.Cleanup(func() {
		if l, err := netlink.LinkByName("kvtestmig0"); err == nil {
			_ = netlink.LinkDel(l)
		}
	})
	nsPath := netnsFor(t)
	list := confList(t, config)
	res, err := cniCfg.AddNetworkList(ctx, list, rt("cni-ipam", "handler", nsPath, "ctr-mig", "migration0"))
	if err != nil {
		t.Fatalf("ADD under bridge: %v", err)
	}
	got, _ := current.NewResultFromResult(res)
	if len(got.IPs) != 1 || got.IPs[0].Address.String() != alloc.IPAddresses[0] {
		t.Fatalf("bridge result IPs %v, allocation %v", got.IPs, alloc.IPAddresses)
	}
	if err := nl.Do(nsPath, func() error {
		l, err := netlink.LinkByName("migration0")
		if err != nil {
			return err
		}
		addrs, _ := netlink.AddrList(l, netlink.FAMILY_V4)
		for _, a := range addrs {
			if a.IPNet.String() == alloc.IPAddresses[0] {
				return nil
			}
		}
		return fmt.Errorf("migration0 addresses %v lack %s", addrs, alloc.IPAddresses[0])
	}); err != nil {
		t.Fatal(err)
	}
	if err := cniCfg.DelNetworkList(ctx, list, rt("cni-ipam", "handler", nsPath, "ctr-mig", "migration0")); err != nil {
		t.Fatalf("DEL under bridge: %v", err)
	}
}

func TestAddWithoutAllocationFailsClearly(t *testing.T) {
	testenv.NeedsFixture(t, cniCfg != nil)
	ctx := context.Background()
	config := `{"cniVersion":"1.1.0","type":"kvnet-cni","name":"cni-none_net","topology":"layer2","role":"secondary","subnets":"10.94.0.0/24","annotationTimeout":"1s"}`
	create(t, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "cni-none"}})
	create(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "cni-none", Name: "lonely"}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "x"}}}})
	_, err := cniCfg.AddNetworkList(ctx, confList(t, config), rt("cni-none", "lonely", netnsFor(t), "ctr-none", "net1"))
	if err == nil || !strings.Contains(err.Error(), `no allocation for network "cni-none_net" in annotation kvnet.io/pod-networks of pod cni-none/lonely after 1s`) {
		t.Fatalf("ADD without allocation: %v", err)
	}
	if _, err := netlink.LinkByName(cni.HostIfName("ctr-none", "net1")); err == nil {
		t.Fatal("failed ADD left a host interface")
	}
	bad := `{"cniVersion":"1.1.0","type":"kvnet-cni","name":"x","topology":"mesh"}`
	_, err = cniCfg.AddNetworkList(ctx, confList(t, bad), rt("cni-none", "lonely", netnsFor(t), "ctr-bad", "net1"))
	if err == nil || !strings.Contains(err.Error(), `"topology" "mesh"`) {
		t.Fatalf("ADD with a bad configuration: %v", err)
	}
}

// BenchmarkAdd measures CNI ADD (via libcni and the real binary) once the
// annotation exists; reports p50 and p99.
func BenchmarkAdd(b *testing.B) {
	testenv.NeedsFixture(b, cniCfg != nil)
	ctx := context.Background()
	ns := fmt.Sprintf("cni-bench-%d", time.Now().UnixNano()%1e9)
	nad := network(b, ns, "10.95.0.0/16")
	annotatedPod(b, ns, "p", "net")
	list := confList(b, nad.Spec.Config)
	nsPath := netnsFor(b)
	var lat []time.Duration
	for i := range b.N {
		r := rt(ns, "p", nsPath, fmt.Sprintf("bench-%d", i), "net1")
		start := time.Now()
		if _, err := cniCfg.AddNetworkList(ctx, list, r); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(start))
		b.StopTimer()
		if err := cniCfg.DelNetworkList(ctx, list, r); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
}

// TestUnservedNetwork: a network kvnet-node says it cannot attach on this
// node (its status file) is refused by ADD and STATUS with kvnet-node's
// reason, and ADD makes nothing; once served, the same ADD works.
func TestUnservedNetwork(t *testing.T) {
	testenv.NeedsFixture(t, cniCfg != nil)
	ctx := context.Background()
	nad := network(t, "cni-unserved", "10.94.0.0/24")
	annotatedPod(t, "cni-unserved", "p1", "net")
	statusFile := filepath.Join(t.TempDir(), "status.json")
	var conf map[string]any
	if err := json.Unmarshal([]byte(nad.Spec.Config), &conf); err != nil {
		t.Fatal(err)
	}
	conf["statusFile"] = statusFile
	config, _ := json.Marshal(conf)
	list := confList(t, string(config))
	const why = "vlan.access.id 100 needs 802.1Q VLAN links (the Linux kernel module 8021q), which node n1 lacks"
	status := fmt.Sprintf(`{"ready":true,"exhaustedNetworks":[],"unservedNetworks":{%q:%q}}`, conf["name"], why)
	if err := os.WriteFile(statusFile, []byte(status), 0o644); err != nil {
		t.Fatal(err)
	}
	nsPath := netnsFor(t)
	r := rt("cni-unserved", "p1", nsPath, "container-u", "net1")
	for verb, err := range map[string]error{
		"ADD":    func() error { _, err := cniCfg.AddNetworkList(ctx, list, r); return err }(),
		"STATUS": cniCfg.GetStatusNetworkList(ctx, list),
	} {
		var e *types.Error
		if !errors.As(err, &e) || e.Code != types.ErrPluginNotAvailable || !strings.Contains(e.Details, why) {
			t.Fatalf("%s on an unserved network: %v; want code 50 with kvnet-node's reason", verb, err)
		}
	}
	if _, err := netlink.LinkByName(cni.HostIfName("container-u", "net1")); err == nil {
		t.Fatal("a refused ADD left a host interface")
	}
	if err := os.WriteFile(statusFile, []byte(`{"ready":true,"exhaustedNetworks":[]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := cniCfg.AddNetworkList(ctx, list, r); err != nil {
		t.Fatalf("ADD once served: %v", err)
	}
	_ = cniCfg.DelNetworkList(ctx, list, r)
}

// TestLocalnetWaitsForNode: a localnet network's ADD is refused until
// kvnet-node has said, ready, whether this node can attach it (its bridge
// mapping, VLAN support); then it works, with localnet's MTU of 1500.
func TestLocalnetWaitsForNode(t *testing.T) {
	testenv.NeedsFixture(t, cniCfg != nil)
	ctx := context.Background()
	statusFile := filepath.Join(t.TempDir(), "status.json")
	config := fmt.Sprintf(`{"cniVersion":"1.1.0","type":"kvnet-cni","name":"cni-localnet_ln","netAttachDefName":"cni-localnet/ln","topology":"localnet","role":"secondary","subnets":"10.95.0.0/24","physicalNetworkName":"physnet","statusFile":%q}`, statusFile)
	create(t, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "cni-localnet"}})
	create(t, &nadv1.NetworkAttachmentDefinition{ObjectMeta: metav1.ObjectMeta{Namespace: "cni-localnet", Name: "ln"}, Spec: nadv1.NetworkAttachmentDefinitionSpec{Config: config}})
	annotatedPod(t, "cni-localnet", "p1", "ln")
	list := confList(t, config)
	r := rt("cni-localnet", "p1", netnsFor(t), "container-ln", "net1")
	for _, status := range []string{"", `{"ready":false,"exhaustedNetworks":[]}`} {
		if status != "" {
			if err := os.WriteFile(statusFile, []byte(status), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		_, err := cniCfg.AddNetworkList(ctx, list, r)
		var e *types.Error
		if !errors.As(err, &e) || e.Code != types.ErrPluginNotAvailable || !strings.Contains(e.Details, "is a localnet network: whether this node can attach it is known once kvnet-node is ready") {
			t.Fatalf("ADD with kvnet-node status %q: %v; want code 50 saying it waits for kvnet-node", status, err)
		}
	}
	if err := os.WriteFile(statusFile, []byte(`{"ready":true,"exhaustedNetworks":[],"podMTU":1450}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := cniCfg.AddNetworkList(ctx, list, r); err != nil {
		t.Fatalf("ADD once kvnet-node is ready: %v", err)
	}
	t.Cleanup(func() { _ = cniCfg.DelNetworkList(ctx, list, r) })
	if err := nl.Do(r.NetNS, func() error {
		l, err := netlink.LinkByName("net1")
		if err != nil {
			return err
		}
		if l.Attrs().MTU != 1500 {
			return fmt.Errorf("net1 MTU %d, want localnet's 1500 (not the tunnel's 1450)", l.Attrs().MTU)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}
