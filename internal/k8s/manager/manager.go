// Package manager assembles kvnet-controller: the scheme of every API kvnet
// reads or writes, a leader-elected controller-runtime manager with metrics
// and health probes, and the controllers. cmd/kvnet-controller and the lab
// both run it, so the lab exercises exactly what a cluster runs.
package manager

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	nadv1 "kvnet.io/kvnet/api/k8scni/v1"
	ipamclaimv1alpha1 "kvnet.io/kvnet/api/k8scni/v1alpha1"
	mnpv1beta1 "kvnet.io/kvnet/api/k8scni/v1beta1"
	kubevirtv1 "kvnet.io/kvnet/api/kubevirt/v1"
	udnv1 "kvnet.io/kvnet/api/udn/v1"
	"kvnet.io/kvnet/internal/k8s/certs"
	"kvnet.io/kvnet/internal/k8s/controllers/epmirror"
	"kvnet.io/kvnet/internal/k8s/controllers/hostsubnets"
	ipamcontroller "kvnet.io/kvnet/internal/k8s/controllers/ipam"
	macpoolcontroller "kvnet.io/kvnet/internal/k8s/controllers/macpool"
	"kvnet.io/kvnet/internal/k8s/controllers/nodeids"
	"kvnet.io/kvnet/internal/k8s/controllers/policyevents"
	udncontroller "kvnet.io/kvnet/internal/k8s/controllers/udn"
	vmclaimscontroller "kvnet.io/kvnet/internal/k8s/controllers/vmclaims"
	"kvnet.io/kvnet/internal/k8s/webhooks"
	"kvnet.io/kvnet/internal/reserved"
	"kvnet.io/kvnet/internal/udn"
)

