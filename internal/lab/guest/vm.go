package guest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"kvnet.io/kvnet/internal/nl"
)

// DefaultMemoryMB is the guest memory when Config.MemoryMB is 0. The guest
// (Debian's 6.1 cloud kernel, an initramfs with dhcpcd and glibc) panics
// at boot below 76 MiB; at 76 it has 15 MiB available after boot, at 96
// about 36 MiB, room for its services and many connections. See
// hack/guest/README.md.
const DefaultMemoryMB = 96

// The guest's service ports.
const (
	EchoPort = 7    // TCP echo
	HTTPPort = 80   // HTTP, answering the VM's name
	ExecPort = 2323 // lab-only exec service, see Exec
)

// NIC is a guest NIC on an existing tap device.
type NIC struct {
	Tap string // tap device in Config.NetNS
	MAC string // the guest's MAC, e.g. 52:54:00:00:00:01
}

// Config describes a guest.
type Config struct {
	// Name is the VM's name: letters, digits, '.', '_' and '-'. The guest
	// learns it from its kernel command line (kvnet.name=) and answers it
	// over HTTP.
	Name string
	// Image is the kernel and initramfs (FindImage, EnsureImage).
	Image Image
	// Disk, when set, is a bootable raw disk (the guest's containerDisk,
	// hack/guest/build-disk.sh) that the firmware boots instead of Image,
	// as KubeVirt boots a containerDisk: attached as virtio-blk in
	// snapshot mode (the file is never written). The kernel command line
	// is then the disk's, so the guest learns its name from its first DHCP
	// lease's hostname instead of Name.
	Disk string
	// NetNS is the network namespace QEMU runs in: a name under /run/netns
	// or a path (/proc/<pid>/ns/net, ...); "" is the caller's.
	NetNS string
	// NICs are the guest's NICs, eth0, eth1, ... in this order. Their tap
	// devices must exist in NetNS and not be used by another process.
	NICs []NIC
	// MemoryMB is the guest memory; 0 is DefaultMemoryMB.
	MemoryMB int
	// ConsoleLog is the file the guest's serial console is appended to,
	// with QEMU's own messages; "" is a file in a temporary directory that
	// Stop removes.
	ConsoleLog string
	// Incoming makes the VM a migration target, waiting for the state of
	// a running guest on this URI (e.g. "tcp:0.0.0.0:4444") instead of
	// booting. Its console then shows only what the guest prints after the
	// migration.
	Incoming string
	// QMPSocket is the path of the QMP unix socket (at most 107 bytes);
	// "" is one in a temporary directory that Stop removes.
	QMPSocket string
}

// VM is a running QEMU guest.
type VM struct {
	cfg    Config
	cmd    *exec.Cmd
	qmp    *QMP
	tmpDir string
	stderr *tailWriter
	done   chan struct{}
	err    error // how QEMU ended, once done is closed

	stopOnce sync.Once
	stopped  bool

	mu      sync.Mutex
	console *console
}

var validName = regexp.MustCompile(`^[A-Za-z0-9._-]+$`)

