// Package simcluster runs the node side of a simulated cluster on this
// machine: simulated nodes (internal/lab/simnet), kvnet-node on each, and
// optionally the kubelet + Multus stand-in (internal/lab/simkubelet) per
// node and the virt-controller stand-in (internal/lab/simvirt). It is the
// one harness the lab (`kvnet-lab up`), the demo and the privileged tests
// share, so that what the tests prove is what the lab runs.
//
// kvnet-node runs either as the shipped binary, one process per node (the
// lab: a node agent that dies is a process that exits, as on a real node),
// or inside this process (tests that inspect an agent's plan). Either way a
// component that stops on its own after start-up is a failure: Failed is
// closed and Err says which component and why, so its owner can report it
// and shut the rest down, instead of losing the error.
//
// It is lab-only: nothing in kvnet-controller, kvnet-node or kvnet-cni
// links it (internal/lint checks this).
package simcluster

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"kvnet.io/kvnet/internal/cni"
	"kvnet.io/kvnet/internal/datapath"
	"kvnet.io/kvnet/internal/lab/simkubelet"
	"kvnet.io/kvnet/internal/lab/simnet"
	"kvnet.io/kvnet/internal/lab/simvirt"
	"kvnet.io/kvnet/internal/node"
	"kvnet.io/kvnet/internal/physnet"
)

// Config describes a simulated cluster. Admin, StateDir, CNIBinDir and
// Nodes are required.
type Config struct {
	// Prefix names every network namespace (simnet.Cluster.Prefix); empty:
	// a random one. Namespaces left by an earlier run with this prefix are
	// removed first.
	Prefix string
	// Nodes are the simulated nodes' simnet names, e.g. "n1", "n2".
	Nodes []string
	// NodeName maps a simnet name to the Kubernetes Node name; nil:
	// "<Prefix>-<name>", unique per run.
	NodeName func(simName string) string

	// Admin reaches the API server as an admin: the Node objects and the
	// stand-ins for components that are not kvnet's (kubelet,
	// virt-controller) use it.
	Admin *rest.Config
	// APIAddr is the API server's host:port on this host's loopback; it is
	// forwarded into each node namespace, where kvnet-cni runs.
	APIAddr string

	// AgentBinary runs kvnet-node as this executable, one process per node,
	// with AgentKubeconfig. Empty: kvnet-node runs in this process with
	// Agent.
	AgentBinary     string
	AgentKubeconfig string
	Agent           *rest.Config
	// AgentMetricsAddr, with AgentBinary, is where each kvnet-node serves
	// its metrics inside its node's namespace (e.g. "127.0.0.1:9464");
	// empty: none.
	AgentMetricsAddr string
	// Resync is kvnet-node's resync period; 0: its default.
	Resync time.Duration
	// PodScope is kvnet-node's --pod-scope; "": its default.
	PodScope string
	// DNS servers kvnet-node hands out by DHCP.
	DNS []netip.Addr
	// ClusterDNS is kvnet-node's cluster DNS Service; zero: its default.
	ClusterDNS types.NamespacedName

	// StateDir holds per-node files: kvnet-node's status file, kvnet-cni's
	// kubeconfig (written by kvnet-node, as the DaemonSet does), the CNI
	// cache and the process logs.
	StateDir string
	// CNIBinDir holds kvnet-cni and kvnet-ipam. With CNIBinary set, the
	// harness installs that binary there first, as kvnet-node's init step
	// does on a real node.
	CNIBinDir string
	CNIBinary string
	// ExtraCNIPlugins are plugin executables copied into CNIBinDir.
	ExtraCNIPlugins []string
	// CNIKubeconfig, when set, is the kubeconfig every kvnet-cni uses
	// instead of the one kvnet-node writes per node.
	CNIKubeconfig string

	// Kubelets runs a simulated kubelet on each node.
	Kubelets bool
	// MultusDefaultNetwork makes the kubelets behave like stock Multus
	// (simkubelet.Config.ClusterDefaultNetwork) over a stand-in cluster
	// default network: on each node a bridge cni0 with host-local IPAM,
	// 10.244.<i>.0/24 on the i-th node (no routes between nodes), as
	// Flannel's per-node bridge. CNIBinDir must hold the bridge and
	// host-local plugins (ExtraCNIPlugins).
	MultusDefaultNetwork bool
	// Runtime runs the pods' "containers" on every node's kubelet (the
	// lab's QEMU guests: simlauncher.Launcher); nil runs none.
	Runtime simkubelet.Runtime
	// Virt runs the virt-controller stand-in over all nodes.
	Virt bool
	// GuestAgent, with Virt, tells the virt-controller stand-in what the
	// guests hold (simvirt.Config.GuestAgent; the lab's is the Runtime,
	// simlauncher.Launcher); nil: VMIs report their launcher pods'
	// allocations.
	GuestAgent simvirt.GuestAgent

	// Log receives the components' logs; the zero value discards.
	Log logr.Logger
}