// NewScheme returns a scheme with the Kubernetes built-ins and every API
// kvnet uses.
func NewScheme() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{
		clientgoscheme.AddToScheme, udnv1.AddToScheme, nadv1.AddToScheme,
		ipamclaimv1alpha1.AddToScheme, mnpv1beta1.AddToScheme, kubevirtv1.AddToScheme,
	} {
		if err := add(s); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// Options configures kvnet-controller.
type Options struct {
	// MetricsAddr serves Prometheus metrics; "0" disables them.
	MetricsAddr string
	// ProbeAddr serves /healthz and /readyz; "0" disables them.
	ProbeAddr string
	// PprofAddr serves Go's profiles (/debug/pprof/); "" or "0" (the
	// default) disables them. They reveal the process's internals: bind
	// it to localhost.
	PprofAddr string
	// LeaderElection enables leader election (on in a cluster).
	LeaderElection bool
	// LeaderElectionNamespace holds the lease; empty means the pod's namespace.
	LeaderElectionNamespace string
	// LeaseDuration, RenewDeadline and RetryPeriod tune leader election;
	// zero keeps controller-runtime's defaults (15 s, 10 s, 2 s). Tests
	// shorten them to exercise a fail-over.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	// MaxConcurrentReconciles per controller; 0 means the controllers' default.
	MaxConcurrentReconciles int
	// SkipNameValidation lets one process build the manager more than once
	// (tests that restart the controller).
	SkipNameValidation bool
	// Webhook enables the admission webhooks and the MAC pool; nil leaves
	// them off.
	Webhook *WebhookOptions
	// GlobalNamespaces no UDN or CUDN may serve, besides default and
	// openshift-*; nil means udn.DefaultGlobalNamespaces (an empty,
	// non-nil list: none).
	GlobalNamespaces []string
	// ReservedSubnets are the cluster's reserved subnets; zero means the
	// defaults.
	ReservedSubnets reserved.Subnets
	// DynamicHostSubnets gives a node host subnets of a Layer3 network
	// only while pods of the network run there, and for HostSubnetGrace
	// (0: hostsubnets.DefaultGrace) after the last one ended.
	DynamicHostSubnets bool
	HostSubnetGrace    time.Duration
	// Drain, once started, closes the webhooks' connections after each
	// response (see webhooks.Drain); nil: never.
	Drain *webhooks.Drain
	// RestartReserve is the number of address sets per network the leader
	// keeps free and recorded, so that its successor serves new pods
	// before it has read every claim and pod; 0 turns it off (and deletes
	// the records).
	RestartReserve int
	// Namespace is the controller's own (its pod's): the restart reserve's
	// records, and the leader lease unless LeaderElectionNamespace is set.
	// Empty leaves the restart reserve off.
	Namespace string
	// HoldIPAMRebuild, if set, holds the allocators' rebuild after the
	// restart reserve is loaded until it is closed (tests).
	HoldIPAMRebuild <-chan struct{}
}

// How pods get their namespace's primary network (WebhookOptions.PrimaryAttachment).
const (
	PrimaryByMultus         = "multus"
	PrimaryByDefaultNetwork = "default-network"
	// PrimaryByMultusDefault: the primary NAD is the pod's default
	// network for Multus (v1.multus-cni.io/default-network), and kvnet-cni
	// runs the cluster default network for eth0 itself; Multus then marks
	// ovn-udn1 default in network-status in its own write.
	PrimaryByMultusDefault = "multus-default"
)

// DefaultOptions returns kvnet-controller's defaults, the one place
// they are kept: cmd/kvnet-controller's flags default to them, and the
// lab and tests start from them. Its Webhook is DefaultWebhookOptions.
func DefaultOptions() Options {
	w := DefaultWebhookOptions()
	return Options{MetricsAddr: ":8080", ProbeAddr: ":8081", PprofAddr: "0", LeaderElection: true, Webhook: &w, Namespace: "kvnet-system",
		GlobalNamespaces: slices.Clone(udn.DefaultGlobalNamespaces), ReservedSubnets: reserved.Default(),
		HostSubnetGrace: hostsubnets.DefaultGrace}
}

// DefaultWebhookOptions returns the webhook defaults: port 9443 in
// kvnet-system, the primary network attached by Multus (no default
// network NAD needed), the MAC range in kvnet-mac-range-config.
func DefaultWebhookOptions() WebhookOptions {
	return WebhookOptions{Port: 9443, Namespace: "kvnet-system", PrimaryAttachment: PrimaryByMultus,
		MACRangeConfigMap: "kvnet-mac-range-config"}
}

// Validate reports the first setting that cannot work, naming it; New
// refuses such options rather than fill in a value of its own.
func (w *WebhookOptions) Validate() error {
	switch {
	case w.Port <= 0 || w.Port > 65535:
		return fmt.Errorf("webhook port %d: want 1-65535", w.Port)
	case w.Namespace == "":
		return errors.New("webhook namespace is empty")
	case w.MACRangeConfigMap == "":
		return errors.New("MAC range ConfigMap name is empty")
	}
	switch w.PrimaryAttachment {
	case PrimaryByMultus, PrimaryByMultusDefault:
		return nil
	case PrimaryByDefaultNetwork:
	default:
		return fmt.Errorf("primary network attachment %q: want %q, %q or %q", w.PrimaryAttachment, PrimaryByMultus, PrimaryByMultusDefault, PrimaryByDefaultNetwork)
	}
	if w.DefaultNetworkNAD == "" {
		return fmt.Errorf("default network NAD is required with primary network attachment %s: the <namespace>/<name> of the cluster default network's NAD (OVN-Kubernetes: ovn-kubernetes/default)", w.PrimaryAttachment)
	}
	ns, name, ok := strings.Cut(w.DefaultNetworkNAD, "/")
	if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
		return fmt.Errorf("default network NAD %q: want <namespace>/<name>", w.DefaultNetworkNAD)
	}
	return nil
}

// WebhookOptions configures the webhook server. Start from
// DefaultWebhookOptions: New fills in nothing but the certificate's DNS
// names.
type WebhookOptions struct {
	Host string // listen address; "" = all
	Port int    // must be set
	// Namespace holds the certificate Secret and the MAC range ConfigMap.
	Namespace string
	// DNSNames and IPs of the serving certificate; default the Service's
	// DNS names.
	DNSNames []string
	IPs      []net.IP
	// PrimaryAttachment says how pods get their namespace's primary
	// network: PrimaryByMultus (an element of the networks annotation that
	// kvnet's webhook adds; the cluster default network stays eth0),
	// PrimaryByMultusDefault (the primary NAD as Multus's default network
	// for the pod; kvnet-cni attaches eth0 and ovn-udn1 together) or
	// PrimaryByDefaultNetwork (the cluster's default network plugin
	// attaches it, as OVN-Kubernetes does, and the lab's kubelet). It
	// must be set: DefaultWebhookOptions has the default.
	PrimaryAttachment string
	// DefaultNetworkNAD is "<namespace>/<name>" of the cluster default
	// network's NAD, written in launcher pods' default-network element;
	// required in PrimaryByDefaultNetwork mode (kvnet cannot tell which
	// NAD it is; OVN-Kubernetes': ovn-kubernetes/default), unused with
	// PrimaryByMultus.
	DefaultNetworkNAD string
	// MACRangeConfigMap is the name of the MAC range ConfigMap in
	// Namespace.
	MACRangeConfigMap string
	// MACPendingTimeout: see macpool.Options.PendingTimeout.
	MACPendingTimeout time.Duration
}

