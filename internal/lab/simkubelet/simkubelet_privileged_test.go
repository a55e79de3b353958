package simkubelet_test

// The simulated kubelet against a real API server with kvnet-controller
// allocating, the real kvnet-cni binary and real network namespaces.
// Needs root.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/testr"
	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nadv1 "kvnet.io/kvnet/api/k8scni/v1"
	udnv1 "kvnet.io/kvnet/api/udn/v1"
	"kvnet.io/kvnet/internal/cni"
	"kvnet.io/kvnet/internal/lab/simkubelet"
	"kvnet.io/kvnet/internal/nl"
	"kvnet.io/kvnet/internal/podnetworks"
	"kvnet.io/kvnet/internal/testenv"
	"kvnet.io/kvnet/internal/testenv/nstest"
)

var (
	env        *testenv.Env
	c          client.Client
	binDir     string
	cacheDir   string
	kubeconfig string
	apiAddr    string // the API server's host:port (on 127.0.0.1)
	nodeNS     string // the node's namespace name
	privileged bool   // running as root, with the control plane up
)

const nodeName = "sim-node-1"

func TestMain(m *testing.M) {
	if !testenv.Privileged() {
		// The unprivileged unit tests still run; the others skip.
		testenv.ReportPrivilegedNotRun("kvnet.io/kvnet/internal/lab/simkubelet")
		os.Exit(m.Run())
	}
	privileged = true
	os.Exit(testenv.WithFixture(testenv.FixtureOptions{Build: map[string]string{
		"kvnet-cni": "kvnet.io/kvnet/cmd/kvnet-cni",
		// The stand-in cluster default network of Multus mode.
		"bridge":     "github.com/containernetworking/plugins/plugins/main/bridge",
		"host-local": "github.com/containernetworking/plugins/plugins/ipam/host-local",
	}},
		func(fx *testenv.Fixture) int { return run(m, fx) }))
}

func run(m *testing.M, fx *testenv.Fixture) int {
	env, c, kubeconfig, apiAddr, binDir = fx.Env, fx.Env.Client, fx.Kubeconfig, fx.APIAddr, fx.BinDir
	cacheDir = filepath.Join(fx.Dir, "cni-cache")
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	nodeNS = "kvsk" + hex.EncodeToString(b) + "-node"
	if _, err := nl.CreateNamedNS(nodeNS); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() {
		names, _ := nl.ListNamedNS(podPrefix())
		for _, n := range names {
			_ = nl.DeleteNamedNS(n)
		}
		_ = nl.DeleteNamedNS(nodeNS)
	}()
	return m.Run()
}

func podPrefix() string { return nodeNS + "-p-" }

func config(t *testing.T) simkubelet.Config {
	return simkubelet.Config{
		NodeName:         nodeName,
		NodeNetNS:        nodeNS,
		RESTConfig:       env.Config,
		CNIBinDir:        binDir,
		CNICacheDir:      cacheDir,
		Env:              []string{"KVNET_KUBECONFIG=" + kubeconfig},
		PodNetNSPrefix:   podPrefix(),
		LoopbackForwards: []string{apiAddr},
		Log:              testr.NewWithOptions(t, testr.Options{Verbosity: 1}),
	}
}

// kubelet is a running simkubelet.
type kubelet struct {
	cfg    simkubelet.Config
	cancel context.CancelFunc
	done   chan error
}

// startKubelet runs a simkubelet until the test ends (or stop); mutate
// functions adjust its configuration.
func startKubelet(t *testing.T, mutate ...func(*simkubelet.Config)) *kubelet {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	k := &kubelet{cfg: config(t), cancel: cancel, done: make(chan error, 1)}
	for _, m := range mutate {
		m(&k.cfg)
	}
	go func() { k.done <- simkubelet.Run(ctx, k.cfg) }()
	t.Cleanup(func() { k.stop(t) })
	return k
}

func (k *kubelet) stop(t *testing.T) {
	t.Helper()
	if k.cancel == nil {
		return
	}
	k.cancel()
	k.cancel = nil
	select {
	case err := <-k.done:
		if err != nil {
			t.Errorf("simkubelet.Run: %v", err)
		}
	case <-time.After(time.Minute):
		t.Error("simkubelet.Run did not return within 1m of cancellation")
	}
}