// Start starts QEMU for cfg and returns once QEMU runs (its QMP socket
// answers): the guest boots (or, with Incoming, waits for its state) from
// then on; WaitReady and WaitLease follow it. ctx bounds the start only:
// the VM runs until Stop, or until the guest powers off. Start needs root.
func Start(ctx context.Context, cfg Config) (_ *VM, err error) {
	if err := CheckQEMU(); err != nil {
		return nil, err
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.MemoryMB == 0 {
		cfg.MemoryMB = DefaultMemoryMB
	}
	nsPath := ""
	if cfg.NetNS != "" {
		nsPath = cfg.NetNS
		if !strings.ContainsRune(nsPath, '/') {
			nsPath = nl.NSPath(nsPath)
		}
		if !nl.IsNetNS(nsPath) {
			return nil, fmt.Errorf("guest %s: network namespace %q not found (%s is not a mounted netns)", cfg.Name, cfg.NetNS, nsPath)
		}
	}
	if err := checkTaps(nsPath, cfg); err != nil {
		return nil, err
	}

	v := &VM{cfg: cfg, done: make(chan struct{}), stderr: &tailWriter{max: 4096}}
	defer func() {
		if err != nil && v.tmpDir != "" {
			os.RemoveAll(v.tmpDir)
		}
	}()
	if v.cfg.ConsoleLog == "" || v.cfg.QMPSocket == "" {
		if v.tmpDir, err = os.MkdirTemp("", "kvnet-guest-"+cfg.Name+"-"); err != nil {
			return nil, fmt.Errorf("guest %s: %w", cfg.Name, err)
		}
		if v.cfg.ConsoleLog == "" {
			v.cfg.ConsoleLog = filepath.Join(v.tmpDir, "console.log")
		}
		if v.cfg.QMPSocket == "" {
			v.cfg.QMPSocket = filepath.Join(v.tmpDir, "qmp.sock")
		}
	}
	if len(v.cfg.QMPSocket) > 107 {
		return nil, fmt.Errorf("guest %s: QMP socket path %q is longer than a unix socket path may be (107 bytes)", cfg.Name, v.cfg.QMPSocket)
	}
	if err := os.Remove(v.cfg.QMPSocket); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("guest %s: stale QMP socket: %w", cfg.Name, err)
	}
	logFile, err := os.OpenFile(v.cfg.ConsoleLog, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("guest %s: console log: %w", cfg.Name, err)
	}
	defer logFile.Close()
	st, err := logFile.Stat()
	if err != nil {
		return nil, fmt.Errorf("guest %s: console log: %w", cfg.Name, err)
	}
	v.console = newConsole(v.cfg.ConsoleLog, st.Size())

	v.cmd = exec.Command(QEMUBinary, v.cfg.args()...)
	v.cmd.Stdin = nil
	out := io.MultiWriter(logFile, v.stderr)
	v.cmd.Stdout, v.cmd.Stderr = out, out
	// QEMU dies with the thread that started it, i.e. with this process
	// (see run).
	v.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	started := make(chan error, 1)
	go v.run(nsPath, started)
	if err := <-started; err != nil {
		return nil, fmt.Errorf("guest %s: start %s in netns %q: %w", cfg.Name, QEMUBinary, cfg.NetNS, err)
	}
	defer func() {
		if err != nil {
			v.Stop()
		}
	}()
	if v.qmp, err = v.dialQMP(ctx); err != nil {
		return nil, err
	}
	return v, nil
}

func (c Config) validate() error {
	if !validName.MatchString(c.Name) {
		return fmt.Errorf("guest: invalid VM name %q: letters, digits, '.', '_' and '-' only", c.Name)
	}
	if c.Disk != "" {
		if strings.Contains(c.Disk, ",") {
			return fmt.Errorf("guest %s: Disk path %q may not contain ','", c.Name, c.Disk)
		}
		if _, err := os.Stat(c.Disk); err != nil {
			return fmt.Errorf("guest %s: Disk: %w", c.Name, err)
		}
	} else {
		if c.Image.Kernel == "" || c.Image.Initrd == "" {
			return fmt.Errorf("guest %s: Config.Image is empty: FindImage or EnsureImage gives it", c.Name)
		}
		for _, p := range []string{c.Image.Kernel, c.Image.Initrd} {
			if _, err := os.Stat(p); err != nil {
				return fmt.Errorf("guest %s: %w (%w)", c.Name, ErrImageNotBuilt, err)
			}
		}
	}
	if c.MemoryMB < 0 {
		return fmt.Errorf("guest %s: negative MemoryMB", c.Name)
	}
	taps := map[string]bool{}
	for i, n := range c.NICs {
		if n.Tap == "" || strings.ContainsAny(n.Tap, ", /") || len(n.Tap) > 15 {
			return fmt.Errorf("guest %s: NIC %d: invalid tap name %q", c.Name, i, n.Tap)
		}
		if taps[n.Tap] {
			return fmt.Errorf("guest %s: tap %s used by two NICs", c.Name, n.Tap)
		}
		taps[n.Tap] = true
		mac, err := net.ParseMAC(n.MAC)
		if err != nil || len(mac) != 6 {
			return fmt.Errorf("guest %s: NIC %d: invalid MAC %q", c.Name, i, n.MAC)
		}
		if mac[0]&1 != 0 {
			return fmt.Errorf("guest %s: NIC %d: MAC %s is multicast", c.Name, i, n.MAC)
		}
	}
	if strings.ContainsAny(c.Incoming, " ,") {
		return fmt.Errorf("guest %s: invalid Incoming %q", c.Name, c.Incoming)
	}
	if strings.Contains(c.ConsoleLog, ",") || strings.Contains(c.QMPSocket, ",") {
		return fmt.Errorf("guest %s: console log and QMP socket paths may not contain ','", c.Name)
	}
	return nil
}

