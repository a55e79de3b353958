package guest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"kvnet.io/kvnet/internal/nl"
	"kvnet.io/kvnet/internal/repo"
	"kvnet.io/kvnet/internal/testenv"
)

// TestMain reports, as any user but root, that the privileged tests of the
// package did not run; the unit tests run as any user.
func TestMain(m *testing.M) {
	testenv.ReportPrivilegedNotRun("kvnet.io/kvnet/internal/lab/guest")
	os.Exit(m.Run())
}

// requirePrivileged skips a test that needs root, QEMU, ip and busybox
// where they are missing, or fails it when KVNET_REQUIRE_PRIVILEGED=1 (CI,
// where a skip would hide a regression).
func requirePrivileged(tb testing.TB) {
	tb.Helper()
	testenv.NeedsRoot(tb)
	missing := func(why string) {
		tb.Helper()
		if os.Getenv(testenv.RequirePrivilegedEnv) == "1" {
			tb.Fatalf("%s; %s=1 forbids skipping it", why, testenv.RequirePrivilegedEnv)
		}
		tb.Skip(why)
	}
	if err := CheckQEMU(); err != nil {
		missing("needs qemu: " + err.Error())
	}
	for _, tool := range []struct{ bin, pkg string }{{"ip", "iproute2"}, {"busybox", "busybox"}} {
		if _, err := exec.LookPath(tool.bin); err != nil {
			missing(fmt.Sprintf("needs %s: install Debian package %s", tool.bin, tool.pkg))
		}
	}
}

var (
	imageOnce sync.Once
	image     Image
	imageErr  error
)

// testImage builds the guest image once per test binary (a no-op when it
// is up to date).
func testImage(tb testing.TB) Image {
	tb.Helper()
	imageOnce.Do(func() {
		root, err := repo.Root()
		if err != nil {
			imageErr = err
			return
		}
		image, imageErr = EnsureImage(root)
	})
	if imageErr != nil {
		tb.Fatal(imageErr)
	}
	return image
}

// lab is a network namespace with bridges (br0 at labGateway/24, more
// with addBridge), tap devices on them and DHCP servers (busybox udhcpd)
// on them.
type lab struct {
	ns  string
	dir string
}

var (
	labGateway = netip.MustParseAddr("10.77.0.1")
	labMTU     = 1400
)

func run(tb testing.TB, argv ...string) {
	tb.Helper()
	if out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput(); err != nil {
		tb.Fatalf("%s: %v: %s", strings.Join(argv, " "), err, out)
	}
}

// labNSPrefix starts the names of the tests' namespaces, followed by the
// test process's pid.
const labNSPrefix = "kvguest-"

func newLab(tb testing.TB) *lab {
	tb.Helper()
	removeStaleLabs(tb)
	l := &lab{ns: fmt.Sprintf("%s%d-%04x", labNSPrefix, os.Getpid(), rand.IntN(1<<16)), dir: tb.TempDir()}
	if _, err := nl.CreateNamedNS(l.ns); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := nl.DeleteNamedNS(l.ns); err != nil {
			tb.Error(err)
		}
	})
	l.addBridge(tb, "br0", labGateway)
	return l
}

// removeStaleLabs deletes the namespaces of test processes that died
// before their cleanup ran.
func removeStaleLabs(tb testing.TB) {
	names, err := nl.ListNamedNS(labNSPrefix)
	if err != nil {
		tb.Fatal(err)
	}
	for _, n := range names {
		pid, _, _ := strings.Cut(strings.TrimPrefix(n, labNSPrefix), "-")
		if _, err := os.Stat("/proc/" + pid); errors.Is(err, os.ErrNotExist) {
			tb.Logf("removing the namespace %s of a dead test process", n)
			nl.DeleteNamedNS(n)
		}
	}
}

// addBridge adds the bridge name with gw/24 on it.
func (l *lab) addBridge(tb testing.TB, name string, gw netip.Addr) {
	tb.Helper()
	run(tb, "ip", "-n", l.ns, "link", "add", name, "type", "bridge")
	run(tb, "ip", "-n", l.ns, "addr", "add", gw.String()+"/24", "dev", name)
	run(tb, "ip", "-n", l.ns, "link", "set", name, "up")
}