// running fails the test if Run has returned.
func (k *kubelet) running(t *testing.T) {
	t.Helper()
	select {
	case err := <-k.done:
		k.cancel = nil
		t.Fatalf("simkubelet.Run returned early: %v", err)
	default:
	}
}

// waitTimeout bounds every wait for the kubelet to converge.
const waitTimeout = 60 * time.Second

// logRecorder records what a kubelet logs (and forwards it to the test
// log), so that a test can wait for a decision the kubelet made instead of
// sleeping and hoping it has made it.
type logRecorder struct {
	mu      sync.Mutex
	entries []logEntry
}

type logEntry struct {
	msg string
	kvs []any
}

// recordLogs makes the kubelet's logger a recorder's.
func recordLogs(t *testing.T) (*logRecorder, func(*simkubelet.Config)) {
	r := &logRecorder{}
	return r, func(cfg *simkubelet.Config) {
		cfg.Log = logr.New(recSink{next: testr.NewWithOptions(t, testr.Options{Verbosity: 1}).GetSink(), rec: r})
	}
}

// count returns how many entries have message msg and "pod" pod.
func (r *logRecorder) count(msg, pod string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, e := range r.entries {
		if e.msg != msg {
			continue
		}
		for i := 0; i+1 < len(e.kvs); i += 2 {
			if e.kvs[i] == "pod" && e.kvs[i+1] == pod {
				n++
			}
		}
	}
	return n
}

// recSink is a logr.LogSink that records every entry into rec and
// forwards it to next.
type recSink struct {
	next logr.LogSink
	rec  *logRecorder
	kvs  []any
}

func (s recSink) record(msg string, kvs []any) {
	s.rec.mu.Lock()
	defer s.rec.mu.Unlock()
	s.rec.entries = append(s.rec.entries, logEntry{msg: msg, kvs: append(slices.Clone(s.kvs), kvs...)})
}

func (s recSink) Init(info logr.RuntimeInfo) { info.CallDepth++; s.next.Init(info) }
func (s recSink) Enabled(int) bool           { return true }
func (s recSink) Info(level int, msg string, kvs ...any) {
	s.GetCallStackHelper()()
	s.record(msg, kvs)
	if s.next.Enabled(level) {
		s.next.Info(level, msg, kvs...)
	}
}
func (s recSink) Error(err error, msg string, kvs ...any) {
	s.GetCallStackHelper()()
	s.record(msg, kvs)
	s.next.Error(err, msg, kvs...)
}

// GetCallStackHelper lets the test log name the kubelet's line, not the
// sink's.
func (s recSink) GetCallStackHelper() func() {
	if h, ok := s.next.(logr.CallStackHelperLogSink); ok {
		return h.GetCallStackHelper()
	}
	return func() {}
}
func (s recSink) WithValues(kvs ...any) logr.LogSink {
	return recSink{next: s.next.WithValues(kvs...), rec: s.rec, kvs: append(slices.Clone(s.kvs), kvs...)}
}
func (s recSink) WithName(name string) logr.LogSink {
	return recSink{next: s.next.WithName(name), rec: s.rec, kvs: s.kvs}
}

// oneWorker makes a kubelet handle one pod at a time, in queue order: once
// a pod queued later is Running, everything queued before it has been
// handled. Tests use that as a barrier instead of a sleep.
func oneWorker(cfg *simkubelet.Config) { cfg.Workers = 1 }

// The kubelet's log messages the tests wait for: its decisions.
const (
	logPermanent = "pod cannot start until it changes"
	logRetrying  = "pod sync failed; retrying"
	logAdopted   = "adopting running pod"
)

// primaryNetwork makes a namespace labelled for a primary network and a
// primary Layer2 UDN "net" in it, and waits for its NAD.
func primaryNetwork(t testing.TB, ns, subnet string) {
	t.Helper()
	testenv.Create(t, c, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns,
		Labels: map[string]string{"k8s.ovn.org/primary-user-defined-network": ""}}})
	testenv.Create(t, c, &udnv1.UserDefinedNetwork{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "net"},
		Spec: udnv1.UserDefinedNetworkSpec{Topology: udnv1.NetworkTopologyLayer2, Layer2: &udnv1.Layer2Config{
			Role: udnv1.NetworkRolePrimary, Subnets: udnv1.DualStackCIDRs{udnv1.CIDR(subnet)}}},
	})
	testenv.Eventually(t, waitTimeout, "NAD "+ns+"/net", func() error {
		return c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "net"}, &nadv1.NetworkAttachmentDefinition{})
	})
}

