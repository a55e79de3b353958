package controlplane

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// Process is a process found using a directory.
type Process struct {
	PID  int
	Name string // its command (comm)
	Why  string // how it uses the directory: an argument, an open file, its cwd
}

func (p Process) String() string { return fmt.Sprintf("pid %d (%s, %s)", p.PID, p.Name, p.Why) }

// UsageOptions says what counts as using a directory.
type UsageOptions struct {
	// Cwd counts a working directory inside it.
	Cwd bool
	// IgnoreFile skips open files it returns true for (e.g. logs someone
	// reads).
	IgnoreFile func(path string) bool
}

// ProcessesUsing returns the processes, other than this one and its
// ancestors, whose command line names dir (or a path under it) or which
// hold a file under it open: what a run killed before it could stop its
// children leaves behind (an etcd holding its data directory's lock,
// a kube-apiserver, QEMU). Processes it cannot read are skipped.
func ProcessesUsing(dir string, opts UsageOptions) ([]Process, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	if r, err := filepath.EvalSymlinks(abs); err == nil {
		abs = r
	}
	under := func(p string) bool { return p == abs || strings.HasPrefix(p, abs+"/") }
	mentions := func(arg string) bool {
		for i := strings.Index(arg, abs); i >= 0; {
			end := i + len(abs)
			if end == len(arg) || arg[end] == '/' {
				return true
			}
			j := strings.Index(arg[end:], abs)
			if j < 0 {
				break
			}
			i = end + j
		}
		return false
	}
	skip := ancestors()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var out []Process
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || slices.Contains(skip, pid) {
			continue
		}
		proc := filepath.Join("/proc", e.Name())
		comm, err := os.ReadFile(filepath.Join(proc, "comm"))
		if err != nil {
			continue
		}
		p := Process{PID: pid, Name: strings.TrimSpace(string(comm))}
		if b, err := os.ReadFile(filepath.Join(proc, "cmdline")); err == nil {
			for _, a := range strings.Split(string(b), "\x00") {
				if mentions(a) {
					p.Why = "argument " + a
					break
				}
			}
		}
		if p.Why == "" && opts.Cwd {
			if cwd, err := os.Readlink(filepath.Join(proc, "cwd")); err == nil && under(cwd) {
				p.Why = "working directory " + cwd
			}
		}
		if p.Why == "" {
			fds, _ := os.ReadDir(filepath.Join(proc, "fd"))
			for _, fd := range fds {
				target, err := os.Readlink(filepath.Join(proc, "fd", fd.Name()))
				if err != nil || !under(target) || (opts.IgnoreFile != nil && opts.IgnoreFile(target)) {
					continue
				}
				p.Why = "open file " + target
				break
			}
		}
		if p.Why != "" {
			out = append(out, p)
		}
	}
	return out, nil
}

// ancestors returns this process's PID and its ancestors'.
func ancestors() []int {
	var out []int
	for pid := os.Getpid(); pid > 1 && !slices.Contains(out, pid); {
		out = append(out, pid)
		b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
		if err != nil {
			break
		}
		// pid (comm) state ppid ...: comm may hold spaces and parentheses.
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(f) < 2 {
			break
		}
		if pid, err = strconv.Atoi(f[1]); err != nil {
			break
		}
	}
	return out
}

// checkStaleEtcd fails, naming them, when processes still use the etcd
// data directory dir: etcd would wait for its lock until envtest gives up
// with "timeout waiting for process etcd to start".
func checkStaleEtcd(dir string) error {
	procs, err := ProcessesUsing(dir, UsageOptions{Cwd: true})
	if err != nil || len(procs) == 0 {
		return nil //nolint:nilerr // no /proc: nothing to tell
	}
	return StaleError("etcd data directory", dir, procs)
}

// StaleError is the error for processes left using dir (what names it).
func StaleError(what, dir string, procs []Process) error {
	s := make([]string, len(procs))
	pids := make([]string, len(procs))
	for i, p := range procs {
		s[i], pids[i] = p.String(), strconv.Itoa(p.PID)
	}
	return fmt.Errorf("%s %s is still used by %s: left from an earlier run that did not stop; stop it (kill %s) and start again",
		what, dir, strings.Join(s, ", "), strings.Join(pids, " "))
}