// checkTaps checks that every NIC's tap exists in the namespace and is a
// tap (not a tun, not another kind of link).
func checkTaps(nsPath string, cfg Config) error {
	if len(cfg.NICs) == 0 {
		return nil
	}
	h, err := nl.NewHandle(nsPath)
	if err != nil {
		return fmt.Errorf("guest %s: %w", cfg.Name, err)
	}
	defer h.Close()
	where := "the current network namespace"
	if cfg.NetNS != "" {
		where = fmt.Sprintf("netns %q", cfg.NetNS)
	}
	for _, n := range cfg.NICs {
		l, err := h.LinkByName(n.Tap)
		if err != nil {
			if nl.IsNotFound(err) {
				return fmt.Errorf("guest %s: tap device %q not found in %s (create it first: ip tuntap add dev %s mode tap)", cfg.Name, n.Tap, where, n.Tap)
			}
			return fmt.Errorf("guest %s: tap device %q in %s: %w", cfg.Name, n.Tap, where, err)
		}
		tt, ok := l.(*netlink.Tuntap)
		if !ok || tt.Mode == netlink.TUNTAP_MODE_TUN {
			return fmt.Errorf("guest %s: %q in %s is a %s, not a tap device", cfg.Name, n.Tap, where, l.Type())
		}
	}
	return nil
}

// args is QEMU's command line.
func (c Config) args() []string {
	a := []string{
		"-name", c.Name,
		"-machine", "pc",
		"-accel", "tcg",
		"-smp", "1",
		"-m", strconv.Itoa(c.MemoryMB),
		"-nodefaults", "-no-user-config",
		"-display", "none",
		"-no-reboot",
	}
	if c.Disk != "" {
		a = append(a, "-drive", "file="+c.Disk+",format=raw,if=virtio,snapshot=on")
	} else {
		a = append(a,
			"-kernel", c.Image.Kernel,
			"-initrd", c.Image.Initrd,
			// panic=-1 reboots at once on a panic, which -no-reboot turns
			// into QEMU exiting.
			"-append", "console=ttyS0 quiet panic=-1 kvnet.name="+c.Name)
	}
	a = append(a,
		"-chardev", "file,id=console,path="+c.ConsoleLog+",append=on",
		"-serial", "chardev:console",
		"-qmp", "unix:"+c.QMPSocket+",server=on,wait=off",
	)
	for i, n := range c.NICs {
		id := "n" + strconv.Itoa(i)
		a = append(a,
			"-netdev", "tap,id="+id+",ifname="+n.Tap+",script=no,downscript=no",
			// romfile= skips the iPXE option ROM: no network boot here.
			"-device", "virtio-net-pci,netdev="+id+",mac="+n.MAC+",romfile=")
	}
	if c.Incoming != "" {
		a = append(a, "-incoming", c.Incoming)
	}
	return a
}

// run starts QEMU from a thread in the namespace at nsPath and waits for it.
// The thread stays locked and is never switched back: it ends with this
// goroutine, after QEMU, so the namespace never leaks to other goroutines
// and QEMU's Pdeathsig (sent when the thread that forked it ends) fires only
// if this process dies.
func (v *VM) run(nsPath string, started chan<- error) {
	runtime.LockOSThread()
	defer close(v.done)
	if nsPath != "" {
		fd, err := unix.Open(nsPath, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			started <- fmt.Errorf("open %s: %w", nsPath, err)
			return
		}
		err = unix.Setns(fd, unix.CLONE_NEWNET)
		unix.Close(fd)
		if err != nil {
			started <- fmt.Errorf("setns %s: %w", nsPath, err)
			return
		}
	}
	if err := v.cmd.Start(); err != nil {
		started <- err
		return
	}
	started <- nil
	v.err = v.cmd.Wait()
}