// Cluster is a running simulated cluster.
type Cluster struct {
	cfg Config
	Sim *simnet.Cluster

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	fwds   []*simnet.Forwarder
	apiFwd map[string]*simnet.Forwarder // by simnet node name

	failOnce sync.Once
	failed   chan struct{} // closed on the first failure
	mu       sync.Mutex    // guards following
	failErr  error
	agents   map[string]*agent // by simnet name
	closing  bool
}

type agent struct {
	inproc *node.Agent // in-process mode
	proc   *exec.Cmd   // process mode
	cancel context.CancelFunc
	done   chan error
	killed atomic.Bool // by KillAgent: its exit is no failure
}

// Start builds the nodes and starts every component, and returns once
// every kvnet-node is ready. On error it removes what it made.
func Start(ctx context.Context, cfg Config) (_ *Cluster, err error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	if cfg.Prefix == "" {
		cfg.Prefix = simnet.RandomPrefix()
	}
	cfg.setDefaults()
	if err := simnet.Cleanup(cfg.Prefix); err != nil {
		return nil, fmt.Errorf("simcluster: remove a previous run's namespaces: %w", err)
	}
	sim, err := simnet.New(cfg.Prefix, cfg.Nodes...)
	if err != nil {
		return nil, err
	}
	c := &Cluster{cfg: cfg, Sim: sim, failed: make(chan struct{}), agents: map[string]*agent{}, apiFwd: map[string]*simnet.Forwarder{}}
	c.ctx, c.cancel = context.WithCancel(context.WithoutCancel(ctx))
	defer func() {
		if err != nil {
			_ = c.Close()
		}
	}()
	for _, d := range []string{cfg.StateDir, cfg.CNIBinDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return c, err
		}
	}
	for _, p := range cfg.ExtraCNIPlugins {
		if err := copyExecutable(p, filepath.Join(cfg.CNIBinDir, filepath.Base(p))); err != nil {
			return c, fmt.Errorf("simcluster: install CNI plugin %s: %w", p, err)
		}
	}
	if cfg.CNIBinary != "" {
		if err := node.InstallCNI(cfg.CNIBinary, cfg.CNIBinDir); err != nil {
			return c, fmt.Errorf("simcluster: %w", err)
		}
	}
	cs, err := kubernetes.NewForConfig(cfg.Admin)
	if err != nil {
		return c, err
	}
	for _, nd := range sim.Nodes {
		name := cfg.NodeName(nd.Name)
		if err := os.MkdirAll(c.nodeDir(nd.Name), 0o755); err != nil {
			return c, err
		}
		// Every node is on the simulated physical network, as an admin (or
		// a NodeNetworkConfigurationPolicy) would say with its bridge
		// mappings.
		mappings := map[string]string{physnet.BridgeMappingsAnnotation: simnet.PhysicalNetwork + ":" + simnet.PhysicalBridge}
		_, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: mappings}}, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": mappings}})
			_, err = cs.CoreV1().Nodes().Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{})
		}
		if err != nil {
			return c, fmt.Errorf("simcluster: create node %s: %w", name, err)
		}
		// kvnet-cni runs in the node namespace and reads the API server at
		// the host's loopback address.
		f, err := simnet.Forward(nd.NS, cfg.APIAddr, cfg.APIAddr)
		if err != nil {
			return c, err
		}
		c.fwds = append(c.fwds, f)
		c.apiFwd[nd.Name] = f
		if err := c.StartAgent(nd.Name); err != nil {
			return c, err
		}
	}
	if cfg.Kubelets {
		for _, nd := range sim.Nodes {
			kc := c.KubeletConfig(nd.Name)
			c.run("simulated kubelet "+kc.NodeName, func(ctx context.Context) error { return simkubelet.Run(ctx, kc) })
		}
	}
	if cfg.Virt {
		names := make([]string, len(sim.Nodes))
		for i, nd := range sim.Nodes {
			names[i] = cfg.NodeName(nd.Name)
		}
		vc := simvirt.Config{RESTConfig: cfg.Admin, Nodes: names, GuestAgent: cfg.GuestAgent, Log: cfg.Log.WithName("simvirt")}
		c.run("virt-controller stand-in", func(ctx context.Context) error { return simvirt.Run(ctx, vc) })
	}
	for _, nd := range sim.Nodes {
		if err := c.WaitAgentReady(ctx, nd.Name, 2*time.Minute); err != nil {
			return c, err
		}
	}
	return c, nil
}

