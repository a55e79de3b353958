//go:build cluster

// The real-cluster test builds kubelet, kube-scheduler, kube-proxy, Multus,
// Flannel, CoreDNS and the registry on its first run (minutes on 2 cores;
// cached after, see hack/build-cluster-tools.sh). It carries the build tag
// "cluster": make test (hack/test.sh) runs it as root after the rest of
// the suite, alone; make cluster-test runs only it.

package cluster

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"kvnet.io/kvnet/internal/repo"
	"kvnet.io/kvnet/internal/testenv"
)

// buildTools runs hack/build-cluster-tools.sh and returns the directory it
// prints.
func buildTools(t testing.TB) string {
	t.Helper()
	root, err := repo.Root()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(root, "hack", "build-cluster-tools.sh"))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("hack/build-cluster-tools.sh: %v\n%s", err, stderr.String())
	}
	return strings.TrimSpace(stdout.String())
}

// errorLines returns the last n lines of a klog or logrus log that report
// errors.
func errorLines(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "E") || strings.Contains(l, "level=error") {
			out = append(out, l)
		}
	}
	if len(out) > n {
		out = out[len(out)-n:]
	}
	return strings.Join(out, "\n")
}

// documentedContainerd is the containerd release docs/cluster.md
// describes the nodes running (Debian bookworm's).
const documentedContainerd = "1.6.20"

type testLog struct{ t testing.TB }

