// Package cluster is kvnet-lab's "cluster" command: a real cluster on this
// machine (real kubelets and containerd in node namespaces, a registry of
// its own; package internal/lab/cluster, docs/cluster.md).
package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	labcluster "kvnet.io/kvnet/internal/lab/cluster"
)

const (
	logFile = "cluster.log"
	pidFile = "cluster.pid"
)

type flagpole struct {
	dir         string
	binDir      string
	nodes       int
	kvnetImages bool
	kubeVirt    bool
	network     string
	ipFamily    string
	multus      string
	foreground  bool
	waitLock    bool
	timeout     time.Duration
}

// NewCommand returns kvnet-lab's "cluster" command (up, down, demo).
func NewCommand() *cobra.Command {
	f := &flagpole{}
	cmd := &cobra.Command{
		Use:   "cluster",
		Short: "A real cluster on this machine: kubelets and containerd in node namespaces, a registry of its own (root)",
	}
	up := &cobra.Command{
		Use:   "up",
		Short: "Start the cluster in the background and wait until every node is Ready",
		Long: "Starts the lab's control plane, kube-scheduler, a registry with the lab's images, and nodes with\n" +
			"containerd and a kubelet. Writes <dir>/kubeconfig and <dir>/env (shell assignments).",
		RunE: func(cmd *cobra.Command, _ []string) error {
			if f.foreground {
				return runForeground(cmd.Context(), f)
			}
			return startBackground(f)
		},
	}
	up.Flags().StringVar(&f.binDir, "bin-dir", "", "the directory hack/build-cluster-tools.sh prints (kubelet, kube-scheduler, registry, CNI plugins, busybox)")
	up.Flags().IntVar(&f.nodes, "nodes", 3, "number of nodes (1 to 9)")
	up.Flags().StringVar(&f.ipFamily, "ip-family", labcluster.IPFamilyIPv4, "ipv4, or dual: nodes, pod subnets, Flannel and kube-proxy of both families (with the default network flannel)")
	up.Flags().StringVar(&f.network, "default-network", labcluster.NetworkFlannel, "the default pod network: flannel (VXLAN, from its manifest), bridge (the bridge plugin and host routes) or ptp32 (Calico's layout: a /32 per pod, default via 169.254.1.1 onlink, host routes; ptp, host-local and the lab's ptp32 plugin)")
	up.Flags().StringVar(&f.multus, "multus", labcluster.MultusThick, "Multus v4.3.0: thick (multus-daemon and multus-shim, from upstream's multus-daemonset-thick.yml), thin (the multus plugin, from upstream's multus-daemonset.yml) or none")
	up.Flags().BoolVar(&f.kvnetImages, "kvnet-images", true, "also build kvnet's images (make images) and push them to the registry")
	up.Flags().BoolVar(&f.kubeVirt, "kubevirt", false, "also install KubeVirt v1.8.4 (images built by the repository, virt-operator from its release manifest, a KubeVirt CR with useEmulation); the first build takes long")
	up.Flags().BoolVar(&f.foreground, "foreground", false, "run in the foreground until interrupted")
	up.Flags().BoolVar(&f.waitLock, "wait-for-lock", false, "wait for another cluster on this machine to go (within --timeout) instead of failing")
	up.Flags().DurationVar(&f.timeout, "timeout", 15*time.Minute, "how long to wait for the cluster to be up")
	down := &cobra.Command{
		Use:   "down",
		Short: "Stop the cluster and remove everything it made (namespaces, bridge, cgroups, mounts, files)",
		RunE:  func(*cobra.Command, []string) error { return stop(f.dir) },
	}
	for _, c := range []*cobra.Command{up, down} {
		c.Flags().StringVar(&f.dir, "dir", ".cluster", "the cluster's directory (kubeconfig, env, logs, state)")
	}
	cmd.AddCommand(up, down, newDemoCommand())
	return cmd
}

