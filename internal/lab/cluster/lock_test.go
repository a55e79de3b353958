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
