package node_test

// kvnet-node end to end on one machine: a real API server with
// kvnet-controller allocating, three simulated nodes (internal/lab/simnet) each
// running an Agent, pods plumbed by the real kvnet-cni binary executed in
// the node's namespace as a runtime would, and traffic checked with
// busybox ping and udhcpc. Needs root.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	nadv1 "kvnet.io/kvnet/api/k8scni/v1"
	ipamclaimv1alpha1 "kvnet.io/kvnet/api/k8scni/v1alpha1"
	kubevirtv1 "kvnet.io/kvnet/api/kubevirt/v1"
	udnv1 "kvnet.io/kvnet/api/udn/v1"
	"kvnet.io/kvnet/internal/cni"
	"kvnet.io/kvnet/internal/datapath"
	"kvnet.io/kvnet/internal/lab/controlplane"
	"kvnet.io/kvnet/internal/lab/simcluster"
	"kvnet.io/kvnet/internal/lab/simnet"
	"kvnet.io/kvnet/internal/nl"
	"kvnet.io/kvnet/internal/node"
	"kvnet.io/kvnet/internal/podnetworks"
	"kvnet.io/kvnet/internal/testenv"
	"kvnet.io/kvnet/internal/testenv/nstest"
	"kvnet.io/kvnet/internal/udn"
)

var (
	env        *testenv.Env
	c          client.Client
	cniBinary  string
	kubeconfig string
	tmpDir     string
)

const dnsServer = "192.0.2.53"

func TestMain(m *testing.M) {
	flag.Parse()
	if testenv.Fuzzing() {
		// Fuzz targets here are pure: no control plane for each worker.
		os.Exit(m.Run())
	}
	if !testenv.Privileged() {
		// The unit tests still run; the privileged ones skip (testenv.NeedsFixture).
		testenv.ReportPrivilegedNotRun("kvnet.io/kvnet/internal/node")
		os.Exit(m.Run())
	}
	os.Exit(testenv.WithFixture(testenv.FixtureOptions{Build: map[string]string{"kvnet-cni": "kvnet.io/kvnet/cmd/kvnet-cni"}}, func(fx *testenv.Fixture) int {
		env, c, tmpDir, kubeconfig, cniBinary = fx.Env, fx.Env.Client, fx.Dir, fx.Kubeconfig, fx.Bin("kvnet-cni")
		return m.Run()
	}))
}

// waitTimeout bounds every wait for the lab to converge.
const waitTimeout = 30 * time.Second

// lab is the simulated cluster of internal/lab/simcluster (the one the lab
// runs) with in-process agents, whose plans the tests inspect; the tests
// run kvnet-cni themselves, as a runtime would.
type lab struct {
	t testing.TB
	*simcluster.Cluster
}

func newLab(t testing.TB, names ...string) *lab {
	t.Helper()
	testenv.NeedsFixture(t, env != nil)
	return newLabAs(t, env.Config, kubeconfig, names...)
}

// newLabAs runs the agents with restCfg; kvnet-cni uses cniKubeconfig.
func newLabAs(t testing.TB, restCfg *rest.Config, cniKubeconfig string, names ...string) *lab {
	t.Helper()
	return newLabWith(t, restCfg, cniKubeconfig, nil, names...)
}

