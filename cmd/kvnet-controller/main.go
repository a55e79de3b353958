// Command kvnet-controller runs kvnet's cluster-wide controllers.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap/zapcore"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"kvnet.io/kvnet/internal/install/teardown"
	"kvnet.io/kvnet/internal/k8s/apiwait"
	"kvnet.io/kvnet/internal/k8s/manager"
	"kvnet.io/kvnet/internal/k8s/webhooks"
	"kvnet.io/kvnet/internal/reserved"
	"kvnet.io/kvnet/internal/udn"
)

func main() {
	options := bindFlags(flag.CommandLine)
	preDelete := flag.Bool("pre-delete", false,
		"do what an uninstall does before kvnet's objects are deleted, then exit: refuse while user-defined networks exist, "+
			"remove kvnet's state from every node (kvnet-node --cleanup); the Helm chart's pre-delete hook runs this")
	drainFor := flag.Duration("shutdown-drain", 2*time.Second,
		"on SIGTERM, how long the webhooks keep answering, each response closing its connection, before the replica stops "+
			"(so that the API server never writes a call on a connection the stopping replica closes)")
	nodeCleanupTimeout := flag.Duration("node-cleanup-timeout", teardown.DefaultNodeCleanupTimeout, "with --pre-delete: how long to wait for the node cleanup")
	// Millisecond timestamps: a live migration's switch-over is read from
	// logs in milliseconds (--zap-time-encoding overrides it).
	zapOpts := zap.Options{TimeEncoder: zapcore.RFC3339NanoTimeEncoder}
	zapOpts.BindFlags(flag.CommandLine)
	flag.Parse()
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&zapOpts)))
	opts, err := options(os.Getenv("POD_NAMESPACE"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "kvnet-controller:", err)
		os.Exit(2)
	}
	drain := &webhooks.Drain{}
	opts.Drain = drain
	ctx, restCfg := stopContext(drain, *drainFor), ctrl.GetConfigOrDie()
	if *preDelete {
		if err := runPreDelete(ctx, restCfg, os.Getenv("POD_NAMESPACE"), *nodeCleanupTimeout); err != nil {
			fmt.Fprintln(os.Stderr, "kvnet-controller --pre-delete:", err)
			os.Exit(1)
		}
		return
	}
	// The manager needs the API's discovery data: wait for the API server
	// rather than exit into the kubelet's back-off.
	err = apiwait.Wait(ctx, restCfg, apiwait.DefaultBackoff, ctrl.Log.WithName("kvnet-controller"))
	if err == nil {
		err = manager.Run(ctx, restCfg, opts)
	}
	if errors.Is(err, manager.ErrKubeVirtArrived) {
		// Its Deployment starts it again, with the VM controllers.
		ctrl.Log.Info("exiting to be restarted", "reason", err.Error())
		os.Exit(1)
	}
	if err != nil {
		ctrl.Log.Error(err, "kvnet-controller failed")
		os.Exit(1)
	}
}

// runPreDelete runs install.PreDelete for kvnet in namespace ns (default
// kvnet-system), logging to stdout: the pod's log says what was cleaned,
// or why nothing was.
func runPreDelete(ctx context.Context, cfg *rest.Config, ns string, timeout time.Duration) error {
	if ns == "" {
		ns = "kvnet-system"
	}
	c, err := client.New(cfg, client.Options{Scheme: clientgoscheme.Scheme})
	if err != nil {
		return err
	}
	return teardown.PreDelete(ctx, c, ns, teardown.Options{NodeCleanupTimeout: timeout}, os.Stdout)
}

