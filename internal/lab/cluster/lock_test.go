package cluster

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

func TestLockMachine(t *testing.T) {
	path := filepath.Join(t.TempDir(), "lock")
	first, err := lockMachine(path, false)
	if err != nil {
		t.Fatal(err)
	}
	_, err = lockMachine(path, false)
	if !errors.Is(err, ErrClusterRunning) {
		t.Fatalf("second lock: got %v, want ErrClusterRunning", err)
	}
	if !strings.Contains(err.Error(), "pid "+strconv.Itoa(os.Getpid())) {
		t.Errorf("error %q does not name the holder's pid %d", err, os.Getpid())
	}
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	again, err := lockMachine(path, false)
	if err != nil {
		t.Fatalf("lock after release: %v", err)
	}
	_ = again.Close()
}

// TestCleanupStoppedLeavesAnotherCluster: with the lock held by another
// cluster, nothing is removed (the bridge and namespaces are its own).
func TestCleanupStoppedLeavesAnotherCluster(t *testing.T) {
	path := filepath.Join(t.TempDir(), "lock")
	other, err := lockMachine(path, false)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, EnvFile), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := cleanupStopped(path, dir); !errors.Is(err, ErrClusterRunning) {
		t.Errorf("got %v, want ErrClusterRunning", err)
	}
	if _, err := os.Stat(filepath.Join(dir, EnvFile)); err != nil {
		t.Errorf("the directory was cleaned up: %v", err)
	}
}