func (cfg *Config) setDefaults() {
	if cfg.NodeName == nil {
		prefix := cfg.Prefix
		cfg.NodeName = func(n string) string { return prefix + "-" + n }
	}
}

func (cfg *Config) check() error {
	var missing []string
	if cfg.Admin == nil {
		missing = append(missing, "Admin")
	}
	if cfg.APIAddr == "" {
		missing = append(missing, "APIAddr")
	}
	if cfg.StateDir == "" {
		missing = append(missing, "StateDir")
	}
	if cfg.CNIBinDir == "" {
		missing = append(missing, "CNIBinDir")
	}
	if len(cfg.Nodes) == 0 {
		missing = append(missing, "Nodes")
	}
	switch {
	case cfg.AgentBinary != "" && cfg.AgentKubeconfig == "":
		missing = append(missing, "AgentKubeconfig (for AgentBinary)")
	case cfg.AgentBinary == "" && cfg.Agent == nil:
		missing = append(missing, "Agent or AgentBinary")
	}
	if len(missing) > 0 {
		return fmt.Errorf("simcluster: Config lacks %s", strings.Join(missing, ", "))
	}
	return nil
}

// Failed is closed once a component stopped on its own; Err says which.
func (c *Cluster) Failed() <-chan struct{} { return c.failed }

// Err is the first component failure, or nil.
func (c *Cluster) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.failErr
}

func (c *Cluster) fail(err error) {
	c.mu.Lock()
	if c.closing {
		c.mu.Unlock()
		return
	}
	if c.failErr == nil {
		c.failErr = err
	}
	c.mu.Unlock()
	c.failOnce.Do(func() { close(c.failed) })
}

// run runs f until Close; f returning before that is a failure.
func (c *Cluster) run(what string, f func(ctx context.Context) error) {
	c.wg.Go(func() {
		err := f(c.ctx)
		if c.ctx.Err() != nil {
			return
		}
		if err == nil {
			err = errors.New("stopped")
		}
		c.fail(fmt.Errorf("%s: %w", what, err))
	})
}

// NodeName is the Kubernetes Node of simulated node n.
func (c *Cluster) NodeName(n string) string { return c.cfg.NodeName(n) }

// Node is simulated node n.
func (c *Cluster) Node(n string) (*simnet.Node, error) {
	for _, nd := range c.Sim.Nodes {
		if nd.Name == n {
			return nd, nil
		}
	}
	return nil, fmt.Errorf("simcluster: no node %q", n)
}

func (cfg Config) nodeDir(n string) string {
	cfg.setDefaults()
	return filepath.Join(cfg.StateDir, "nodes", cfg.NodeName(n))
}

// StatusFile is node n's kvnet-node status file (kvnet-cni reads it
// through $KVNET_STATUS_FILE: the simulated nodes share one filesystem).
func (cfg Config) StatusFile(n string) string {
	return filepath.Join(cfg.nodeDir(n), "cni-status.json")
}

// CNIKubeconfigOf is the kubeconfig kvnet-cni uses on node n.
func (cfg Config) CNIKubeconfigOf(n string) string {
	if cfg.CNIKubeconfig != "" {
		return cfg.CNIKubeconfig
	}
	return filepath.Join(cfg.nodeDir(n), "kvnet-cni.kubeconfig")
}

// CNIEnv is the environment kvnet-cni needs on node n, beyond CNI_*.
func (cfg Config) CNIEnv(n string) []string {
	return []string{"KVNET_KUBECONFIG=" + cfg.CNIKubeconfigOf(n), "KVNET_STATUS_FILE=" + cfg.StatusFile(n)}
}

