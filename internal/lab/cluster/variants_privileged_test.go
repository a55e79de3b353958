//go:build cluster

package cluster

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap/zapcore"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"kvnet.io/kvnet/internal/testenv"
)

// TestClusterVariants brings up a cluster of the variants of what kvnet
// runs on (docs/cluster.md, "Variants") and runs kvnet on it. Both
// variants share one cluster, since they change different things (the
// Multus flavour and eth0's layout) and each cluster costs minutes of a
// CI run:
//   - thin Multus instead of the thick one: its DaemonSet runs
//     thin_entrypoint, the nodes' 00-multus.conflist is of type multus, and
//     a pod with a NAD gets the interface and a network-status from it;
//   - the /32 layout (Calico's): pods' eth0 has a /32 and "default via
//     169.254.1.1 dev eth0 onlink", the node has a host route per pod,
//     pods on two nodes reach each other by pod IP, and Multus adds a
//     NAD's interface there too.
//
// Flannel with thick Multus, dual-stack, is the cluster of
// TestClusterPodsReachEachOther.
//
// kvnet is installed, checked and uninstalled as a user does (testKvnet),
// with pods of a primary UDN whose HTTP readiness and TCP liveness probes
// must keep passing (under the /32 layout only kvnet-cni's KeepProbePath
// lets the node's probes be answered over eth0). The pod scenarios of
// policy (variantSkip) run on the dual-stack cluster only: kvnet-node
// enforces policy on the UDN interfaces, which neither the Multus flavour
// nor eth0's layout changes.
func TestClusterVariants(t *testing.T) {
	testenv.NeedsRoot(t)
	binDir := buildTools(t)
	for _, v := range []struct {
		name, network, multus string
		checks                []func(context.Context, *testing.T, *Cluster)
	}{
		{"ThinMultusPTP32", NetworkPTP32, MultusThin, []func(context.Context, *testing.T, *Cluster){checkThinMultus, checkPTP32}},
	} {
		t.Run(v.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
			defer cancel()
			c := upForTest(ctx, t, Config{Dir: t.TempDir(), BinDir: binDir, Nodes: 3, KvnetImages: true,
				DefaultNetwork: v.network, Multus: v.multus, IPFamily: IPFamilyIPv4, Log: testLog{t}, WaitForLock: true})
			env, err := os.ReadFile(filepath.Join(c.Dir, EnvFile))
			if err != nil {
				t.Fatal(err)
			}
			for _, want := range []string{"DEFAULT_NETWORK=" + v.network + "\n", "MULTUS=" + v.multus + "\n", "IP_FAMILY=" + IPFamilyIPv4 + "\n"} {
				if !strings.Contains(string(env), want) {
					t.Errorf("%s lacks %q:\n%s", EnvFile, want, env)
				}
			}
			const ns = "cluster-e2e"
			if _, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			testenv.Eventually(t, time.Minute, "default ServiceAccount in "+ns, func() error {
				_, err := c.Client.CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{})
				return err
			})
			// testMultus compares with a pod without the networks annotation.
			if _, err := c.Client.CoreV1().Pods(ns).Create(ctx, sleeper(ns, "client-3", NodeName(3), c.Images["busybox"]), metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			waitPodReady(ctx, t, c, ns, "client-3")
			for _, check := range v.checks {
				check(ctx, t, c)
			}
			t.Run("Multus", func(t *testing.T) { testMultus(ctx, t, c, ns) })
			// The day-2 subtests (kvnet-node killed, kvnet-controller
			// rolled) test kvnet, not the variant: once is enough.
			t.Run("Kvnet", func(t *testing.T) { testKvnet(ctx, t, c, false, "", variantSkip...) })
		})
	}
}

// variantSkip are the pod scenarios TestClusterVariants leaves to the
// dual-stack cluster of TestClusterPodsReachEachOther: policy, enforced
// by kvnet-node on the UDN interfaces whatever Multus and eth0 are (about
// 70 s a cluster, the matrix's nine pods most of it).
var variantSkip = []string{ScenarioPolicy, ScenarioMatrix, ScenarioMultiPolicy}

func init() {
	// The package's controller-runtime clients log through its logger:
	// errors to stderr, and no "log.SetLogger(...) was never called"
	// stack trace in the middle of a test's output.
	ctrllog.SetLogger(zap.New(zap.WriteTo(os.Stderr), zap.Level(zapcore.ErrorLevel)))
}

// recap holds what failed on the clusters of this test binary (failf),
// for upForTest to repeat at the end of a failed test's output.
var recap struct {
	mu    sync.Mutex
	lines []string
}

