package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"kvnet.io/kvnet/internal/lab/controlplane"
	"kvnet.io/kvnet/internal/testenv"
)

// labProc is a process seen in /proc: its PID, start time (to tell a
// reused PID apart), name and command line.
type labProc struct {
	pid, ppid int
	start     string
	name      string
	cmdline   string
}

func (p labProc) String() string { return fmt.Sprintf("pid %d (%s: %.120s)", p.pid, p.name, p.cmdline) }

// procs reads every process of /proc.
func procs(t testing.TB) map[int]labProc {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	out := map[int]labProc{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		s := string(stat)
		open, closing := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || closing < open {
			continue
		}
		f := strings.Fields(s[closing+1:]) // state ppid ... starttime is field 22 of stat
		if len(f) < 20 {
			continue
		}
		if f[0] == "Z" {
			continue // a zombie has ended; its parent has not reaped it yet
		}
		ppid, _ := strconv.Atoi(f[1])
		cmd, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		out[pid] = labProc{pid: pid, ppid: ppid, start: f[19], name: s[open+1 : closing],
			cmdline: strings.TrimSpace(strings.ReplaceAll(string(cmd), "\x00", " "))}
	}
	return out
}

// descendants returns the processes whose parent chain leads to root.
func descendants(all map[int]labProc, root int) []labProc {
	var out []labProc
	for _, p := range all {
		for q, seen := p, 0; q.ppid > 1 && seen < 64; seen++ {
			if q.ppid == root {
				out = append(out, p)
				break
			}
			var ok bool
			if q, ok = all[q.ppid]; !ok {
				break
			}
		}
	}
	return out
}

// TestLabSIGKILLLeavesNoProcess kills a running lab (with a VM running)
// with SIGKILL, as the OOM killer or `kill -9` does: every process the lab
// started (etcd, kube-apiserver, kube-controller-manager, kvnet-node,
// QEMU) must end with it. Then "up" names a process still holding the lab
// directory instead of timing out, and "down --purge" leaves a clean
// slate.
func TestLabSIGKILLLeavesNoProcess(t *testing.T) {
	testenv.NeedsRoot(t)
	root, binDir, run := buildKvnetIn(t)
	dir := t.TempDir()
	showLabLogOnFailure(t, dir)
	run("up", "--dir", dir, "--nodes", "2")
	labPID := readPID(t, filepath.Join(dir, "lab.pid"))
	prefix := labNetnsPrefix(t, dir)
	c := labClient(t, dir)
	const ns = "e2e-kill"
	primaryUDN(t, c, ns, "10.51.0.0/24")
	if err := c.Create(context.Background(), l2bridgeVM(ns, "vm-1")); err != nil {
		t.Fatal(err)
	}
	waitBoot(t, dir, ns, "vm-1", 1)

	children := descendants(procs(t), labPID)
	var names []string
	for _, p := range children {
		names = append(names, p.name)
	}
	for _, want := range []string{"etcd", "kube-apiserver", "kube-controller", "kvnet-node", "qemu-system-x86"} {
		if !slices.ContainsFunc(names, func(n string) bool { return strings.HasPrefix(n, want) }) {
			t.Fatalf("the lab (pid %d) runs no %s among its processes %v", labPID, want, names)
		}
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		t.Fatal(err)
	}
	// Whatever is left is killed at the end, so that a failure here does
	// not leak a lab into the next test.
	leftovers := func() []labProc {
		var left []labProc
		all := procs(t)
		for _, c := range children {
			if p, ok := all[c.pid]; ok && p.start == c.start {
				left = append(left, p)
			}
		}
		for _, p := range all {
			if p.pid != os.Getpid() && strings.Contains(p.cmdline, abs) && !slices.ContainsFunc(left, func(l labProc) bool { return l.pid == p.pid }) {
				left = append(left, p)
			}
		}
		return left
	}
	t.Cleanup(func() {
		for _, p := range leftovers() {
			_ = syscall.Kill(p.pid, syscall.SIGKILL)
		}
		run("down", "--dir", dir, "--purge")
	})

	if err := syscall.Kill(labPID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "every process of the killed lab ended", func() error {
		if left := leftovers(); len(left) > 0 {
			return fmt.Errorf("left running: %v", left)
		}
		return nil
	})

	// A process left holding the lab's etcd data (as a killed lab's etcd
	// did): "up" names it instead of waiting for etcd's lock.
	held, err := os.Open(filepath.Join(dir, "etcd", "member", "snap", "db"))
	if err != nil {
		t.Fatal(err)
	}
	stale := exec.Command("sleep", "600")
	stale.ExtraFiles = []*os.File{held}
	if err := stale.Start(); err != nil {
		t.Fatal(err)
	}
	held.Close()
	t.Cleanup(func() { _ = stale.Process.Kill(); _ = stale.Wait() })
	up := exec.Command(filepath.Join(binDir, "kvnet-lab"), "up", "--dir", dir, "--nodes", "2")
	up.Dir = root
	up.Env = append(os.Environ(), controlplane.BinDirEnv+"="+filepath.Join(root, ".cache", "bin"))
	out, err := up.CombinedOutput()
	if err == nil {
		t.Fatalf("up with a stale process holding the lab directory succeeded:\n%s", out)
	}
	if want := fmt.Sprintf("pid %d (sleep, open file %s", stale.Process.Pid, filepath.Join(abs, "etcd")); !strings.Contains(string(out), want) {
		t.Errorf("up's error does not name the stale process (%q):\n%s", want, out)
	}
	_ = stale.Process.Kill()
	_ = stale.Wait()

	purge := run("down", "--dir", dir, "--purge")
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		entries, _ := os.ReadDir(dir)
		t.Errorf("down --purge left %s (%v): %v\n%s", dir, err, entries, purge)
	}
	if out, err := exec.Command("ip", "netns", "list").CombinedOutput(); err != nil {
		t.Fatal(err)
	} else if strings.Contains(string(out), prefix) {
		t.Errorf("down --purge left network namespaces %s*:\n%s", prefix, out)
	}
}