// AgentLog is node n's kvnet-node log in process mode.
func (cfg Config) AgentLog(n string) string { return filepath.Join(cfg.nodeDir(n), "kvnet-node.log") }

// KubeletConfig is the simulated kubelet configuration of node n;
// simkubelet.PodNetNS tells a pod's namespace from it.
func (cfg Config) KubeletConfig(n string) simkubelet.Config {
	cfg.setDefaults()
	name := cfg.NodeName(n)
	return simkubelet.Config{
		NodeName:       name,
		NodeNetNS:      cfg.Prefix + "-" + n,
		RESTConfig:     cfg.Admin,
		CNIBinDir:      cfg.CNIBinDir,
		CNICacheDir:    filepath.Join(cfg.nodeDir(n), "cni-cache"),
		PodNetNSPrefix: cfg.Prefix + "-" + n + "-pod-",
		Env:            cfg.CNIEnv(n),
		Runtime:        cfg.Runtime,
		Log:            cfg.Log.WithName("simkubelet").WithValues("node", name),

		ClusterDefaultNetwork: cfg.clusterDefaultNetwork(n),
	}
}

// clusterDefaultNetwork is node n's stand-in cluster default network
// configuration, or nil (see MultusDefaultNetwork).
func (cfg Config) clusterDefaultNetwork(n string) []byte {
	if !cfg.MultusDefaultNetwork {
		return nil
	}
	i := slices.Index(cfg.Nodes, n) + 1
	return fmt.Appendf(nil, `{"cniVersion":"1.0.0","name":"cluster-default","plugins":[{"type":"bridge","bridge":"cni0","isGateway":true,`+
		`"ipam":{"type":"host-local","ranges":[[{"subnet":"10.244.%d.0/24"}]],"routes":[{"dst":"0.0.0.0/0"}],"dataDir":%q}}]}`,
		i, filepath.Join(cfg.nodeDir(n), "host-local"))
}

func (c *Cluster) nodeDir(n string) string { return c.cfg.nodeDir(n) }

// StatusFile is node n's kvnet-node status file.
func (c *Cluster) StatusFile(n string) string { return c.cfg.StatusFile(n) }

// CNIKubeconfig is the kubeconfig kvnet-cni uses on node n.
func (c *Cluster) CNIKubeconfig(n string) string { return c.cfg.CNIKubeconfigOf(n) }

// CNIEnv is the environment kvnet-cni needs on node n, beyond CNI_*.
func (c *Cluster) CNIEnv(n string) []string { return c.cfg.CNIEnv(n) }

// AgentPIDFile holds the process ID of node n's kvnet-node in process
// mode (for whoever wants to kill it, as a chaos test does).
func (c *Cluster) AgentPIDFile(n string) string { return filepath.Join(c.nodeDir(n), "kvnet-node.pid") }

// AgentLog is node n's kvnet-node log in process mode.
func (c *Cluster) AgentLog(n string) string { return c.cfg.AgentLog(n) }

// KubeletConfig is the simulated kubelet configuration of node n.
func (c *Cluster) KubeletConfig(n string) simkubelet.Config {
	kc := c.cfg.KubeletConfig(n)
	if nd, err := c.Node(n); err == nil {
		kc.NodeIP = nd.IP // reported as the Node's InternalIP
	}
	return kc
}

// Agent is node n's in-process kvnet-node, or nil (process mode, or
// stopped).
func (c *Cluster) Agent(n string) *node.Agent {
	c.mu.Lock()
	defer c.mu.Unlock()
	if a := c.agents[n]; a != nil {
		return a.inproc
	}
	return nil
}

// AgentPID is the process ID of node n's kvnet-node in process mode, or 0.
func (c *Cluster) AgentPID(n string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if a := c.agents[n]; a != nil && a.proc != nil && a.proc.Process != nil {
		return a.proc.Process.Pid
	}
	return 0
}

