package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"kvnet.io/kvnet/internal/lab/controlplane"
	"kvnet.io/kvnet/internal/repo"
)

// Files Up writes into the cluster's directory.
const (
	KubeconfigFile = "kubeconfig"
	EnvFile        = "env"
	createdFile    = "created-dirs" // host mount points Up made, for Down
)

// Config configures a cluster.
type Config struct {
	// Dir holds the cluster's state: kubeconfig, env, logs, the registry's
	// storage and every node's directories. Down removes it.
	Dir string
	// BinDir is what hack/build-cluster-tools.sh printed: kubelet,
	// kube-scheduler, registry, the CNI plugins, busybox.
	BinDir string
	// ControlPlaneBinDir holds etcd, kube-apiserver and
	// kube-controller-manager (empty: package controlplane's default).
	ControlPlaneBinDir string
	// Nodes is the number of nodes (1 to 9).
	Nodes int
	// KvnetImages also builds kvnet's images (make images) and pushes them
	// to the registry under <registry>/kvnet/<name>:KvnetTag.
	KvnetImages bool
	// DefaultNetwork is the cluster's default pod network: Flannel (VXLAN,
	// installed from its manifest) when empty or "flannel"; "bridge" is
	// stage 1's layout (the reference bridge plugin per node and host
	// routes between the nodes' pod subnets); "ptp32" is the /32 layout
	// (NetworkPTP32: Calico's, with ptp and host routes).
	DefaultNetwork string
	// Multus is the Multus mode: MultusThick (its DaemonSet, from
	// upstream's manifest) when empty, MultusThin (the thin plugin, from
	// upstream's manifest) or MultusNone.
	Multus string
	// Log receives progress lines (nil: none).
	Log io.Writer
	// KubeVirt installs KubeVirt (kubevirt.go): its images built by the
	// repository (the first build takes long), virt-operator from its
	// release manifest and a KubeVirt CR; Up waits until it is Deployed.
	KubeVirt bool
	// IPFamily is IPFamilyIPv4 (when empty) or IPFamilyDual: nodes,
	// pod subnets, Flannel and kube-proxy of both families (the Service
	// range is always dual-stack).
	IPFamily string
	// WaitForLock makes Up wait for another cluster on this machine to go
	// (LockPath) instead of failing with ErrClusterRunning.
	WaitForLock bool
}

// Cluster is a running cluster.
type Cluster struct {
	// Dir is the state directory (absolute).
	Dir string
	// Kubeconfig is the admin kubeconfig's path.
	Kubeconfig string
	// Registry is the registry's host:port.
	Registry string
	// Images maps image names (pause, busybox; kvnet-controller,
	// kvnet-node with KvnetImages) to references in Registry.
	Images map[string]string
	// Nodes are the nodes' names.
	Nodes []string
	// Client is an admin client.
	Client kubernetes.Interface
	// DefaultNetwork is the default pod network (NetworkFlannel,
	// NetworkBridge or NetworkPTP32).
	DefaultNetwork string
	// Multus is the Multus mode (MultusThick, MultusThin or MultusNone).
	Multus string
	// IPFamily is IPFamilyIPv4 or IPFamilyDual.
	IPFamily string
	// CP is the control plane.
	CP *controlplane.ControlPlane

	log   io.Writer
	sp    *controlplane.Spawner
	procs []*proc
	lock  *os.File
}

// proc is a child process and the end of its wait.
type proc struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
	err  error
}

func (p *proc) exited() error {
	return fmt.Errorf("%s exited (%v); log %s:\n%s", p.name, p.err, p.log, tail(p.log, 15))
}