func (l testLog) Write(p []byte) (int, error) {
	l.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// TestClusterPodsReachEachOther brings a 3-node dual-stack cluster up
// (Flannel, Multus thick: docs/cluster.md, "Variants") and, through the
// Kubernetes API only, checks the nodes (Ready, containerd), runs a
// busybox pod from the cluster's registry on each of two nodes with an
// HTTP readiness probe, and execs into one to fetch the other's page by
// pod IP, then over IPv6 (checkDualStack). kvnet runs there with
// kvnet-node's --pod-scope=networks (the scope a large cluster runs),
// the day-two subtests with it.
func TestClusterPodsReachEachOther(t *testing.T) {
	testenv.NeedsRoot(t)
	binDir := buildTools(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	// WaitForLock: queue behind another cluster on this machine.
	c := upForTest(ctx, t, Config{Dir: t.TempDir(), BinDir: binDir, Nodes: 3, KvnetImages: true, IPFamily: IPFamilyDual, Log: testLog{t}, WaitForLock: true})
	if env, err := os.ReadFile(filepath.Join(c.Dir, EnvFile)); err != nil || !strings.Contains(string(env), "IP_FAMILY="+IPFamilyDual+"\n") {
		t.Errorf("%s: want IP_FAMILY=%s: %v\n%s", EnvFile, IPFamilyDual, err, env)
	}
	cs := c.Client

	// kubectl get nodes: three, Ready, on containerd.
	nodes, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(nodes.Items) != 3 {
		t.Fatalf("nodes: got %d, want 3", len(nodes.Items))
	}
	// The nodes run the host's containerd (Debian's, docs/cluster.md):
	// each must report exactly its version.
	out, err := exec.Command("containerd", "--version").Output()
	if err != nil {
		t.Fatalf("containerd --version: %v", err)
	}
	binVersion, err := containerdVersion(string(out))
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes.Items {
		if !NodeReady(&n) {
			t.Errorf("node %s not Ready: %+v", n.Name, n.Status.Conditions)
		}
		if err := checkRuntimeVersion(n.Status.NodeInfo.ContainerRuntimeVersion, binVersion, documentedContainerd); err != nil {
			t.Errorf("node %s: %v", n.Name, err)
		}
		t.Logf("node %s: %s, kubelet %s, podCIDR %s", n.Name, n.Status.NodeInfo.ContainerRuntimeVersion, n.Status.NodeInfo.KubeletVersion, n.Spec.PodCIDR)
	}

	// The default network is Flannel's: its DaemonSet runs on every node
	// and flanneld (VXLAN) has annotated each node with its lease.
	ds, err := cs.AppsV1().DaemonSets("kube-flannel").Get(ctx, "kube-flannel-ds", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ds.Status.NumberReady != 3 {
		t.Errorf("DaemonSet kube-flannel-ds: %d pods ready, want 3", ds.Status.NumberReady)
	}
	for _, n := range nodes.Items {
		if bt := n.Annotations["flannel.alpha.coreos.com/backend-type"]; bt != "vxlan" {
			t.Errorf("node %s: flannel backend-type annotation %q, want vxlan", n.Name, bt)
		}
	}

	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "cluster-e2e"}}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// In-cluster clients: kube-controller-manager gives the namespace its
	// default ServiceAccount (pods are refused without it, the
	// ServiceAccount admission plugin being on) and the CA bundle.
	testenv.Eventually(t, time.Minute, "default ServiceAccount and kube-root-ca.crt in "+ns.Name, func() error {
		if _, err := cs.CoreV1().ServiceAccounts(ns.Name).Get(ctx, "default", metav1.GetOptions{}); err != nil {
			return err
		}
		_, err := cs.CoreV1().ConfigMaps(ns.Name).Get(ctx, "kube-root-ca.crt", metav1.GetOptions{})
		return err
	})
	for _, p := range []*corev1.Pod{webPod(ns.Name, "web-1", NodeName(1), c.Images["busybox"]), webPod(ns.Name, "web-2", NodeName(2), c.Images["busybox"])} {
		if _, err := cs.CoreV1().Pods(ns.Name).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	ready := map[string]*corev1.Pod{}
	for _, name := range []string{"web-1", "web-2"} {
		ready[name] = waitPodReady(ctx, t, c, ns.Name, name)
	}
	for name, p := range ready {
		// Pulled from the cluster's registry, not imported behind the
		// kubelet's back: the image ID is the registry's digest.
		if id := p.Status.ContainerStatuses[0].ImageID; !strings.HasPrefix(id, c.Registry+"/kvnet-lab/busybox@sha256:") {
			t.Errorf("pod %s: image ID %q, want one pulled from %s", name, id, c.Registry)
		}
	}
	if a, b := ready["web-1"].Spec.NodeName, ready["web-2"].Spec.NodeName; a == b {
		t.Fatalf("both pods on node %s", a)
	}
	for _, n := range nodes.Items {
		for name, p := range ready {
			if p.Spec.NodeName != n.Name {
				continue
			}
			// Flannel's bridge on the node's lease, the node's pod CIDR.
			if cidr, err := netip.ParsePrefix(n.Spec.PodCIDR); err != nil || !cidr.Contains(netip.MustParseAddr(p.Status.PodIP)) {
				t.Errorf("pod %s: IP %s not in node %s's pod CIDR %q", name, p.Status.PodIP, n.Name, n.Spec.PodCIDR)
			}
		}
	}

	// kubectl exec web-1 -- httpget http://<web-2's IP>:8080/
	url := fmt.Sprintf("http://%s:8080/", ready["web-2"].Status.PodIP)
	if got, want := strings.TrimSpace(execIn(ctx, t, c, ns.Name, "web-1", "httpget", url)), "hello from web-2"; got != want {
		t.Errorf("web-1 fetching %s: got %q, want %q", url, got, want)
	}

	t.Run("DualStack", func(t *testing.T) { checkDualStack(ctx, t, c, ns.Name) })
	t.Run("InClusterAPI", func(t *testing.T) { testInClusterAPI(ctx, t, c, ns.Name) })
	t.Run("KubeProxy", func(t *testing.T) { testKubeProxy(ctx, t, c, ns.Name) })
	t.Run("CoreDNS", func(t *testing.T) { testCoreDNS(ctx, t, c, ns.Name) })
	t.Run("Multus", func(t *testing.T) { testMultus(ctx, t, c, ns.Name) })
	t.Run("Kvnet", func(t *testing.T) { testKvnet(ctx, t, c, true, "networks") })
}

// testCoreDNS resolves the Service web (KubeProxy made it) by name from
// a pod, through the cluster DNS its resolv.conf names.
func testCoreDNS(ctx context.Context, t *testing.T, c *Cluster, ns string) {
	svc, err := c.Client.CoreV1().Services(ns).Get(ctx, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	resolv := execIn(ctx, t, c, ns, "client-3", "cat", "/etc/resolv.conf")
	if !strings.Contains(resolv, "nameserver "+DNSServiceIP.String()) {
		t.Errorf("client-3's resolv.conf names no %s:\n%s", DNSServiceIP, resolv)
	}
	name := "web." + ns + ".svc.cluster.local"
	testenv.Eventually(t, 30*time.Second, "nslookup "+name+" from client-3", func() error {
		out, errOut, err := execOut(ctx, c, ns, "client-3", "nslookup", name)
		if err != nil {
			return fmt.Errorf("%v: %s%s", err, out, errOut)
		}
		if !strings.Contains(out, "Address: "+svc.Spec.ClusterIP) {
			return fmt.Errorf("no address %s in %q", svc.Spec.ClusterIP, out)
		}
		return nil
	})
	// And the Service answers at its name.
	out := execIn(ctx, t, c, ns, "client-3", "httpget", "http://"+name+"/")
	if !strings.HasPrefix(out, "hello from web-") {
		t.Errorf("httpget http://%s/: got %q", name, out)
	}
}

// testKubeProxy checks kube-proxy's Services: a ClusterIP Service in
// front of web-1 and web-2 reached from a pod on the third node, and the
// kubernetes Service (10.96.0.1:443) from a pod with its ServiceAccount.
func testKubeProxy(ctx context.Context, t *testing.T, c *Cluster, ns string) {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: ns},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{"app": "web"},
			Ports:    []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromString("http")}},
		},
	}
	svc, err := c.Client.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Client.CoreV1().Pods(ns).Create(ctx, sleeper(ns, "client-3", NodeName(3), c.Images["busybox"]), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPodReady(ctx, t, c, ns, "client-3")
	url := "http://" + svc.Spec.ClusterIP + "/"
	testenv.Eventually(t, time.Minute, "client-3 on "+NodeName(3)+" reaches Service web at "+url, func() error {
		out, errOut, err := execOut(ctx, c, ns, "client-3", "httpget", url)
		if err != nil {
			return fmt.Errorf("%v: %s", err, errOut)
		}
		if !strings.HasPrefix(out, "hello from web-") {
			return fmt.Errorf("got %q", out)
		}
		return nil
	})
	api := fmt.Sprintf("https://%s:443/api/v1/namespaces/%s/pods/web-2", KubernetesServiceIP, ns)
	testenv.Eventually(t, 30*time.Second, "client-3 reads pod web-2 through the kubernetes Service at "+api, func() error {
		out, errOut, err := execOut(ctx, c, ns, "client-3", append(append([]string{"httpget"}, saFiles...), api)...)
		if err != nil {
			return fmt.Errorf("%v: %s", err, errOut)
		}
		if !strings.Contains(out, `"name":"web-2"`) {
			return fmt.Errorf("no pod web-2 in %q", out)
		}
		return nil
	})
}