// newLabWith is newLabAs with the lab's configuration changed by edit.
func newLabWith(t testing.TB, restCfg *rest.Config, cniKubeconfig string, edit func(*simcluster.Config), names ...string) *lab {
	t.Helper()
	api, err := url.Parse(env.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	cfg := simcluster.Config{
		Nodes:         names,
		Admin:         env.Config,
		APIAddr:       api.Host,
		Agent:         restCfg,
		DNS:           []netip.Addr{netip.MustParseAddr(dnsServer)},
		Resync:        5 * time.Second,
		StateDir:      filepath.Join(tmpDir, t.Name()),
		CNIBinDir:     filepath.Dir(cniBinary),
		CNIKubeconfig: cniKubeconfig,
	}
	if edit != nil {
		edit(&cfg)
	}
	cl, err := simcluster.Start(context.Background(), cfg)
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
	return &lab{t: t, Cluster: cl}
}

// nodeName is the Node of simulated node n: unique per test, since Nodes
// are cluster-scoped and outlive a test.
func (l *lab) nodeName(n string) string { return l.NodeName(n) }

func (l *lab) node(n string) *simnet.Node {
	nd, err := l.Node(n)
	if err != nil {
		l.t.Fatal(err)
	}
	return nd
}

func (l *lab) agent(n string) *node.Agent {
	a := l.Agent(n)
	if a == nil {
		l.t.Fatalf("no agent runs on %s", n)
	}
	return a
}

func (l *lab) startAgent(n string) {
	l.t.Helper()
	if err := l.StartAgent(n); err != nil {
		l.t.Fatal(err)
	}
	if err := l.WaitAgentReady(context.Background(), n, 30*time.Second); err != nil {
		l.t.Fatal(err)
	}
}

func (l *lab) stopAgent(n string) {
	if err := l.StopAgent(n); err != nil {
		l.t.Error(err)
	}
}

// tenant makes a namespace with a primary Layer2 UDN on subnet and returns
// its NAD once rendered.
func tenant(t testing.TB, ns, subnet string, persistent bool) *nadv1.NetworkAttachmentDefinition {
	t.Helper()
	testenv.Create(t, c, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{udn.PrimaryNamespaceLabel: ""}}})
	l2 := &udnv1.Layer2Config{Role: udnv1.NetworkRolePrimary, Subnets: udnv1.DualStackCIDRs{udnv1.CIDR(subnet)}}
	if persistent {
		l2.IPAM = &udnv1.IPAMConfig{Lifecycle: udnv1.IPAMLifecyclePersistent}
	}
	testenv.Create(t, c, &udnv1.UserDefinedNetwork{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "udn"},
		Spec:       udnv1.UserDefinedNetworkSpec{Topology: udnv1.NetworkTopologyLayer2, Layer2: l2},
	})
	var nad nadv1.NetworkAttachmentDefinition
	testenv.Eventually(t, waitTimeout, "NAD of "+ns, func() error {
		return c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "udn"}, &nad)
	})
	return &nad
}

// pod is a simulated pod: its namespace and its allocation.
type pod struct {
	ns, name string
	node     string // simulated node
	netns    string // path
	ifName   string // its interface on the network: ovn-udn1 for the primary one
	a        podnetworks.Attachment
}

func (p *pod) ip() string { return strings.Split(p.a.IPAddresses[0], "/")[0] }

// runPod creates a pod on node n, waits for its allocation and runs the
// real kvnet-cni ADD for its primary network inside the node namespace.
// plumb=false leaves the pod interface without addresses (a VM that asks
// DHCP), by running kvnet-cni and then flushing them.
func (l *lab) runPod(nad *nadv1.NetworkAttachmentDefinition, name, n string, mutate func(*corev1.Pod)) *pod {
	l.t.Helper()
	return l.runPodOn(nad, name, n, "ovn-udn1", mutate)
}

// runPodOn is runPod for interface ifName of network nad: a secondary one
// needs mutate to select it.
func (l *lab) runPodOn(nad *nadv1.NetworkAttachmentDefinition, name, n, ifName string, mutate func(*corev1.Pod)) *pod {
	l.t.Helper()
	p := l.allocatedPod(nad, name, n, ifName, mutate)
	l.cni("ADD", nad, p)
	return p
}

// allocatedPod is runPodOn up to the CNI ADD: the pod object with its
// allocation, and its network namespace.
func (l *lab) allocatedPod(nad *nadv1.NetworkAttachmentDefinition, name, n, ifName string, mutate func(*corev1.Pod)) *pod {
	l.t.Helper()
	ns := nad.Namespace
	obj := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: map[string]string{}, Labels: map[string]string{}},
		Spec:       corev1.PodSpec{NodeName: l.nodeName(n), Containers: []corev1.Container{{Name: "c", Image: "busybox"}}},
	}
	if mutate != nil {
		mutate(obj)
	}
	testenv.Create(l.t, c, obj)
	p := &pod{ns: ns, name: name, node: n, ifName: ifName}
	testenv.Eventually(l.t, waitTimeout, "allocation of "+name, func() error {
		var got corev1.Pod
		if err := c.Get(context.Background(), client.ObjectKeyFromObject(obj), &got); err != nil {
			return err
		}
		nets, err := podnetworks.Parse(got.Annotations[podnetworks.Annotation])
		if err != nil {
			return err
		}
		a, ok := nets[ns+"/"+nad.Name]
		if !ok {
			return fmt.Errorf("no entry for %s/%s", ns, nad.Name)
		}
		p.a = a
		return nil
	})
	var err error
	if p.netns, err = l.Sim.NewNS("p-" + name); err != nil {
		l.t.Fatal(err)
	}
	return p
}

