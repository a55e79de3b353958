// Package lab implements kvnet-lab's up, down and console: a whole kvnet installation on one
// machine. "up" starts etcd, kube-apiserver, kube-controller-manager
// (built by hack/build-tools.sh) and kvnet-controller, installs kvnet's CRDs,
// policies and RBAC, and writes an admin kubeconfig into the lab directory;
// "down" stops it ("down --purge" also removes its state from the
// directory: a clean slate). Every process the lab starts ends with it,
// even when the lab is killed with SIGKILL (parent-death signals, see
// internal/lab/controlplane), and "up" names any process that still holds
// the lab directory rather than waiting on it. kvnet-controller (and kvnet-node, below) run as their
// service accounts, bound only by the RBAC kvnet ships (config/rbac,
// config/node/rbac.yaml, embedded in the binary), so the lab fails on a
// missing permission as a cluster would.
//
// As root, "up" also builds simulated nodes (--nodes, default 3):
// network namespaces joined by a veth underlay (internal/lab/simnet), each
// running the shipped kvnet-node and a simulated kubelet
// (internal/lab/simkubelet) that plumbs the pods bound to it with the
// shipped kvnet-cni, plus the KubeVirt stand-ins: simvirt (VMs, VMIs,
// migrations) and simlauncher (a QEMU guest per running VMI). There is no
// scheduler: pods name their node (spec.nodeName: node-1, ...). A
// component that fails after start-up stops the whole lab.
package lab

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"go.uber.org/zap/zapcore"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"kvnet.io/kvnet/internal/k8s/manager"
	"kvnet.io/kvnet/internal/lab/controlplane"
	"kvnet.io/kvnet/internal/lab/simlauncher"
	"kvnet.io/kvnet/internal/lab/simnet"
)

// labState is what a lab keeps in its directory (globs), which down
// --purge removes.
var labState = []string{
	"etcd", KubeconfigFile, "*.kubeconfig", "*.log", pidFile, readyFile, failedFile,
	"netns-prefix", "nodes", "cni", "vms",
}

// Files in the lab directory.
const (
	KubeconfigFile = "kubeconfig"
	pidFile        = "lab.pid"
	logFile        = "lab.log"
	readyFile      = "ready"
	failedFile     = "failed" // why the last lab stopped on its own
)

// tokenTTL is how long the service-account tokens of kvnet-controller and
// kvnet-node are valid: a year, as the lab does not rotate them.
const tokenTTL = 365 * 24 * time.Hour

type flagpole struct {
	dir        string
	foreground bool
	timeout    time.Duration
	nodes      int
	multus     bool
}

// NewCommands returns kvnet-lab's "up", "down" and "console".
func NewCommands() []*cobra.Command {
	flags := &flagpole{}
	up := &cobra.Command{
		Use:   "up",
		Short: "Start the lab in the background and wait until it is ready",
		Long: "Starts etcd, kube-apiserver, kube-controller-manager and kvnet-controller.\n" +
			"The admin kubeconfig is written to <dir>/kubeconfig.",
		RunE: func(cmd *cobra.Command, _ []string) error {
			if flags.foreground {
				return runForeground(cmd.Context(), flags)
			}
			return startBackground(flags)
		},
	}
	up.Flags().BoolVar(&flags.foreground, "foreground", false, "run in the foreground until interrupted")
	up.Flags().DurationVar(&flags.timeout, "timeout", 3*time.Minute, "how long to wait for the lab to be ready")
	up.Flags().BoolVar(&flags.multus, "multus", false, "attach primary networks as on a cluster with stock Multus: pods keep eth0 on a stand-in cluster default network, "+
		"kvnet's webhook selects the primary network as ovn-udn1 (kvnet-controller --primary-network-attachment=multus); default: as OVN-Kubernetes does")
	up.Flags().IntVar(&flags.nodes, "nodes", 3, "simulated nodes (network namespaces, each with kvnet-node and a simulated kubelet); needs root, 0 for none")
	var purge bool
	down := &cobra.Command{
		Use:   "down",
		Short: "Stop the lab (--purge: and remove its state, to start from a clean slate)",
		RunE: func(*cobra.Command, []string) error {
			if err := stop(flags.dir); err != nil {
				return err
			}
			if purge {
				return purgeDir(flags.dir)
			}
			return nil
		},
	}
	down.Flags().BoolVar(&purge, "purge", false, "also remove the lab's state from its directory: etcd data (every object), logs, kubeconfigs, VM consoles, CNI state, leftover network namespaces")
	var namespace string
	console := &cobra.Command{
		Use:   "console <vmi>",
		Short: "Print the serial console log of a VMI's guests",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return printConsole(cmd.OutOrStdout(), flags.dir, namespace, args[0])
		},
	}
	console.Flags().StringVarP(&namespace, "namespace", "n", "default", "namespace of the VMI")
	cmds := []*cobra.Command{up, down, console}
	for _, c := range cmds {
		c.Flags().StringVar(&flags.dir, "dir", ".local", "lab directory (kubeconfig, logs, pid)")
	}
	return cmds
}