// Up builds and starts a cluster and waits until every node is Ready. On
// error, what was started is stopped and removed again.
func Up(ctx context.Context, cfg Config) (_ *Cluster, err error) {
	if cfg.Nodes < 1 || cfg.Nodes > 9 {
		return nil, fmt.Errorf("cluster: nodes %d: want 1 to 9", cfg.Nodes)
	}
	if cfg.Dir == "" {
		return nil, errors.New("cluster: empty state directory (Dir)")
	}
	if cfg.Log == nil {
		cfg.Log = io.Discard
	}
	switch cfg.DefaultNetwork {
	case "":
		cfg.DefaultNetwork = NetworkFlannel
	case NetworkFlannel, NetworkBridge, NetworkPTP32:
	default:
		return nil, fmt.Errorf("cluster: default network %q: want %q, %q or %q", cfg.DefaultNetwork, NetworkFlannel, NetworkBridge, NetworkPTP32)
	}
	switch cfg.Multus {
	case "":
		cfg.Multus = MultusThick
	case MultusThick, MultusThin, MultusNone:
	default:
		return nil, fmt.Errorf("cluster: multus %q: want %q, %q or %q", cfg.Multus, MultusThick, MultusThin, MultusNone)
	}
	switch cfg.IPFamily {
	case "":
		cfg.IPFamily = IPFamilyIPv4
	case IPFamilyIPv4:
	case IPFamilyDual:
		if cfg.DefaultNetwork != NetworkFlannel {
			return nil, fmt.Errorf("cluster: ip family %q: only with the default network %q", cfg.IPFamily, NetworkFlannel)
		}
	default:
		return nil, fmt.Errorf("cluster: ip family %q: want %q or %q", cfg.IPFamily, IPFamilyIPv4, IPFamilyDual)
	}
	dual := cfg.IPFamily == IPFamilyDual
	if err := Preflight(cfg.BinDir); err != nil {
		return nil, err
	}
	dir, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return nil, err
	}
	lock, err := lockMachine(LockPath, cfg.WaitForLock)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			_ = lock.Close() // Down closed it too when it ran: harmless
		}
	}()
	if err := Cleanup(dir); err != nil {
		return nil, fmt.Errorf("cluster: leftovers of an earlier run: %w", err)
	}
	root, err := repo.Root()
	if err != nil {
		return nil, err
	}
	for _, d := range []string{"logs", "work"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return nil, err
		}
	}
	c := &Cluster{Dir: dir, log: cfg.Log, DefaultNetwork: cfg.DefaultNetwork, Multus: cfg.Multus, IPFamily: cfg.IPFamily, sp: controlplane.NewSpawner(), Images: map[string]string{}, lock: lock,
		Registry: net.JoinHostPort(HostIP.String(), strconv.Itoa(RegistryPort))}
	defer func() {
		if err != nil {
			_ = c.Down()
		}
	}()
	start := time.Now()
	step := func(format string, args ...any) {
		fmt.Fprintf(cfg.Log, "cluster: [%5.1fs] %s\n", time.Since(start).Seconds(), fmt.Sprintf(format, args...))
	}

	step("network: bridge %s (%s), %d node namespaces", BridgeName, HostIP, cfg.Nodes)
	if err := buildBridge(dual); err != nil {
		return nil, err
	}
	for i := 1; i <= cfg.Nodes; i++ {
		if err := buildNodeNet(i, dual); err != nil {
			return nil, err
		}
	}
	// The host routes each node's pod subnet to the node (with the bridge
	// and ptp32 layouts the nodes do too; Flannel routes between the nodes
	// itself).
	if err := routePodSubnets(cfg.Nodes, cfg.DefaultNetwork != NetworkFlannel); err != nil {
		return nil, err
	}

	step("registry on %s", c.Registry)
	if err := c.startRegistry(ctx, cfg.BinDir); err != nil {
		return nil, err
	}
	step("images: pause, busybox, coredns")
	labImages, err := buildLabImages(ctx, root, cfg.BinDir, filepath.Join(dir, "work"))
	if err != nil {
		return nil, err
	}
	if cfg.DefaultNetwork == NetworkFlannel {
		step("images: flannel, flannel-cni-plugin")
		fl, err := flannelImages(cfg.BinDir)
		if err != nil {
			return nil, err
		}
		labImages = append(labImages, fl...)
	}
	switch cfg.Multus {
	case MultusThick:
		step("image: multus")
		mi, err := multusImage(cfg.BinDir)
		if err != nil {
			return nil, err
		}
		labImages = append(labImages, mi)
	case MultusThin:
		step("image: multus-thin")
		mi, err := multusThinImage(cfg.BinDir)
		if err != nil {
			return nil, err
		}
		labImages = append(labImages, mi)
	}
	var ptp32 []byte
	if cfg.DefaultNetwork == NetworkPTP32 {
		step("CNI plugin: ptp32 (internal/lab/cluster/ptp32)")
		if ptp32, err = buildPTP32Plugin(ctx, root, filepath.Join(dir, "work")); err != nil {
			return nil, err
		}
	}
	refs, err := pushLabImages(ctx, c.Registry, labImages)
	if err != nil {
		return nil, err
	}
	for k, v := range refs {
		c.Images[k] = v
	}
	if cfg.KvnetImages {
		step("images: kvnet-controller, kvnet-node (make images)")
		refs, err := pushKvnetImages(ctx, root, c.Registry, filepath.Join(dir, "work"), cfg.Log)
		if err != nil {
			return nil, err
		}
		for k, v := range refs {
			c.Images[k] = v
		}
	}

	step("control plane: etcd, kube-apiserver, kube-controller-manager")
	c.CP, err = controlplane.Start(ctx, controlplane.Config{
		BinDir: cfg.ControlPlaneBinDir,
		LogDir: filepath.Join(dir, "logs"),
		// The node lifecycle controller takes the not-ready taint the
		// kubelet registers its node with off once the node is Ready
		// (and marks nodes that stop reporting); the ClusterRole
		// aggregation controller fills the view, edit and admin roles;
		// the workload controllers run the add-ons (CoreDNS's
		// Deployment) and what users install; the namespace and
		// garbage collector controllers delete what is in a deleted
		// namespace and what a deleted owner owned (kvnet uninstall); the
		// job controller runs Jobs (virt-operator's install strategy).
		Controllers: []string{"nodelifecycle", "clusterrole-aggregation", "deployment", "replicaset", "daemonset", "podgc", "namespace", "garbagecollector", "job"},
		APIServerArgs: map[string]string{
			// Kubelets register their hostname, which this host cannot
			// resolve: the API server reaches them (exec, logs) at their
			// InternalIP on the bridge.
			"kubelet-preferred-address-types": "InternalIP,Hostname",
			// Webhooks and aggregated APIs are called at their
			// Service's endpoint (a pod IP, which the host routes to
			// its node) rather than its cluster IP: the host runs no
			// kube-proxy, as a control-plane host without a kubelet.
			"enable-aggregator-routing": "true",
		},
		// Pods reach the API server (the kubernetes Service's endpoint)
		// on the bridge, with ServiceAccount tokens; so do the nodes and
		// the host's clients.
		InCluster: &controlplane.InCluster{Address: HostIP, ServiceIP: KubernetesServiceIP},
	})
	if err != nil {
		return nil, err
	}
	c.Kubeconfig = filepath.Join(dir, KubeconfigFile)
	if err := os.WriteFile(c.Kubeconfig, c.CP.Kubeconfig, 0o600); err != nil {
		return nil, err
	}
	if c.Client, err = kubernetes.NewForConfig(c.CP.Config); err != nil {
		return nil, err
	}
	if err := bindNodes(ctx, c.Client); err != nil {
		return nil, err
	}
	proxyKC, err := proxyKubeconfig(ctx, c.CP.Env, c.Client)
	if err != nil {
		return nil, err
	}

	step("kube-scheduler")
	if err := c.startScheduler(cfg.BinDir); err != nil {
		return nil, err
	}

	created, err := makeMountPoints()
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, createdFile), []byte(strings.Join(created, "\n")), 0o644); err != nil { //nolint:gosec // not secret
		return nil, err
	}
	nodes := make([]node, cfg.Nodes)
	for i := 1; i <= cfg.Nodes; i++ {
		n := node{i: i, dir: filepath.Join(dir, "nodes", NodeName(i)), binDir: cfg.BinDir, dual: dual}
		nodes[i-1] = n
		c.Nodes = append(c.Nodes, n.name())
		step("node %s: containerd, kubelet, kube-proxy", n.name())
		kc, err := nodeKubeconfig(c.CP.Env, n.name())
		if err != nil {
			return nil, err
		}
		if err := n.write(kc, proxyKC, c.Images["pause"], c.Registry); err != nil {
			return nil, fmt.Errorf("node %s: %w", n.name(), err)
		}
		if err := makeCgroupRoot(n.cgroupRoot()); err != nil {
			return nil, fmt.Errorf("node %s: %w", n.name(), err)
		}
		if err := c.startNode(n); err != nil {
			return nil, err
		}
	}

	step("waiting for the nodes to register")
	for _, n := range nodes {
		if err := c.waitFor(ctx, 3*time.Minute, "node "+n.name()+" registered", func() (bool, error) {
			_, err := c.Client.CoreV1().Nodes().Get(ctx, n.name(), metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return false, nil
			}
			return err == nil, err
		}); err != nil {
			return nil, err
		}
		// The pod subnet, as kube-controller-manager's node IPAM would
		// assign it (and Flannel reads it): fixed per node here.
		patch := fmt.Sprintf(`{"spec":{"podCIDR":%q,"podCIDRs":[%q]}}`, PodCIDR(n.i), PodCIDR(n.i))
		if dual {
			patch = fmt.Sprintf(`{"spec":{"podCIDR":%q,"podCIDRs":[%q,%q]}}`, PodCIDR(n.i), PodCIDR(n.i), PodCIDR6(n.i))
		}
		if _, err := c.Client.CoreV1().Nodes().Patch(ctx, n.name(), types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			return nil, fmt.Errorf("node %s: set pod CIDR: %w", n.name(), err)
		}
		var cniErr error
		switch cfg.DefaultNetwork {
		case NetworkBridge:
			cniErr = n.writeCNI()
		case NetworkPTP32:
			cniErr = n.writePTP32CNI(ptp32)
		}
		if cniErr != nil {
			return nil, fmt.Errorf("node %s: CNI config: %w", n.name(), cniErr)
		}
	}
	if cfg.DefaultNetwork == NetworkFlannel {
		// Once every node has its pod subnet: flanneld reads it.
		step("Flannel (VXLAN) from its manifest")
		if err := c.installFlannel(ctx, dual); err != nil {
			return nil, err
		}
	}
	step("waiting for the nodes to be Ready")
	for _, n := range nodes {
		if err := c.waitFor(ctx, 3*time.Minute, "node "+n.name()+" Ready", func() (bool, error) {
			nd, err := c.Client.CoreV1().Nodes().Get(ctx, n.name(), metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			return NodeReady(nd), nil
		}); err != nil {
			return nil, err
		}
	}
	switch cfg.Multus {
	case MultusThick:
		step("Multus (thick) from its manifest")
		if err := c.installMultus(ctx); err != nil {
			return nil, err
		}
	case MultusThin:
		step("Multus (thin) from its manifest")
		if err := c.installMultusThin(ctx); err != nil {
			return nil, err
		}
	}
	step("CoreDNS (kube-dns %s)", DNSServiceIP)
	if err := c.installCoreDNS(ctx); err != nil {
		return nil, err
	}
	if cfg.KubeVirt {
		step("KubeVirt: images, virt-operator, KubeVirt CR")
		if err := c.installKubeVirt(ctx, root, cfg.Log); err != nil {
			return nil, err
		}
	}
	if err := c.writeEnv(); err != nil {
		return nil, err
	}
	step("up: %d nodes Ready; KUBECONFIG=%s", cfg.Nodes, c.Kubeconfig)
	return c, nil
}

