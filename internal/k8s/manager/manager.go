// Package manager assembles kvnet-controller: the scheme of every API kvnet
// reads or writes, a leader-elected controller-runtime manager with metrics
// and health probes, and the controllers. cmd/kvnet-controller and the lab
// both run it, so the lab exercises exactly what a cluster runs.
package manager

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	nadv1 "kvnet.io/kvnet/api/k8scni/v1"
	ipamclaimv1alpha1 "kvnet.io/kvnet/api/k8scni/v1alpha1"
	kubevirtv1 "kvnet.io/kvnet/api/kubevirt/v1"
	udnv1 "kvnet.io/kvnet/api/udn/v1"
	ipamcontroller "kvnet.io/kvnet/internal/k8s/controllers/ipam"
	udncontroller "kvnet.io/kvnet/internal/k8s/controllers/udn"
)

// NewScheme returns a scheme with the Kubernetes built-ins and every API
// kvnet uses.
func NewScheme() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{
		clientgoscheme.AddToScheme, udnv1.AddToScheme, nadv1.AddToScheme,
		ipamclaimv1alpha1.AddToScheme, kubevirtv1.AddToScheme,
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
	// LeaderElection enables leader election (on in a cluster).
	LeaderElection bool
	// LeaderElectionNamespace holds the lease; empty means the pod's namespace.
	LeaderElectionNamespace string
	// MaxConcurrentReconciles per controller; 0 means the controllers' default.
	MaxConcurrentReconciles int
	// SkipNameValidation lets one process build the manager more than once
	// (tests that restart the controller).
	SkipNameValidation bool
}

// New builds the manager with every kvnet controller registered.
func New(cfg *rest.Config, opts Options) (ctrl.Manager, error) {
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
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                  scheme,
		Metrics:                 metricsserver.Options{BindAddress: opts.MetricsAddr},
		HealthProbeBindAddress:  opts.ProbeAddr,
		LeaderElection:          opts.LeaderElection,
		LeaderElectionID:        "kvnet-controller.kvnet.io",
		LeaderElectionNamespace: opts.LeaderElectionNamespace,
	})
	if err != nil {
		return nil, fmt.Errorf("create manager: %w", err)
	}
	if err := udncontroller.Setup(mgr, udncontroller.Options{MaxConcurrentReconciles: opts.MaxConcurrentReconciles, SkipNameValidation: opts.SkipNameValidation}); err != nil {
		return nil, fmt.Errorf("set up UDN controllers: %w", err)
	}
	ipamReady, err := ipamcontroller.Setup(mgr, ipamcontroller.Options{MaxConcurrentReconciles: opts.MaxConcurrentReconciles, SkipNameValidation: opts.SkipNameValidation})
	if err != nil {
		return nil, fmt.Errorf("set up IPAM controllers: %w", err)
	}
	if opts.ProbeAddr != "0" {
		if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
			return nil, err
		}
		// Ready only once the allocators are rebuilt from the API.
		if err := mgr.AddReadyzCheck("ipam-rebuilt", ipamReady); err != nil {
			return nil, err
		}
	}
	return mgr, nil
}

// Run builds the manager and runs it until ctx ends.
func Run(ctx context.Context, cfg *rest.Config, opts Options) error {
	mgr, err := New(cfg, opts)
	if err != nil {
		return err
	}
	return mgr.Start(ctx)
}