func newPod(ns, name string, annotations map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: annotations},
		Spec: corev1.PodSpec{NodeName: nodeName,
			Containers: []corev1.Container{{Name: "c", Image: "registry.example/irrelevant"}}},
	}
}

func getPod(ns, name string) (*corev1.Pod, error) {
	var p corev1.Pod
	err := c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &p)
	return &p, err
}

func readyCondition(p *corev1.Pod) *corev1.PodCondition {
	for i := range p.Status.Conditions {
		if p.Status.Conditions[i].Type == corev1.PodReady {
			return &p.Status.Conditions[i]
		}
	}
	return nil
}

// waitRunning waits until the pod is Running and Ready and returns it.
func waitRunning(t testing.TB, ns, name string) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	testenv.Eventually(t, waitTimeout, "pod "+ns+"/"+name+" Running", func() error {
		p, err := getPod(ns, name)
		if err != nil {
			return err
		}
		cond := readyCondition(p)
		if p.Status.Phase != corev1.PodRunning || cond == nil || cond.Status != corev1.ConditionTrue {
			return fmt.Errorf("phase %q, Ready condition %+v", p.Status.Phase, cond)
		}
		pod = p
		return nil
	})
	return pod
}

// primaryAllocation waits for the pod's allocation on NAD key.
func primaryAllocation(t testing.TB, pod *corev1.Pod, key string) podnetworks.Attachment {
	t.Helper()
	nets, err := podnetworks.Parse(pod.Annotations[podnetworks.Annotation])
	if err != nil {
		t.Fatal(err)
	}
	a, ok := nets[key]
	if !ok || len(a.IPAddresses) == 0 {
		t.Fatalf("no allocation for %s in %v", key, nets)
	}
	return a
}

// podLink returns the pod's interface ifName as its namespace has it.
func podLink(nsPath, ifName string) (netlink.Link, []netlink.Addr, error) {
	h, err := nl.NewHandle(nsPath)
	if err != nil {
		return nil, nil, err
	}
	defer h.Close()
	l, err := h.LinkByName(ifName)
	if err != nil {
		return nil, nil, err
	}
	addrs, err := h.AddrList(l, netlink.FAMILY_ALL)
	return l, addrs, err
}

func hostEnd(pod *corev1.Pod, ifName string) (netlink.Link, error) {
	h, err := nl.NewHandle(nl.NSPath(nodeNS))
	if err != nil {
		return nil, err
	}
	defer h.Close()
	return h.LinkByName(cni.HostIfName(string(pod.UID), ifName))
}

func TestPodLifecycle(t *testing.T) {
	testenv.NeedsFixture(t, privileged)
	ctx := context.Background()
	const ns = "sk-life"
	primaryNetwork(t, ns, "10.20.0.0/24")
	k := startKubelet(t)
	testenv.Create(t, c, newPod(ns, "p1", nil))

	pod := waitRunning(t, ns, "p1")
	alloc := primaryAllocation(t, pod, ns+"/net")
	want := netip.MustParsePrefix(alloc.IPAddresses[0])
	if !netip.MustParsePrefix("10.20.0.0/24").Contains(want.Addr()) {
		t.Fatalf("allocation %s outside 10.20.0.0/24", want)
	}
	if pod.Status.PodIP != want.Addr().String() || len(pod.Status.PodIPs) != 1 || pod.Status.PodIPs[0].IP != pod.Status.PodIP {
		t.Fatalf("podIP %q podIPs %v, allocation %s", pod.Status.PodIP, pod.Status.PodIPs, want)
	}

	nsPath := simkubelet.PodNetNS(k.cfg, pod)
	l, addrs, err := podLink(nsPath, simkubelet.PrimaryIfName)
	if err != nil {
		t.Fatalf("pod interface: %v", err)
	}
	if l.Attrs().HardwareAddr.String() != alloc.MACAddress {
		t.Fatalf("%s MAC %s, allocation %s", simkubelet.PrimaryIfName, l.Attrs().HardwareAddr, alloc.MACAddress)
	}
	found := false
	for _, a := range addrs {
		found = found || a.IPNet.String() == want.String()
	}
	if !found {
		t.Fatalf("%s addresses %v lack %s", simkubelet.PrimaryIfName, addrs, want)
	}
	h, err := hostEnd(pod, simkubelet.PrimaryIfName)
	if err != nil {
		t.Fatalf("host end in the node namespace: %v", err)
	}
	if !strings.HasPrefix(h.Attrs().Name, "kvp") {
		t.Fatalf("host end %q", h.Attrs().Name)
	}

	// An ordinary (graceful) delete: the kubelet tears down and confirms.
	if err := c.Delete(ctx, pod); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, waitTimeout, "pod gone", func() error {
		if _, err := getPod(ns, "p1"); !apierrors.IsNotFound(err) {
			return fmt.Errorf("pod still there (err %v)", err)
		}
		return nil
	})
	waitTornDown(t, "pod namespace and host end gone", nsPath, pod)
	k.running(t)
}

