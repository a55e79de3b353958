package cluster

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// LockPath is the machine-wide lock a running cluster holds. Clusters on
// one machine share the bridge, its addresses and the node namespaces'
// names, and Up's removal of an earlier run's leftovers would tear down a
// running cluster: so one runs at a time.
const LockPath = "/run/kvnet-cluster.lock"

// ErrClusterRunning is returned by Up when another cluster holds LockPath.
var ErrClusterRunning = errors.New("cluster: another cluster is running on this machine")

// lockMachine takes the lock at path (LockPath), waiting for it when wait is set. The lock
// lives as long as the returned file is open (and the process).
func lockMachine(path string, wait bool) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("cluster: lock: %w", err)
	}
	how := syscall.LOCK_EX
	if !wait {
		how |= syscall.LOCK_NB
	}
	if err := syscall.Flock(int(f.Fd()), how); err != nil {
		holder, _ := os.ReadFile(path)
		_ = f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w (pid %s holds %s): stop it first (kvnet-lab cluster down --dir <its dir>)",
				ErrClusterRunning, strings.TrimSpace(string(holder)), path)
		}
		return nil, fmt.Errorf("cluster: lock %s: %w", path, err)
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return f, nil
}