// New builds the manager with every kvnet controller registered.
func New(cfg *rest.Config, opts Options) (ctrl.Manager, error) {
	if opts.Webhook != nil {
		if err := opts.Webhook.Validate(); err != nil {
			return nil, err
		}
	}
	scheme, err := NewScheme()
	if err != nil {
		return nil, err
	}
	// Rely on the API server's priority and fairness rather than client-go's
	// default 5 requests/s, as controller-runtime's GetConfig does.
	cfg = rest.CopyConfig(cfg)
	if cfg.QPS == 0 {
		cfg.QPS = -1
	}
	if opts.MetricsAddr == "" {
		opts.MetricsAddr = "0"
	}
	if opts.ProbeAddr == "" {
		opts.ProbeAddr = "0"
	}
	var webhookServer webhook.Server
	var certMgr *certs.Manager
	if w := opts.Webhook; w != nil {
		if len(w.DNSNames) == 0 && len(w.IPs) == 0 {
			w.DNSNames = []string{"kvnet-webhook." + w.Namespace + ".svc", "kvnet-webhook." + w.Namespace + ".svc.cluster.local"}
		}
		direct, err := client.NewWithWatch(cfg, client.Options{Scheme: scheme})
		if err != nil {
			return nil, err
		}
		certMgr = certs.New(direct, certs.Options{Namespace: w.Namespace, SecretName: certs.SecretName, DNSNames: w.DNSNames, IPs: w.IPs})
		// Certificates before serving: the API server must never meet a
		// webhook without one.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := certMgr.Ensure(ctx); err != nil {
			return nil, fmt.Errorf("webhook certificates: %w", err)
		}
		webhookServer = webhook.NewServer(webhook.Options{
			Host: w.Host, Port: w.Port,
			TLSOpts: []func(*tls.Config){func(c *tls.Config) { c.GetCertificate = certMgr.GetCertificate }},
		})
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		WebhookServer:           webhookServer,
		Scheme:                  scheme,
		Metrics:                 metricsserver.Options{BindAddress: opts.MetricsAddr},
		HealthProbeBindAddress:  opts.ProbeAddr,
		PprofBindAddress:        opts.PprofAddr,
		LeaderElection:          opts.LeaderElection,
		LeaderElectionID:        leaderLease,
		LeaderElectionNamespace: opts.LeaderElectionNamespace,
		// The process exits once the manager stops, so the lease can be
		// handed over at once instead of after LeaseDuration: a rollout
		// (strategy Recreate) has a leader again within seconds.
		LeaderElectionReleaseOnCancel: true,
		LeaseDuration:                 durationOrNil(opts.LeaseDuration),
		RenewDeadline:                 durationOrNil(opts.RenewDeadline),
		RetryPeriod:                   durationOrNil(opts.RetryPeriod),
		Cache:                         cacheOptions(opts),
	})
	if err != nil {
		return nil, fmt.Errorf("create manager: %w", err)
	}
	if err := udncontroller.Setup(mgr, udncontroller.Options{MaxConcurrentReconciles: opts.MaxConcurrentReconciles, SkipNameValidation: opts.SkipNameValidation,
		GlobalNamespaces: opts.GlobalNamespaces, Reserved: opts.ReservedSubnets}); err != nil {
		return nil, fmt.Errorf("set up UDN controllers: %w", err)
	}
	if err := nodeids.Setup(mgr, nodeids.Options{SkipNameValidation: opts.SkipNameValidation}); err != nil {
		return nil, fmt.Errorf("set up node ID controller: %w", err)
	}
	if err := hostsubnets.Setup(mgr, hostsubnets.Options{
		SkipNameValidation: opts.SkipNameValidation, Dynamic: opts.DynamicHostSubnets, Grace: opts.HostSubnetGrace}); err != nil {
		return nil, fmt.Errorf("set up host subnet controller: %w", err)
	}
	if err := epmirror.Setup(mgr, epmirror.Options{SkipNameValidation: opts.SkipNameValidation}); err != nil {
		return nil, fmt.Errorf("set up EndpointSlice mirror controller: %w", err)
	}
	if err := policyevents.Setup(mgr, policyevents.Options{SkipNameValidation: opts.SkipNameValidation}); err != nil {
		return nil, fmt.Errorf("set up policy events controller: %w", err)
	}
	ipamStarted, err := ipamcontroller.Setup(mgr, ipamcontroller.Options{MaxConcurrentReconciles: opts.MaxConcurrentReconciles, SkipNameValidation: opts.SkipNameValidation,
		Reserve:     ipamcontroller.ReserveOptions{Size: opts.RestartReserve, Namespace: opts.Namespace, Epoch: leaderEpoch(mgr.GetAPIReader(), opts)},
		HoldRebuild: opts.HoldIPAMRebuild})
	if err != nil {
		return nil, fmt.Errorf("set up IPAM controllers: %w", err)
	}
	vms, err := kubeVirtServed(mgr)
	if err != nil {
		return nil, err
	}
	if vms {
		if err := vmclaimscontroller.Setup(mgr, vmclaimscontroller.Options{After: ipamStarted.Rebuilt, SkipNameValidation: opts.SkipNameValidation}); err != nil {
			return nil, fmt.Errorf("set up VM claims controller: %w", err)
		}
	} else {
		ctrllog.Log.Info("KubeVirt's VirtualMachine CRD is not served: running without the VM claims controller, the MAC pool and the VM webhook; stopping when it appears, to be restarted with them")
		if err := mgr.Add(kubeVirtWatch{cfg: cfg}); err != nil {
			return nil, err
		}
	}
	var macReady healthz.Checker
	if opts.Webhook != nil {
		if macReady, err = setupWebhooks(mgr, opts, certMgr, vms); err != nil {
			return nil, err
		}
	}
	if opts.ProbeAddr != "0" {
		if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
			return nil, err
		}
		// Every replica answers admissions, so every replica may be Ready:
		// a standby once its caches (and MAC index) are built, the leader
		// only once it has rebuilt the allocators from the API as well, or
		// serves new pods from the restart reserve meanwhile.
		serving := ipamStarted.Ready
		if opts.LeaderElection {
			// Without leader election the one replica leads: it is not a
			// standby before its manager marks it elected.
			serving = leaderOnly(mgr.Elected(), serving)
		}
		if err := mgr.AddReadyzCheck("ipam-serving", serving); err != nil {
			return nil, err
		}
		if err := mgr.AddReadyzCheck("caches-synced", cacheSynced(mgr.GetCache())); err != nil {
			return nil, err
		}
		if macReady != nil {
			if err := mgr.AddReadyzCheck("macpool-indexed", macReady); err != nil {
				return nil, err
			}
		}
	}
	return mgr, nil
}