func TestBadNetworksAnnotation(t *testing.T) {
	testenv.NeedsFixture(t, privileged)
	ctx := context.Background()
	const ns = "sk-bad"
	testenv.Create(t, c, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	logs, record := recordLogs(t)
	k := startKubelet(t, record, oneWorker)
	testenv.Create(t, c, newPod(ns, "bad", map[string]string{"k8s.v1.cni.cncf.io/networks": "not a valid/name!"}))

	var rv string
	testenv.Eventually(t, waitTimeout, "Ready=False on the bad pod", func() error {
		p, err := getPod(ns, "bad")
		if err != nil {
			return err
		}
		cond := readyCondition(p)
		if cond == nil || cond.Status != corev1.ConditionFalse {
			return fmt.Errorf("Ready condition %+v", cond)
		}
		if cond.Reason != simkubelet.ReasonNetworkSetupFailed || !strings.Contains(cond.Message, "k8s.v1.cni.cncf.io/networks") {
			return fmt.Errorf("Ready=False reason %q message %q does not name the annotation", cond.Reason, cond.Message)
		}
		rv = p.ResourceVersion
		return nil
	})
	// No retry storm: the pod is left alone until it changes. A retry
	// would write nothing new (the same Ready=False), so the API cannot
	// show one; the kubelet's decision can: the failed sync either gives
	// up until the pod changes or is queued for a retry.
	testenv.Eventually(t, waitTimeout, "the kubelet's decision on the bad pod", func() error {
		if logs.count(logPermanent, ns+"/bad")+logs.count(logRetrying, ns+"/bad") == 0 {
			return errors.New("neither given up nor queued for a retry yet")
		}
		return nil
	})
	if n := logs.count(logRetrying, ns+"/bad"); n > 0 {
		t.Fatalf("bad pod queued for a retry (%d times) though it cannot start until it changes", n)
	}
	k.running(t)

	// The kubelet still runs other pods... With one worker, good is
	// handled after every event queued before it, among them the bad
	// pod's own status update: once good runs, a sync of the bad pod that
	// update triggered (status updates must not trigger any) has happened.
	testenv.Create(t, c, newPod(ns, "good", nil))
	waitRunning(t, ns, "good")
	if n, r := logs.count(logPermanent, ns+"/bad"), logs.count(logRetrying, ns+"/bad"); n != 1 || r != 0 {
		t.Fatalf("unchanged bad pod set up %d times and queued for a retry %d times, want once and never", n+r, r)
	}
	if p, err := getPod(ns, "bad"); err != nil || p.ResourceVersion != rv {
		t.Fatalf("bad pod rewritten while unchanged (resourceVersion %s -> %s, err %v)", rv, p.ResourceVersion, err)
	}
	// ...and the bad one once its annotation is fixed.
	p, err := getPod(ns, "bad")
	if err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(p.DeepCopy())
	delete(p.Annotations, "k8s.v1.cni.cncf.io/networks")
	if err := c.Patch(ctx, p, patch); err != nil {
		t.Fatal(err)
	}
	waitRunning(t, ns, "bad")
	for _, name := range []string{"bad", "good"} {
		_ = c.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}})
	}
	testenv.Eventually(t, waitTimeout, "pods deleted", func() error {
		var list corev1.PodList
		if err := c.List(ctx, &list, client.InNamespace(ns)); err != nil {
			return err
		}
		if len(list.Items) > 0 {
			return fmt.Errorf("%d pods left", len(list.Items))
		}
		return nil
	})
	k.running(t)
}