func (l *lab) addTap(tb testing.TB, name, bridge string) {
	tb.Helper()
	run(tb, "ip", "-n", l.ns, "tuntap", "add", "dev", name, "mode", "tap")
	run(tb, "ip", "-n", l.ns, "link", "set", name, "master", bridge, "up")
}

// serveDHCP runs udhcpd on bridge (whose address is gw/24), leasing ip to
// mac with gw as router and DNS server, and the MTU mtu.
func (l *lab) serveDHCP(tb testing.TB, bridge string, gw netip.Addr, mtu int, mac string, ip netip.Addr) {
	tb.Helper()
	l.serveDHCPHostname(tb, bridge, gw, mtu, mac, ip, "")
}

// serveDHCPHostname is serveDHCP, also sending hostname (option 12)
// unless it is "".
func (l *lab) serveDHCPHostname(tb testing.TB, bridge string, gw netip.Addr, mtu int, mac string, ip netip.Addr, hostname string) {
	tb.Helper()
	extra := ""
	if hostname != "" {
		extra = "option hostname " + hostname + "\n"
	}
	conf := filepath.Join(l.dir, "udhcpd-"+bridge+".conf")
	leases := filepath.Join(l.dir, "udhcpd-"+bridge+".leases")
	if err := os.WriteFile(leases, nil, 0o644); err != nil {
		tb.Fatal(err)
	}
	pool := gw.As4()
	pool[3] = 100
	first := netip.AddrFrom4(pool)
	pool[3] = 150
	last := netip.AddrFrom4(pool)
	err := os.WriteFile(conf, []byte(fmt.Sprintf(`interface %s
start %s
end %s
max_leases 51
lease_file %s
pidfile %s
static_lease %s %s
option subnet 255.255.255.0
option router %s
option dns %s
option mtu %d
option lease 3600
%s`, bridge, first, last, leases, filepath.Join(l.dir, "udhcpd-"+bridge+".pid"), mac, ip, gw, gw, mtu, extra)), 0o644)
	if err != nil {
		tb.Fatal(err)
	}
	log, err := os.Create(filepath.Join(l.dir, "udhcpd-"+bridge+".log"))
	if err != nil {
		tb.Fatal(err)
	}
	cmd := exec.Command("ip", "netns", "exec", l.ns, "busybox", "udhcpd", "-f", conf)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		log.Close()
		if tb.Failed() {
			b, _ := os.ReadFile(log.Name())
			tb.Logf("udhcpd on %s:\n%s", bridge, b)
		}
	})
}

func (l *lab) start(tb testing.TB, ctx context.Context, cfg Config) *VM {
	tb.Helper()
	if cfg.Disk == "" && cfg.Image.Kernel == "" {
		cfg.Image = testImage(tb)
	}
	cfg.NetNS = l.ns
	if cfg.ConsoleLog == "" {
		cfg.ConsoleLog = filepath.Join(l.dir, cfg.Name+".console")
	}
	vm, err := Start(ctx, cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		vm.Stop()
		if tb.Failed() {
			b, _ := os.ReadFile(vm.Config().ConsoleLog)
			tb.Logf("console of %s:\n%s", cfg.Name, b)
		}
	})
	return vm
}

func (l *lab) dial(ctx context.Context, addr netip.Addr, port uint16) (net.Conn, error) {
	return DialContext(ctx, l.ns, "tcp", netip.AddrPortFrom(addr, port).String())
}

// httpGet fetches http://addr/ from the lab's namespace.
func (l *lab) httpGet(ctx context.Context, addr netip.Addr) (string, error) {
	c := http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, a string) (net.Conn, error) {
			return DialContext(ctx, l.ns, network, a)
		},
		DisableKeepAlives: true,
	}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr.String()+"/", nil)
	if err != nil {
		return "", err
	}
	resp, err := c.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET http://%s/: %s: %s", addr, resp.Status, b)
	}
	return string(b), nil
}

