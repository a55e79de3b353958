package lab

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/client-go/tools/clientcmd"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"kvnet.io/kvnet/internal/k8s/manager"
	"kvnet.io/kvnet/internal/lab/controlplane"
	"kvnet.io/kvnet/internal/lab/simcluster"
	"kvnet.io/kvnet/internal/lab/simlauncher"
	"kvnet.io/kvnet/internal/node"
)

// chaosFlags configure `kvnet-lab chaos`.
type chaosFlags struct {
	dir        string
	keep       bool
	nodes      int
	ops        int
	seed       uint64
	rate       float64
	workers    int
	killEvery  time.Duration
	quiesce    time.Duration
	auditEvery time.Duration
	guests     int
	output     string
	// restartReserve is kvnet-controller's --restart-reserve.
	restartReserve int
}

// NewChaosCommand returns `kvnet-lab chaos`: a seeded, bounded run of cluster
// churn with faults injected, ended by an audit.
func NewChaosCommand() *cobra.Command {
	f := &chaosFlags{}
	cmd := &cobra.Command{
		Use:   "chaos",
		Short: "Churn a private lab while killing kvnet-controller, kvnet-node and the API server; then audit",
		Long: `chaos starts a private lab (its own control plane, kvnet-controller as a
process, simulated nodes with kvnet-node and a simulated kubelet each, the
virt-controller stand-in; --guests of the VMs run as QEMU guests, the others
are only their launcher pods' network namespaces), drives a seeded mix of
operations at a steady rate — pods with and without IPAMClaims, VMs created,
stopped, started, deleted, migrated and hot-plugged, tenant namespaces with
their UDNs created and deleted — while it kills kvnet-controller with
SIGKILL at random intervals, restarts the API server once and kills
kvnet-node on one node once. Every --audit-every it audits a snapshot of
the cluster (one resourceVersion) for duplicate IPs and MACs. Then it waits
for the cluster to settle (migrations included), checks that every pod and
VM that should have addresses has them (VMs their claims' IPs), that every
migration succeeded unless the run stopped or deleted its VM first, that
every guest answers TCP echo and HTTP at its claim's IP from a pod of its
tenant, and runs kvnet audit. It exits non-zero on any finding.

Everything runs on this machine's loopback and in the lab's own network
namespaces (root is needed for those).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			res, err := runChaos(cmd.Context(), f)
			if res != nil {
				if f.output == "json" {
					enc := json.NewEncoder(cmd.OutOrStdout())
					enc.SetIndent("", "  ")
					if jerr := enc.Encode(res); jerr != nil {
						return jerr
					}
				} else {
					res.print(cmd.OutOrStdout())
				}
			}
			if err != nil {
				return err
			}
			if !res.OK() {
				return errors.New("chaos: findings (see above)")
			}
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.dir, "dir", "", "directory of the run's lab (logs, etcd); default: a new temporary directory")
	fl.BoolVar(&f.keep, "keep", false, "keep --dir afterwards (a temporary one is removed otherwise)")
	fl.IntVar(&f.nodes, "nodes", 3, "simulated nodes (at least 2: migrations and a kvnet-node kill)")
	fl.IntVar(&f.ops, "ops", 1000, "operations to perform")
	fl.Uint64Var(&f.seed, "seed", 1, "seed of the operation mix and the fault times")
	fl.Float64Var(&f.rate, "rate", 25, "operations started per second")
	fl.IntVar(&f.workers, "workers", 8, "operations in flight at most")
	fl.DurationVar(&f.killEvery, "kill-every", 3*time.Second, "mean interval between kvnet-controller kills")
	fl.DurationVar(&f.quiesce, "quiesce-timeout", 5*time.Minute, "how long the cluster may go without progress towards settling after the last operation (at most 4 times this in all)")
	fl.DurationVar(&f.auditEvery, "audit-every", 3*time.Second, "interval between the audit snapshots taken during the run (duplicate IPs and MACs at any moment)")
	fl.IntVar(&f.guests, "guests", 2, "VMs run as QEMU guests (the others are only their launcher pods' network namespaces) and reached over the datapath at the end")
	fl.IntVar(&f.restartReserve, "restart-reserve", 0, "run kvnet-controller with --restart-reserve: address sets per network each new controller hands out before its rebuild (0: off)")
	fl.StringVarP(&f.output, "output", "o", "", "output format: json, or empty for text")
	cmd.AddCommand(newChaosControllerCommand())
	return cmd
}

func (f *chaosFlags) check() error {
	switch {
	case f.nodes < 2:
		return fmt.Errorf("--nodes %d: at least 2 (migrations and a kvnet-node kill need them)", f.nodes)
	case f.ops < 1:
		return fmt.Errorf("--ops %d: at least 1", f.ops)
	case f.rate <= 0:
		return fmt.Errorf("--rate %g: must be positive", f.rate)
	case f.workers < 1:
		return fmt.Errorf("--workers %d: at least 1", f.workers)
	case f.killEvery <= 0:
		return fmt.Errorf("--kill-every %s: must be positive", f.killEvery)
	case f.guests < 0:
		return fmt.Errorf("--guests %d: must not be negative", f.guests)
	case f.auditEvery <= 0:
		return fmt.Errorf("--audit-every %s: must be positive", f.auditEvery)
	case f.output != "" && f.output != "json":
		return fmt.Errorf("--output %q: json or empty", f.output)
	case os.Geteuid() != 0:
		return errors.New("kvnet-lab chaos needs root: its simulated nodes are network namespaces")
	}
	return nil
}

// newChaosControllerCommand is the kvnet-controller process chaos kills
// and restarts: the controller's manager, configured as the lab runs it
// (webhooks on 127.0.0.1, no leader election: one replica).
func newChaosControllerCommand() *cobra.Command {
	var kubeconfig, probeAddr, metricsAddr, pprofAddr string
	var webhookPort int
	var dynamicHostSubnets bool
	var restartReserve int
	cmd := &cobra.Command{
		Use:    "controller",
		Short:  "run kvnet-controller for a chaos run (internal)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctrl.SetLogger(zap.New(nanoTimes))
			cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
			if err != nil {
				return err
			}
			ctx, cancel := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer cancel()
			return manager.Run(ctx, cfg, manager.Options{
				MetricsAddr: metricsAddr, ProbeAddr: probeAddr, PprofAddr: pprofAddr,
				Webhook:            controlplane.WebhookOptions(webhookPort, false),
				DynamicHostSubnets: dynamicHostSubnets,
				RestartReserve:     restartReserve, Namespace: controlplane.KvnetNamespace,
			})
		},
	}
	cmd.Flags().StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig of the controller's service account")
	cmd.Flags().StringVar(&probeAddr, "probe-addr", "", "address of /readyz")
	cmd.Flags().StringVar(&metricsAddr, "metrics-addr", "0", "address of /metrics; 0: none")
	cmd.Flags().StringVar(&pprofAddr, "pprof-addr", "0", "address of /debug/pprof/; 0: none")
	cmd.Flags().IntVar(&webhookPort, "webhook-port", 0, "port of the webhooks on 127.0.0.1")
	cmd.Flags().BoolVar(&dynamicHostSubnets, "enable-dynamic-host-subnets", false, "as kvnet-controller's flag")
	cmd.Flags().IntVar(&restartReserve, "restart-reserve", 0, "as kvnet-controller's flag")
	return cmd
}

// chaosEnv is a chaos run's private lab.
type chaosEnv struct {
	f   *chaosFlags
	dir string
	cp  *controlplane.ControlPlane
	c   client.Client // admin
	cl  *simcluster.Cluster
	// launcher runs the guests (nil with --guests 0).
	launcher *simlauncher.Launcher
	nodes    []string
	log      *os.File // the controller processes' log

	ctrlKubeconfig string
	webhookPort    int
	probeAddr      string
	metricsAddr    string // the controller's /metrics
	// ctrlArgs are more flags of the controller processes.
	ctrlArgs []string

	mu   sync.Mutex   // guards ctrl
	ctrl *ctrlProcess // the running kvnet-controller
	// startFailures counts controllers that exited while starting.
	startFailures atomic.Int32
}

// startController starts a kvnet-controller process and waits until it
// serves (/readyz). A controller that exits while starting (it cannot
// reach the API server while that restarts) is started again, as the
// kubelet restarts a crashed container, for up to two minutes; the
// restarts are counted.
func (e *chaosEnv) startController(ctx context.Context) error {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		err := e.startControllerOnce(ctx)
		if err == nil || !errors.Is(err, errExitedAtStart) || time.Now().After(deadline) {
			return err
		}
		e.startFailures.Add(1)
		time.Sleep(500 * time.Millisecond)
	}
}

var errExitedAtStart = errors.New("kvnet-controller exited while starting")

// ctrlProcess is one kvnet-controller process.
type ctrlProcess struct {
	cmd    *exec.Cmd
	exited chan struct{} // closed once it exited; then err is set
	err    error
}

func (e *chaosEnv) startControllerOnce(ctx context.Context) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	args := append([]string{"chaos", "controller", "--kubeconfig", e.ctrlKubeconfig,
		"--probe-addr", e.probeAddr, "--metrics-addr", e.metricsAddr, "--webhook-port", strconv.Itoa(e.webhookPort)}, e.ctrlArgs...)
	cmd := exec.Command(self, args...)
	cmd.Stdout, cmd.Stderr = e.log, e.log
	// It dies with this process (see simcluster on Pdeathsig and threads).
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	p := &ctrlProcess{cmd: cmd, exited: make(chan struct{})}
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		p.err = cmd.Wait()
		close(p.exited)
	}()
	if err := <-started; err != nil {
		return fmt.Errorf("start kvnet-controller: %w", err)
	}
	exitErr := make(chan error, 1)
	go func() {
		<-p.exited
		exitErr <- fmt.Errorf("%w: %v", errExitedAtStart, p.err)
	}()
	if err := waitReadyz(ctx, "http://"+e.probeAddr+"/readyz", exitErr); err != nil {
		_ = cmd.Process.Kill()
		<-p.exited
		return fmt.Errorf("kvnet-controller (log %s): %w", e.log.Name(), err)
	}
	e.mu.Lock()
	e.ctrl = p
	e.mu.Unlock()
	return nil
}

// fromReserve counts the pods the controllers' log says they served from
// the restart reserve.
func (e *chaosEnv) fromReserve() int {
	b, err := os.ReadFile(e.log.Name())
	if err != nil {
		return 0
	}
	return bytes.Count(b, []byte("allocated from the restart reserve"))
}

// killController kills the running kvnet-controller with SIGKILL and waits
// for it to be gone.
func (e *chaosEnv) killController() error {
	e.mu.Lock()
	p := e.ctrl
	e.ctrl = nil
	e.mu.Unlock()
	if p == nil {
		return errors.New("no kvnet-controller runs")
	}
	if err := p.cmd.Process.Kill(); err != nil {
		return err
	}
	<-p.exited
	return nil
}

// controllerExited reports an exit of the running controller that chaos
// did not cause.
func (e *chaosEnv) controllerExited() error {
	e.mu.Lock()
	p := e.ctrl
	e.mu.Unlock()
	if p == nil {
		return nil
	}
	select {
	case <-p.exited:
		return fmt.Errorf("kvnet-controller exited by itself: %v (log %s)", p.err, e.log.Name())
	default:
		return nil
	}
}

func (e *chaosEnv) close() {
	e.mu.Lock()
	p := e.ctrl
	e.ctrl = nil
	e.mu.Unlock()
	if p != nil {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.exited:
		case <-time.After(10 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.exited
		}
	}
	if e.launcher != nil {
		// The guests go first: they live in the pods' namespaces.
		e.launcher.Close()
	}
	if e.cl != nil {
		if err := e.cl.Close(); err != nil && e.cl.Err() == nil {
			fmt.Fprintln(os.Stderr, "chaos: simulated nodes:", err)
		}
	}
	if e.cp != nil {
		if err := e.cp.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "chaos: stop control plane:", err)
		}
	}
	if e.log != nil {
		e.log.Close()
	}
}

// setUp starts the run's control plane, kvnet-controller and nodes.
func setUpChaos(ctx context.Context, f *chaosFlags, dir string) (_ *chaosEnv, err error) {
	cfg, err := controlplane.KvnetConfig()
	if err != nil {
		return nil, err
	}
	var ctrlArgs []string
	if f.restartReserve > 0 {
		ctrlArgs = append(ctrlArgs, "--restart-reserve", strconv.Itoa(f.restartReserve))
	}
	e, err := startControl(ctx, dir, cfg, ctrlArgs...)
	if err != nil {
		return nil, err
	}
	e.f = f
	defer func() {
		if err != nil {
			e.close()
		}
	}()
	if e.cl, e.launcher, err = startNodes(ctx, dir, e.cp, e.c, f.nodes, f.guests > 0, false, false); err != nil {
		return nil, fmt.Errorf("simulated nodes: %w", err)
	}
	for i := range f.nodes {
		e.nodes = append(e.nodes, NodeName(i+1))
	}
	return e, nil
}

// startControl starts a private lab's control plane (cfg, its logs in
// dir) and kvnet-controller as a process with its webhooks, as chaos and
// scale runs use them.
func startControl(ctx context.Context, dir string, cfg controlplane.Config, ctrlArgs ...string) (_ *chaosEnv, err error) {
	e := &chaosEnv{dir: dir, ctrlArgs: ctrlArgs}
	defer func() {
		if err != nil {
			e.close()
		}
	}()
	cfg.LogDir = dir
	if e.cp, err = controlplane.Start(ctx, cfg); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, KubeconfigFile), e.cp.Kubeconfig, 0o600); err != nil {
		return nil, err
	}
	scheme, err := manager.NewScheme()
	if err != nil {
		return nil, err
	}
	if e.c, err = client.New(e.cp.Config, client.Options{Scheme: scheme}); err != nil {
		return nil, err
	}
	ports, err := freePorts(3)
	if err != nil {
		return nil, err
	}
	e.webhookPort, e.probeAddr, e.metricsAddr = ports[0], fmt.Sprintf("127.0.0.1:%d", ports[1]), fmt.Sprintf("127.0.0.1:%d", ports[2])
	if err := controlplane.InstallRBAC(ctx, e.c); err != nil {
		return nil, fmt.Errorf("install RBAC: %w", err)
	}
	if err := controlplane.InstallWebhooks(ctx, e.c, controlplane.KvnetNamespace, e.webhookPort, false); err != nil {
		return nil, fmt.Errorf("install webhooks: %w", err)
	}
	ctrlCfg, err := e.cp.ServiceAccountConfig(ctx, controlplane.KvnetNamespace, controlplane.ControllerServiceAccount, tokenTTL)
	if err != nil {
		return nil, err
	}
	e.ctrlKubeconfig = filepath.Join(dir, "kvnet-controller.kubeconfig")
	if _, err := node.WriteCNIKubeconfig(e.ctrlKubeconfig, ctrlCfg); err != nil {
		return nil, err
	}
	if e.log, err = os.Create(filepath.Join(dir, "kvnet-controller.log")); err != nil {
		return nil, err
	}
	if err := e.startController(ctx); err != nil {
		return nil, err
	}
	return e, nil
}

func runChaos(ctx context.Context, f *chaosFlags) (res *ChaosResult, err error) {
	if err := f.check(); err != nil {
		return nil, err
	}
	ctx, cancel := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer cancel()
	dir, finish, err := runDir("chaos", f.dir, f.keep)
	if err != nil {
		return nil, err
	}
	// A run that failed or found something keeps its logs.
	defer func() { finish(err == nil && res != nil && res.OK()) }()
	start := time.Now()
	e, err := setUpChaos(ctx, f, dir)
	if err != nil {
		return nil, err
	}
	defer e.close()
	fmt.Fprintf(os.Stderr, "chaos: lab up in %s (%d nodes, logs in %s); %d operations at %g/s, seed %d\n",
		time.Since(start).Round(time.Millisecond), f.nodes, dir, f.ops, f.rate, f.seed)
	w, err := newWorld(ctx, e)
	if err != nil {
		return nil, err
	}
	defer w.stop()
	return w.run(ctx)
}

// ChaosResult is what a chaos run prints (-o json: these fields).
type ChaosResult struct {
	Seed       uint64         `json:"seed"`
	Operations map[string]int `json:"operations"`
	// OpsDone counts the operations the API server accepted; OpsFailed
	// those it still refused after retries (named in Errors).
	OpsDone   int      `json:"opsDone"`
	OpsFailed int      `json:"opsFailed"`
	Errors    []string `json:"errors,omitempty"`
	Duration  string   `json:"duration"`

	ControllerKills int `json:"controllerKills"`
	// ControllerStartFailures counts kvnet-controllers that exited while
	// starting (the API server unreachable) and were started again.
	ControllerStartFailures int `json:"controllerStartFailures"`
	APIServerRestarts       int `json:"apiServerRestarts"`
	NodeAgentKills          int `json:"nodeAgentKills"`
	// FromRestartReserve counts the pods the restarted controllers served
	// from their restart reserve before their rebuild (--restart-reserve),
	// from their log.
	FromRestartReserve int `json:"fromRestartReserve,omitempty"`

	// Allocation latency: pod created → its kvnet.io/pod-networks
	// annotation seen, in milliseconds; DuringFaults for pods whose wait
	// overlapped a fault (a component down or restarting).
	Allocation       Latency `json:"allocationMs"`
	AllocationFaults Latency `json:"allocationDuringFaultsMs"`

	// Settle is how long the cluster took to settle after the last
	// operation; Unsettled lists what never did.
	Settle    string   `json:"settle"`
	Unsettled []string `json:"unsettled,omitempty"`
	// Checked counts what was found settled: pods with addresses, running
	// VMs with their claims' addresses.
	PodsChecked int `json:"podsChecked"`
	VMsChecked  int `json:"vmsChecked"`
	// Audit is kvnet audit's findings afterwards.
	Audit []string `json:"audit"`
	// Migrations counts the outcomes of the migrations the run started;
	// an unexpected one is a finding.
	Migrations Migrations `json:"migrations"`
	// Snapshots counts the audits taken during the run (every
	// --audit-every, each at one resourceVersion), SnapshotsFailed those
	// the API server did not answer (while it restarted); Duplicates are
	// the duplicate IPs and MACs they saw, each a finding.
	Snapshots       int             `json:"snapshots"`
	SnapshotsFailed int             `json:"snapshotsFailed"`
	Duplicates      []SeenDuplicate `json:"duplicates"`
	// Guests counts the VMs run as QEMU guests (--guests); GuestsAnswered
	// those that answered, from a pod of their tenant, at their claim's
	// IP; GuestFindings says why the others did not.
	Guests         int      `json:"guests"`
	GuestsAnswered int      `json:"guestsAnswered"`
	GuestFindings  []string `json:"guestFindings,omitempty"`
	// GuestCrashes are the guests whose own kernel panicked (not
	// findings: see checkGuests).
	GuestCrashes []string `json:"guestCrashes,omitempty"`
}

// OK says the run found nothing wrong.
func (r *ChaosResult) OK() bool {
	return len(r.Unsettled) == 0 && len(r.Audit) == 0 && r.OpsFailed == 0 &&
		len(r.Migrations.Unexpected) == 0 && len(r.Duplicates) == 0 && len(r.GuestFindings) == 0
}

// Latency summarises durations in milliseconds.
type Latency struct {
	N   int     `json:"n"`
	P50 float64 `json:"p50"`
	P99 float64 `json:"p99"`
	Max float64 `json:"max"`
}

func latencyOf(ds []time.Duration) Latency {
	if len(ds) == 0 {
		return Latency{}
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	q := func(p float64) time.Duration { return s[min(len(s)-1, int(p*float64(len(s))))] }
	return Latency{N: len(s), P50: ms(q(0.50)), P99: ms(q(0.99)), Max: ms(s[len(s)-1])}
}

func (r *ChaosResult) print(w interface{ Write([]byte) (int, error) }) {
	var names []string
	for k := range r.Operations {
		names = append(names, k)
	}
	sort.Strings(names)
	fmt.Fprintf(w, "chaos: seed %d, %d operations done, %d failed, in %s\n", r.Seed, r.OpsDone, r.OpsFailed, r.Duration)
	for _, n := range names {
		fmt.Fprintf(w, "  %-16s %d\n", n, r.Operations[n])
	}
	fmt.Fprintf(w, "faults: %d kvnet-controller kills (SIGKILL), %d API server restart(s), %d kvnet-node kill(s); %d controller start(s) failed and were retried\n",
		r.ControllerKills, r.APIServerRestarts, r.NodeAgentKills, r.ControllerStartFailures)
	if r.FromRestartReserve > 0 {
		fmt.Fprintf(w, "restart reserve: %d pods served from it before a rebuild\n", r.FromRestartReserve)
	}
	fmt.Fprintf(w, "allocation latency: p50 %.1f ms, p99 %.1f ms, max %.1f ms (%d pods); during faults: p50 %.1f ms, p99 %.1f ms, max %.1f ms (%d pods)\n",
		r.Allocation.P50, r.Allocation.P99, r.Allocation.Max, r.Allocation.N,
		r.AllocationFaults.P50, r.AllocationFaults.P99, r.AllocationFaults.Max, r.AllocationFaults.N)
	fmt.Fprintf(w, "settled in %s: %d pods with addresses, %d running VMs with their claims' addresses\n", r.Settle, r.PodsChecked, r.VMsChecked)
	for _, u := range r.Unsettled {
		fmt.Fprintf(w, "  NOT SETTLED: %s\n", u)
	}
	for _, e := range r.Errors {
		fmt.Fprintf(w, "  FAILED OPERATION: %s\n", e)
	}
	m := r.Migrations
	fmt.Fprintf(w, "migrations: %d started, %d succeeded, %d failed (%d of them after the run stopped or deleted the VM), %d deleted with their tenant\n",
		m.Started, m.Succeeded, m.Failed, m.Expected, m.Gone)
	for _, u := range m.Unexpected {
		fmt.Fprintf(w, "  MIGRATION: %s\n", u)
	}
	fmt.Fprintf(w, "audit snapshots during the run: %d taken (%d not answered), %d duplicate IPs or MACs seen\n", r.Snapshots, r.SnapshotsFailed, len(r.Duplicates))
	for _, d := range r.Duplicates {
		fmt.Fprintf(w, "  DUPLICATE: %s\n", d)
	}
	fmt.Fprintf(w, "guests: %d of %d VMs running as QEMU guests answered TCP echo and HTTP at their claim's IP from a pod of their tenant\n", r.GuestsAnswered, r.Guests)
	for _, g := range r.GuestCrashes {
		fmt.Fprintf(w, "  not checked: %s\n", g)
	}
	for _, g := range r.GuestFindings {
		fmt.Fprintf(w, "  GUEST: %s\n", g)
	}
	if len(r.Audit) == 0 {
		fmt.Fprintln(w, "audit: no findings (0 duplicate IPs, 0 duplicate MACs, 0 leaked claims)")
	}
	for _, a := range r.Audit {
		fmt.Fprintf(w, "  AUDIT: %s\n", a)
	}
}

// faultLog records when components were down, to tell which allocations
// waited through a fault.
type faultLog struct {
	mu      sync.Mutex
	windows [][2]time.Time // [start, end]; end zero while open
	kills   atomic.Int32
	api     atomic.Int32
	agents  atomic.Int32
}

func (l *faultLog) open() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.windows = append(l.windows, [2]time.Time{time.Now()})
	return len(l.windows) - 1
}

func (l *faultLog) close(i int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.windows[i][1] = time.Now()
}

// overlaps says whether [from, to] overlaps a fault window.
func (l *faultLog) overlaps(from, to time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, w := range l.windows {
		end := w[1]
		if end.IsZero() {
			end = time.Now()
		}
		if !from.After(end) && !to.Before(w[0]) {
			return true
		}
	}
	return false
}

// killControllers kills kvnet-controller with SIGKILL every ~killEvery
// and starts it again after a random pause, until stop is closed. It
// returns the first error that leaves the lab broken (a controller that
// exited by itself, or one that does not come back).
func (e *chaosEnv) killControllers(ctx context.Context, stop <-chan struct{}, rng *rand.Rand, faults *faultLog) error {
	for {
		select {
		case <-stop:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Duration(float64(e.f.killEvery) * (0.5 + rng.Float64()))):
		}
		if err := e.controllerExited(); err != nil {
			return err
		}
		i := faults.open()
		if err := e.killController(); err != nil {
			return err
		}
		faults.kills.Add(1)
		time.Sleep(time.Duration(200+rng.IntN(1300)) * time.Millisecond)
		if err := e.startController(ctx); err != nil {
			return err
		}
		faults.close(i)
	}
}

// injectOnce kills kvnet-node on the last node when progress() passes one
// third (and starts it again, as its DaemonSet would), and restarts the
// API server when it passes one half.
//
// quiet, around the API server restart, holds back tenant deletions until
// no namespace is terminating and lets them go again once the restarted
// API server serves every API group: kube-controller-manager can finish
// deleting a namespace without the custom resources that a just-restarted
// API server does not list yet, leaving objects nothing can delete (kvnet
// audit reports them as Orphaned). That is an upstream race, not what the
// run measures.
func (e *chaosEnv) injectOnce(ctx context.Context, stop <-chan struct{}, rng *rand.Rand, faults *faultLog, progress func() float64, quiet func(context.Context, bool) error) error {
	wait := func(at float64) bool {
		for progress() < at {
			select {
			case <-stop:
				return false
			case <-ctx.Done():
				return false
			case <-time.After(100 * time.Millisecond):
			}
		}
		return true
	}
	if !wait(1.0 / 3) {
		return ctx.Err()
	}
	n := e.nodes[len(e.nodes)-1]
	i := faults.open()
	if err := e.cl.KillAgent(n); err != nil {
		return err
	}
	faults.agents.Add(1)
	time.Sleep(time.Duration(500+rng.IntN(1500)) * time.Millisecond)
	if err := e.cl.StartAgent(n); err != nil {
		return err
	}
	if err := e.cl.WaitAgentReady(ctx, n, 2*time.Minute); err != nil {
		return fmt.Errorf("kvnet-node on %s after its kill: %w", n, err)
	}
	faults.close(i)
	if !wait(0.5) {
		return ctx.Err()
	}
	if err := quiet(ctx, true); err != nil {
		return err
	}
	i = faults.open()
	if err := e.cp.RestartAPIServer(); err != nil {
		return err
	}
	faults.api.Add(1)
	faults.close(i)
	return quiet(ctx, false)
}

// runDir prepares a private run's directory: dir, or a new temporary one
// (kvnet-<what>-*), with its lab.log, where the stand-ins (simulated
// kubelets, virt-controller) log. finish closes the log and removes a
// temporary directory unless keep, or the run failed or found something
// (ok false): then it says where the logs are.
func runDir(what, dir string, keep bool) (_ string, finish func(ok bool), err error) {
	temp := dir == ""
	if temp {
		if dir, err = os.MkdirTemp("", "kvnet-"+what+"-"); err != nil {
			return "", nil, err
		}
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", nil, err
	}
	if dir, err = filepath.Abs(dir); err != nil {
		return "", nil, err
	}
	logf, err := os.Create(filepath.Join(dir, "lab.log"))
	if err != nil {
		return "", nil, err
	}
	ctrl.SetLogger(zap.New(zap.WriteTo(logf), nanoTimes))
	return dir, func(ok bool) {
		logf.Close()
		if !temp || keep {
			return
		}
		if !ok {
			fmt.Fprintf(os.Stderr, "%s: logs kept in %s\n", what, dir)
			return
		}
		os.RemoveAll(dir)
	}, nil
}