// cni runs kvnet-cni with command in the pod's node namespace, as a
// container runtime does (Multus passes the NAD's config as is).
func (l *lab) cni(command string, nad *nadv1.NetworkAttachmentDefinition, p *pod) {
	l.t.Helper()
	if err := l.tryCNI(command, nad, p); err != nil {
		l.t.Fatal(err)
	}
}

// tryCNI is cni returning kvnet-cni's failure with its output.
// extraEnv is added to kvnet-cni's environment.
func (l *lab) tryCNI(command string, nad *nadv1.NetworkAttachmentDefinition, p *pod, extraEnv ...string) error {
	cmd := exec.Command("ip", "netns", "exec", filepath.Base(l.node(p.node).NS), cniBinary)
	cmd.Env = append(os.Environ(),
		"CNI_COMMAND="+command, "CNI_CONTAINERID=ctr-"+p.name, "CNI_NETNS="+p.netns, "CNI_IFNAME="+p.ifName,
		"CNI_PATH="+filepath.Dir(cniBinary), "CNI_ARGS=IgnoreUnknown=true;K8S_POD_NAMESPACE="+p.ns+";K8S_POD_NAME="+p.name,
		l.CNIEnv(p.node)[0], l.CNIEnv(p.node)[1])
	cmd.Env = append(cmd.Env, extraEnv...)
	cmd.Stdin = strings.NewReader(nad.Spec.Config)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("kvnet-cni %s %s: %v\n%s%s", command, p.name, err, stdout.String(), stderr.String())
	}
	return nil
}

// deletePod does what kubelet does for a deleted pod: CNI DEL, then
// confirms the deletion (grace period 0).
func (l *lab) deletePod(nad *nadv1.NetworkAttachmentDefinition, p *pod) {
	l.t.Helper()
	l.cni("DEL", nad, p)
	obj := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: p.ns, Name: p.name}}
	if err := c.Delete(context.Background(), obj, client.GracePeriodSeconds(0)); err != nil {
		l.t.Fatal(err)
	}
}

func ping(from *pod, ip string) error {
	return nstest.Ping(from.netns, ip)
}

func mustReach(t *testing.T, from *pod, ip string) {
	t.Helper()
	testenv.Eventually(t, waitTimeout, fmt.Sprintf("%s reaches %s", from.name, ip), func() error { return ping(from, ip) })
}

func mustNotReach(t *testing.T, from *pod, ip string) {
	t.Helper()
	for range 3 {
		if err := ping(from, ip); err == nil {
			t.Errorf("%s/%s reached %s", from.ns, from.name, ip)
			return
		}
	}
}

// tokenPort is where serveToken answers.
const tokenPort = 7777

// serveToken answers each TCP connection to tokenPort in p's namespace with
// p's name, until the test ends.
func serveToken(t *testing.T, p *pod) {
	t.Helper()
	nstest.ServeLine(t, p.netns, fmt.Sprintf(":%d", tokenPort), func(net.Conn) string { return p.name })
}

// answeredBy connects from p to ip's token server and fails unless want
// answered.
func answeredBy(from *pod, ip, want string) error {
	got, err := tokenAt(from, net.JoinHostPort(ip, fmt.Sprint(tokenPort)))
	if err != nil {
		return err
	}
	if got != want {
		return fmt.Errorf("%s answered as %q, want %q", ip, got, want)
	}
	return nil
}

// tokenAt connects from p to addr and returns the token its server sends.
func tokenAt(from *pod, addr string) (string, error) {
	return nstest.ReadLine(from.netns, addr, 2*time.Second)
}