// StartAgent starts kvnet-node on node n (after StopAgent, a fresh one
// that rebuilds its datapath from the API). It does not wait for it to be
// ready: see WaitAgentReady.
func (c *Cluster) StartAgent(n string) error {
	nd, err := c.Node(n)
	if err != nil {
		return err
	}
	c.mu.Lock()
	running := c.agents[n] != nil
	c.mu.Unlock()
	if running {
		return fmt.Errorf("simcluster: kvnet-node on %s runs already", n)
	}
	name := c.cfg.NodeName(n)
	ctx, cancel := context.WithCancel(c.ctx)
	a := &agent{cancel: cancel, done: make(chan error, 1)}
	if c.cfg.AgentBinary != "" {
		args := []string{
			"--node-name", name,
			"--router-netns-prefix", "kvnet-" + filepath.Base(nd.NS) + "-r",
			"--underlay-ip", nd.IP.String(), "--underlay-interface", simnet.UnderlayDev,
			"--status-file", c.StatusFile(n),
			"--kubeconfig", c.cfg.AgentKubeconfig,
			"--metrics-bind-address", cmp.Or(c.cfg.AgentMetricsAddr, "0"), "--health-probe-bind-address", "0",
		}
		if c.cfg.CNIKubeconfig == "" {
			args = append(args, "--cni-kubeconfig", c.CNIKubeconfig(n))
		}
		if len(c.cfg.DNS) > 0 {
			dns := make([]string, len(c.cfg.DNS))
			for i, d := range c.cfg.DNS {
				dns[i] = d.String()
			}
			args = append(args, "--dns", strings.Join(dns, ","))
		}
		if c.cfg.Resync > 0 {
			args = append(args, "--resync", c.cfg.Resync.String())
		}
		if c.cfg.PodScope != "" {
			args = append(args, "--pod-scope", c.cfg.PodScope)
		}
		if c.cfg.ClusterDNS.Name != "" {
			args = append(args, "--cluster-dns-service", c.cfg.ClusterDNS.String())
		}
		logf, err := os.OpenFile(c.AgentLog(n), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			cancel()
			return err
		}
		// kvnet-node runs in the node's network namespace, entered from
		// outside as a node's own network is; nsenter enters only the
		// network namespace, so the router namespaces it names under
		// /run/netns are the host's, where the lab finds and removes them.
		cmd := exec.Command("nsenter", append([]string{"--net=" + nd.NS, "--", c.cfg.AgentBinary}, args...)...)
		cmd.Stdout, cmd.Stderr = logf, logf
		// The agent dies with the lab. Pdeathsig fires when the thread
		// that started the child exits, and Go ends threads a goroutine
		// left locked (as network-namespace code does), so the child is
		// started and waited for on a thread locked for its lifetime.
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		started := make(chan error, 1)
		go func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			if err := cmd.Start(); err != nil {
				started <- err
				return
			}
			started <- nil
			err := cmd.Wait()
			logf.Close()
			if err == nil {
				err = errors.New("exited")
			}
			a.done <- fmt.Errorf("%w (log: %s)", err, c.AgentLog(n))
		}()
		if err := <-started; err != nil {
			logf.Close()
			cancel()
			return fmt.Errorf("simcluster: start kvnet-node on %s: %w", name, err)
		}
		a.proc = cmd
		_ = os.WriteFile(c.AgentPIDFile(n), []byte(fmt.Sprint(cmd.Process.Pid)), 0o644)
		go func() {
			<-ctx.Done()
			_ = cmd.Process.Signal(syscall.SIGTERM)
		}()
	} else {
		nc := node.Config{
			NodeName:   name,
			Datapath:   datapath.NodeConfig{NetNS: nd.NS, UnderlayIP: nd.IP, UnderlayDev: simnet.UnderlayDev},
			DNS:        c.cfg.DNS,
			ClusterDNS: c.cfg.ClusterDNS,
			// As kvnet-node's flag default.
			DNSProxyPort: node.DefaultDNSProxyPort,
			StatusFile:   c.StatusFile(n),
			Resync:       c.cfg.Resync,
			PodScope:     c.cfg.PodScope,
		}
		if c.cfg.CNIKubeconfig == "" {
			nc.CNIKubeconfig = c.CNIKubeconfig(n)
		}
		ag, err := node.New(c.cfg.Agent, nc)
		if err != nil {
			cancel()
			return fmt.Errorf("simcluster: kvnet-node on %s: %w", name, err)
		}
		a.inproc = ag
		go func() {
			err := ag.Run(ctx)
			if err == nil {
				err = errors.New("stopped")
			}
			a.done <- err
		}()
	}
	c.mu.Lock()
	c.agents[n] = a
	c.mu.Unlock()
	c.wg.Go(func() {
		err := <-a.done
		a.done <- err // for StopAgent
		if ctx.Err() == nil && !a.killed.Load() {
			c.fail(fmt.Errorf("kvnet-node on %s: %w", name, err))
		}
	})
	return nil
}