func TestRestartAdoptsAndCollects(t *testing.T) {
	testenv.NeedsFixture(t, privileged)
	ctx := context.Background()
	const ns = "sk-restart"
	primaryNetwork(t, ns, "10.21.0.0/24")
	k := startKubelet(t)
	testenv.Create(t, c, newPod(ns, "p", nil))
	testenv.Create(t, c, newPod(ns, "q", nil))
	pod := waitRunning(t, ns, "p")
	pod2 := waitRunning(t, ns, "q")
	nsPath, nsPath2 := simkubelet.PodNetNS(k.cfg, pod), simkubelet.PodNetNS(k.cfg, pod2)
	before, _, err := podLink(nsPath, simkubelet.PrimaryIfName)
	if err != nil {
		t.Fatal(err)
	}
	nsBefore, err := inode(nsPath)
	if err != nil {
		t.Fatal(err)
	}
	k.stop(t)

	// While the kubelet is down: a namespace of no pod (left by a crash),
	// and q is force-deleted.
	stray := podPrefix() + "deadbeef0000"
	if _, err := nl.CreateNamedNS(stray); err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(ctx, pod2, client.GracePeriodSeconds(0)); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, waitTimeout, "q gone", func() error {
		if _, err := getPod(ns, "q"); !apierrors.IsNotFound(err) {
			return fmt.Errorf("pod still there (err %v)", err)
		}
		return nil
	})
	if _, err := hostEnd(pod2, simkubelet.PrimaryIfName); err != nil {
		t.Fatalf("q's host end gone before the kubelet restarted: %v", err)
	}

	logs, record := recordLogs(t)
	k = startKubelet(t, record, oneWorker)
	testenv.Eventually(t, waitTimeout, "stray namespace and q's network collected", func() error {
		if nl.NamedNSExists(stray) {
			return errors.New("stray namespace still there")
		}
		if nl.NamedNSExists(filepath.Base(nsPath2)) {
			return errors.New("q's namespace still there")
		}
		if _, err := hostEnd(pod2, simkubelet.PrimaryIfName); err == nil {
			return errors.New("q's host end still there")
		}
		return nil
	})
	if m, _ := filepath.Glob(filepath.Join(cacheDir, "results", "*"+string(pod2.UID)+"*")); len(m) > 0 {
		t.Fatalf("q's CNI cache entries left: %v", m)
	}
	// A barrier instead of a sleep: the collection above runs once the
	// restarted kubelet has listed the node's pods, so p (listed) is queued
	// before r (created now); with one worker, once r runs, p has been
	// handled, rightly (adopted) or wrongly (a new sandbox).
	testenv.Create(t, c, newPod(ns, "r", nil))
	waitRunning(t, ns, "r")
	if n := logs.count(logAdopted, ns+"/p"); n != 1 {
		t.Errorf("p adopted %d times by the restarted kubelet, want once", n)
	}
	after, _, err := podLink(nsPath, simkubelet.PrimaryIfName)
	if err != nil {
		t.Fatalf("pod interface after restart: %v", err)
	}
	nsAfter, err := inode(nsPath)
	if err != nil {
		t.Fatal(err)
	}
	if nsAfter != nsBefore || after.Attrs().Index != before.Attrs().Index {
		t.Fatalf("p's sandbox recreated on restart (namespace inode %d -> %d, interface index %d -> %d)",
			nsBefore, nsAfter, before.Attrs().Index, after.Attrs().Index)
	}
	waitRunning(t, ns, "p")

	// Force deletion while running.
	if err := c.Delete(ctx, pod, client.GracePeriodSeconds(0)); err != nil {
		t.Fatal(err)
	}
	waitTornDown(t, "force-deleted pod torn down", nsPath, pod)
	k.running(t)
}

// A plugin that fails ADD with a CNI error, after recording the network
// namespace it runs in and an environment variable from Config.Env.
const failingPlugin = `#!/bin/sh
if [ "$CNI_COMMAND" = ADD ]; then
	echo "$(readlink /proc/self/ns/net) $KVTEST_MARK" > "$KVTEST_OUT"
	echo '{"cniVersion":"1.0.0","code":11,"msg":"boom","details":"the test plugin always fails"}'
	exit 1
fi
exit 0
`

