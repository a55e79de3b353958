package testenv

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"kvnet.io/kvnet/internal/k8s/manager"
	"kvnet.io/kvnet/internal/repo"
)

// Eventually calls f until it returns nil, failing the test with f's last
// error after timeout. It waits for the system to converge; it does not
// measure speed.
func Eventually(t testing.TB, timeout time.Duration, what string, f func() error) {
	t.Helper()
	if err := until(timeout, f); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// EventuallyOrError is Eventually that fails the test without stopping
// it (so that the checks after it run too) and reports whether f came
// right.
func EventuallyOrError(t testing.TB, timeout time.Duration, what string, f func() error) bool {
	t.Helper()
	if err := until(timeout, f); err != nil {
		t.Errorf("%s: %v", what, err)
		return false
	}
	return true
}

// until calls f every 50 ms until it returns nil, or returns its last
// error after timeout.
func until(timeout time.Duration, f func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Create creates o or fails the test.
func Create(t testing.TB, c client.Client, o client.Object) {
	t.Helper()
	if err := c.Create(context.Background(), o); err != nil {
		t.Fatalf("create %T %s: %v", o, o.GetName(), err)
	}
}

// FinalizeNamespace ends the deletion of namespace name (already deleted,
// so terminating) by hand, as kube-controller-manager would but without
// deleting what is in it, and waits until it is gone: what it held stays
// stored, orphaned, as after an upstream race.
func FinalizeNamespace(t testing.TB, c client.Client, name string) {
	t.Helper()
	ctx := context.Background()
	ns := &corev1.Namespace{}
	if err := c.Get(ctx, client.ObjectKey{Name: name}, ns); err != nil {
		t.Fatal(err)
	}
	ns.Spec.Finalizers = nil
	if err := c.SubResource("finalize").Update(ctx, ns); err != nil {
		t.Fatalf("finalize namespace %s: %v", name, err)
	}
	Eventually(t, 30*time.Second, "namespace "+name+" gone", func() error {
		if err := c.Get(ctx, client.ObjectKey{Name: name}, &corev1.Namespace{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("namespace: %v", err)
		}
		return nil
	})
}

// Controller is a kvnet-controller running against an Env in tests.
type Controller struct {
	env  *Env
	opts manager.Options
	stop func()
}

// Options returns the options the controller runs with.
func (c *Controller) Options() manager.Options { return c.opts }

// Stop stops the controller; it is safe to call twice.
func (c *Controller) Stop() {
	if c.stop != nil {
		c.stop()
		c.stop = nil
	}
}

// Start starts a stopped controller: a fresh one, which must rebuild its
// state from the API.
func (c *Controller) Start(t testing.TB) {
	t.Helper()
	if c.stop != nil {
		return
	}
	stop, err := c.env.RunController(c.opts)
	if err != nil {
		t.Fatal(err)
	}
	c.stop = stop
}

// Restart stops the controller and starts a fresh one.
func (c *Controller) Restart(t testing.TB) {
	t.Helper()
	c.Stop()
	c.Start(t)
}

// Fuzzing reports whether the test binary runs under "go test -fuzz" (as
// the coordinator or as a fuzz worker). A TestMain that builds a fixture
// (control plane, binaries) should skip it then: fuzz targets test pure
// code, and every worker process would otherwise build its own. It parses
// the command line, so call it from TestMain only.
func Fuzzing() bool {
	flag.Parse()
	for _, name := range []string{"test.fuzz", "test.fuzzworker"} {
		if f := flag.Lookup(name); f != nil && f.Value.String() != "" && f.Value.String() != "false" {
			return true
		}
	}
	return false
}

// MainAPI is the TestMain body of a package that needs only the API
// server: it starts a control plane, calls setup (which may be nil) with it,
// runs the tests and tears down. It returns the exit code.
func MainAPI(m *testing.M, opts Options, setup func(*Env) error) int {
	return run(m, opts, func(e *Env) (func(), error) {
		if setup == nil {
			return func() {}, nil
		}
		return func() {}, setup(e)
	})
}

// Main is a test package's TestMain body: it starts a control plane and
// kvnet-controller (with the options setup returns; nil setup means
// defaults), stores them in env and ctl, runs the tests and tears down.
// It returns the exit code.
func Main(m *testing.M, opts Options, setup func(*Env) (manager.Options, error), env **Env, ctl **Controller) int {
	return run(m, opts, func(e *Env) (func(), error) {
		var mo manager.Options
		if setup != nil {
			var err error
			if mo, err = setup(e); err != nil {
				return nil, fmt.Errorf("set up controller: %w", err)
			}
		}
		stop, err := e.RunController(mo)
		if err != nil {
			return nil, fmt.Errorf("start controller: %w", err)
		}
		c := &Controller{env: e, opts: mo, stop: stop}
		*env = e
		if ctl != nil {
			*ctl = c
		}
		return c.Stop, nil
	})
}

// run starts a control plane, calls setup, runs the tests, then the
// cleanup setup returned, and stops the control plane.
//
// Under "go test -fuzz" it starts nothing: fuzz targets test pure code, and
// every fuzz worker process would otherwise start its own control plane.
func run(m *testing.M, opts Options, setup func(*Env) (cleanup func(), err error)) int {
	if Fuzzing() {
		return m.Run()
	}
	e, err := Start(opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, "start control plane:", err)
		return 1
	}
	defer func() {
		if err := e.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "stop control plane:", err)
		}
	}()
	cleanup, err := setup(e)
	if err != nil {
		fmt.Fprintln(os.Stderr, "set up test environment:", err)
		return 1
	}
	defer cleanup()
	return m.Run()
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort(tb testing.TB) int {
	tb.Helper()
	port, err := freePort()
	if err != nil {
		tb.Fatal(err)
	}
	return port
}

// GoBuild returns the command that builds kvnet binaries for a test in
// the repository at root: repo.GoBuild's settings, those of the images, so
// that the real-cluster test's image build reuses the tests' compile.
func GoBuild(root string, args ...string) *exec.Cmd {
	return repo.GoBuild(context.Background(), "go", root, args...)
}
