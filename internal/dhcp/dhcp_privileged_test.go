package dhcp

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"kvnet.io/kvnet/internal/testenv"
)

// The topology mirrors a kvnet node: a "switch" netns holds the network's
// bridge; the "router" netns holds the gateway interface (gw0, 10.0.0.1/24)
// whose veth peer is a bridge port; each guest netns holds an eth0 with the
// VM's MAC whose peer is another bridge port. The server runs in the router
// netns; the guest runs busybox udhcpc, a real DHCP client.
const (
	gwIface    = "gw0"
	guestIface = "eth0"
)

var gatewayPrefix = netip.MustParsePrefix("10.0.0.1/24")

// scriptTmpl is the udhcpc event script. It records the variables udhcpc
// derives from the reply, one file per event, and on "bound" configures
// the address so that a later renewal can be unicast from it. The file is
// written under a temporary name and renamed, so the test never reads a
// half-written file.
const scriptTmpl = `#!/bin/sh
out=%q
case "$1" in
bound|renew)
	{
		echo "ip=$ip"
		echo "subnet=$subnet"
		echo "mask=$mask"
		echo "router=$router"
		echo "dns=$dns"
		echo "mtu=$mtu"
		echo "hostname=$hostname"
		echo "domain=$domain"
		echo "search=$search"
		echo "lease=$lease"
		echo "staticroutes=$staticroutes"
		echo "serverid=$serverid"
	} > "$out/$1.tmp"
	mv "$out/$1.tmp" "$out/$1"
	if [ "$1" = bound ]; then
		%s ip addr add "$ip/$mask" dev "$interface" || true
	fi
	;;
esac
exit 0
`

// TestMain reports, as any user but root, that the privileged tests of the
// package did not run; the unit tests run as any user.
func TestMain(m *testing.M) {
	testenv.ReportPrivilegedNotRun("kvnet.io/kvnet/internal/dhcp")
	os.Exit(m.Run())
}

