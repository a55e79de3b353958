package cluster

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"kvnet.io/kvnet/internal/lab/controlplane"
)

const cgroupFS = "/sys/fs/cgroup"

// Preflight checks what a cluster needs of the host, and fails at the first
// thing missing, naming it (and its Debian package).
func Preflight(binDir string) error {
	if os.Geteuid() != 0 {
		return errors.New("cluster: needs root (network, mount and PID namespaces, cgroups)")
	}
	tools := []struct{ cmd, pkg string }{
		{"ip", "iproute2"},
		{"nsenter", "util-linux"},
		{"unshare", "util-linux"},
		{"setpriv", "util-linux"},
		{"mount", "mount"},
		{"sysctl", "procps"},
		{"containerd", "containerd"},
		{"containerd-shim-runc-v2", "containerd"},
		{"runc", "runc"},
		{"nft", "nftables"}, // kube-proxy's nftables mode
		{"ldd", "libc-bin"}, // the Flannel image's iptables
		{iptablesBinary, "iptables"},
		{"apt-get", "apt"},
	}
	for _, t := range tools {
		if _, err := exec.LookPath(t.cmd); err != nil {
			return fmt.Errorf("cluster: %s not found: install Debian package %s (hack/install-deps.sh --cluster does)", t.cmd, t.pkg)
		}
	}
	if binDir == "" {
		return errors.New("cluster: no bin dir: pass the directory hack/build-cluster-tools.sh prints")
	}
	for _, b := range []string{"kubelet", "kube-scheduler", "kube-proxy", "registry", "busybox", "coredns", "flanneld", "flannel", "portmap", "bridge", "host-local", "loopback", "macvlan", "ptp", "multus-daemon", "multus-shim", "multus", "install_multus", "passthru", "thin_entrypoint"} {
		if _, err := os.Stat(filepath.Join(binDir, b)); err != nil {
			return fmt.Errorf("cluster: %s not in %s: run hack/build-cluster-tools.sh", b, binDir)
		}
	}
	fss, err := os.ReadFile("/proc/filesystems")
	if err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	if !strings.Contains(string(fss), "\toverlay\n") {
		// Loadable: try, then look again.
		_ = exec.Command("modprobe", "overlay").Run()
		fss, _ = os.ReadFile("/proc/filesystems")
		if !strings.Contains(string(fss), "\toverlay\n") {
			return errors.New("cluster: kernel feature overlay (overlayfs) missing: containerd's snapshotter needs it")
		}
	}
	for _, h := range []string{"cpu", "cpuacct", "cpuset", "memory", "pids"} {
		if _, err := os.Stat(filepath.Join(cgroupFS, h, "cgroup.procs")); err != nil {
			if _, err2 := os.Stat(filepath.Join(cgroupFS, "cgroup.controllers")); err2 == nil {
				break // cgroup v2: one hierarchy
			}
			return fmt.Errorf("cluster: kernel feature cgroup %s hierarchy missing at %s", h, filepath.Join(cgroupFS, h))
		}
	}
	if _, err := os.Stat("/proc/sys/net/ipv4/ip_forward"); err != nil {
		return errors.New("cluster: kernel feature IPv4 networking missing")
	}
	// Tried in a network namespace of their own, which goes with the
	// command: Flannel's VXLAN device and kube-proxy's nf_tables.
	probes := []struct{ feature, script string }{
		{"vxlan (Flannel's VXLAN backend)", "ip link add kvc-probe type vxlan id 1 dstport 8472"},
		{"nf_tables (kube-proxy's nftables mode)", "nft add table ip kvc-probe"},
	}
	for _, p := range probes {
		if out, err := exec.Command("unshare", "--net", "sh", "-c", p.script).CombinedOutput(); err != nil {
			return fmt.Errorf("cluster: kernel feature %s missing: %s: %v: %s", p.feature, p.script, err, strings.TrimSpace(string(out)))
		}
	}
	return nil
}

// makeMountPoints creates the host directories the nodes bind-mount over
// and returns the ones it created (Down removes them when empty).
func makeMountPoints() ([]string, error) {
	var created []string
	for _, d := range nodeDirs {
		// Create from the top, remembering each directory that was new.
		parts := strings.Split(strings.TrimPrefix(d, "/"), "/")
		p := ""
		for _, part := range parts {
			p += "/" + part
			if _, err := os.Stat(p); err == nil {
				continue
			}
			if err := os.Mkdir(p, 0o755); err != nil {
				return created, err
			}
			created = append(created, p)
		}
	}
	return created, nil
}