// APIBytesReceived is how many bytes node n's processes (kvnet-node,
// kvnet-cni) have received from the API server so far.
func (c *Cluster) APIBytesReceived(n string) int64 {
	if f := c.apiFwd[n]; f != nil {
		return f.Received()
	}
	return 0
}

// StopAgent stops node n's kvnet-node and waits for it; the node's
// datapath stays as it was, as when a DaemonSet pod is replaced.
func (c *Cluster) StopAgent(n string) error {
	c.mu.Lock()
	a := c.agents[n]
	delete(c.agents, n)
	c.mu.Unlock()
	if a == nil {
		return nil
	}
	a.cancel()
	err := <-a.done
	a.done <- err
	if a.inproc != nil && !errors.Is(err, context.Canceled) && err.Error() != "stopped" {
		return fmt.Errorf("kvnet-node on %s: %w", n, err)
	}
	return nil
}

// KillAgent kills node n's kvnet-node process with SIGKILL, as a crash or
// an OOM kill does, and waits for it to be gone; unlike an exit on its own
// this is no failure of the cluster. StartAgent starts it again, as the
// DaemonSet would. Only in process mode (AgentBinary).
func (c *Cluster) KillAgent(n string) error {
	c.mu.Lock()
	a := c.agents[n]
	if a != nil && a.proc != nil {
		delete(c.agents, n)
	}
	c.mu.Unlock()
	switch {
	case a == nil:
		return fmt.Errorf("simcluster: no kvnet-node runs on %s", n)
	case a.proc == nil:
		return fmt.Errorf("simcluster: kvnet-node on %s runs in this process; only a process can be killed", n)
	}
	a.killed.Store(true)
	if err := a.proc.Process.Kill(); err != nil {
		return fmt.Errorf("simcluster: kill kvnet-node on %s: %w", n, err)
	}
	err := <-a.done
	a.done <- err
	a.cancel()
	return nil
}

// WaitAgentReady waits until node n's kvnet-node has applied its datapath
// (its status file says ready), or fails naming why.
func (c *Cluster) WaitAgentReady(ctx context.Context, n string, timeout time.Duration) error {
	deadline := time.After(timeout)
	for {
		if c.agentReady(n) {
			return nil
		}
		select {
		case <-c.failed:
			return c.Err()
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline:
			return fmt.Errorf("simcluster: kvnet-node on %s not ready after %s", c.cfg.NodeName(n), timeout)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (c *Cluster) agentReady(n string) bool {
	if a := c.Agent(n); a != nil {
		return a.Ready()
	}
	b, err := os.ReadFile(c.StatusFile(n))
	if err != nil {
		return false
	}
	var st cni.Status
	return json.Unmarshal(b, &st) == nil && st.Ready
}

// Close stops every component, waits for them and removes the namespaces.
// It returns the first failure seen before Close, if any.
func (c *Cluster) Close() error {
	c.mu.Lock()
	c.closing = true
	c.mu.Unlock()
	if c.cancel != nil {
		c.cancel()
	}
	c.wg.Wait()
	for _, f := range c.fwds {
		f.Close()
	}
	errs := []error{c.Err()}
	if c.Sim != nil {
		errs = append(errs, c.Sim.Close())
	}
	return errors.Join(errs...)
}

// PodNetNS is the path of pod's network namespace, as the simulated kubelet
// of its node made it.
func (c *Cluster) PodNetNS(pod *corev1.Pod) (string, error) {
	for _, nd := range c.Sim.Nodes {
		if c.cfg.NodeName(nd.Name) == pod.Spec.NodeName {
			return simkubelet.PodNetNS(c.KubeletConfig(nd.Name), pod), nil
		}
	}
	return "", fmt.Errorf("simcluster: pod %s/%s is on node %q, not a simulated node", pod.Namespace, pod.Name, pod.Spec.NodeName)
}

// copyExecutable copies the executable src to dst (replaced atomically).
func copyExecutable(src, dst string) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	tmp := dst + ".tmp"
	if err := os.WriteFile(tmp, b, 0o755); err != nil {
		return err
	}
	return os.Rename(tmp, dst)
}