func TestServeUdhcpcPrivileged(t *testing.T) {
	testenv.NeedsRoot(t)
	busybox := "/usr/bin/busybox"
	if _, err := os.Stat(busybox); err != nil {
		// Fail rather than skip: a missing client must not pass as green.
		t.Fatalf("busybox (for udhcpc) not found: %v", err)
	}

	topo := newTopology(t)
	leases := NewStaticLeases()
	srv, err := New(Config{
		NetNS:     topo.router.path,
		Interface: gwIface,
		ServerIP:  gatewayPrefix.Addr(),
		Leases:    leases,
		Log:       testr.NewWithOptions(t, testr.Options{Verbosity: 1}),
	})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})

	leaseFor := func(ip string, host string) Lease {
		return Lease{
			IP:       netip.MustParsePrefix(ip),
			Router:   gatewayPrefix.Addr(),
			DNS:      []netip.Addr{netip.MustParseAddr("10.96.0.10"), netip.MustParseAddr("8.8.8.8")},
			MTU:      1400,
			Hostname: host,
			Domain:   "ns1.svc.cluster.local",
			Search:   []string{"ns1.svc.cluster.local", "cluster.local"},
			Routes: []Route{
				{Dst: netip.MustParsePrefix("10.1.0.0/16"), Via: netip.MustParseAddr("10.0.0.254")},
				{Dst: netip.MustParsePrefix("192.168.7.0/25"), Via: netip.MustParseAddr("10.0.0.253")},
			},
			LeaseTime: 2 * time.Hour,
		}
	}
	// wantEnv is what udhcpc must report for leaseFor(ip, host).
	wantEnv := func(ip, host string) map[string]string {
		return map[string]string{
			"ip":           ip,
			"subnet":       "255.255.255.0",
			"mask":         "24",
			"router":       "10.0.0.1",
			"dns":          "10.96.0.10 8.8.8.8",
			"mtu":          "1400",
			"hostname":     host,
			"domain":       "ns1.svc.cluster.local",
			"search":       "ns1.svc.cluster.local cluster.local",
			"lease":        "7200",
			"staticroutes": "10.1.0.0/16 10.0.0.254 192.168.7.0/25 10.0.0.253 0.0.0.0/0 10.0.0.1",
			"serverid":     "10.0.0.1",
		}
	}

	t.Run("client gets exactly the allocated lease", func(t *testing.T) {
		mac := net.HardwareAddr{0x02, 0x00, 0x0a, 0x00, 0x00, 0x05}
		leases.Set(mac, leaseFor("10.0.0.5/24", "vm-a"))
		g := topo.addGuest(t, "a", mac)
		out := t.TempDir()
		cmd := g.udhcpc(t, busybox, out, "-n", "-q", "-f")
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("udhcpc: %v\n%s", err, b)
		}
		assertEnv(t, readEnv(t, filepath.Join(out, "bound")), wantEnv("10.0.0.5", "vm-a"))
	})

	t.Run("unknown mac gets no lease", func(t *testing.T) {
		g := topo.addGuest(t, "u", net.HardwareAddr{0x02, 0x00, 0x0a, 0x00, 0x00, 0x99})
		out := t.TempDir()
		cmd := g.udhcpc(t, busybox, out, "-n", "-q", "-f", "-t", "2", "-T", "1")
		b, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		if !errors.As(err, &exit) {
			t.Fatalf("udhcpc for an unknown MAC: err = %v, want a non-zero exit\n%s", err, b)
		}
		if _, err := os.Stat(filepath.Join(out, "bound")); err == nil {
			t.Fatal("udhcpc for an unknown MAC reported a lease")
		}
	})

	t.Run("renewal keeps the address and picks up new options", func(t *testing.T) {
		mac := net.HardwareAddr{0x02, 0x00, 0x0a, 0x00, 0x00, 0x06}
		lease := leaseFor("10.0.0.6/24", "vm-b")
		leases.Set(mac, lease)
		g := topo.addGuest(t, "b", mac)
		out := t.TempDir()
		// No -q: udhcpc stays bound and renews on SIGUSR1 with a unicast
		// REQUEST from its address (RENEWING), which the server must
		// answer by unicast to ciaddr.
		cmd := g.udhcpc(t, busybox, out, "-n", "-f")
		var log strings.Builder
		cmd.Stdout, cmd.Stderr = &log, &log
		if err := cmd.Start(); err != nil {
			t.Fatalf("start udhcpc: %v", err)
		}
		t.Cleanup(func() {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			_ = cmd.Wait()
		})
		bound := waitFile(t, filepath.Join(out, "bound"), 20*time.Second, &log)
		want := wantEnv("10.0.0.6", "vm-b")
		assertEnv(t, readEnv(t, bound), want)

		// A pushed update reaches the guest on its next renewal.
		lease.DNS = []netip.Addr{netip.MustParseAddr("10.96.0.11")}
		leases.Set(mac, lease)
		if err := cmd.Process.Signal(syscall.SIGUSR1); err != nil {
			t.Fatalf("signal udhcpc to renew: %v", err)
		}
		renew := waitFile(t, filepath.Join(out, "renew"), 20*time.Second, &log)
		want["dns"] = "10.96.0.11"
		assertEnv(t, readEnv(t, renew), want)
	})
}

// TestServeStopsPrivileged checks that Close and context cancellation both
// end Serve with nil, that Close is idempotent, and that the port is free
// again afterwards (a restarted server can bind it).
func TestServeStopsPrivileged(t *testing.T) {
	testenv.NeedsRoot(t)
	n := newNetNS(t, "stop")
	cfg := Config{NetNS: n.path, Interface: "lo", ServerIP: netip.MustParseAddr("127.0.0.1"), Leases: NewStaticLeases()}
	tests := []struct {
		name string
		stop func(s *Server, cancel context.CancelFunc)
	}{
		{name: "close", stop: func(s *Server, _ context.CancelFunc) { _ = s.Close() }},
		{name: "cancel", stop: func(_ *Server, cancel context.CancelFunc) { cancel() }},
		{name: "cancel before serve", stop: nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, err := New(cfg)
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if tc.stop == nil {
				cancel()
			}
			done := make(chan error, 1)
			id := make(chan string, 1)
			go func() {
				id <- goroutineID()
				done <- s.Serve(ctx)
			}()
			if tc.stop != nil {
				// Stop only once Serve is parked in its socket read, so
				// that what is tested is Close or cancellation waking a
				// blocked read, never a Serve that had not started yet.
				waitBlockedInRead(t, <-id, done)
				tc.stop(s, cancel)
			}
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("Serve = %v, want nil", err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("Serve did not return")
			}
			if err := s.Close(); err != nil {
				t.Errorf("second Close = %v, want nil", err)
			}
		})
	}
}

