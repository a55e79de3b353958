package lab

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"kvnet.io/kvnet/internal/k8s/manager"
	"kvnet.io/kvnet/internal/lab/controlplane"
	"kvnet.io/kvnet/internal/lab/simcluster"
	"kvnet.io/kvnet/internal/lab/simvirt"
	"kvnet.io/kvnet/internal/node"
)

// scaleFlags configure `kvnet-lab scale`.
type scaleFlags struct {
	// dynamicHostSubnets runs kvnet-controller with
	// --enable-dynamic-host-subnets.
	dynamicHostSubnets bool
	// restartReserve is kvnet-controller's --restart-reserve.
	restartReserve int
	// podScope is the real kvnet-nodes' --pod-scope.
	podScope  string
	dir       string
	keep      bool
	nodes     int
	realNodes int
	udns      int
	pods      int
	vms       int
	churn     time.Duration
	churnRate float64
	writers   int
	stall     time.Duration
	summary   string
	output    string
	// profileDir receives CPU profiles of kvnet-controller during the
	// networks, pods, VMs and churn steps; empty: none taken.
	profileDir string
}

// NewScaleCommand returns `kvnet-lab scale`: the scale lab.
func NewScaleCommand() *cobra.Command {
	f := &scaleFlags{}
	cmd := &cobra.Command{
		Use:   "scale",
		Short: "Measure kvnet at scale: KWOK nodes, thousands of pods and VMs, hundreds of UDNs; then audit",
		Long: `scale starts a private lab — etcd, kube-apiserver, kube-controller-manager,
kube-scheduler, kvnet-controller as a process with its webhooks, the
virt-controller stand-in — and KWOK simulating --nodes nodes and the
lifecycle of their pods. With --real-nodes (root), that many real
kvnet-node processes join the same cluster in network namespaces, each with
a few pods of its own, so the node side is measured against the whole
cluster's objects.

It measures the API server's write floor, creates --udns networks (per
tenant namespace a primary UDN, Layer2 or Layer3, and a secondary Layer2;
a tenth are secondary ClusterUserDefinedNetworks over several
namespaces) and --pods pods, waits until KWOK runs them, measures the
floor again, creates --vms VMs with persistent IPs, then churns
for --churn (pods deleted and created at --churn-rate per second, VMs
stopped and started, VMs migrated), restarts kvnet-controller, and audits
the cluster. It prints a table and writes the summary (JSON) to
--summary. It exits non-zero when the audit finds a duplicate IP or MAC or
a leaked claim, when a VM's IP changed across a restart or migration, or
when anything never got its addresses.

Every figure is a measurement of this run on this machine, not a timed
assertion.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			sum, err := runScale(cmd.Context(), f)
			if sum != nil {
				if f.summary != "" {
					if werr := writeSummary(f.summary, sum); werr != nil {
						err = errors.Join(err, werr)
					}
				}
				if f.output == "json" {
					enc := json.NewEncoder(cmd.OutOrStdout())
					enc.SetIndent("", "  ")
					if jerr := enc.Encode(sum); jerr != nil {
						return jerr
					}
				} else {
					sum.print(cmd.OutOrStdout())
				}
			}
			if err != nil {
				return err
			}
			if bad := sum.problems(); len(bad) > 0 {
				return fmt.Errorf("scale: %v", bad)
			}
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.dir, "dir", "", "directory of the run (logs, etcd); default: a new temporary directory")
	fl.BoolVar(&f.keep, "keep", false, "keep --dir afterwards (a temporary one is removed after a clean run)")
	fl.IntVar(&f.nodes, "nodes", 100, "KWOK nodes")
	fl.IntVar(&f.realNodes, "real-nodes", 0, "real kvnet-node processes in network namespaces (needs root)")
	fl.IntVar(&f.udns, "udns", 100, "networks: UDNs (a primary and a secondary per tenant namespace) and a tenth of them CUDNs")
	fl.IntVar(&f.pods, "pods", 5000, "pods created before the churn")
	fl.IntVar(&f.vms, "vms", 500, "VMs with persistent IPs")
	fl.DurationVar(&f.churn, "churn", 30*time.Second, "how long the churn lasts")
	fl.Float64Var(&f.churnRate, "churn-rate", 20, "pods deleted and created per second during the churn")
	fl.IntVar(&f.writers, "writers", 32, "concurrent writers creating objects")
	fl.DurationVar(&f.stall, "stall-timeout", 3*time.Minute, "how long a wait may go without progress before the run fails")
	fl.BoolVar(&f.dynamicHostSubnets, "dynamic-host-subnets", false,
		"run kvnet-controller with --enable-dynamic-host-subnets: Layer3 host subnets only on the nodes that use the network")
	fl.IntVar(&f.restartReserve, "restart-reserve", 0,
		"run kvnet-controller with --restart-reserve: address sets per network its successor hands out before its rebuild (0: off)")
	fl.StringVar(&f.podScope, "pod-scope", node.PodScopeCluster,
		"the real kvnet-nodes' --pod-scope: cluster (every pod of the cluster) or networks (their own and their networks' pods)")
	fl.StringVar(&f.profileDir, "profile-dir", "", "write CPU profiles of kvnet-controller (5 s each) during the networks, pods, VMs and churn steps to this directory (go tool pprof -top DIR/controller-pods-*.pprof)")
	fl.StringVar(&f.summary, "summary", "", "write the summary (JSON) to this file")
	fl.StringVarP(&f.output, "output", "o", "", "output format: json, or empty for the table")
	return cmd
}

func (f *scaleFlags) check() error {
	switch {
	case f.nodes < 2:
		return fmt.Errorf("--nodes %d: at least 2 (migrations need another node)", f.nodes)
	case node.CheckPodScope(f.podScope) != nil:
		return fmt.Errorf("--%w", node.CheckPodScope(f.podScope))
	case f.realNodes < 0:
		return fmt.Errorf("--real-nodes %d: must not be negative", f.realNodes)
	case f.realNodes > 0 && os.Geteuid() != 0:
		return fmt.Errorf("--real-nodes %d: needs root (the nodes are network namespaces)", f.realNodes)
	case f.udns < 4:
		return fmt.Errorf("--udns %d: at least 4 (two tenants with a primary and a secondary network each)", f.udns)
	case f.pods < 1:
		return fmt.Errorf("--pods %d: at least 1", f.pods)
	case f.vms < 4:
		return fmt.Errorf("--vms %d: at least 4 (the churn's four VM workers each take their own)", f.vms)
	case f.churn < 0:
		return fmt.Errorf("--churn %s: must not be negative", f.churn)
	case f.churnRate <= 0:
		return fmt.Errorf("--churn-rate %g: must be positive", f.churnRate)
	case f.writers < 1:
		return fmt.Errorf("--writers %d: at least 1", f.writers)
	case f.stall <= 0:
		return fmt.Errorf("--stall-timeout %s: must be positive", f.stall)
	case f.output != "" && f.output != "json":
		return fmt.Errorf("--output %q: json or empty", f.output)
	}
	return nil
}

// scaleEnv is a scale run's private lab.
type scaleEnv struct {
	*chaosEnv
	f         *scaleFlags
	fast      client.Client // admin, without client-side rate limits
	kwok      *controlplane.Helper
	kwokNodes []string
	// realNodes are the simnet names of the nodes running kvnet-node.
	realNodes []string
	// pprofAddr is kvnet-controller's pprof endpoint (with --profile-dir).
	pprofAddr string
	// stopVirt stops the virt-controller stand-in; virtDone is closed
	// once it has.
	stopVirt func()
	virtDone chan struct{}
}

func (e *scaleEnv) close() {
	if e.stopVirt != nil {
		e.stopVirt()
		<-e.virtDone
	}
	e.chaosEnv.close()
}

// agentMetricsAddr is where each real kvnet-node serves its metrics, in
// its node's namespace.
const agentMetricsAddr = "127.0.0.1:9464"

func setUpScale(ctx context.Context, f *scaleFlags, dir string) (_ *scaleEnv, err error) {
	cfg, err := controlplane.KvnetConfig()
	if err != nil {
		return nil, err
	}
	// A fresh etcd each run, kept in dir: its size is a measurement.
	etcdDir := filepath.Join(dir, "etcd")
	if err := os.RemoveAll(etcdDir); err != nil {
		return nil, err
	}
	cfg.EtcdDataDir = etcdDir
	cfg.APIServerArgs = map[string]string{
		// As a control plane sized for a thousand nodes would be.
		"max-requests-inflight":          "1600",
		"max-mutating-requests-inflight": "800",
	}
	var ctrlArgs []string
	if f.dynamicHostSubnets {
		ctrlArgs = append(ctrlArgs, "--enable-dynamic-host-subnets")
	}
	if f.restartReserve > 0 {
		ctrlArgs = append(ctrlArgs, "--restart-reserve", strconv.Itoa(f.restartReserve))
	}
	var pprofAddr string
	if f.profileDir != "" {
		ports, err := freePorts(1)
		if err != nil {
			return nil, err
		}
		pprofAddr = fmt.Sprintf("127.0.0.1:%d", ports[0])
		ctrlArgs = append(ctrlArgs, "--pprof-addr", pprofAddr)
	}
	ce, err := startControl(ctx, dir, cfg, ctrlArgs...)
	if err != nil {
		return nil, err
	}
	e := &scaleEnv{chaosEnv: ce, f: f, pprofAddr: pprofAddr}
	defer func() {
		if err != nil {
			e.close()
		}
	}()
	fastCfg := rest.CopyConfig(e.cp.Config)
	fastCfg.QPS = -1
	scheme, err := manager.NewScheme()
	if err != nil {
		return nil, err
	}
	if e.fast, err = client.New(fastCfg, client.Options{Scheme: scheme}); err != nil {
		return nil, err
	}
	admin, err := e.cp.AdminKubeconfig()
	if err != nil {
		return nil, err
	}
	if _, err := e.cp.Spawn(ctx, "kube-scheduler", []string{
		"--kubeconfig=" + admin, "--leader-elect=false", "--secure-port=0",
		"--kube-api-qps=5000", "--kube-api-burst=10000", "--v=1",
	}, filepath.Join(dir, "kube-scheduler.log")); err != nil {
		return nil, err
	}
	stages := filepath.Join(dir, "kwok-stages.yaml")
	if err := os.WriteFile(stages, []byte(kwokStages), 0o644); err != nil {
		return nil, err
	}
	if e.kwok, err = e.cp.Spawn(ctx, "kwok", []string{
		"--kubeconfig=" + admin, "--config=" + stages,
		"--manage-nodes-with-annotation-selector=" + kwokNodeAnnotation + "=fake",
		"--cidr=100.64.0.0/10", "--node-ip=192.0.2.1",
		"--server-address=127.0.0.1:0",
		// No node leases: nothing here reads them (no node lifecycle
		// controller runs), and renewing 1,000 of them every 10 s took
		// some 100 of the API server's writes per second.
		"--node-lease-duration-seconds=0",
	}, filepath.Join(dir, "kwok.log")); err != nil {
		return nil, err
	}
	if err := installKubeVirtCR(ctx, e.c); err != nil {
		return nil, err
	}
	if err := e.createKWOKNodes(ctx); err != nil {
		return nil, err
	}
	if f.realNodes > 0 {
		if err := e.startRealNodes(ctx); err != nil {
			return nil, fmt.Errorf("real nodes: %w", err)
		}
	}
	// The virt-controller stand-in places launcher pods on the KWOK nodes.
	// Without client-side limits and with more workers than the lab's:
	// the stand-in must not be what limits VM start-up here.
	vc := simvirt.Config{RESTConfig: fastCfg, Nodes: e.kwokNodes, Workers: 16, Log: ctrl.Log.WithName("simvirt")}
	vctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	e.stopVirt, e.virtDone = stop, make(chan struct{})
	go func() {
		defer close(e.virtDone)
		if err := simvirt.Run(vctx, vc); err != nil && vctx.Err() == nil {
			ctrl.Log.Error(err, "virt-controller stand-in stopped")
		}
	}()
	return e, nil
}

// KWOK manages the nodes with this annotation; scaleNodeIPAnnotation
// gives each its InternalIP (kwokStages).
const (
	kwokNodeAnnotation    = "kwok.x-k8s.io/node"
	scaleNodeIPAnnotation = "scale.kvnet.io/node-ip"
	scaleLabel            = "kvnet-scale"
)

func kwokNodeName(i int) string { return fmt.Sprintf("kwok-node-%d", i) }

func (e *scaleEnv) createKWOKNodes(ctx context.Context) error {
	for i := range e.f.nodes {
		e.kwokNodes = append(e.kwokNodes, kwokNodeName(i))
	}
	err := parallel(e.f.writers, len(e.kwokNodes), func(i int) error {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: e.kwokNodes[i],
			Labels: map[string]string{"type": "kwok", scaleLabel: "1"},
			Annotations: map[string]string{kwokNodeAnnotation: "fake",
				scaleNodeIPAnnotation: fmt.Sprintf("198.18.%d.%d", i/250, i%250+1)}}}
		return e.fast.Create(ctx, n)
	})
	if err != nil {
		return fmt.Errorf("create KWOK nodes: %w", err)
	}
	// Ready (KWOK's first stage) before anything is scheduled.
	if err := waitProgress(ctx, e.f.stall, "KWOK nodes Ready", func() (int, int, error) {
		var list corev1.NodeList
		if err := e.fast.List(ctx, &list, client.MatchingLabels{"type": "kwok"}); err != nil {
			return 0, 0, err
		}
		ready := 0
		for _, n := range list.Items {
			for _, c := range n.Status.Conditions {
				if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
					ready++
				}
			}
		}
		return ready, len(e.kwokNodes), nil
	}); err != nil {
		return err
	}
	// The API server taints a new node not-ready; the node lifecycle
	// controller (not run here: KWOK's nodes send no heartbeats) lifts
	// the taint once the node is Ready. The run lifts it itself.
	return parallel(e.f.writers, len(e.kwokNodes), func(i int) error {
		patch := []byte(`{"spec":{"taints":null}}`)
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: e.kwokNodes[i]}}
		return e.fast.Patch(ctx, n, client.RawPatch("application/merge-patch+json", patch))
	})
}

func (e *scaleEnv) startRealNodes(ctx context.Context) error {
	cl, _, err := startNodesWith(ctx, e.dir, e.cp, e.c, e.f.realNodes, false, false, false, func(cfg *simcluster.Config) {
		cfg.Virt = false
		cfg.AgentMetricsAddr = agentMetricsAddr
		cfg.PodScope = e.f.podScope
	})
	if err != nil {
		return err
	}
	e.cl = cl
	for i := range e.f.realNodes {
		e.realNodes = append(e.realNodes, NodeName(i+1))
	}
	return nil
}

// waitProgress polls count until done == want. It fails when done has
// not grown for stall (the machine may be slow; it must not be stuck).
func waitProgress(ctx context.Context, stall time.Duration, what string, count func() (done, want int, err error)) error {
	best, since := -1, time.Now()
	for {
		done, want, err := count()
		if err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		if done >= want {
			return nil
		}
		if done > best {
			best, since = done, time.Now()
		} else if time.Since(since) > stall {
			return fmt.Errorf("%s: %d of %d, no progress for %s", what, done, want, stall)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func runScale(ctx context.Context, f *scaleFlags) (sum *ScaleSummary, err error) {
	if err := f.check(); err != nil {
		return nil, err
	}
	ctx, cancel := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer cancel()
	dir, finish, err := runDir("scale", f.dir, f.keep)
	if err != nil {
		return nil, err
	}
	defer func() { finish(err == nil && sum != nil && len(sum.problems()) == 0) }()
	start := time.Now()
	e, err := setUpScale(ctx, f, dir)
	if err != nil {
		return nil, err
	}
	defer e.close()
	// The run's informers end before the lab stops: the API server's
	// graceful stop waits for open watches.
	ctx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	fmt.Fprintf(os.Stderr, "scale: lab up in %s (%d KWOK nodes, %d real; logs in %s)\n",
		time.Since(start).Round(time.Millisecond), f.nodes, f.realNodes, dir)
	r, err := newScaleRun(ctx, e)
	if err != nil {
		return nil, err
	}
	return r.run(ctx)
}

func writeSummary(path string, s *ScaleSummary) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

func printRows(w io.Writer, rows [][2]string) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\n", r[0], r[1])
	}
	tw.Flush()
}
