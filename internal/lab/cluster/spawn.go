package cluster

import (
	"runtime"
)

// spawner forks every child of a cluster from one locked OS thread that
// lives until Down: a parent-death signal (Pdeathsig) fires when the
// thread that forked the child ends, not the process, so children forked
// from Go's ordinary threads could die early or late (same idiom as
// package controlplane).
type spawner struct {
	fns  chan func()
	done chan struct{}
}

func newSpawner() *spawner {
	s := &spawner{fns: make(chan func()), done: make(chan struct{})}
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with stop
		defer close(s.done)
		for f := range s.fns {
			f()
		}
	}()
	return s
}

// do runs f on the spawner's thread and returns its error.
func (s *spawner) do(f func() error) error {
	errc := make(chan error, 1)
	s.fns <- func() { errc <- f() }
	return <-errc
}

// stop ends the thread; call it once the children are gone.
func (s *spawner) stop() {
	close(s.fns)
	<-s.done
}