// goroutineID returns the id of the calling goroutine, from the header
// ("goroutine <id> [running]:") of its stack trace.
func goroutineID() string {
	buf := make([]byte, 64)
	buf = buf[:runtime.Stack(buf, false)]
	return strings.Fields(string(buf))[1]
}

// waitBlockedInRead waits until goroutine id, which runs Serve, is parked
// waiting for the socket to become readable: its stack trace reads
// "goroutine <id> [IO wait" with Serve among its frames. Serve has nothing
// else to wait on, so this is the state the caller wants to interrupt. It
// fails t if Serve returns first or the state is not reached in 10s.
func waitBlockedInRead(t *testing.T, id string, done <-chan error) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	buf := make([]byte, 1<<20)
	for {
		select {
		case err := <-done:
			t.Fatalf("Serve returned %v before it was stopped", err)
		default:
		}
		for _, g := range strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
			if strings.HasPrefix(g, "goroutine "+id+" [IO wait") && strings.Contains(g, "dhcp.(*Server).Serve(") {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("Serve (goroutine %s) not blocked in its socket read after 10s", id)
		}
		time.Sleep(time.Millisecond)
	}
}

// netNS is a named network namespace with a netlink handle inside it.
type netNS struct {
	name string
	path string
	fd   netns.NsHandle
	nl   *netlink.Handle
}

// newNetNS creates a named netns (bind-mounted under /var/run/netns, so
// nsenter and Config.NetNS can use its path) and removes it at cleanup.
func newNetNS(t *testing.T, role string) *netNS {
	t.Helper()
	suffix := make([]byte, 4)
	_, _ = rand.Read(suffix)
	name := fmt.Sprintf("kvdhcp-%s-%s", role, hex.EncodeToString(suffix))

	// netns.NewNamed moves the calling thread into the new namespace;
	// do it on a locked thread and move back. If moving back fails the
	// thread stays locked, so the runtime discards it with the goroutine.
	var fd netns.NsHandle
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer orig.Close()
		fd, err = netns.NewNamed(name)
		if serr := netns.Set(orig); serr != nil {
			errc <- errors.Join(err, serr)
			return
		}
		runtime.UnlockOSThread()
		errc <- err
	}()
	if err := <-errc; err != nil {
		_ = netns.DeleteNamed(name)
		t.Fatalf("create netns %q: %v", name, err)
	}
	n := &netNS{name: name, path: filepath.Join("/var/run/netns", name), fd: fd}
	t.Cleanup(func() {
		if n.nl != nil {
			n.nl.Close()
		}
		_ = n.fd.Close()
		if err := netns.DeleteNamed(name); err != nil {
			t.Errorf("delete netns %q: %v", name, err)
		}
	})
	nl, err := netlink.NewHandleAt(fd)
	if err != nil {
		t.Fatalf("netlink handle in %q: %v", name, err)
	}
	n.nl = nl
	lo, err := nl.LinkByName("lo")
	if err == nil {
		err = nl.LinkSetUp(lo)
	}
	if err != nil {
		t.Fatalf("set lo up in %q: %v", name, err)
	}
	return n
}

type topology struct {
	sw, router *netNS
	bridge     netlink.Link
}

