package testenv

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"

	"kvnet.io/kvnet/internal/k8s/manager"
)

// Fixture is what the integration tests of node-side code share: a control
// plane running kvnet-controller, and a temporary directory with the admin
// kubeconfig (for binaries such as kvnet-cni, which read a file) and
// binaries built from this module.
type Fixture struct {
	Env        *Env
	Dir        string // removed by Close
	Kubeconfig string // Dir/kubeconfig
	BinDir     string // Dir/bin: the binaries of FixtureOptions.Build
	APIAddr    string // host:port of the API server (for simnet.Forward)

	stopController func()
}

// FixtureOptions configures NewFixture.
type FixtureOptions struct {
	// Webhooks runs kvnet-controller with its webhooks (launcher pods, VM
	// MACs), as a cluster does.
	Webhooks bool
	// Build maps binary names to Go packages built into BinDir.
	Build map[string]string
}

// NewFixture starts the control plane and kvnet-controller and builds the
// binaries. Call Close when the tests are done.
func NewFixture(o FixtureOptions) (_ *Fixture, err error) {
	env, err := Start(Options{NoControllerManager: true})
	if err != nil {
		return nil, fmt.Errorf("start control plane: %w", err)
	}
	f := &Fixture{Env: env}
	defer func() {
		if err != nil {
			f.Close()
		}
	}()
	var opts manager.Options
	if o.Webhooks {
		if opts, err = env.WebhookOptions(context.Background()); err != nil {
			return nil, err
		}
	}
	if f.stopController, err = env.RunController(opts); err != nil {
		return nil, err
	}
	if f.Dir, err = os.MkdirTemp("", "kvnet-test-"); err != nil {
		return nil, err
	}
	f.Kubeconfig = filepath.Join(f.Dir, "kubeconfig")
	if err := os.WriteFile(f.Kubeconfig, env.CP.Kubeconfig, 0o600); err != nil {
		return nil, err
	}
	u, err := url.Parse(env.Config.Host)
	if err != nil {
		return nil, err
	}
	f.APIAddr = u.Host
	f.BinDir = filepath.Join(f.Dir, "bin")
	for name, pkg := range o.Build {
		cmd := GoBuild(env.Root, "-o", filepath.Join(f.BinDir, name), pkg)
		if out, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("build %s: %v\n%s", pkg, err, out)
		}
	}
	return f, nil
}

// Bin returns the path of a binary of FixtureOptions.Build.
func (f *Fixture) Bin(name string) string { return filepath.Join(f.BinDir, name) }

// Close stops kvnet-controller and the control plane and removes Dir.
func (f *Fixture) Close() {
	if f.stopController != nil {
		f.stopController()
	}
	if f.Dir != "" {
		_ = os.RemoveAll(f.Dir)
	}
	if err := f.Env.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "testenv: stop control plane:", err)
	}
}

// WithFixture is the TestMain body of a node-side test package: it builds a
// Fixture, hands it to run (which stores what the tests need and runs them,
// returning m.Run's code), closes it and returns the exit code; a fixture
// that cannot be built is reported and exit code 1.
func WithFixture(o FixtureOptions, run func(*Fixture) int) int {
	fx, err := NewFixture(o)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer fx.Close()
	return run(fx)
}
