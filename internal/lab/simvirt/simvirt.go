package simvirt

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	nadv1 "kvnet.io/kvnet/api/k8scni/v1"
	kubevirtv1 "kvnet.io/kvnet/api/kubevirt/v1"
)

// Config configures the stand-in virt-controller.
type Config struct {
	// RESTConfig reaches the API server.
	RESTConfig *rest.Config
	// Nodes are the (simulated) nodes launcher pods may be bound to; at
	// least one.
	Nodes []string
	// GuestAgent, when set, tells the addresses the VMIs' guests hold:
	// status.interfaces of a running VMI with a guest report them, as
	// KubeVirt's do from the guest agent (see withGuest), polled every
	// GuestPoll. Without it, status.interfaces report the launcher pod's
	// allocation.
	GuestAgent GuestAgent
	// Workers is how many VMs are reconciled at once; 0 means 4.
	Workers int
	// Log receives what happens; the zero value discards.
	Log logr.Logger
}

// Labels, annotations and the finalizer simvirt writes, as KubeVirt names
// them, and simvirt's own.
const (
	// CreatedByLabel on a launcher pod holds the UID of its VMI.
	CreatedByLabel = "kubevirt.io/created-by"
	// MigrationJobUIDLabel on a migration target pod holds the UID of its
	// VirtualMachineInstanceMigration.
	MigrationJobUIDLabel = "kubevirt.io/migrationJobUID"
	// MigrationJobNameAnnotation on a migration target pod names its
	// VirtualMachineInstanceMigration.
	MigrationJobNameAnnotation = "kubevirt.io/migrationJobName"
	// VMIFinalizer keeps a VMI until its launcher pods are gone.
	VMIFinalizer = "foregroundDeleteVirtualMachine"
	// FailureReasonAnnotation says why a VMI or migration failed (or, on a
	// Pending VMI, why its launcher pod cannot be created); simvirt's own.
	FailureReasonAnnotation = "simvirt.kvnet.io/failure-reason"
	// ComputeContainer is the launcher pod's container.
	ComputeContainer = "compute"
	// LauncherImage is the compute container's image (nothing pulls it).
	LauncherImage = "quay.io/kubevirt/virt-launcher:simvirt"
	// InfoSource is the infoSource of a VMI interface with addresses.
	InfoSource = "domain, guest-agent"
)

// VMI phases.
const (
	PhasePending    = "Pending"
	PhaseScheduling = "Scheduling"
	PhaseRunning    = "Running"
	PhaseSucceeded  = "Succeeded"
	PhaseFailed     = "Failed"
)

// Migration phases (PhasePending, PhaseScheduling, PhaseSucceeded and
// PhaseFailed too).
const (
	PhaseTargetReady = "TargetReady"
)

// Run strategies.
const (
	RunStrategyAlways         = "Always"
	RunStrategyRerunOnFailure = "RerunOnFailure"
	RunStrategyOnce           = "Once"
	RunStrategyHalted         = "Halted"
	RunStrategyManual         = "Manual"
)

// Retry bounds of a failed reconcile.
const (
	retryBase = 500 * time.Millisecond
	retryMax  = 30 * time.Second
)

func (cfg *Config) check() error {
	if cfg.RESTConfig == nil {
		return errors.New("simvirt: Config lacks RESTConfig")
	}
	if len(cfg.Nodes) == 0 {
		return errors.New("simvirt: Config lacks Nodes")
	}
	seen := map[string]bool{}
	for _, n := range cfg.Nodes {
		if n == "" || seen[n] {
			return fmt.Errorf("simvirt: Config.Nodes %q: empty or duplicate node name", cfg.Nodes)
		}
		seen[n] = true
	}
	return nil
}

// NewScheme returns a scheme with the types simvirt reads and writes.
func NewScheme() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		return nil, err
	}
	if err := kubevirtv1.AddToScheme(s); err != nil {
		return nil, err
	}
	if err := nadv1.AddToScheme(s); err != nil { // the migration network
		return nil, err
	}
	return s, nil
}