// NodeReady reports whether a node's Ready condition is True.
func NodeReady(n *corev1.Node) bool {
	for _, cond := range n.Status.Conditions {
		if cond.Type == corev1.NodeReady {
			return cond.Status == corev1.ConditionTrue
		}
	}
	return false
}

// waitFor polls cond until it holds, failing early when a child process
// of the cluster exits or ctx ends.
func (c *Cluster) waitFor(ctx context.Context, timeout time.Duration, what string, cond func() (bool, error)) error {
	deadline := time.Now().Add(timeout)
	var last error
	for {
		ok, err := cond()
		if ok {
			return nil
		}
		if err != nil {
			last = err
		}
		for _, p := range c.procs {
			select {
			case <-p.done:
				return fmt.Errorf("waiting for %s: %w", what, p.exited())
			default:
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: not after %s (last error: %v)", what, timeout, last)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w", what, ctx.Err())
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// start starts a child process under a parent-death signal.
func (c *Cluster) start(name, logPath string, cmd *exec.Cmd) (*proc, error) {
	f, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := c.sp.Do(cmd.Start); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		_ = f.Close()
		close(p.done)
	}()
	c.procs = append(c.procs, p)
	return p, nil
}

func (c *Cluster) startRegistry(ctx context.Context, binDir string) error {
	storage := filepath.Join(c.Dir, "registry")
	if err := os.MkdirAll(storage, 0o755); err != nil {
		return err
	}
	conf := fmt.Sprintf(`# The kvnet-lab cluster's registry (distribution).
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: %s
  delete:
    enabled: true
http:
  addr: %s
`, storage, c.Registry)
	confPath := filepath.Join(c.Dir, "registry.yaml")
	if err := os.WriteFile(confPath, []byte(conf), 0o644); err != nil { //nolint:gosec // a config file
		return err
	}
	cmd := exec.Command(filepath.Join(binDir, "registry"), "serve", confPath)
	// No trace exporter: nothing to send traces to.
	cmd.Env = append(os.Environ(), "OTEL_TRACES_EXPORTER=none", "OTEL_SDK_DISABLED=true")
	if _, err := c.start("registry", filepath.Join(c.Dir, "logs", "registry.log"), cmd); err != nil {
		return err
	}
	url := "http://" + c.Registry + "/v2/"
	return c.waitFor(ctx, time.Minute, "registry at "+url, func() (bool, error) {
		resp, err := http.Get(url) //nolint:gosec,noctx // our own registry
		if err != nil {
			return false, err
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
}

func (c *Cluster) startScheduler(binDir string) error {
	cmd := exec.Command(filepath.Join(binDir, "kube-scheduler"),
		"--kubeconfig="+c.Kubeconfig,
		"--authentication-kubeconfig="+c.Kubeconfig,
		"--authorization-kubeconfig="+c.Kubeconfig,
		"--leader-elect=false",
		"--bind-address=127.0.0.1",
		"--secure-port=0",
		"--v=1",
	)
	_, err := c.start("kube-scheduler", filepath.Join(c.Dir, "logs", "kube-scheduler.log"), cmd)
	return err
}

// startNode starts node n's PID 1 (init.sh) in its network namespace and
// new mount and PID namespaces. unshare --kill-child kills it when
// unshare dies, and with it everything in the node's PID namespace.
func (c *Cluster) startNode(n node) error {
	cmd := exec.Command("nsenter", "--net=/run/netns/"+Netns(n.i), "--",
		"unshare", "--mount", "--pid", "--fork", "--kill-child", "--mount-proc", "--",
		"/bin/sh", n.path("init.sh"))
	_, err := c.start("node "+n.name(), n.path("logs/init.log"), cmd)
	return err
}

// bindNodes gives kubelets (group system:nodes) the system:node role:
// the lab's API server authorizes with RBAC alone (no Node authorizer).
func bindNodes(ctx context.Context, cs kubernetes.Interface) error {
	crb := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "kvnet-lab:nodes"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "system:node"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.GroupKind, Name: "system:nodes"}},
	}
	_, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, crb, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("bind system:nodes to system:node: %w", err)
	}
	return nil
}

// proxyKubeconfig is the kubeconfig every node's kube-proxy uses: a
// client certificate for user system:kube-proxy, bound to the
// system:node-proxier ClusterRole (as kubeadm binds it).
func proxyKubeconfig(ctx context.Context, env *envtest.Environment, cs kubernetes.Interface) ([]byte, error) {
	const user = "system:kube-proxy"
	crb := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "kvnet-lab:kube-proxy"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "system:node-proxier"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}},
	}
	if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, crb, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("bind %s to system:node-proxier: %w", user, err)
	}
	u, err := env.ControlPlane.AddUser(envtest.User{Name: user}, nil)
	if err != nil {
		return nil, fmt.Errorf("kube-proxy: user: %w", err)
	}
	return u.KubeConfig()
}