// Running reports whether a lab runs with its state in dir, and its PID.
func Running(dir string) (int, bool) {
	b, err := os.ReadFile(filepath.Join(dir, pidFile))
	if err != nil {
		return 0, false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0, false
	}
	if !alive(pid) {
		return 0, false
	}
	_, err = os.Stat(filepath.Join(dir, readyFile))
	return pid, err == nil
}

// alive reports whether process pid runs: it exists and is no zombie (a
// lab killed after its starter exited is reparented, and a parent that
// does not reap leaves it a zombie, which signal 0 still finds).
func alive(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return true // no /proc to tell: signal 0 says it exists
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	return len(f) == 0 || (f[0] != "Z" && f[0] != "X")
}

func startBackground(flags *flagpole) error {
	if pid, ok := Running(flags.dir); ok {
		fmt.Printf("kvnet-lab: already running (pid %d); kubeconfig: %s\n", pid, filepath.Join(flags.dir, KubeconfigFile))
		return nil
	}
	if err := checkStale(flags.dir); err != nil {
		return err
	}
	if err := os.MkdirAll(flags.dir, 0o755); err != nil {
		return err
	}
	_ = os.Remove(filepath.Join(flags.dir, readyFile))
	self, err := os.Executable()
	if err != nil {
		return err
	}
	logf, err := os.Create(filepath.Join(flags.dir, logFile))
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(self, "up", "--foreground", "--dir", flags.dir, "--nodes", strconv.Itoa(flags.nodes), "--multus="+strconv.FormatBool(flags.multus))
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start lab: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	deadline := time.After(flags.timeout)
	for {
		select {
		case err := <-exited:
			return fmt.Errorf("lab exited during start-up (%v); log: %s\n%s", err, logf.Name(), tail(logf.Name(), 20))
		case <-deadline:
			_ = cmd.Process.Kill()
			return fmt.Errorf("lab not ready after %s; log: %s\n%s", flags.timeout, logf.Name(), tail(logf.Name(), 20))
		case <-time.After(200 * time.Millisecond):
		}
		if _, err := os.Stat(filepath.Join(flags.dir, readyFile)); err == nil {
			fmt.Printf("kvnet-lab: up (pid %d)\n  kubeconfig: %s\n  log:        %s\n", cmd.Process.Pid,
				filepath.Join(flags.dir, KubeconfigFile), logf.Name())
			return nil
		}
	}
}