// Run runs the stand-in virt-controller until ctx is done; it then returns
// nil. It returns an error when it cannot start (the KubeVirt CRDs must be
// installed).
func Run(ctx context.Context, cfg Config) error {
	if err := cfg.check(); err != nil {
		return err
	}
	log := cfg.Log
	if log.GetSink() == nil {
		log = logr.Discard()
	}
	scheme, err := NewScheme()
	if err != nil {
		return err
	}
	rc := rest.CopyConfig(cfg.RESTConfig)
	rc.UserAgent = "kvnet-simvirt"
	rc.WarningHandler, rc.WarningHandlerWithContext = nil, warnings{log: log}
	if rc.QPS == 0 {
		rc.QPS, rc.Burst = 100, 200
	}
	skip := true
	mgr, err := ctrl.NewManager(rc, ctrl.Options{
		Scheme:                 scheme,
		Logger:                 log,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Controller:             config.Controller{SkipNameValidation: &skip},
		Cache: cache.Options{ByObject: map[client.Object]cache.ByObject{
			// Only launcher pods: they trigger reconciles and tell node load.
			&corev1.Pod{}: {Label: labels.SelectorFromSet(labels.Set{kubevirtv1.AppLabel: kubevirtv1.VirtLauncherValue})},
		}},
	})
	if err != nil {
		return fmt.Errorf("simvirt: create manager: %w", err)
	}
	if err := setup(mgr, cfg.Nodes, cfg.GuestAgent, cmp.Or(cfg.Workers, 4)); err != nil {
		return fmt.Errorf("simvirt: %w", err)
	}
	if err := setupHandlers(mgr, cfg.Nodes); err != nil {
		return fmt.Errorf("simvirt: %w", err)
	}
	log.Info("simvirt running", "nodes", cfg.Nodes)
	if err := mgr.Start(ctx); err != nil {
		return fmt.Errorf("simvirt: %w", err)
	}
	return nil
}

// setup registers the controller: one reconcile per VM name, triggered by
// the VM, the VMI, migrations naming the VMI and launcher pods.
func setup(mgr ctrl.Manager, nodes []string, agent GuestAgent, workers int) error {
	r := &reconciler{client: mgr.GetClient(), reader: mgr.GetAPIReader(), nodes: append([]string(nil), nodes...), agent: agent}
	byName := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
		return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: o.GetName()}}}
	})
	byVMIName := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
		m, ok := o.(*kubevirtv1.VirtualMachineInstanceMigration)
		if !ok || m.Spec.VMIName == "" {
			return nil
		}
		return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: m.Namespace, Name: m.Spec.VMIName}}}
	})
	byDomain := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
		name := o.GetAnnotations()[kubevirtv1.DomainAnnotation]
		if name == "" {
			return nil
		}
		return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: name}}}
	})
	skip := true
	return ctrl.NewControllerManagedBy(mgr).
		Named("simvirt").
		Watches(&kubevirtv1.VirtualMachine{}, byName).
		Watches(&kubevirtv1.VirtualMachineInstance{}, byName).
		Watches(&kubevirtv1.VirtualMachineInstanceMigration{}, byVMIName).
		Watches(&corev1.Pod{}, byDomain).
		WithOptions(controller.Options{
			MaxConcurrentReconciles: workers,
			SkipNameValidation:      &skip,
			RateLimiter:             workqueue.NewTypedItemExponentialFailureRateLimiter[reconcile.Request](retryBase, retryMax),
		}).
		Complete(r)
}

// warnings logs the API server's warnings, except the one every VMI
// creation earns: KubeVirt's finalizer name is not domain-qualified, and
// simvirt keeps KubeVirt's name.
type warnings struct{ log logr.Logger }

func (w warnings) HandleWarningHeaderWithContext(_ context.Context, code int, _ string, text string) {
	if code != 299 || text == "" || strings.Contains(text, VMIFinalizer) {
		return
	}
	w.log.Info("API server warning", "warning", text)
}