// failf fails t with the message, and keeps it (its first 500 bytes) for
// the recap at the end of the cluster's test.
func failf(t *testing.T, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	t.Error(msg)
	short := msg
	if len(short) > 500 {
		short = short[:500] + "..."
	}
	recap.mu.Lock()
	recap.lines = append(recap.lines, t.Name()+": "+short)
	recap.mu.Unlock()
}

// fatalf is failf that stops the test.
func fatalf(t *testing.T, format string, args ...any) {
	t.Helper()
	failf(t, format, args...)
	t.FailNow()
}

// recapTB is t for helpers that take a testing.TB: what they fail with
// is kept for the recap too.
type recapTB struct{ *testing.T }

func (r recapTB) Errorf(format string, args ...any) {
	r.Helper()
	failf(r.T, format, args...)
}

func (r recapTB) Fatalf(format string, args ...any) {
	r.Helper()
	fatalf(r.T, format, args...)
}

func (r recapTB) Error(args ...any) {
	r.Helper()
	failf(r.T, "%s", fmt.Sprint(args...))
}

func (r recapTB) Fatal(args ...any) {
	r.Helper()
	fatalf(r.T, "%s", fmt.Sprint(args...))
}

// upForTest brings a cluster up for t and takes it down when t ends,
// first logging the nodes' errors if t failed.
func upForTest(ctx context.Context, t *testing.T, cfg Config) *Cluster {
	t.Helper()
	c, err := Up(ctx, cfg)
	if err != nil {
		t.Fatalf("up: %v", err)
	}
	recap.mu.Lock()
	from := len(recap.lines)
	recap.mu.Unlock()
	t.Cleanup(func() {
		if t.Failed() {
			for _, n := range c.Nodes[:2] {
				for _, f := range []string{"kubelet.log", "containerd.log"} {
					t.Logf("%s %s (errors, last 10):\n%s", n, f, errorLines(filepath.Join(c.Dir, "nodes", n, "logs", f), 10))
				}
			}
			// Last, what failed: CI shows only the beginning and
			// the end of a long output.
			recap.mu.Lock()
			failed := slices.Clone(recap.lines[from:])
			recap.mu.Unlock()
			if len(failed) > 0 {
				t.Logf("what failed on this cluster (repeated from above):\n%s", recapText(failed))
			} else {
				t.Logf("what failed on this cluster: a check outside the recap (failf); the first error above")
			}
		}
		if err := c.Down(); err != nil {
			t.Errorf("down: %v", err)
		}
	})
	return c
}