// setupWebhooks registers the webhooks, and the MAC pool behind the VM
// webhook when vms (KubeVirt's VirtualMachine CRD is served).
func setupWebhooks(mgr ctrl.Manager, opts Options, certMgr *certs.Manager, vms bool) (healthz.Checker, error) {
	w := opts.Webhook
	var pool *macpoolcontroller.Manager
	if vms {
		var err error
		pool, err = macpoolcontroller.Setup(mgr, macpoolcontroller.Options{
			ConfigMap:          types.NamespacedName{Namespace: w.Namespace, Name: w.MACRangeConfigMap},
			Namespace:          w.Namespace,
			PendingTimeout:     w.MACPendingTimeout,
			SkipNameValidation: opts.SkipNameValidation,
		})
		if err != nil {
			return nil, fmt.Errorf("set up MAC pool: %w", err)
		}
	}
	srv := mgr.GetWebhookServer()
	dec := admission.NewDecoder(mgr.GetScheme())
	srv.Register(webhooks.LauncherPodPath, opts.Drain.Wrap(&webhook.Admission{Handler: webhooks.Counted("launcher-pod", &webhooks.LauncherPodMutator{
		Reader: mgr.GetAPIReader(), Cache: mgr.GetClient(), Decoder: dec, DefaultNetworkNAD: w.DefaultNetworkNAD,
		PrimaryInNetworks:       w.PrimaryAttachment == PrimaryByMultus,
		PrimaryAsDefaultNetwork: w.PrimaryAttachment == PrimaryByMultusDefault,
	})}))
	srv.Register(webhooks.PrimaryPodPath, opts.Drain.Wrap(&webhook.Admission{Handler: webhooks.Counted("primary-pod", &webhooks.PrimaryPodMutator{
		Reader: mgr.GetAPIReader(), Cache: mgr.GetClient(), Decoder: dec,
		Multus:           w.PrimaryAttachment == PrimaryByMultus || w.PrimaryAttachment == PrimaryByMultusDefault,
		AsDefaultNetwork: w.PrimaryAttachment == PrimaryByMultusDefault,
	})}))
	// Renewals and caBundle upkeep, on every replica.
	if err := mgr.Add(certMgr); err != nil {
		return nil, err
	}
	if pool == nil {
		return nil, nil
	}
	srv.Register(webhooks.VirtualMachinePath, opts.Drain.Wrap(&webhook.Admission{Handler: webhooks.Counted("virtualmachine", &webhooks.VMMutator{Pool: pool, Decoder: dec})}))
	return func(*http.Request) error {
		if !pool.Ready() {
			return errors.New("MAC pool not indexed yet")
		}
		return nil
	}, nil
}