// hierarchies are the cgroup mounts: every v1 hierarchy (named ones too)
// and the v2 one.
func hierarchies() []string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		pre, post, ok := strings.Cut(line, " - ")
		if !ok {
			continue
		}
		f, g := strings.Fields(pre), strings.Fields(post)
		if len(f) < 5 || len(g) < 1 || (g[0] != "cgroup" && g[0] != "cgroup2") {
			continue
		}
		if strings.HasPrefix(f[4], cgroupFS) && !slices.Contains(out, f[4]) {
			out = append(out, f[4])
		}
	}
	return out
}

// makeCgroupRoot creates a node's cgroup root in every hierarchy (the
// kubelet refuses a --cgroup-root that does not exist), with cpuset's
// CPUs and memory nodes copied from the parent so that children can use
// it.
func makeCgroupRoot(root string) error {
	for _, h := range hierarchies() {
		p := filepath.Join(h, root)
		if err := os.MkdirAll(p, 0o755); err != nil {
			return fmt.Errorf("cgroup %s: %w", p, err)
		}
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			if b, err := os.ReadFile(filepath.Join(h, f)); err == nil {
				if err := os.WriteFile(filepath.Join(p, f), b, 0o644); err != nil { //nolint:gosec // cgroupfs
					return fmt.Errorf("cgroup %s: %w", filepath.Join(p, f), err)
				}
			}
		}
	}
	return nil
}

// removeCgroups removes every node's cgroup tree, deepest first; a cgroup
// whose last process is still exiting is retried for a while.
func removeCgroups() error {
	var left []string
	for _, h := range hierarchies() {
		entries, _ := os.ReadDir(h)
		for _, e := range entries {
			if !e.IsDir() || !strings.HasPrefix(e.Name(), cgroupPrefix+"node-") {
				continue
			}
			var dirs []string
			_ = filepath.WalkDir(filepath.Join(h, e.Name()), func(p string, d fs.DirEntry, err error) error {
				if err == nil && d.IsDir() {
					dirs = append(dirs, p)
				}
				return nil
			})
			slices.Reverse(dirs)
			for _, d := range dirs {
				var err error
				for range 100 {
					if err = syscall.Rmdir(d); err == nil || errors.Is(err, syscall.ENOENT) {
						err = nil
						break
					}
					time.Sleep(50 * time.Millisecond)
				}
				if err != nil {
					left = append(left, fmt.Sprintf("%s (%v)", d, err))
				}
			}
		}
	}
	if len(left) > 0 {
		return fmt.Errorf("cgroups left: %s", strings.Join(left, ", "))
	}
	return nil
}

// KeepFiles are the names of the files in a cluster's directory that
// Cleanup leaves: those of the command running the cluster (its log and
// PID), which may start the cluster in the same directory.
var KeepFiles = []string{"cluster.log", "cluster.pid"}

// Cleanup removes what a cluster with state directory dir left behind,
// whether or not it is running: it kills the processes using dir (a
// node's init kills its whole PID namespace), deletes the network
// namespaces and the bridge, the nodes' cgroups, the host mount points
// the cluster created and the directory's contents but KeepFiles.
func Cleanup(dir string) error { return cleanup(dir, true) }

// cleanup is Cleanup; killUsers false skips killing the processes using
// dir, for Down, whose own processes are gone already: a command waiting
// for this one to finish (kvnet-lab cluster down --dir <dir>) names dir
// too and must live.
func cleanup(dir string, killUsers bool) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	var errs []error
	if _, err := os.Stat(abs); err == nil && killUsers {
		procs, _ := controlplane.ProcessesUsing(abs, controlplane.UsageOptions{Cwd: true})
		for _, p := range procs {
			_ = syscall.Kill(p.PID, syscall.SIGKILL)
		}
		for _, p := range procs {
			for range 200 {
				if syscall.Kill(p.PID, 0) != nil {
					break
				}
				time.Sleep(25 * time.Millisecond)
			}
		}
	}
	if err := removeNet(); err != nil {
		errs = append(errs, err)
	}
	if err := removeCgroups(); err != nil {
		errs = append(errs, err)
	}
	if b, err := os.ReadFile(filepath.Join(abs, createdFile)); err == nil {
		created := strings.Fields(string(b))
		slices.Reverse(created)
		for _, d := range created {
			_ = syscall.Rmdir(d) // only when empty: something else may use it now
		}
	}
	entries, _ := os.ReadDir(abs)
	for _, e := range entries {
		if slices.Contains(KeepFiles, e.Name()) {
			continue
		}
		if err := os.RemoveAll(filepath.Join(abs, e.Name())); err != nil {
			errs = append(errs, fmt.Errorf("remove %s: %w", filepath.Join(abs, e.Name()), err))
		}
	}
	return errors.Join(errs...)
}