func TestFailingPluginNamedAndRetried(t *testing.T) {
	testenv.NeedsFixture(t, privileged)
	const ns = "sk-fail"
	testenv.Create(t, c, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	testenv.Create(t, c, &nadv1.NetworkAttachmentDefinition{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "failnad"},
		Spec: nadv1.NetworkAttachmentDefinitionSpec{Config: `{"cniVersion":"1.0.0","name":"failnet","type":"kvtestfail"}`}})
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(binDir, "kvtestfail"), []byte(failingPlugin), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(filepath.Join(binDir, "kvtestfail")) })
	out := filepath.Join(dir, "out")
	k := startKubelet(t, func(cfg *simkubelet.Config) {
		cfg.Env = append(cfg.Env, "KVTEST_OUT="+out, "KVTEST_MARK=from-config")
	})
	testenv.Create(t, c, newPod(ns, "p", map[string]string{"k8s.v1.cni.cncf.io/networks": "failnad"}))
	testenv.Eventually(t, waitTimeout, "Ready=False naming the attachment", func() error {
		p, err := getPod(ns, "p")
		if err != nil {
			return err
		}
		cond := readyCondition(p)
		if cond == nil || cond.Status != corev1.ConditionFalse {
			return fmt.Errorf("Ready condition %+v", cond)
		}
		for _, s := range []string{"attachment net1 (NAD sk-fail/failnad, plugin kvtestfail)", "boom", "the test plugin always fails"} {
			if !strings.Contains(cond.Message, s) {
				return fmt.Errorf("message %q lacks %q", cond.Message, s)
			}
		}
		return nil
	})
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(nl.NSPath(nodeNS), &st); err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("net:[%d] from-config\n", st.Ino); string(b) != want {
		t.Fatalf("plugin ran with %q, want %q (node namespace, Config.Env)", b, want)
	}
	// Retried with backoff: the plugin runs again.
	if err := os.Remove(out); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, waitTimeout, "retry", func() error {
		_, err := os.Stat(out)
		return err
	})
	// No failed attempt leaves a namespace behind while it waits.
	p, _ := getPod(ns, "p")
	if err := c.Delete(context.Background(), p); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, waitTimeout, "pod gone", func() error {
		if _, err := getPod(ns, "p"); !apierrors.IsNotFound(err) {
			return fmt.Errorf("pod still there (err %v)", err)
		}
		if nl.NamedNSExists(filepath.Base(simkubelet.PodNetNS(k.cfg, p))) {
			return errors.New("pod namespace still there")
		}
		return nil
	})
	k.running(t)
}

// inode returns the inode of a named network namespace: a new namespace
// under the same name has another.
func inode(nsPath string) (uint64, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(nsPath, &st); err != nil {
		return 0, fmt.Errorf("stat %s: %w", nsPath, err)
	}
	return st.Ino, nil
}

// waitTornDown waits until the pod's namespace and the host end of its
// primary interface are gone.
func waitTornDown(t *testing.T, what, nsPath string, pod *corev1.Pod) {
	t.Helper()
	testenv.Eventually(t, waitTimeout, what, func() error {
		if nl.NamedNSExists(filepath.Base(nsPath)) {
			return errors.New("pod namespace still there")
		}
		if _, err := hostEnd(pod, simkubelet.PrimaryIfName); err == nil {
			return errors.New("host end still there")
		}
		return nil
	})
}