// echoOnce sends msg over a new connection to the echo service and checks
// it comes back.
func (l *lab) echoOnce(ctx context.Context, addr netip.Addr, msg string) error {
	conn, err := l.dial(ctx, addr, EchoPort)
	if err != nil {
		return err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(conn, msg); err != nil {
		return err
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(conn, got); err != nil {
		return fmt.Errorf("echo %q: %w (got %q)", msg, err, got)
	}
	if string(got) != msg {
		return fmt.Errorf("echo %q: got %q", msg, got)
	}
	return nil
}

func TestStartChecksTaps(t *testing.T) {
	requirePrivileged(t)
	l := newLab(t)
	_, err := Start(t.Context(), Config{Name: "vm", Image: testImage(t), NetNS: l.ns, NICs: []NIC{{Tap: "tap9", MAC: "52:54:00:77:00:09"}}})
	if err == nil || !strings.Contains(err.Error(), `tap device "tap9" not found in netns "`+l.ns+`"`) {
		t.Fatalf("Start without the tap = %v", err)
	}
	_, err = Start(t.Context(), Config{Name: "vm", Image: testImage(t), NetNS: l.ns, NICs: []NIC{{Tap: "br0", MAC: "52:54:00:77:00:09"}}})
	if err == nil || !strings.Contains(err.Error(), "not a tap device") {
		t.Fatalf("Start on a bridge = %v", err)
	}
	_, err = Start(t.Context(), Config{Name: "vm", Image: testImage(t), NetNS: "kvguest-no-such-ns"})
	if err == nil || !strings.Contains(err.Error(), `network namespace "kvguest-no-such-ns" not found`) {
		t.Fatalf("Start in a missing netns = %v", err)
	}
}

func TestBootLeaseEchoHTTP(t *testing.T) {
	requirePrivileged(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	const mac = "52:54:00:77:00:10"
	ip := netip.MustParseAddr("10.77.0.10")
	l := newLab(t)
	l.addTap(t, "tap0", "br0")
	l.serveDHCP(t, "br0", labGateway, labMTU, mac, ip)

	began := time.Now()
	vm := l.start(t, ctx, Config{Name: "vm-a", NICs: []NIC{{Tap: "tap0", MAC: mac}}})
	lease, err := vm.WaitLease(ctx, "eth0")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("boot to lease: %v; lease %+v", time.Since(began).Round(time.Millisecond), lease)
	if lease.Addr != netip.PrefixFrom(ip, 24) || lease.Router != labGateway || lease.MTU != labMTU ||
		lease.MAC.String() != mac || len(lease.DNS) != 1 || lease.DNS[0] != labGateway {
		t.Fatalf("lease = %+v, want %s/24 router %s dns %s mtu %d mac %s", lease, ip, labGateway, labGateway, labMTU, mac)
	}
	if err := vm.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("boot to ready: %v", time.Since(began).Round(time.Millisecond))
	if errs := vm.ConsoleErrors(); len(errs) > 0 {
		t.Errorf("guest errors: %q", errs)
	}

	// Echo: many connections one after another, then several open at once.
	for i := range 20 {
		if err := l.echoOnce(ctx, ip, fmt.Sprintf("hello %d from the netns\n", i)); err != nil {
			t.Fatal(err)
		}
	}
	var conns []net.Conn
	for range 8 {
		c, err := l.dial(ctx, ip, EchoPort)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		conns = append(conns, c)
	}
	for round := range 3 {
		for i, c := range conns {
			msg := fmt.Sprintf("conn %d round %d\n", i, round)
			c.SetDeadline(time.Now().Add(10 * time.Second))
			if _, err := io.WriteString(c, msg); err != nil {
				t.Fatal(err)
			}
			got := make([]byte, len(msg))
			if _, err := io.ReadFull(c, got); err != nil || string(got) != msg {
				t.Fatalf("concurrent echo %d: %q, %v", i, got, err)
			}
		}
	}

	body, err := l.httpGet(ctx, ip)
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(body) != "vm-a" {
		t.Fatalf("GET / = %q, want the VM's name", body)
	}

	// The guest reaches the netns (as a VM would ping a pod), with the
	// lease applied.
	if out, err := Exec(ctx, l.ns, ip, "ping -c 1 -W 2 "+labGateway.String()); err != nil {
		t.Fatalf("guest ping: %v\n%s", err, out)
	}
	out, err := Exec(ctx, l.ns, ip, "cat /etc/resolv.conf; cat /sys/class/net/eth0/mtu; ip route show default")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"nameserver " + labGateway.String(), "1400", "default via " + labGateway.String()} {
		if !strings.Contains(out, want) {
			t.Errorf("guest config lacks %q:\n%s", want, out)
		}
	}
	if _, err := Exec(ctx, l.ns, ip, "exit 3"); err == nil || !strings.Contains(err.Error(), "exit status 3") {
		t.Errorf("Exec(exit 3) = %v", err)
	}

	st, err := vm.QMP().QueryStatus()
	if err != nil || st.Status != "running" {
		t.Fatalf("QueryStatus = %+v, %v", st, err)
	}
	vm.Stop()
	if err := vm.Wait(); err != nil {
		t.Fatalf("Wait after Stop = %v", err)
	}
}

// TestEveryNICGetsALease: a guest with two NICs on two bridges brings up
// both, with each one's lease (address, MTU, route) applied.
func TestEveryNICGetsALease(t *testing.T) {
	requirePrivileged(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	gw1 := netip.MustParseAddr("10.78.0.1")
	nics := []struct {
		tap, bridge, mac string
		gw, ip           netip.Addr
		mtu              int
	}{
		{"tap0", "br0", "52:54:00:77:00:40", labGateway, netip.MustParseAddr("10.77.0.40"), labMTU},
		{"tap1", "br1", "52:54:00:78:00:40", gw1, netip.MustParseAddr("10.78.0.40"), 1300},
	}
	l := newLab(t)
	l.addBridge(t, "br1", gw1)
	var cfgNICs []NIC
	for _, n := range nics {
		l.addTap(t, n.tap, n.bridge)
		l.serveDHCP(t, n.bridge, n.gw, n.mtu, n.mac, n.ip)
		cfgNICs = append(cfgNICs, NIC{Tap: n.tap, MAC: n.mac})
	}
	began := time.Now()
	vm := l.start(t, ctx, Config{Name: "vm-two", NICs: cfgNICs})
	if err := vm.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("boot to ready: %v", time.Since(began).Round(time.Millisecond))
	for i, n := range nics {
		iface := fmt.Sprintf("eth%d", i)
		lease, err := vm.WaitLease(ctx, iface)
		if err != nil {
			t.Fatal(err)
		}
		if lease.IP() != n.ip || lease.MTU != n.mtu || lease.Router != n.gw || lease.MAC.String() != n.mac {
			t.Errorf("%s: lease %+v, want %s mtu %d router %s mac %s", iface, lease, n.ip, n.mtu, n.gw, n.mac)
		}
		if err := l.echoOnce(ctx, n.ip, "via "+iface+"\n"); err != nil {
			t.Errorf("echo via %s: %v", iface, err)
		}
	}
	out, err := Exec(ctx, l.ns, nics[1].ip, "ip route")
	if err != nil {
		t.Fatal(err)
	}
	out = strings.Join(strings.Fields(out), " ") // busybox ip pads with spaces
	for _, want := range []string{"default via 10.77.0.1 dev eth0 metric 100", "default via 10.78.0.1 dev eth1 metric 101"} {
		if !strings.Contains(out, want) {
			t.Errorf("guest routes lack %q:\n%s", want, out)
		}
	}
	// IPv6: a dhcpcd per NIC, each running (one dhcpcd for both NICs
	// segfaulted as it set up the second, and no NIC got IPv6).
	testenv.Eventually(t, 30*time.Second, "a dhcpcd per NIC", func() error {
		out, err := Exec(ctx, l.ns, nics[0].ip, "ps; dmesg | grep [s]egfault || true")
		if err != nil {
			return err
		}
		if strings.Contains(out, "segfault") {
			t.Fatalf("a process of the guest crashed:\n%s", out)
		}
		for _, want := range []string{"dhcpcd: eth0", "dhcpcd: eth1"} {
			if !strings.Contains(out, want) {
				return fmt.Errorf("no %q process in the guest:\n%s", want, out)
			}
		}
		return nil
	})
}

// stream writes a deterministic byte stream to an echo connection and
// checks that exactly it comes back, in order.
type stream struct {
	conn net.Conn

	mu       sync.Mutex
	sent     int64
	echoed   int64
	lastEcho time.Time
	maxGap   time.Duration // longest wait between two echoed reads
	err      error
	readDone chan struct{}
}

func streamByte(i int64) byte { return byte(i % 251) }

func newStream(conn net.Conn) *stream {
	s := &stream{conn: conn, lastEcho: time.Now(), readDone: make(chan struct{})}
	go s.read()
	return s
}

func (s *stream) read() {
	defer close(s.readDone)
	buf := make([]byte, 4096)
	for {
		n, err := s.conn.Read(buf)
		s.mu.Lock()
		now := time.Now()
		if n > 0 {
			s.maxGap = max(s.maxGap, now.Sub(s.lastEcho))
			s.lastEcho = now
		}
		for _, b := range buf[:n] {
			if want := streamByte(s.echoed); b != want && s.err == nil {
				s.err = fmt.Errorf("byte %d: got %d, want %d", s.echoed, b, want)
			}
			s.echoed++
		}
		if s.echoed > s.sent && s.err == nil {
			s.err = fmt.Errorf("echoed %d bytes, sent only %d", s.echoed, s.sent)
		}
		s.mu.Unlock()
		if err != nil {
			if !errors.Is(err, io.EOF) {
				s.mu.Lock()
				if s.err == nil {
					s.err = fmt.Errorf("read: %w", err)
				}
				s.mu.Unlock()
			}
			return
		}
	}
}

// write sends chunk bytes every interval until ctx ends.
func (s *stream) write(ctx context.Context, chunk int, interval time.Duration) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	buf := make([]byte, chunk)
	for {
		s.mu.Lock()
		for i := range buf {
			buf[i] = streamByte(s.sent + int64(i))
		}
		s.sent += int64(chunk) // before the write, so the reader never sees more echoed than sent
		s.mu.Unlock()
		s.conn.SetWriteDeadline(time.Now().Add(30 * time.Second))
		if _, err := s.conn.Write(buf); err != nil {
			return fmt.Errorf("write: %w", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

func (s *stream) counts() (sent, echoed int64, maxGap time.Duration, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sent, s.echoed, s.maxGap, s.err
}

func TestLiveMigration(t *testing.T) {
	requirePrivileged(t)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	const mac = "52:54:00:77:00:20"
	ip := netip.MustParseAddr("10.77.0.20")
	l := newLab(t)
	l.addTap(t, "tap0", "br0")
	l.addTap(t, "tap1", "br0")
	l.serveDHCP(t, "br0", labGateway, labMTU, mac, ip)

	// Same machine, same MAC; the target waits for the state on the
	// namespace's loopback.
	nic := func(tap string) []NIC { return []NIC{{Tap: tap, MAC: mac}} }
	src := l.start(t, ctx, Config{Name: "vm-m", NICs: nic("tap0")})
	dst := l.start(t, ctx, Config{Name: "vm-m", NICs: nic("tap1"), Incoming: "tcp:127.0.0.1:4444",
		ConsoleLog: filepath.Join(l.dir, "vm-m-target.console")})
	if _, err := src.WaitLease(ctx, "eth0"); err != nil {
		t.Fatal(err)
	}
	if err := src.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	if st, err := dst.QMP().QueryStatus(); err != nil || st.Status != "inmigrate" {
		t.Fatalf("target status = %+v, %v; want inmigrate", st, err)
	}

	conn, err := l.dial(ctx, ip, EchoPort)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	s := newStream(conn)
	wctx, stopWriting := context.WithCancel(ctx)
	writeErr := make(chan error, 1)
	go func() { writeErr <- s.write(wctx, 512, 5*time.Millisecond) }()

	waitEchoed := func(what string, atLeast int64) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			sent, echoed, _, err := s.counts()
			if err != nil {
				t.Fatalf("%s: %v", what, err)
			}
			if echoed >= atLeast {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d of %d bytes echoed, want %d", what, echoed, sent, atLeast)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitEchoed("before the migration", 64<<10)

	began := time.Now()
	if err := src.QMP().Migrate("tcp:127.0.0.1:4444"); err != nil {
		t.Fatal(err)
	}
	mi, err := src.QMP().WaitMigration(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var ramMB float64
	if mi.RAM != nil {
		ramMB = float64(mi.RAM.Transferred) / (1 << 20)
	}
	t.Logf("migration %s: total %d ms, downtime %d ms, setup %d ms, %.1f MiB sent (wall %v)",
		mi.Status, mi.TotalTimeMS, mi.DowntimeMS, mi.SetupTimeMS, ramMB, time.Since(began).Round(time.Millisecond))
	if st, err := src.QMP().QueryStatus(); err != nil || st.Running {
		t.Errorf("source after migration: %+v, %v; want stopped", st, err)
	}
	for {
		st, err := dst.QMP().QueryStatus()
		if err != nil {
			t.Fatal(err)
		}
		if st.Running {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("target never ran: %+v", st)
		}
		time.Sleep(20 * time.Millisecond)
	}
	src.Stop()
	_, echoedAtMigration, _, _ := s.counts()

	// The same connection goes on echoing, from the target.
	waitEchoed("after the migration", echoedAtMigration+64<<10)
	stopWriting()
	if err := <-writeErr; err != nil {
		t.Fatal(err)
	}
	sent, _, _, _ := s.counts()
	waitEchoed("draining", sent)
	conn.(*net.TCPConn).CloseWrite()
	select {
	case <-s.readDone:
	case <-time.After(10 * time.Second):
		t.Fatal("the guest did not close the echo connection after ours")
	}
	sent, echoed, maxGap, err := s.counts()
	if err != nil {
		t.Fatal(err)
	}
	if echoed != sent {
		t.Fatalf("sent %d bytes, echoed %d", sent, echoed)
	}
	t.Logf("one connection through the migration: %d bytes echoed in order, longest pause %v", echoed, maxGap.Round(time.Millisecond))

	body, err := l.httpGet(ctx, ip)
	if err != nil || strings.TrimSpace(body) != "vm-m" {
		t.Fatalf("GET / on the target = %q, %v", body, err)
	}
}

// BenchmarkBootToLease measures QEMU start to the guest's first DHCP
// lease, and reports the guest memory and QEMU's RSS at that point.
func BenchmarkBootToLease(b *testing.B) {
	requirePrivileged(b)
	const mac = "52:54:00:77:00:30"
	ip := netip.MustParseAddr("10.77.0.30")
	l := newLab(b)
	l.addTap(b, "tap0", "br0")
	l.serveDHCP(b, "br0", labGateway, labMTU, mac, ip)
	img := testImage(b)
	var rss, mem float64
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		vm, err := Start(ctx, Config{Name: "bench", Image: img, NetNS: l.ns, NICs: []NIC{{Tap: "tap0", MAC: mac}},
			ConsoleLog: filepath.Join(l.dir, fmt.Sprintf("bench-%d.console", i))})
		if err != nil {
			b.Fatal(err)
		}
		lease, err := vm.WaitLease(ctx, "eth0")
		b.StopTimer()
		if err != nil || lease.IP() != ip {
			vm.Stop()
			b.Fatalf("lease %+v, %v", lease, err)
		}
		r, err := vm.RSS()
		if err != nil {
			b.Fatal(err)
		}
		rss += float64(r) / (1 << 20)
		mem = float64(vm.Config().MemoryMB)
		vm.Stop()
		cancel()
		b.StartTimer()
	}
	b.ReportMetric(mem, "guest-MiB")
	b.ReportMetric(rss/float64(b.N), "qemu-RSS-MiB")
	b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/lease")
}
