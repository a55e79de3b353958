package controlplane

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
)

// Every process of a control plane dies with the process that started it,
// even one killed with SIGKILL (a lab, a test binary): each is started with
// a parent-death signal (Pdeathsig, SIGKILL). The kernel sends it when the
// thread that forked the child ends, not the process, so the children are
// forked from one locked OS thread (Spawner) that lives until Stop.
//
// envtest starts etcd and kube-apiserver itself, with no way to set
// Pdeathsig: they are started through a wrapper script each that execs the
// real binary under util-linux's setpriv --pdeathsig KILL, which keeps the
// process (its PID, its parent) and sets the signal before exec.

// Spawner runs functions that start child processes on one OS thread, so
// that their Pdeathsig fires when the Spawner stops, not when some Go
// thread ends. The lab's real cluster forks its nodes' processes with one
// too.
type Spawner struct {
	fns  chan func()
	done chan struct{}
}

// NewSpawner starts a Spawner's thread.
func NewSpawner() *Spawner {
	s := &Spawner{fns: make(chan func()), done: make(chan struct{})}
	go func() {
		// Never unlocked: the thread ends with the goroutine, after stop,
		// when every child has been stopped.
		runtime.LockOSThread()
		defer close(s.done)
		for f := range s.fns {
			f()
		}
	}()
	return s
}

// Do runs f on the Spawner's thread and returns its error.
func (s *Spawner) Do(f func() error) error {
	errc := make(chan error, 1)
	s.fns <- func() { errc <- f() }
	return <-errc
}

// Stop ends the Spawner's thread; call it once the children are stopped.
func (s *Spawner) Stop() {
	close(s.fns)
	<-s.done
}

// setprivBinary is util-linux's setpriv, which the wrappers exec through.
func setprivBinary() (string, error) {
	p, err := exec.LookPath("setpriv")
	if err != nil {
		return "", errors.New("setpriv not found: install util-linux (hack/install-deps.sh does); the control plane starts etcd and kube-apiserver with it so that they die with their parent")
	}
	return p, nil
}

// writeDeathWrapper writes dir/name, a script that execs bin with its
// arguments under a parent-death signal, and returns its path.
func writeDeathWrapper(dir, name, setpriv, bin string) (string, error) {
	p := filepath.Join(dir, name)
	script := fmt.Sprintf("#!/bin/sh\n# %s, killed when its parent (thread) dies.\nexec %q --pdeathsig KILL -- %q \"$@\"\n", name, setpriv, bin)
	if err := os.WriteFile(p, []byte(script), 0o755); err != nil { //nolint:gosec // an executable script
		return "", fmt.Errorf("write %s wrapper: %w", name, err)
	}
	return p, nil
}