// dialQMP waits until QEMU answers on its QMP socket, or exits.
func (v *VM) dialQMP(ctx context.Context) (*QMP, error) {
	for {
		dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		q, err := DialQMP(dctx, v.cfg.QMPSocket)
		cancel()
		if err == nil {
			return q, nil
		}
		select {
		case <-v.done:
			return nil, v.exitError("exited while starting")
		case <-ctx.Done():
			return nil, fmt.Errorf("guest %s: QEMU did not answer on %s: %w (last: %v)", v.cfg.Name, v.cfg.QMPSocket, ctx.Err(), err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// exitError describes how QEMU ended, with its last messages and the
// console's last lines. Call it only once done is closed.
func (v *VM) exitError(what string) error {
	v.mu.Lock()
	_ = v.console.poll() // best effort: the tail only annotates an error
	tail := v.console.tailText()
	v.mu.Unlock()
	status := "exit status 0"
	if v.err != nil {
		status = v.err.Error()
	}
	msg := strings.TrimSpace(v.stderr.String())
	if msg == "" {
		msg = "(no messages)"
	}
	return fmt.Errorf("guest %s: QEMU %s (%s): %s\nconsole:\n%s", v.cfg.Name, what, status, msg, tail)
}

// Name is the VM's name.
func (v *VM) Name() string { return v.cfg.Name }

// Config is the VM's configuration, with the defaults Start filled in
// (MemoryMB, ConsoleLog, QMPSocket).
func (v *VM) Config() Config { return v.cfg }

// PID is QEMU's process id.
func (v *VM) PID() int { return v.cmd.Process.Pid }

// QMP is the VM's QMP client (QEMU serves one client per socket; this is
// it). Stop closes it.
func (v *VM) QMP() *QMP { return v.qmp }

// Done is closed when QEMU has exited.
func (v *VM) Done() <-chan struct{} { return v.done }

// Stop kills QEMU, waits for it and removes the temporary files of the
// defaults. It may be called more than once.
func (v *VM) Stop() {
	v.stopOnce.Do(func() {
		v.mu.Lock()
		v.stopped = true
		v.mu.Unlock()
		if v.qmp != nil {
			v.qmp.Close()
		}
		_ = v.cmd.Process.Kill() // already exited is fine: done reports it
		<-v.done
		if v.tmpDir != "" {
			os.RemoveAll(v.tmpDir)
		}
	})
}

// Wait waits for QEMU to exit: nil when Stop ended it or the guest powered
// off, an error with QEMU's last messages and the console's last lines
// otherwise (a guest that panics makes QEMU exit too).
func (v *VM) Wait() error {
	<-v.done
	v.mu.Lock()
	stopped := v.stopped
	v.mu.Unlock()
	if stopped || v.err == nil {
		return nil
	}
	return v.exitError("exited")
}

// RSS is QEMU's resident set size in bytes (VmRSS of /proc/<pid>/status).
func (v *VM) RSS() (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", v.PID()))
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(string(b)) {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(rest)
			if len(f) == 2 && f[1] == "kB" {
				kb, err := strconv.ParseInt(f[0], 10, 64)
				return kb * 1024, err
			}
		}
	}
	return 0, fmt.Errorf("no VmRSS in /proc/%d/status", v.PID())
}

// WaitLease returns the newest lease the guest reported for its NIC iface
// (e.g. "eth0") since Start, waiting for one until ctx ends or QEMU exits.
func (v *VM) WaitLease(ctx context.Context, iface string) (Lease, error) {
	return v.waitLease(ctx, "a lease on "+iface, func(c *console) map[string]Lease { return c.leases }, iface)
}

// WaitLease6 returns the newest DHCPv6 lease (KVNET-LEASE6) the guest
// reported for its NIC iface since Start, waiting for one until ctx ends or
// QEMU exits. The guest asks for one where a router advertisement has the
// Managed flag; it may come after KVNET-READY.
func (v *VM) WaitLease6(ctx context.Context, iface string) (Lease, error) {
	return v.waitLease(ctx, "a DHCPv6 lease on "+iface, func(c *console) map[string]Lease { return c.leases6 }, iface)
}

// waitLease waits for iface's entry in the console's lease map of.
func (v *VM) waitLease(ctx context.Context, what string, of func(*console) map[string]Lease, iface string) (Lease, error) {
	var l Lease
	err := v.waitConsole(ctx, what, func(c *console) bool {
		var ok bool
		l, ok = of(c)[iface]
		return ok
	})
	return l, err
}

// Leases returns the newest (DHCPv4) lease per guest NIC reported since
// Start.
func (v *VM) Leases() map[string]Lease {
	return v.leaseMap(func(c *console) map[string]Lease { return c.leases })
}

// Leases6 returns the newest DHCPv6 lease per guest NIC reported since
// Start.
func (v *VM) Leases6() map[string]Lease {
	return v.leaseMap(func(c *console) map[string]Lease { return c.leases6 })
}

// ReadyName returns the name the guest announced in its KVNET-READY line
// ("" before it): Config.Name, or with Config.Disk its DHCP hostname.
func (v *VM) ReadyName() string {
	v.mu.Lock()
	defer v.mu.Unlock()
	_ = v.console.poll() // best effort, as leaseMap
	return v.console.name
}

// Released6 returns the guest NICs whose DHCPv6 address went (a
// KVNET-LEASE6-GONE line) since Start and came back by no newer lease.
func (v *VM) Released6() map[string]bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	_ = v.console.poll() // best effort, as leaseMap
	m := make(map[string]bool, len(v.console.gone6))
	for k := range v.console.gone6 {
		m[k] = true
	}
	return m
}

func (v *VM) leaseMap(of func(*console) map[string]Lease) map[string]Lease {
	v.mu.Lock()
	defer v.mu.Unlock()
	_ = v.console.poll() // best effort: the tail only annotates an error
	m := make(map[string]Lease, len(of(v.console)))
	for k, l := range of(v.console) {
		m[k] = l
	}
	return m
}

// WaitReady waits until the guest printed KVNET-READY (its services
// listen and its first DHCP round is over), until ctx ends or QEMU exits.
func (v *VM) WaitReady(ctx context.Context) error {
	return v.waitConsole(ctx, "KVNET-READY", func(c *console) bool { return c.ready })
}

// ConsoleErrors returns the KVNET-ERROR lines the guest printed since
// Start.
func (v *VM) ConsoleErrors() []string {
	v.mu.Lock()
	defer v.mu.Unlock()
	_ = v.console.poll() // best effort: the tail only annotates an error
	return append([]string(nil), v.console.errors...)
}

func (v *VM) waitConsole(ctx context.Context, what string, found func(*console) bool) error {
	t := time.NewTicker(25 * time.Millisecond)
	defer t.Stop()
	for {
		v.mu.Lock()
		err := v.console.poll()
		ok := err == nil && found(v.console)
		tail := v.console.tailText()
		v.mu.Unlock()
		if ok {
			return nil
		}
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("guest %s: console log: %w", v.cfg.Name, err)
		}
		select {
		case <-v.done:
			// One last look: QEMU may have printed it just before exiting.
			v.mu.Lock()
			_ = v.console.poll() // best effort: the tail only annotates an error
			ok := found(v.console)
			v.mu.Unlock()
			if ok {
				return nil
			}
			return v.exitError("exited while waiting for " + what)
		case <-ctx.Done():
			return fmt.Errorf("guest %s: waiting for %s: %w\nconsole:\n%s", v.cfg.Name, what, ctx.Err(), tail)
		case <-t.C:
		}
	}
}

// tailWriter keeps the last max bytes written to it.
type tailWriter struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (w *tailWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.b = append(w.b, p...)
	if len(w.b) > w.max {
		w.b = append([]byte(nil), w.b[len(w.b)-w.max:]...)
	}
	return len(p), nil
}

func (w *tailWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return string(w.b)
}
