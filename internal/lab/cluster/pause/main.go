// Command pause is the real-cluster lab's pod sandbox image: PID 1 of every
// pod, holding its namespaces. It waits for SIGTERM or SIGINT and reaps
// any child reparented to it meanwhile (processes of a pod sharing its PID
// namespace). Static, no libc: see internal/lab/cluster.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for s := range sigs {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		reap()
	}
}

// reap collects every exited child without blocking.
func reap() {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
	}
}