// waitPodReady waits for pod ns/name to be Ready and returns it.
func waitPodReady(ctx context.Context, t *testing.T, c *Cluster, ns, name string) *corev1.Pod {
	t.Helper()
	var ready *corev1.Pod
	testenv.Eventually(t, 3*time.Minute, "pod "+ns+"/"+name+" Ready", func() error {
		p, err := c.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, cond := range p.Status.Conditions {
			if cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue {
				ready = p
				return nil
			}
		}
		return fmt.Errorf("phase %s, conditions %+v, containers %+v", p.Status.Phase, p.Status.Conditions, p.Status.ContainerStatuses)
	})
	return ready
}

// execOut runs a command in pod ns/pod's first container through the
// API server (kubectl exec) and returns its stdout and stderr.
func execOut(ctx context.Context, c *Cluster, ns, pod string, cmd ...string) (stdout, stderr string, err error) {
	return PodExec(ctx, c.CP.Config, c.Client, ns, pod, cmd...)
}

// execIn is execOut failing the test on an error.
func execIn(ctx context.Context, t *testing.T, c *Cluster, ns, pod string, cmd ...string) string {
	t.Helper()
	out, errOut, err := execOut(ctx, c, ns, pod, cmd...)
	if err != nil {
		t.Fatalf("exec %s -- %s: %v (stderr %q)", pod, strings.Join(cmd, " "), err, errOut)
	}
	return out
}

// saFiles are a pod's ServiceAccount files, as httpget flags.
var saFiles = []string{
	"-cacert", "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt",
	"-token", "/var/run/secrets/kubernetes.io/serviceaccount/token",
}

// testInClusterAPI checks that a pod reaches the API server where the
// kubernetes Endpoints say, verifies it with the CA of kube-root-ca.crt
// and is authenticated by its ServiceAccount token.
func testInClusterAPI(ctx context.Context, t *testing.T, c *Cluster, ns string) {
	slices, err := c.Client.DiscoveryV1().EndpointSlices(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{LabelSelector: "kubernetes.io/service-name=kubernetes"})
	if err != nil {
		t.Fatal(err)
	}
	var endpoint string
	for _, s := range slices.Items {
		for _, e := range s.Endpoints {
			for _, a := range e.Addresses {
				for _, p := range s.Ports {
					endpoint = net.JoinHostPort(a, fmt.Sprint(*p.Port))
				}
			}
		}
	}
	if want := HostIP.String() + ":"; !strings.HasPrefix(endpoint, want) {
		t.Fatalf("kubernetes Service endpoint %q, want the advertised %s<port>", endpoint, want)
	}
	// Let the namespace's default ServiceAccount read pods there.
	rb := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "default-view", Namespace: ns},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "view"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "default", Namespace: ns}},
	}
	if _, err := c.Client.RbacV1().RoleBindings(ns).Create(ctx, rb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	url := fmt.Sprintf("https://%s/api/v1/namespaces/%s/pods/web-2", endpoint, ns)
	testenv.Eventually(t, 30*time.Second, "web-1 reads pod web-2 from "+url+" with its ServiceAccount", func() error {
		out, errOut, err := execOut(ctx, c, ns, "web-1", append(append([]string{"httpget"}, saFiles...), url)...)
		if err != nil {
			return fmt.Errorf("%v: %s", err, errOut)
		}
		if !strings.Contains(out, `"name":"web-2"`) {
			return fmt.Errorf("no pod web-2 in %q", out)
		}
		return nil
	})
}