func linkExists(nsPath, name string) bool {
	h, err := nl.NewHandle(nsPath)
	if err != nil {
		return false
	}
	defer h.Close()
	_, err = h.LinkByName(name)
	return err == nil
}

func networkID(t *testing.T, nad *nadv1.NetworkAttachmentDefinition) int {
	t.Helper()
	var id int
	if _, err := fmt.Sscan(nad.Annotations[udn.NetworkIDAnnotation], &id); err != nil {
		t.Fatalf("NAD %s/%s network ID: %v", nad.Namespace, nad.Name, err)
	}
	return id
}

// TestAgentTwoTenantsThreeNodes drives everything through the API: two
// tenants with the same subnet, pods spread over three nodes.
// TestAgentAnswersKvnetCNI: kvnet-cni's ADD learns the allocation from
// the agent's socket next to its status file (the trace says "node"), and
// from the API server when nothing answers there (the socket removed, as
// when kvnet-node is down): the pod is wired either way.
func TestAgentAnswersKvnetCNI(t *testing.T) {
	l := newLab(t, "n1")
	nad := tenant(t, "agent-sock", "10.1.7.0/24", false)
	traces := t.TempDir()
	add := func(name string) cni.Trace {
		t.Helper()
		p := l.allocatedPod(nad, name, "n1", "ovn-udn1", nil)
		if err := l.tryCNI("ADD", nad, p, "KVNET_CNI_TRACE_DIR="+traces); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(filepath.Join(traces, "ctr-"+name+"-ovn-udn1.json"))
		if err != nil {
			t.Fatal(err)
		}
		var tr cni.Trace
		if err := json.Unmarshal(b, &tr); err != nil {
			t.Fatal(err)
		}
		if tr.Error != "" || tr.Pod != nad.Namespace+"/"+name {
			t.Fatalf("trace %+v", tr)
		}
		t.Logf("trace %+v", tr)
		return tr
	}
	sock := filepath.Join(filepath.Dir(l.StatusFile("n1")), cni.SocketName)
	testenv.Eventually(t, waitTimeout, "the agent's socket "+sock, func() error {
		_, err := os.Stat(sock)
		return err
	})
	if tr := add("s1"); tr.Path != "node" {
		t.Errorf("with the agent's socket: ADD took path %q, want node (%+v)", tr.Path, tr)
	}
	if err := os.Remove(sock); err != nil {
		t.Fatal(err)
	}
	if tr := add("s2"); tr.Path != "api" {
		t.Errorf("without the agent's socket: ADD took path %q, want api (%+v)", tr.Path, tr)
	}
}

