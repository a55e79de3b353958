// Command kvnet-controller runs kvnet's cluster-wide controllers.
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"

	"go.uber.org/zap/zapcore"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"kvnet.io/kvnet/internal/k8s/manager"
	"kvnet.io/kvnet/internal/reserved"
	"kvnet.io/kvnet/internal/udn"
)

func main() {
	var opts manager.Options
	flag.StringVar(&opts.MetricsAddr, "metrics-bind-address", ":8080", "address of the Prometheus metrics endpoint; 0 disables it")
	flag.StringVar(&opts.ProbeAddr, "health-probe-bind-address", ":8081", "address of /healthz and /readyz; 0 disables them")
	flag.BoolVar(&opts.LeaderElection, "leader-elect", true, "elect a leader among replicas")
	webhookPort := flag.Int("webhook-port", 9443, "port of the admission webhooks; 0 disables them")
	primaryAttachment := flag.String("primary-network-attachment", manager.PrimaryByMultus,
		"how pods get their namespace's primary network: multus (kvnet's webhook selects it in k8s.v1.cni.cncf.io/networks as ovn-udn1; "+
			"the cluster default network stays eth0) or default-network (the cluster's default network plugin attaches it)")
	defaultNAD := flag.String("default-network-nad", "", "<namespace>/<name> of the cluster default network's NAD, written in launcher pods' default-network element; "+
		"required in default-network mode (OVN-Kubernetes: ovn-kubernetes/default), unused with multus")
	flag.StringVar(&opts.LeaderElectionNamespace, "leader-election-namespace", "", "namespace of the leader lease (default: the pod's)")
	reservedSubnets := reserved.Flags(flag.CommandLine)
	globalNS := flag.String("global-namespaces", strings.Join(udn.DefaultGlobalNamespaces, ","),
		"comma-separated namespaces (or prefixes ending in *) no UserDefinedNetwork or ClusterUserDefinedNetwork may serve, besides default and openshift-*, which never are")
	// Millisecond timestamps: a live migration's switch-over is read from
	// logs in milliseconds (--zap-time-encoding overrides it).
	zapOpts := zap.Options{TimeEncoder: zapcore.RFC3339NanoTimeEncoder}
	zapOpts.BindFlags(flag.CommandLine)
	flag.Parse()
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&zapOpts)))
	if err := checkDefaultNetworkNAD(*primaryAttachment, *defaultNAD); err != nil {
		fmt.Fprintln(os.Stderr, "kvnet-controller:", err)
		os.Exit(2)
	}
	var err error
	if opts.ReservedSubnets, err = reservedSubnets(); err == nil {
		opts.GlobalNamespaces, err = udn.ParseGlobalNamespaces(*globalNS)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "kvnet-controller:", err)
		os.Exit(2)
	}
	if *webhookPort != 0 {
		opts.Webhook = &manager.WebhookOptions{Port: *webhookPort, Namespace: os.Getenv("POD_NAMESPACE"),
			PrimaryAttachment: *primaryAttachment, DefaultNetworkNAD: *defaultNAD}
	}

	if err := manager.Run(ctrl.SetupSignalHandler(), ctrl.GetConfigOrDie(), opts); err != nil {
		ctrl.Log.Error(err, "kvnet-controller failed")
		os.Exit(1)
	}
}

// checkDefaultNetworkNAD: in default-network mode the cluster default
// network's NAD is the user's to name (kvnet cannot tell which it is);
// it must be <namespace>/<name>.
func checkDefaultNetworkNAD(mode, nad string) error {
	if mode != manager.PrimaryByDefaultNetwork {
		return nil
	}
	if nad == "" {
		return fmt.Errorf("--default-network-nad is required with --primary-network-attachment=%s: the <namespace>/<name> of the cluster default network's NAD (OVN-Kubernetes: ovn-kubernetes/default)", mode)
	}
	ns, name, ok := strings.Cut(nad, "/")
	if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
		return fmt.Errorf("--default-network-nad %q: want <namespace>/<name>", nad)
	}
	return nil
}