func tail(path string, n int) string {
	b, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// nanoTimes stamps log lines to the nanosecond, as kvnet-node and
// kvnet-controller do: a migration's switch-over is read in milliseconds.
func nanoTimes(o *zap.Options) { o.TimeEncoder = zapcore.RFC3339NanoTimeEncoder }

func runForeground(ctx context.Context, flags *flagpole) error {
	dir := flags.dir
	ctx, cancel := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer cancel()
	ctrl.SetLogger(zap.New(nanoTimes))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	abs, _ := filepath.Abs(dir)
	if err := checkStale(dir); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, pidFile), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		return err
	}
	defer os.Remove(filepath.Join(dir, pidFile))
	defer os.Remove(filepath.Join(dir, readyFile))
	_ = os.Remove(filepath.Join(dir, failedFile))

	cfg, err := controlplane.KvnetConfig()
	if err != nil {
		return err
	}
	cfg.LogDir = abs
	// The lab's objects (networks, VMs, their claims) survive lab down/up.
	cfg.EtcdDataDir = filepath.Join(abs, "etcd")
	start := time.Now()
	cp, err := controlplane.Start(ctx, cfg)
	if err != nil {
		return err
	}
	defer func() {
		if err := cp.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "lab: stop control plane:", err)
		}
	}()
	if err := os.WriteFile(filepath.Join(dir, KubeconfigFile), cp.Kubeconfig, 0o600); err != nil {
		return err
	}
	fmt.Printf("control plane up in %s\n", time.Since(start).Round(time.Millisecond))

	// Webhooks, metrics and probes on free ports of 127.0.0.1 (the API
	// server calls the webhooks by URL), so that labs in two directories
	// and the tests run side by side.
	ports, err := freePorts(3)
	if err != nil {
		return err
	}
	webhookPort := ports[0]
	metricsAddr := fmt.Sprintf("127.0.0.1:%d", ports[1])
	probeAddr := fmt.Sprintf("127.0.0.1:%d", ports[2])
	scheme, err := manager.NewScheme()
	if err != nil {
		return err
	}
	c, err := client.New(cp.Config, client.Options{Scheme: scheme})
	if err != nil {
		return err
	}
	if err := controlplane.InstallRBAC(ctx, c); err != nil {
		return fmt.Errorf("install RBAC: %w", err)
	}
	if err := ensureClusterDNSObjects(ctx, c); err != nil {
		return fmt.Errorf("cluster DNS: %w", err)
	}
	if err := controlplane.InstallWebhooks(ctx, c, controlplane.KvnetNamespace, webhookPort, flags.multus); err != nil {
		return fmt.Errorf("install webhooks: %w", err)
	}
	ctrlCfg, err := cp.ServiceAccountConfig(ctx, controlplane.KvnetNamespace, controlplane.ControllerServiceAccount, tokenTTL)
	if err != nil {
		return err
	}
	mgr, err := manager.New(ctrlCfg, manager.Options{
		MetricsAddr: metricsAddr, ProbeAddr: probeAddr,
		Webhook: controlplane.WebhookOptions(webhookPort, flags.multus),
	})
	if err != nil {
		return err
	}
	// The controller stops before the control plane does (defers run in
	// reverse): an API server with clients still watching takes its full
	// stop timeout to go.
	mgrCtx, stopMgr := context.WithCancel(ctx)
	errc := make(chan error, 1)
	mgrDone := make(chan struct{})
	go func() {
		defer close(mgrDone)
		errc <- mgr.Start(mgrCtx)
	}()
	defer func() {
		stopMgr()
		<-mgrDone
	}()
	select {
	case <-mgr.Elected():
	case err := <-errc:
		return fmt.Errorf("kvnet-controller: %w", err)
	}
	// Ready means the webhooks and allocators serve: /readyz passes.
	if err := waitReadyz(ctx, "http://"+probeAddr+"/readyz", errc); err != nil {
		return err
	}
	var nodeFailed <-chan struct{} // nil without simulated nodes: never ready
	var nodeErr func() error
	switch {
	case flags.nodes > simnet.MaxNodes:
		return fmt.Errorf("--nodes %d: at most %d", flags.nodes, simnet.MaxNodes)
	case flags.nodes > 0 && os.Geteuid() != 0:
		fmt.Printf("not root: no simulated nodes (they need network namespaces); control plane and kvnet-controller only\n")
	case flags.nodes > 0:
		start := time.Now()
		cl, launcher, err := startNodes(ctx, dir, cp, c, flags.nodes, true, true, flags.multus)
		if err != nil {
			return fmt.Errorf("simulated nodes: %w", err)
		}
		defer func() {
			// The guests go first: they live in the pods' namespaces.
			launcher.Close()
			// A failure that stopped the lab was reported already.
			if err := cl.Close(); err != nil && cl.Err() == nil {
				fmt.Println("kvnet-lab: simulated nodes:", err)
			}
		}()
		dns, err := startClusterDNS(ctx, c, cl.Sim.External)
		if err != nil {
			return fmt.Errorf("cluster DNS: %w", err)
		}
		defer dns.Close()
		fmt.Printf("cluster DNS: Service %s, answered by the lab's stand-in at %s\n", clusterDNSName(), dns.Addr())
		nodeFailed = cl.Failed()
		nodeErr = cl.Err
		fmt.Printf("%d simulated nodes up in %s (kvnet-node and a simulated kubelet each); VM consoles in %s\n",
			flags.nodes, time.Since(start).Round(time.Millisecond), VMsDir(dir))
	}
	if err := os.WriteFile(filepath.Join(dir, readyFile), nil, 0o644); err != nil {
		return err
	}
	fmt.Printf("kvnet-controller running; metrics on http://%s/metrics\n", metricsAddr)
	select {
	case err := <-errc:
		if err != nil && !errors.Is(err, context.Canceled) {
			return fmt.Errorf("kvnet-controller: %w", err)
		}
	case <-nodeFailed:
		// A component of a simulated node stopped: report it and stop the
		// whole lab (the deferred calls), rather than run on half broken.
		err := nodeErr()
		fmt.Println("kvnet-lab: stopping:", err)
		_ = os.WriteFile(filepath.Join(dir, failedFile), []byte(err.Error()+"\n"), 0o644)
		return fmt.Errorf("simulated node failed: %w", err)
	}
	fmt.Println("kvnet-lab: stopped")
	return nil
}