func TestAgentTwoTenantsThreeNodes(t *testing.T) {
	l := newLab(t, "n1", "n2", "n3")
	nadA := tenant(t, "agent-a", "10.1.1.0/24", false)
	nadB := tenant(t, "agent-b", "10.1.1.0/24", false)

	a1 := l.runPod(nadA, "a1", "n1", nil)
	a2 := l.runPod(nadA, "a2", "n2", nil)
	a3 := l.runPod(nadA, "a3", "n3", nil)
	b1 := l.runPod(nadB, "b1", "n1", nil)
	b2 := l.runPod(nadB, "b2", "n3", nil)

	t.Run("pods get the node's pod MTU", func(t *testing.T) {
		// The UDN sets no MTU: kvnet-cni takes the agent's (underlay 1500
		// minus VXLAN) from the status file.
		out, err := exec.Command("ip", "netns", "exec", filepath.Base(a1.netns), "cat", "/sys/class/net/ovn-udn1/mtu").CombinedOutput()
		if err != nil || strings.TrimSpace(string(out)) != "1450" {
			t.Errorf("ovn-udn1 MTU %q (%v), want 1450", out, err)
		}
	})
	t.Run("same tenant across nodes", func(t *testing.T) {
		mustReach(t, a1, a2.ip())
		mustReach(t, a2, a3.ip())
		mustReach(t, b1, b2.ip())
		mustReach(t, a1, "10.1.1.1") // the gateway on the pod's own node
	})
	t.Run("tenants do not see each other", func(t *testing.T) {
		// a3 holds an address no tenant-b pod has: b1 must not reach it.
		if a3.ip() == b1.ip() || a3.ip() == b2.ip() {
			t.Fatalf("test setup: a3 %s shares an IP with tenant b", a3.ip())
		}
		mustNotReach(t, b1, a3.ip())
		mustNotReach(t, b2, a3.ip())
	})
	t.Run("egress reaches the external network", func(t *testing.T) {
		mustReach(t, a2, simnet.InternetIP.String())
	})
	t.Run("status file says ready", func(t *testing.T) {
		b, err := os.ReadFile(l.StatusFile("n1"))
		if err != nil {
			t.Fatal(err)
		}
		var st cni.Status
		if err := json.Unmarshal(b, &st); err != nil || !st.Ready {
			t.Errorf("status %s (%v)", b, err)
		}
	})
	t.Run("VTEPs published", func(t *testing.T) {
		var n corev1.Node
		if err := c.Get(context.Background(), client.ObjectKey{Name: l.nodeName("n2")}, &n); err != nil {
			t.Fatal(err)
		}
		if got := n.Annotations[node.VTEPAnnotation]; got != l.node("n2").IP.String() {
			t.Errorf("n2 %s = %q", node.VTEPAnnotation, got)
		}
	})

	t.Run("restart reconciles from scratch", func(t *testing.T) {
		l.stopAgent("n1")
		b, _ := os.ReadFile(l.StatusFile("n1"))
		if !strings.Contains(string(b), `"ready":false`) {
			t.Errorf("status after stop: %s", b)
		}
		// The datapath stays while the agent is down...
		if err := ping(a1, a2.ip()); err != nil {
			t.Errorf("traffic stopped with the agent: %v", err)
		}
		// ...and what changed meanwhile is caught up at start.
		l.deletePod(nadB, b1)
		l.startAgent("n1")
		bridgeB := datapath.BridgeName(networkID(t, nadB))
		testenv.Eventually(t, waitTimeout, "tenant b's bridge gone from n1", func() error {
			if linkExists(l.node("n1").NS, bridgeB) {
				return fmt.Errorf("%s still on n1", bridgeB)
			}
			return nil
		})
		mustReach(t, a1, a2.ip())
	})

	t.Run("deleted pods leave nothing behind", func(t *testing.T) {
		l.deletePod(nadA, a2)
		bridgeA := datapath.BridgeName(networkID(t, nadA))
		testenv.Eventually(t, waitTimeout, "tenant a's bridge gone from n2", func() error {
			if linkExists(l.node("n2").NS, bridgeA) {
				return fmt.Errorf("%s still on n2", bridgeA)
			}
			return nil
		})
		testenv.Eventually(t, waitTimeout, "n1 forgets a2", func() error {
			for _, m := range l.agent("n1").LastPlan().State.RemoteMACs {
				if m.MAC.String() == a2.a.MACAddress {
					return fmt.Errorf("n1 still sends %s to %s", m.MAC, m.VTEP)
				}
			}
			return nil
		})
		mustReach(t, a1, a3.ip())
	})
}