// checkThinMultus: the Multus DaemonSet is the thin one (thin_entrypoint
// from the repo's multus-thin image) and has made the multus binary the
// nodes' CNI plugin: its configuration, of type multus (not
// multus-shim), first in /etc/cni/net.d. thin_entrypoint names it
// 00-multus.conf for a default network of CNI version below 1.0.0
// (Flannel's 0.3.1) and 00-multus.conflist from 1.0.0 (the /32 layout's).
func checkThinMultus(ctx context.Context, t *testing.T, c *Cluster) {
	ds, err := c.Client.AppsV1().DaemonSets("kube-system").Get(ctx, MultusDaemonSet, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ctr := ds.Spec.Template.Spec.Containers[0]
	if strings.Join(ctr.Command, " ") != "/thin_entrypoint" || ctr.Image != c.Images["multus-thin"] {
		t.Errorf("DaemonSet %s runs %v from %s, want /thin_entrypoint from %s", MultusDaemonSet, ctr.Command, ctr.Image, c.Images["multus-thin"])
	}
	for _, n := range c.Nodes {
		dir := filepath.Join(c.Dir, "nodes", n, "root", "etc", "cni", "net.d")
		var found []string
		for _, name := range []string{"00-multus.conf", "00-multus.conflist"} {
			b, err := os.ReadFile(filepath.Join(dir, name))
			if errors.Is(err, fs.ErrNotExist) {
				continue
			}
			if err != nil {
				t.Errorf("node %s: %v", n, err)
				continue
			}
			found = append(found, name)
			if !strings.Contains(string(b), `"type":"multus"`) && !strings.Contains(string(b), `"type": "multus"`) {
				t.Errorf("node %s: %s is not the thin plugin's:\n%s", n, name, b)
			}
		}
		if len(found) != 1 {
			entries, _ := os.ReadDir(dir)
			var names []string
			for _, e := range entries {
				names = append(names, e.Name())
			}
			t.Errorf("node %s: Multus's configurations %v in %s (%v), want one: 00-multus.conf or 00-multus.conflist", n, found, dir, names)
		}
	}
}

// checkPTP32: pods on two nodes, Ready by HTTP probes from their nodes,
// have eth0 laid out as Calico lays it (a /32, default via 169.254.1.1
// onlink, nothing else) and reach each other by pod IP across nodes.
func checkPTP32(ctx context.Context, t *testing.T, c *Cluster) {
	const ns = "cluster-e2e"
	for i, name := range []string{"web-1", "web-2"} {
		if _, err := c.Client.CoreV1().Pods(ns).Create(ctx, webPod(ns, name, NodeName(i+1), c.Images["busybox"]), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	ip := map[string]string{}
	for i, name := range []string{"web-1", "web-2"} {
		p := waitPodReady(ctx, t, c, ns, name)
		ip[name] = p.Status.PodIP
		if a, err := netip.ParseAddr(p.Status.PodIP); err != nil || !PodCIDR(i+1).Contains(a) {
			t.Errorf("pod %s: IP %q not in %s's pod subnet %s", name, p.Status.PodIP, NodeName(i+1), PodCIDR(i+1))
		}
		addr := execIn(ctx, t, c, ns, name, "ip", "-4", "addr", "show", "dev", "eth0")
		if !strings.Contains(addr, "inet "+p.Status.PodIP+"/32 ") {
			t.Errorf("pod %s: eth0 lacks %s/32:\n%s", name, p.Status.PodIP, addr)
		}
		routes := strings.TrimSpace(execIn(ctx, t, c, ns, name, "ip", "-4", "route", "show"))
		if want := "default via " + LinkLocalGateway.String() + " dev eth0 onlink"; routes != want {
			t.Errorf("pod %s: routes\n%s\nwant only %q", name, routes, want)
		}
		// The node's host route to the pod, through the pod's veth.
		out, err := exec.Command("ip", "-n", Netns(i+1), "-4", "route", "show", p.Status.PodIP).CombinedOutput()
		if err != nil || !strings.Contains(string(out), p.Status.PodIP+" dev veth") || !strings.Contains(string(out), "scope link") {
			t.Errorf("node %s: route to pod %s: %q (%v), want %s dev veth… scope link", NodeName(i+1), name, out, err, p.Status.PodIP)
		}
	}
	url := fmt.Sprintf("http://%s:8080/", ip["web-2"])
	if got, want := strings.TrimSpace(execIn(ctx, t, c, ns, "web-1", "httpget", url)), "hello from web-2"; got != want {
		t.Errorf("web-1 on %s fetching %s on %s: got %q, want %q", NodeName(1), url, NodeName(2), got, want)
	}
}

// checkDualStack: every node has an InternalIP of each family and a pod
// subnet of each; the pods web-1 and web-2 of namespace ns, on node-1 and
// node-2, have a pod IP of each family, in their node's subnets, and
// reach each other over IPv6 (Flannel's IPv6 VXLAN).
func checkDualStack(ctx context.Context, t *testing.T, c *Cluster, ns string) {
	for i, n := range c.Nodes {
		nd, err := c.Client.CoreV1().Nodes().Get(ctx, n, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var ips []string
		for _, a := range nd.Status.Addresses {
			if a.Type == corev1.NodeInternalIP {
				ips = append(ips, a.Address)
			}
		}
		if want := []string{NodeIP(i + 1).String(), NodeIP6(i + 1).String()}; strings.Join(ips, ",") != strings.Join(want, ",") {
			t.Errorf("node %s: InternalIPs %v, want %v", n, ips, want)
		}
		if want := []string{PodCIDR(i + 1).String(), PodCIDR6(i + 1).String()}; strings.Join(nd.Spec.PodCIDRs, ",") != strings.Join(want, ",") {
			t.Errorf("node %s: pod CIDRs %v, want %v", n, nd.Spec.PodCIDRs, want)
		}
	}
	ip6 := map[string]netip.Addr{}
	for i, name := range []string{"web-1", "web-2"} {
		p := waitPodReady(ctx, t, c, ns, name)
		if len(p.Status.PodIPs) != 2 {
			t.Fatalf("pod %s: pod IPs %v, want one of each family", name, p.Status.PodIPs)
		}
		a4, err4 := netip.ParseAddr(p.Status.PodIPs[0].IP)
		a6, err6 := netip.ParseAddr(p.Status.PodIPs[1].IP)
		if err4 != nil || err6 != nil || !PodCIDR(i+1).Contains(a4) || !PodCIDR6(i+1).Contains(a6) {
			t.Errorf("pod %s: pod IPs %v, want in %s and %s", name, p.Status.PodIPs, PodCIDR(i+1), PodCIDR6(i+1))
		}
		ip6[name] = a6
	}
	url := "http://" + netip.AddrPortFrom(ip6["web-2"], 8080).String() + "/"
	testenv.Eventually(t, time.Minute, "web-1 fetches web-2 over IPv6", func() error {
		out, _, err := execOut(ctx, c, ns, "web-1", "httpget", "-timeout", "3s", url)
		if err != nil || strings.TrimSpace(out) != "hello from web-2" {
			return fmt.Errorf("httpget %s: %q, %v", url, out, err)
		}
		return nil
	})
}