// checkStale fails, naming each with its PID, when processes still use
// the lab directory: an etcd, a kube-apiserver, a kvnet-node or a QEMU
// left by a lab that was killed before it could stop them. A new lab
// would otherwise wait for etcd's lock until "timeout waiting for process
// etcd to start". Logs held open (someone's tail -f) do not count.
func checkStale(dir string) error {
	if _, err := os.Stat(dir); err != nil {
		return nil //nolint:nilerr // no directory: nobody uses it
	}
	procs, err := controlplane.ProcessesUsing(dir, controlplane.UsageOptions{
		IgnoreFile: func(p string) bool { return strings.HasSuffix(p, ".log") },
	})
	if err != nil || len(procs) == 0 {
		return nil //nolint:nilerr // no /proc: nothing to tell
	}
	if pid, ok := Running(dir); ok {
		return fmt.Errorf("a lab runs in %s already (pid %d)", dir, pid)
	}
	abs, _ := filepath.Abs(dir)
	return controlplane.StaleError("lab directory", abs, procs)
}

// freePorts returns n distinct free TCP ports of 127.0.0.1.
func freePorts(n int) ([]int, error) {
	var ports []int
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("find a free port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func stop(dir string) error {
	if why, err := os.ReadFile(filepath.Join(dir, failedFile)); err == nil {
		fmt.Printf("kvnet-lab: stopped by itself after a failure: %s", why)
		_ = os.Remove(filepath.Join(dir, failedFile))
	}
	b, err := os.ReadFile(filepath.Join(dir, pidFile))
	if err != nil {
		fmt.Println("kvnet-lab: not running")
		return nil
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return fmt.Errorf("bad pid file %s: %q", filepath.Join(dir, pidFile), b)
	}
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		_ = os.Remove(filepath.Join(dir, pidFile))
		fmt.Println("kvnet-lab: not running")
		return nil
	}
	for range 300 {
		if !alive(pid) {
			fmt.Println("kvnet-lab: stopped")
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	_ = syscall.Kill(pid, syscall.SIGKILL)
	return fmt.Errorf("lab (pid %d) did not stop in 30s; killed", pid)
}

// purgeDir removes a stopped lab's state from dir (labState), then dir
// itself when nothing else is in it; a process still using the directory
// (left from a lab killed before it could stop it) is an error naming it.
func purgeDir(dir string) error {
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		fmt.Printf("kvnet-lab: nothing to purge in %s\n", dir)
		return nil
	}
	// The lab's children die with it, which takes them a moment.
	var procs []controlplane.Process
	var err error
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		procs, err = controlplane.ProcessesUsing(dir, controlplane.UsageOptions{})
		if err != nil || len(procs) == 0 || time.Now().After(deadline) {
			break
		}
	}
	if err == nil && len(procs) > 0 {
		abs, _ := filepath.Abs(dir)
		return controlplane.StaleError("lab directory", abs, procs)
	}
	if os.Geteuid() == 0 {
		// A lab killed with SIGKILL leaves its network namespaces.
		if err := simnet.Cleanup(netnsPrefix(dir)); err != nil {
			return fmt.Errorf("purge: remove the lab's network namespaces: %w", err)
		}
	}
	var errs []error
	for _, pattern := range labState {
		matches, _ := filepath.Glob(filepath.Join(dir, pattern))
		for _, m := range matches {
			if err := os.RemoveAll(m); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("purge %s: %w", dir, err)
	}
	if err := os.Remove(dir); err != nil {
		fmt.Printf("kvnet-lab: purged the lab's state; %s keeps files that are not the lab's\n", dir)
		return nil //nolint:nilerr // someone else's files: left alone
	}
	fmt.Printf("kvnet-lab: purged %s\n", dir)
	return nil
}

func waitReadyz(ctx context.Context, url string, errc <-chan error) error {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		resp, err := http.Get(url) //nolint:gosec,noctx // local probe
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("kvnet-controller not ready after 2m (%s)", url)
		}
		select {
		case err := <-errc:
			return fmt.Errorf("kvnet-controller: %w", err)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// printConsole copies the console log of VMI namespace/name in the lab in
// dir to w.
func printConsole(w io.Writer, dir, namespace, name string) error {
	path := simlauncher.ConsoleLog(VMsDir(dir), namespace, name)
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("no console log for VMI %s/%s in the lab in %s (%s): has it run?", namespace, name, dir, path)
	}
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(w, f)
	return err
}
