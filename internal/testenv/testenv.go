// Package testenv gives tests a real control plane (etcd, kube-apiserver,
// kube-controller-manager) with kvnet's CRDs and policies installed, a
// client, and a way to run kvnet-controller against it.
//
// Tests that use it need the binaries from hack/build-tools.sh (make tools);
// without them Start fails with controlplane.ErrBinariesMissing rather than
// skipping, so a missing toolchain can never pass as green.
package testenv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"kvnet.io/kvnet/internal/k8s/manager"
	"kvnet.io/kvnet/internal/lab/controlplane"
	"kvnet.io/kvnet/internal/repo"
)

// Env is a running control plane for tests.
type Env struct {
	CP     *controlplane.ControlPlane
	Config *rest.Config
	Client client.Client
	Root   string // repository root
}

// Options configures Start.
type Options struct {
	// NoControllerManager skips kube-controller-manager (API-only tests).
	NoControllerManager bool
	// NoKubeVirtCRDs leaves KubeVirt's CRDs (kubevirt.io) out, as on a
	// cluster without KubeVirt.
	NoKubeVirtCRDs bool
}

// Start starts a control plane with kvnet's CRDs and config/policy applied.
func Start(opts Options) (*Env, error) {
	root, err := repo.Root()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cfg, err := controlplane.KvnetConfig()
	if err != nil {
		return nil, err
	}
	cfg.NoControllerManager = opts.NoControllerManager
	if opts.NoKubeVirtCRDs {
		cfg.CRDs = slices.DeleteFunc(slices.Clone(cfg.CRDs), func(crd *apiextensionsv1.CustomResourceDefinition) bool {
			return crd.Spec.Group == "kubevirt.io"
		})
	}
	cp, err := controlplane.Start(ctx, cfg)
	if err != nil {
		return nil, err
	}
	scheme, err := manager.NewScheme()
	if err != nil {
		_ = cp.Stop()
		return nil, err
	}
	c, err := client.New(cp.Config, client.Options{Scheme: scheme})
	if err != nil {
		_ = cp.Stop()
		return nil, err
	}
	return &Env{CP: cp, Config: cp.Config, Client: c, Root: root}, nil
}

// Stop stops the control plane.
func (e *Env) Stop() error { return e.CP.Stop() }

// RunController runs kvnet-controller against the control plane until the
// returned stop function is called; stop waits for it to exit. It returns
// once the controller is Ready.
func (e *Env) RunController(opts manager.Options) (stop func(), err error) {
	return e.runController(opts, true)
}

// RunStandby is RunController for a replica that is not expected to become
// Ready (leader election on, another replica leading): it returns once the
// replica's webhook server (if any) serves. Its readiness URL is
// http://opts.ProbeAddr/readyz (set ProbeAddr to watch it).
func (e *Env) RunStandby(opts manager.Options) (stop func(), err error) {
	return e.runController(opts, false)
}

func (e *Env) runController(opts manager.Options, waitReady bool) (stop func(), err error) {
	ctrl.SetLogger(zap.New(zap.UseDevMode(true), zap.Level(zapLevel())))
	opts.SkipNameValidation = true
	if opts.ProbeAddr == "" {
		// Serve /readyz, so that a (re)started controller is only handed
		// to the test once it has rebuilt its allocators and MAC pool.
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		opts.ProbeAddr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	}
	mgr, err := manager.New(rest.CopyConfig(e.Config), opts)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	stop = func() {
		cancel()
		if err := <-done; err != nil {
			fmt.Fprintln(os.Stderr, "testenv: controller:", err)
		}
	}
	// Wait until the controller is ready (and its webhook server answers
	// TLS), so tests never race a starting (or failed) controller; a failed
	// start is an error here rather than 30 s of denied requests.
	ready := func() bool {
		if opts.Webhook != nil && mgr.GetWebhookServer().StartedChecker()(nil) != nil {
			return false
		}
		if opts.ProbeAddr == "0" || !waitReady {
			return true
		}
		resp, err := http.Get("http://" + opts.ProbeAddr + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}
	deadline := time.Now().Add(time.Minute)
	for !ready() {
		select {
		case err := <-done:
			cancel()
			return nil, fmt.Errorf("kvnet-controller exited while starting: %w", err)
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			stop()
			return nil, errors.New("kvnet-controller not ready after 1m")
		}
	}
	return stop, nil
}

// WebhookOptions returns controller options serving kvnet's webhooks on
// 127.0.0.1 at a free port, after installing the webhook configuration
// (pointing there) and the kvnet-system namespace. Pass the result to
// RunController.
func (e *Env) WebhookOptions(ctx context.Context) (manager.Options, error) {
	port, err := freePort()
	if err != nil {
		return manager.Options{}, err
	}
	if err := controlplane.InstallWebhooks(ctx, e.Client, "kvnet-system", port, false); err != nil {
		return manager.Options{}, err
	}
	w := controlplane.WebhookOptions(port, false)
	w.MACPendingTimeout = 2 * time.Second
	return manager.Options{Webhook: w}, nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