// nodeKubeconfig is a kubeconfig for the kubelet of node name: a client
// certificate for system:node:<name> in group system:nodes.
func nodeKubeconfig(env *envtest.Environment, name string) ([]byte, error) {
	u, err := env.ControlPlane.AddUser(envtest.User{Name: "system:node:" + name, Groups: []string{"system:nodes"}}, nil)
	if err != nil {
		return nil, fmt.Errorf("node %s: user: %w", name, err)
	}
	kc, err := u.KubeConfig()
	if err != nil {
		return nil, err
	}
	// Check it parses: the kubelet would fail later with less to go on.
	if _, err := clientcmd.Load(kc); err != nil {
		return nil, fmt.Errorf("node %s: kubeconfig: %w", name, err)
	}
	return kc, nil
}

// writeEnv writes the env file: shell assignments for scripts and later
// stages (kvnet install, the demo).
func (c *Cluster) writeEnv() error {
	var b strings.Builder
	fmt.Fprintf(&b, "# kvnet-lab cluster (internal/lab/cluster); source it.\n")
	fmt.Fprintf(&b, "KUBECONFIG=%s\n", c.Kubeconfig)
	fmt.Fprintf(&b, "REGISTRY=%s\n", c.Registry)
	fmt.Fprintf(&b, "PAUSE_IMAGE=%s\n", c.Images["pause"])
	fmt.Fprintf(&b, "BUSYBOX_IMAGE=%s\n", c.Images["busybox"])
	if _, ok := c.Images["kvnet-node"]; ok {
		fmt.Fprintf(&b, "KVNET_REGISTRY=%s/kvnet\nKVNET_TAG=%s\n", c.Registry, KvnetTag)
	}
	fmt.Fprintf(&b, "DEFAULT_NETWORK=%s\nMULTUS=%s\nIP_FAMILY=%s\n", c.DefaultNetwork, c.Multus, c.IPFamily)
	if g, ok := c.Images["guest"]; ok {
		fmt.Fprintf(&b, "GUEST_IMAGE=%s\n", g)
	}
	fmt.Fprintf(&b, "NODES=%q\n", strings.Join(c.Nodes, " "))
	return os.WriteFile(filepath.Join(c.Dir, EnvFile), []byte(b.String()), 0o644) //nolint:gosec // not secret
}

// Down stops every process of the cluster and removes what Up made: the
// namespaces, the bridge and its routes, the nodes' cgroups, the host
// mount points Up created and the state directory.
func (c *Cluster) Down() error {
	for _, p := range c.procs {
		if p.cmd.Process != nil {
			_ = p.cmd.Process.Kill()
		}
	}
	for _, p := range c.procs {
		<-p.done
	}
	c.procs = nil
	var errs []error
	if c.CP != nil {
		if err := c.CP.Stop(); err != nil {
			errs = append(errs, err)
		}
		c.CP = nil
	}
	if c.sp != nil {
		c.sp.Stop()
		c.sp = nil
	}
	if err := cleanup(c.Dir, false); err != nil {
		errs = append(errs, err)
	}
	if c.lock != nil {
		_ = c.lock.Close()
		c.lock = nil
	}
	return errors.Join(errs...)
}

func tail(path string, n int) string {
	b, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
