package cluster

// CleanupStopped is Cleanup for a cluster whose process has ended
// (kvnet-lab cluster down), run under LockPath. The moment that process
// ends its lock is free, and a cluster waiting for it starts at once:
// then the bridge, the node namespaces and the cgroups Cleanup removes
// by name are that cluster's (its Up removed what was left first), so
// CleanupStopped returns ErrClusterRunning and removes nothing.
func CleanupStopped(dir string) error { return cleanupStopped(LockPath, dir) }

func cleanupStopped(lockPath, dir string) error {
	lock, err := lockMachine(lockPath, false)
	if err != nil {
		return err
	}
	defer lock.Close()
	return Cleanup(dir)
}