// TestMultusMode: the kubelet behaves like stock Multus over a stand-in
// cluster default network (bridge cni0 + host-local, 10.244.0.0/24). A pod
// of a primary-UDN namespace whose networks annotation selects the primary
// NAD as ovn-udn1 (what kvnet's webhook writes) gets eth0 on the default
// network and ovn-udn1 from kvnet-cni with the default route; its
// network-status is Multus's (eth0 default); its eth0 admits the node and
// not a pod of the default network, which still reaches the node.
func TestMultusMode(t *testing.T) {
	testenv.NeedsFixture(t, privileged)
	const ns, plainNS = "sk-multus", "sk-multus-plain"
	primaryNetwork(t, ns, "10.30.0.0/24")
	testenv.Create(t, c, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: plainNS}})
	def := fmt.Sprintf(`{"cniVersion":"1.0.0","name":"cluster-default","plugins":[{"type":"bridge","bridge":"cni0","isGateway":true,
		"ipam":{"type":"host-local","ranges":[[{"subnet":"10.244.0.0/24"}]],"routes":[{"dst":"0.0.0.0/0"}],"dataDir":%q}}]}`,
		filepath.Join(t.TempDir(), "host-local"))
	k := startKubelet(t, func(cfg *simkubelet.Config) { cfg.ClusterDefaultNetwork = []byte(def) })
	testenv.Create(t, c, newPod(ns, "udn", map[string]string{"k8s.v1.cni.cncf.io/networks": "net@ovn-udn1"}))
	testenv.Create(t, c, newPod(plainNS, "plain", nil))
	pod := waitRunning(t, ns, "udn")
	plain := waitRunning(t, plainNS, "plain")
	alloc := primaryAllocation(t, pod, ns+"/net")
	udnIP := netip.MustParsePrefix(alloc.IPAddresses[0]).Addr()

	// Pod IPs are eth0's, as kubelet reports the default network's.
	eth0IP, err := netip.ParseAddr(pod.Status.PodIP)
	if err != nil || !netip.MustParsePrefix("10.244.0.0/24").Contains(eth0IP) {
		t.Fatalf("pod IP %q, want one of the cluster default network", pod.Status.PodIP)
	}
	var statuses []struct {
		Name, Interface string
		IPs             []string
		Default         bool
	}
	if err := json.Unmarshal([]byte(pod.Annotations[simkubelet.NetworkStatusAnnotation]), &statuses); err != nil {
		t.Fatalf("network-status %q: %v", pod.Annotations[simkubelet.NetworkStatusAnnotation], err)
	}
	if len(statuses) != 2 || statuses[0].Interface != "eth0" || !statuses[0].Default || statuses[0].Name != "cluster-default" ||
		statuses[1].Interface != simkubelet.PrimaryIfName || statuses[1].Name != ns+"/net" || statuses[1].Default ||
		len(statuses[1].IPs) != 1 || statuses[1].IPs[0] != udnIP.String() {
		t.Fatalf("network-status %+v", statuses)
	}

	nsPath := simkubelet.PodNetNS(k.cfg, pod)
	var defaultVia string
	c2 := func() error {
		h, err := nl.NewHandle(nsPath)
		if err != nil {
			return err
		}
		defer h.Close()
		routes, err := h.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{}, 0)
		if err != nil {
			return err
		}
		for _, r := range routes {
			if r.Dst == nil || r.Dst.IP.IsUnspecified() {
				l, err := h.LinkByIndex(r.LinkIndex)
				if err != nil {
					return err
				}
				if defaultVia != "" {
					return fmt.Errorf("two default routes (%s and %s)", defaultVia, l.Attrs().Name)
				}
				defaultVia = l.Attrs().Name
			}
		}
		return nil
	}
	if err := c2(); err != nil || defaultVia != simkubelet.PrimaryIfName {
		t.Fatalf("default route via %q (%v), want only %s", defaultVia, err, simkubelet.PrimaryIfName)
	}

	// eth0: the node (cni0's 10.244.0.1, the kubelet) gets in, the plain
	// pod does not, and the primary-UDN pod opens nothing there;
	// the plain pod's own eth0 is open (control).
	plainPath := simkubelet.PodNetNS(k.cfg, plain)
	listenIn(t, nsPath)
	listenIn(t, plainPath)
	if err := connect(nl.NSPath(nodeNS), eth0IP.String()); err != nil {
		t.Errorf("node -> primary-UDN pod eth0 %s: %v, want the kubelet's probes to get in", eth0IP, err)
	}
	if err := connect(nl.NSPath(nodeNS), plain.Status.PodIP); err != nil {
		t.Errorf("control: node -> plain pod %s: %v", plain.Status.PodIP, err)
	}
	if err := connect(nsPath, plain.Status.PodIP); err == nil {
		t.Errorf("primary-UDN pod -> plain pod %s over eth0 connected; it opens nothing there", plain.Status.PodIP)
	}
	if err := connect(plainPath, eth0IP.String()); err == nil {
		t.Errorf("plain pod -> primary-UDN pod eth0 %s connected; only the node may", eth0IP)
	}
}

const probePort = "9090"

// listenIn accepts (and closes) TCP connections on probePort in the
// namespace at nsPath until the test ends.
func listenIn(t *testing.T, nsPath string) {
	t.Helper()
	nstest.Serve(nstest.Listen(t, nsPath, ":"+probePort), func(net.Conn) {})
}

// connect opens a TCP connection from the namespace at nsPath to
// dst:probePort.
func connect(nsPath, dst string) error {
	conn, err := nstest.Dial(nsPath, net.JoinHostPort(dst, probePort), time.Second)
	if err != nil {
		return err
	}
	return conn.Close()
}