// bindFlags defines kvnet-controller's flags on fs, each defaulting to
// manager.DefaultOptions (the one place defaults are kept), and returns
// what builds the options once fs is parsed: podNamespace (the pod's
// namespace, "" when unknown) holds the webhook's certificate and MAC
// range, else the default's. The options are validated as manager.New
// validates them, naming the flag.
func bindFlags(fs *flag.FlagSet) func(podNamespace string) (manager.Options, error) {
	opts := manager.DefaultOptions()
	w := *opts.Webhook
	fs.StringVar(&opts.MetricsAddr, "metrics-bind-address", opts.MetricsAddr, "address of the Prometheus metrics endpoint; 0 disables it")
	fs.StringVar(&opts.ProbeAddr, "health-probe-bind-address", opts.ProbeAddr, "address of /healthz and /readyz; 0 disables them")
	fs.StringVar(&opts.PprofAddr, "pprof-bind-address", opts.PprofAddr, "address of Go's profiles (/debug/pprof/), e.g. 127.0.0.1:6060; 0 disables them")
	fs.BoolVar(&opts.LeaderElection, "leader-elect", opts.LeaderElection, "elect a leader among replicas")
	fs.IntVar(&w.Port, "webhook-port", w.Port, "port of the admission webhooks; 0 disables them")
	fs.StringVar(&w.PrimaryAttachment, "primary-network-attachment", w.PrimaryAttachment,
		"how pods get their namespace's primary network: "+manager.PrimaryByMultus+" (kvnet's webhook selects it in k8s.v1.cni.cncf.io/networks as ovn-udn1; "+
			"the cluster default network stays eth0), "+manager.PrimaryByMultusDefault+" (kvnet's webhook makes it the pod's default network for Multus, "+
			"v1.multus-cni.io/default-network; kvnet-cni attaches the cluster default network as eth0 and the primary network as ovn-udn1 in one result, "+
			"so that Multus reports ovn-udn1 as the default network; what kvnet install sets) or "+manager.PrimaryByDefaultNetwork+" (the cluster's default network plugin attaches it)")
	fs.StringVar(&w.DefaultNetworkNAD, "default-network-nad", w.DefaultNetworkNAD, "<namespace>/<name> of the cluster default network's NAD, written in launcher pods' default-network element; "+
		"required in "+manager.PrimaryByDefaultNetwork+" mode (OVN-Kubernetes: ovn-kubernetes/default), unused otherwise")
	fs.StringVar(&opts.LeaderElectionNamespace, "leader-election-namespace", opts.LeaderElectionNamespace, "namespace of the leader lease (default: the pod's)")
	fs.BoolVar(&opts.DynamicHostSubnets, "enable-dynamic-host-subnets", opts.DynamicHostSubnets,
		"give a node host subnets of a Layer3 network only while pods of the network run there (and for --host-subnet-grace after), as OVN-Kubernetes' --enable-dynamic-udn-allocation")
	fs.DurationVar(&opts.HostSubnetGrace, "host-subnet-grace", opts.HostSubnetGrace,
		"with --enable-dynamic-host-subnets, how long a node keeps a Layer3 network's host subnets after its last pod of the network ended")
	fs.IntVar(&opts.RestartReserve, "restart-reserve", opts.RestartReserve,
		"address sets per network (one address per subnet) the leader keeps free and recorded in ConfigMaps of its namespace, "+
			"so that after a restart it serves new pods before it has read every IPAMClaim and pod; 0 turns it off and deletes the records")
	reservedSubnets := reserved.Flags(fs)
	globalNS := fs.String("global-namespaces", strings.Join(opts.GlobalNamespaces, ","),
		"comma-separated namespaces (or prefixes ending in *) no UserDefinedNetwork or ClusterUserDefinedNetwork may serve, besides default and openshift-*, which never are")
	return func(podNamespace string) (manager.Options, error) {
		var err error
		if opts.RestartReserve < 0 || opts.RestartReserve > maxRestartReserve {
			return manager.Options{}, fmt.Errorf("--restart-reserve %d: must be from 0 to %d", opts.RestartReserve, maxRestartReserve)
		}
		if podNamespace != "" {
			opts.Namespace = podNamespace
		}
		if opts.HostSubnetGrace <= 0 {
			return manager.Options{}, fmt.Errorf("--host-subnet-grace %s: must be positive", opts.HostSubnetGrace)
		}
		if opts.ReservedSubnets, err = reservedSubnets(); err != nil {
			return manager.Options{}, err
		}
		if opts.GlobalNamespaces, err = udn.ParseGlobalNamespaces(*globalNS); err != nil {
			return manager.Options{}, err
		}
		if w.Port == 0 {
			opts.Webhook = nil
			return opts, nil
		}
		if podNamespace != "" {
			w.Namespace = podNamespace
		}
		if err := w.Validate(); err != nil {
			return manager.Options{}, fmt.Errorf("webhook flags (--webhook-port, --primary-network-attachment, --default-network-nad): %w", err)
		}
		ww := w
		opts.Webhook = &ww
		return opts, nil
	}
}

// maxRestartReserve bounds --restart-reserve: a record lists every set,
// and a ConfigMap holds at most 1 MiB.
const maxRestartReserve = 1024

// stopContext is controller-runtime's signal handler with a drain: the
// first SIGTERM or SIGINT starts drain and cancels the returned context
// drainFor later, which stops the manager; a second signal exits at once.
func stopContext(drain *webhooks.Drain, drainFor time.Duration) context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	sig := make(chan os.Signal, 2)
	signal.Notify(sig, syscall.SIGTERM, os.Interrupt)
	go func() {
		<-sig
		drain.Start()
		ctrl.Log.Info("stopping: the webhooks close each connection after its response until the replica stops", "in", drainFor.String())
		t := time.NewTimer(drainFor)
		select {
		case <-t.C:
		case <-sig:
			os.Exit(1)
		}
		cancel()
		<-sig
		os.Exit(1)
	}()
	return ctx
}
