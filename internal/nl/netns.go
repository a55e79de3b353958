package nl

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// NetNSDir is where named namespaces are bind-mounted, the directory
// `ip netns` uses, so operators can `ip netns exec` into kvnet's namespaces.
const NetNSDir = "/run/netns"

// NSPath returns the path of the named namespace name.
func NSPath(name string) string { return filepath.Join(NetNSDir, name) }

// Do runs f with the calling goroutine's thread switched into the namespace
// at nsPath ("" runs f directly). f must not rely on goroutines it starts
// being in the namespace; see the package doc.
func Do(nsPath string, f func() error) error {
	if nsPath == "" {
		return f()
	}
	err := ns.WithNetNSPath(nsPath, func(ns.NetNS) error { return f() })
	var pne ns.NSPathNotExistErr
	if errors.As(err, &pne) {
		return fmt.Errorf("enter netns %q: %w: %w", nsPath, ErrNotFound, err)
	}
	return err
}

// OpenNS opens the namespace at nsPath ("" = the calling thread's, read
// under LockOSThread). The caller closes the handle; while open it pins the
// namespace and its fd can be given to nftables.WithNetNSFd.
func OpenNS(nsPath string) (netns.NsHandle, error) {
	if nsPath == "" {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		h, err := netns.Get()
		if err != nil {
			return netns.None(), fmt.Errorf("open current netns: %w", err)
		}
		return h, nil
	}
	h, err := netns.GetFromPath(nsPath)
	if err != nil {
		return netns.None(), notFound(fmt.Errorf("open netns %q: %w", nsPath, err))
	}
	return h, nil
}

// mountMu guards following: the one-time preparation of NetNSDir and the
// creation of files in it, so that two goroutines creating the same
// namespace do not stack two bind mounts on one file.
var (
	mountMu       sync.Mutex
	netNSDirReady bool
)

// ensureNetNSDir makes NetNSDir a shared mount point, as `ip netns add`
// does, so that namespaces created here propagate to other mount
// namespaces (a node agent's container with /run/netns mounted
// bidirectionally) and survive there.
func ensureNetNSDir() error {
	if netNSDirReady {
		return nil
	}
	if err := os.MkdirAll(NetNSDir, 0o755); err != nil {
		return fmt.Errorf("create %q: %w", NetNSDir, err)
	}
	for bound := false; ; bound = true {
		err := unix.Mount("", NetNSDir, "none", unix.MS_SHARED|unix.MS_REC, "")
		if err == nil {
			break
		}
		if !errors.Is(err, unix.EINVAL) || bound {
			return fmt.Errorf("make %q a shared mount: %w", NetNSDir, err)
		}
		// EINVAL: not a mount point yet; bind it onto itself and retry.
		if err := unix.Mount(NetNSDir, NetNSDir, "none", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("bind-mount %q onto itself: %w", NetNSDir, err)
		}
	}
	netNSDirReady = true
	return nil
}

// IsNetNS reports whether path is a mounted network namespace.
func IsNetNS(path string) bool {
	var st unix.Statfs_t
	return unix.Statfs(path, &st) == nil && st.Type == unix.NSFS_MAGIC
}

// CreateNamedNS creates the named namespace name under NetNSDir with its
// loopback up and returns its path. It is idempotent: an existing namespace
// of that name is kept as is.
func CreateNamedNS(name string) (string, error) {
	if name == "" || strings.ContainsRune(name, '/') {
		return "", fmt.Errorf("create netns %q: invalid name", name)
	}
	path := NSPath(name)
	mountMu.Lock()
	defer mountMu.Unlock()
	if IsNetNS(path) {
		return path, nil
	}
	if err := ensureNetNSDir(); err != nil {
		return "", err
	}
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE, 0o444)
	if err != nil {
		return "", fmt.Errorf("create netns %q: %w", name, err)
	}
	f.Close()

	errc := make(chan error, 1)
	go func() {
		// This thread enters the new namespace and is never unlocked: when
		// the goroutine returns, the runtime destroys the thread rather
		// than handing a thread in the wrong namespace to other code.
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("unshare netns: %w", err)
			return
		}
		src := fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid())
		if err := unix.Mount(src, path, "none", unix.MS_BIND, ""); err != nil {
			errc <- fmt.Errorf("bind-mount netns: %w", err)
			return
		}
		errc <- nil
	}()
	if err := <-errc; err != nil {
		os.Remove(path)
		return "", fmt.Errorf("create netns %q: %w", name, err)
	}
	if err := setLoopbackUp(path); err != nil {
		return "", fmt.Errorf("create netns %q: %w", name, err)
	}
	return path, nil
}

// setLoopbackUp brings lo up: a fresh namespace has it down, and then even
// packets to the namespace's own addresses go nowhere.
func setLoopbackUp(nsPath string) error {
	h, err := NewHandle(nsPath)
	if err != nil {
		return err
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err != nil {
		return err
	}
	if err := h.LinkSetUp(lo); err != nil {
		return fmt.Errorf("set link %q up: %w", "lo", err)
	}
	return nil
}

// DeleteNamedNS unmounts and removes the named namespace name. A missing
// namespace is not an error. The kernel frees the namespace (and destroys
// its veths, whose peers go with them) once nothing else holds it.
func DeleteNamedNS(name string) error {
	if name == "" || strings.ContainsRune(name, '/') {
		return fmt.Errorf("delete netns %q: invalid name", name)
	}
	path := NSPath(name)
	mountMu.Lock()
	defer mountMu.Unlock()
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil &&
		!errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount netns %q: %w", name, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove netns %q: %w", name, err)
	}
	return nil
}

// ListNamedNS returns the names of the namespaces under NetNSDir that
// start with prefix, sorted.
func ListNamedNS(prefix string) ([]string, error) {
	entries, err := os.ReadDir(NetNSDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list %q: %w", NetNSDir, err)
	}
	var names []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), prefix) {
			names = append(names, e.Name())
		}
	}
	return names, nil
}

// SetSysctl writes value to /proc/sys/<key> inside the namespace at nsPath
// ("" = the calling thread's). key uses slashes ("net/ipv4/ip_forward") so
// interface names with dots stay unambiguous. The write is skipped when
// the value is already set, which keeps read-only /proc/sys setups working
// when nothing needs to change.
func SetSysctl(nsPath, key, value string) error {
	file := filepath.Join("/proc/sys", key)
	return Do(nsPath, func() error {
		cur, err := os.ReadFile(file)
		if err != nil {
			return fmt.Errorf("read sysctl %q: %w", key, notFound(err))
		}
		if strings.TrimSpace(string(cur)) == value {
			return nil
		}
		if err := os.WriteFile(file, []byte(value), 0o644); err != nil {
			return fmt.Errorf("set sysctl %q to %q: %w", key, value, err)
		}
		return nil
	})
}

// NamedNSExists reports whether the named namespace name is mounted.
func NamedNSExists(name string) bool { return IsNetNS(NSPath(name)) }