// TestAgentDHCPAndMigration: a VM on a primary network gets its address
// from the node's DHCP server, and when the VMI moves to another node, the
// other nodes' FDB follows.
func TestAgentDHCPAndMigration(t *testing.T) {
	testenv.NeedsFixture(t, env != nil)
	if _, err := os.Stat("/usr/bin/busybox"); err != nil {
		t.Fatalf("busybox (for udhcpc) not found: %v", err)
	}
	ctx := context.Background()
	l := newLab(t, "n1", "n2", "n3")
	nad := tenant(t, "agent-vm", "10.5.0.0/24", true)
	testenv.Create(t, c, &ipamclaimv1alpha1.IPAMClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "agent-vm", Name: "vm1.udn"},
		Spec:       ipamclaimv1alpha1.IPAMClaimSpec{Network: "agent-vm_udn", Interface: "ovn-udn1"},
	})
	vmi := &kubevirtv1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: "agent-vm", Name: "vm1"}}
	testenv.Create(t, c, vmi)
	setVMINode := func(n string) {
		t.Helper()
		vmi.Status.NodeName = l.nodeName(n)
		if err := c.Status().Update(ctx, vmi); err != nil {
			t.Fatal(err)
		}
	}
	setVMINode("n1")
	launcher := func(p *corev1.Pod) {
		p.Labels["kubevirt.io"] = "virt-launcher"
		p.Labels["vm.kubevirt.io/name"] = "vm1"
		p.Annotations[kubevirtv1.DomainAnnotation] = "vm1"
		p.Annotations["k8s.ovn.org/primary-udn-ipamclaim"] = "vm1.udn"
	}
	src := l.runPod(nad, "virt-launcher-vm1-a", "n1", launcher)
	peer := l.runPod(nad, "peer", "n3", nil)

	t.Run("DHCP hands out the allocation", func(t *testing.T) {
		// The VM asks DHCP: drop what kvnet-cni configured in the pod.
		if err := nstest.Exec(src.netns, "ip", "addr", "flush", "dev", "ovn-udn1"); err != nil {
			t.Fatal(err)
		}
		out := filepath.Join(tmpDir, "udhcpc-"+src.name)
		script := out + ".sh"
		if err := os.WriteFile(script, []byte("#!/bin/sh\n[ \"$1\" = bound ] || exit 0\nprintf 'ip=%s\\nmask=%s\\nrouter=%s\\ndns=%s\\nmtu=%s\\nhostname=%s\\n' \"$ip\" \"$mask\" \"$router\" \"$dns\" \"$mtu\" \"$hostname\" > "+out+"\nip addr add \"$ip/$mask\" dev \"$interface\"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, waitTimeout, "DHCP lease", func() error {
			return nstest.Exec(src.netns, "busybox", "udhcpc", "-i", "ovn-udn1", "-n", "-q", "-f", "-t", "3", "-T", "1", "-s", script)
		})
		b, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		want := fmt.Sprintf("ip=%s\nmask=24\nrouter=10.5.0.1\ndns=%s\nmtu=%d\nhostname=vm1\n", src.ip(), dnsServer, l.agent("n1").MTU())
		if string(b) != want {
			t.Errorf("lease:\n%s\nwant:\n%s", b, want)
		}
		mustReach(t, peer, src.ip())
	})

	t.Run("MAC follows the VMI to its new node", func(t *testing.T) {
		dst := l.runPod(nad, "virt-launcher-vm1-b", "n2", launcher)
		if dst.a.MACAddress != src.a.MACAddress || dst.ip() != src.ip() {
			t.Fatalf("target got %s/%s, source %s/%s: the claim must give both the same", dst.a.MACAddress, dst.ip(), src.a.MACAddress, src.ip())
		}
		vtepOnN3 := func() string {
			for _, m := range l.agent("n3").LastPlan().State.RemoteMACs {
				if m.MAC.String() == src.a.MACAddress {
					return m.VTEP.String()
				}
			}
			return "none"
		}
		// Source and target pod hold the same IP and MAC; each answers
		// with its own name, so the peer can tell which one it reached.
		serveToken(t, src)
		serveToken(t, dst)
		// Before the switch-over the source runs the VM.
		testenv.Eventually(t, waitTimeout, "n3 sends the VM's MAC to n1", func() error {
			if got := vtepOnN3(); got != l.node("n1").IP.String() {
				return fmt.Errorf("n3 sends it to %s", got)
			}
			return nil
		})
		testenv.Eventually(t, waitTimeout, "the peer reaches the source pod", func() error { return answeredBy(peer, src.ip(), src.name) })
		setVMINode("n2")
		testenv.Eventually(t, waitTimeout, "n3 sends the VM's MAC to n2", func() error {
			if got := vtepOnN3(); got != l.node("n2").IP.String() {
				return fmt.Errorf("n3 sends it to %s", got)
			}
			return nil
		})
		// The VM's address now answers from the target pod, not the source.
		testenv.Eventually(t, waitTimeout, "the peer reaches the target pod", func() error { return answeredBy(peer, dst.ip(), dst.name) })
		// And only the target: no connection goes back to the source.
		for i := range 5 {
			if err := answeredBy(peer, dst.ip(), dst.name); err != nil {
				t.Fatalf("connection %d after the switch-over: %v", i+1, err)
			}
		}
		if err := nstest.Exec(src.netns, "ip", "link", "show", "ovn-udn1"); err != nil {
			t.Fatal(err)
		}
	})
}