// cacheOptions restricts what the manager caches: Leases are the MAC
// pool's reservations, in the webhooks' namespace (no webhooks, no pool).
func cacheOptions(opts Options) cache.Options {
	byObject := map[client.Object]cache.ByObject{}
	if opts.Webhook != nil {
		macpoolcontroller.CacheOptions(byObject, opts.Webhook.Namespace)
	}
	return cache.Options{ByObject: byObject}
}

// leaderLease is the name of kvnet-controller's leader Lease.
const leaderLease = "kvnet-controller.kvnet.io"

// leaderEpoch returns how the restart reserve reads the leader's epoch:
// the leader Lease's leaseTransitions, which each new leader increments;
// nil without leader election.
func leaderEpoch(r client.Reader, opts Options) func(context.Context) (int64, bool, error) {
	if !opts.LeaderElection {
		return nil
	}
	ns := opts.LeaderElectionNamespace
	if ns == "" {
		ns = opts.Namespace
	}
	return func(ctx context.Context) (int64, bool, error) {
		var l coordinationv1.Lease
		if err := r.Get(ctx, client.ObjectKey{Namespace: ns, Name: leaderLease}, &l); err != nil {
			return 0, true, err
		}
		if l.Spec.LeaseTransitions == nil {
			return 0, true, nil
		}
		return int64(*l.Spec.LeaseTransitions), true, nil
	}
}

// leaderOnly applies check on the elected leader only: a standby has
// nothing to rebuild.
func leaderOnly(elected <-chan struct{}, check healthz.Checker) healthz.Checker {
	return func(req *http.Request) error {
		select {
		case <-elected:
			return check(req)
		default:
			return nil
		}
	}
}

// cacheSynced fails until the manager's informers have synced: the
// webhooks answer from them.
func cacheSynced(c cache.Cache) healthz.Checker {
	return func(req *http.Request) error {
		ctx, cancel := context.WithTimeout(req.Context(), 200*time.Millisecond)
		defer cancel()
		if !c.WaitForCacheSync(ctx) {
			return errors.New("caches not synced yet")
		}
		return nil
	}
}

func durationOrNil(d time.Duration) *time.Duration {
	if d == 0 {
		return nil
	}
	return &d
}

// Run builds the manager and runs it until ctx ends.
func Run(ctx context.Context, cfg *rest.Config, opts Options) error {
	mgr, err := New(cfg, opts)
	if err != nil {
		return err
	}
	return mgr.Start(ctx)
}