func newTopology(t *testing.T) *topology {
	t.Helper()
	tp := &topology{sw: newNetNS(t, "sw"), router: newNetNS(t, "rtr")}
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "br0"}}
	if err := tp.sw.nl.LinkAdd(br); err != nil {
		t.Fatalf("add bridge: %v", err)
	}
	if err := tp.sw.nl.LinkSetUp(br); err != nil {
		t.Fatalf("set bridge up: %v", err)
	}
	tp.bridge = br
	gw := tp.plug(t, tp.router, gwIface, "p-gw", nil)
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: gatewayPrefix.Addr().AsSlice(), Mask: net.CIDRMask(gatewayPrefix.Bits(), 32)}}
	if err := tp.router.nl.AddrAdd(gw, addr); err != nil {
		t.Fatalf("add %s to %s: %v", gatewayPrefix, gwIface, err)
	}
	return tp
}

// plug creates a veth named ifName in n (with mac, if given) whose peer
// is a bridge port named port, and brings both up.
func (tp *topology) plug(t *testing.T, n *netNS, ifName, port string, mac net.HardwareAddr) netlink.Link {
	t.Helper()
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: ifName, HardwareAddr: mac},
		PeerName:      port,
		PeerNamespace: netlink.NsFd(int(tp.sw.fd)),
	}
	if err := n.nl.LinkAdd(veth); err != nil {
		t.Fatalf("add veth %s in %s: %v", ifName, n.name, err)
	}
	p, err := tp.sw.nl.LinkByName(port)
	if err != nil {
		t.Fatalf("find bridge port %s: %v", port, err)
	}
	if err := tp.sw.nl.LinkSetMaster(p, tp.bridge); err != nil {
		t.Fatalf("attach %s to bridge: %v", port, err)
	}
	if err := tp.sw.nl.LinkSetUp(p); err != nil {
		t.Fatalf("set %s up: %v", port, err)
	}
	l, err := n.nl.LinkByName(ifName)
	if err != nil {
		t.Fatalf("find %s in %s: %v", ifName, n.name, err)
	}
	if err := n.nl.LinkSetUp(l); err != nil {
		t.Fatalf("set %s up in %s: %v", ifName, n.name, err)
	}
	return l
}

type guest struct{ ns *netNS }

// addGuest makes a guest netns whose eth0 has mac and sits on the bridge.
func (tp *topology) addGuest(t *testing.T, role string, mac net.HardwareAddr) *guest {
	t.Helper()
	g := &guest{ns: newNetNS(t, "g"+role)}
	tp.plug(t, g.ns, guestIface, "p-"+role, mac)
	return g
}

// udhcpc returns a command running busybox udhcpc on the guest's eth0,
// recording events under out.
func (g *guest) udhcpc(t *testing.T, busybox, out string, args ...string) *exec.Cmd {
	t.Helper()
	script := filepath.Join(t.TempDir(), "event.sh")
	if err := os.WriteFile(script, []byte(fmt.Sprintf(scriptTmpl, out, busybox)), 0o755); err != nil {
		t.Fatal(err)
	}
	// -F: exec udhcpc in place, so signals reach it directly.
	full := append([]string{"nsenter", "-n" + g.ns.path, "-F", busybox, "udhcpc", "-i", guestIface, "-s", script}, args...)
	return exec.Command(busybox, full...)
}

func waitFile(t *testing.T, path string, timeout time.Duration, log fmt.Stringer) string {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if _, err := os.Stat(path); err == nil {
			return path
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("no %s after %s; udhcpc output:\n%s", filepath.Base(path), timeout, log)
	return ""
}

func readEnv(t *testing.T, path string) map[string]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("read udhcpc event: %v", err)
	}
	defer f.Close()
	env := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), "=")
		env[k] = strings.TrimSpace(v)
	}
	t.Logf("client event %s: %v", filepath.Base(path), env)
	return env
}

func assertEnv(t *testing.T, got, want map[string]string) {
	t.Helper()
	for k, w := range want {
		if got[k] != w {
			t.Errorf("client %s = %q, want %q", k, got[k], w)
		}
	}
}