// TestShippedNodeRBAC runs the agent as the kvnet-node service account,
// bound only by config/node/rbac.yaml, and kvnet-cni with the kubeconfig
// the agent writes from those credentials: every call both make must be
// allowed by what we ship.
func TestShippedNodeRBAC(t *testing.T) {
	testenv.NeedsFixture(t, env != nil)
	ctx := context.Background()
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "kvnet-system"}}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if err := controlplane.ApplyFiles(ctx, c, filepath.Join(env.Root, "config", "node")); err != nil {
		t.Fatal(err)
	}
	sa, err := env.CP.Env.ControlPlane.AddUser(envtest.User{
		Name:   "system:serviceaccount:kvnet-system:kvnet-node",
		Groups: []string{"system:serviceaccounts", "system:authenticated"},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	// The agent writes kvnet-cni's kubeconfig from its own credentials.
	cniKC := filepath.Join(tmpDir, "rbac-cni.kubeconfig")
	if _, err := node.WriteCNIKubeconfig(cniKC, sa.Config()); err != nil {
		t.Fatal(err)
	}
	l := newLabAs(t, sa.Config(), cniKC, "n1", "n2")
	nad := tenant(t, "agent-rbac", "10.7.0.0/24", false)
	p1 := l.runPod(nad, "p1", "n1", nil)
	p2 := l.runPod(nad, "p2", "n2", nil)
	mustReach(t, p1, p2.ip())
	var n corev1.Node
	if err := c.Get(ctx, client.ObjectKey{Name: l.nodeName("n1")}, &n); err != nil {
		t.Fatal(err)
	}
	if n.Annotations[node.VTEPAnnotation] == "" {
		t.Error("the agent could not publish its VTEP")
	}
}

// TestAgentReportsExhaustion: when a network's pool is full, kvnet-controller
// marks its NAD, the agent lists it in the status file and kvnet-cni's
// STATUS answers 50 for it; a freed address clears it.
func TestAgentReportsExhaustion(t *testing.T) {
	l := newLab(t, "n1")
	// A /29 primary network: .1 gateway, .2 management, .3-.6 for pods.
	nad := tenant(t, "agent-full", "10.9.0.0/29", false)
	other := tenant(t, "agent-roomy", "10.9.1.0/24", false)
	for i := range 5 {
		testenv.Create(t, c, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "agent-full", Name: fmt.Sprintf("p%d", i)},
			Spec:       corev1.PodSpec{NodeName: l.nodeName("n1"), Containers: []corev1.Container{{Name: "c", Image: "busybox"}}},
		})
	}
	status := func(nad *nadv1.NetworkAttachmentDefinition) error {
		cmd := exec.Command("ip", "netns", "exec", filepath.Base(l.node("n1").NS), cniBinary)
		cmd.Env = append(os.Environ(), "CNI_COMMAND=STATUS", "CNI_PATH="+filepath.Dir(cniBinary),
			"KVNET_STATUS_FILE="+l.StatusFile("n1"))
		cmd.Stdin = strings.NewReader(nad.Spec.Config)
		out, err := cmd.CombinedOutput()
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	}
	testenv.Eventually(t, waitTimeout, "STATUS fails for the full network", func() error {
		err := status(nad)
		if err == nil {
			return errors.New("STATUS succeeded")
		}
		if !strings.Contains(err.Error(), `"code": 50`) || !strings.Contains(err.Error(), "address pool exhausted") {
			return fmt.Errorf("STATUS error %v, want code 50 address pool exhausted", err)
		}
		return nil
	})
	if err := status(other); err != nil {
		t.Errorf("STATUS of another network: %v", err)
	}
	// Free two addresses: the waiting pod takes one, the other is free.
	for _, p := range []string{"p0", "p1"} {
		if err := c.Delete(context.Background(), &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "agent-full", Name: p}}, client.GracePeriodSeconds(0)); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, waitTimeout, "STATUS succeeds again", func() error { return status(nad) })
}
