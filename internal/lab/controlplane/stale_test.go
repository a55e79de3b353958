package controlplane

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// ProcessesUsing finds a process holding a file of the directory open and
// one naming it in its arguments, not one naming a sibling whose name
// only starts with the directory's, and not this process.
func TestProcessesUsing(t *testing.T) {
	dir := t.TempDir()
	lab := filepath.Join(dir, "lab")
	if err := os.MkdirAll(filepath.Join(lab, "etcd"), 0o755); err != nil {
		t.Fatal(err)
	}
	held, err := os.Create(filepath.Join(lab, "etcd", "db"))
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	start := func(cmd *exec.Cmd) int {
		t.Helper()
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		return cmd.Process.Pid
	}
	opener := exec.Command("sleep", "60")
	opener.ExtraFiles = []*os.File{held}
	openerPID := start(opener)
	// sh -c with the path as $0: an argument naming the directory.
	namerPID := start(exec.Command("sh", "-c", "sleep 60; :", filepath.Join(lab, "etcd")))
	siblingPID := start(exec.Command("sh", "-c", "sleep 60; :", lab+"2"))
	held.Close() // only the child holds it now

	procs, err := ProcessesUsing(lab, UsageOptions{})
	if err != nil {
		t.Fatal(err)
	}
	byPID := map[int]Process{}
	for _, p := range procs {
		byPID[p.PID] = p
	}
	if p, ok := byPID[openerPID]; !ok || !strings.HasPrefix(p.Why, "open file "+filepath.Join(lab, "etcd", "db")) {
		t.Errorf("the process holding etcd/db open: %+v (found %v)", p, procs)
	}
	if p, ok := byPID[namerPID]; !ok || !strings.HasPrefix(p.Why, "argument ") {
		t.Errorf("the process naming the directory: %+v (found %v)", p, procs)
	}
	if _, ok := byPID[siblingPID]; ok {
		t.Errorf("a process naming %s2 counted as using %s: %v", lab, lab, procs)
	}
	if slices.ContainsFunc(procs, func(p Process) bool { return p.PID == os.Getpid() }) {
		t.Errorf("this process counted: %v", procs)
	}
	err = StaleError("lab directory", lab, []Process{byPID[openerPID]})
	if err == nil || !strings.Contains(err.Error(), "kill ") || !strings.Contains(err.Error(), lab) {
		t.Errorf("StaleError: %v", err)
	}
}