func runForeground(ctx context.Context, f *flagpole) error {
	ctx, cancel := signal.NotifyContext(ctx, syscall.SIGTERM, syscall.SIGINT)
	defer cancel()
	if err := os.MkdirAll(f.dir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(f.dir, pidFile), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil { //nolint:gosec // not secret
		return err
	}
	c, err := labcluster.Up(ctx, labcluster.Config{
		Dir: f.dir, BinDir: f.binDir, Nodes: f.nodes, KvnetImages: f.kvnetImages, KubeVirt: f.kubeVirt, DefaultNetwork: f.network, Multus: f.multus, IPFamily: f.ipFamily, Log: os.Stdout,
		WaitForLock: f.waitLock,
	})
	if err != nil {
		return err
	}
	fmt.Println("cluster: ready")
	<-ctx.Done()
	fmt.Println("cluster: stopping")
	return c.Down()
}

func startBackground(f *flagpole) error {
	if pid, ok := running(f.dir); ok {
		return fmt.Errorf("cluster already running (pid %d) in %s: kvnet-lab cluster down --dir %s first", pid, f.dir, f.dir)
	}
	if f.binDir == "" {
		return errors.New("--bin-dir: empty (pass what hack/build-cluster-tools.sh prints; make cluster-up does)")
	}
	if err := os.MkdirAll(f.dir, 0o755); err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	logPath := filepath.Join(f.dir, logFile)
	logf, err := os.Create(logPath)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(self, "cluster", "up", "--foreground", "--dir", f.dir, "--bin-dir", f.binDir,
		"--nodes", strconv.Itoa(f.nodes), "--kvnet-images="+strconv.FormatBool(f.kvnetImages), "--kubevirt="+strconv.FormatBool(f.kubeVirt), "--default-network="+f.network, "--multus="+f.multus, "--ip-family="+f.ipFamily,
		"--wait-for-lock="+strconv.FormatBool(f.waitLock))
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start cluster: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	deadline := time.After(f.timeout)
	shown := 0
	for {
		select {
		case err := <-exited:
			show(logPath, &shown)
			return fmt.Errorf("cluster exited during start-up (%v); log: %s", err, logPath)
		case <-deadline:
			// SIGTERM makes Up stop and remove what it started; a child
			// still waiting for the lock (in flock) ignores it until it
			// has the lock, so it is killed.
			_ = cmd.Process.Signal(syscall.SIGTERM)
			var werr error
			select {
			case werr = <-exited:
			case <-time.After(2 * time.Minute):
				_ = cmd.Process.Kill()
				werr = <-exited
			}
			return fmt.Errorf("cluster not up after %s (stopped: %v); log: %s", f.timeout, werr, logPath)
		case <-time.After(500 * time.Millisecond):
		}
		if show(logPath, &shown) {
			fmt.Printf("kvnet-lab cluster: up (pid %d)\n  kubeconfig: %s\n  env:        %s\n  log:        %s\n",
				cmd.Process.Pid, filepath.Join(f.dir, labcluster.KubeconfigFile), filepath.Join(f.dir, labcluster.EnvFile), logPath)
			return nil
		}
	}
}

// show prints the log's lines past *shown and reports whether the cluster
// said it is ready.
func show(path string, shown *int) bool {
	b, _ := os.ReadFile(path)
	lines := strings.Split(string(b), "\n")
	ready := false
	for ; *shown < len(lines)-1; *shown++ {
		l := lines[*shown]
		if strings.HasPrefix(l, "cluster: ") {
			fmt.Println(l)
		}
		if l == "cluster: ready" {
			ready = true
		}
	}
	return ready
}

// running reports whether the cluster's process runs, and its PID.
func running(dir string) (int, bool) {
	b, err := os.ReadFile(filepath.Join(dir, pidFile))
	if err != nil {
		return 0, false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 || syscall.Kill(pid, 0) != nil {
		return 0, false
	}
	st, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return pid, true
	}
	s := string(st)
	fs := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	return pid, len(fs) == 0 || (fs[0] != "Z" && fs[0] != "X")
}

// stop ends the cluster's process (which takes the cluster down), then
// removes whatever is left, the directory included, unless another
// cluster has started since (CleanupStopped).
func stop(dir string) error {
	if pid, ok := running(dir); ok {
		_ = syscall.Kill(pid, syscall.SIGTERM)
		deadline := time.Now().Add(2 * time.Minute)
		for {
			if _, ok := running(dir); !ok {
				break
			}
			if time.Now().After(deadline) {
				_ = syscall.Kill(pid, syscall.SIGKILL)
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	switch err := labcluster.CleanupStopped(dir); {
	case errors.Is(err, labcluster.ErrClusterRunning):
		// Another cluster took the lock the moment this one's process
		// ended: the bridge, namespaces and cgroups are its own now.
		fmt.Printf("kvnet-lab cluster: another cluster runs now; left the network and cgroups to it (%v)\n", err)
	case err != nil:
		return err
	}
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	fmt.Println("kvnet-lab cluster: down")
	return nil
}
