package simlauncher

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/types"

	"kvnet.io/kvnet/internal/dhcp"
	"kvnet.io/kvnet/internal/lab/guest"
	"kvnet.io/kvnet/internal/lab/simvirt"
	"kvnet.io/kvnet/internal/nl"
	"kvnet.io/kvnet/internal/repo"
	"kvnet.io/kvnet/internal/testenv"
)

func TestMain(m *testing.M) {
	testenv.ReportPrivilegedNotRun("kvnet.io/kvnet/internal/lab/simlauncher")
	os.Exit(m.Run())
}

var (
	imageOnce sync.Once
	image     guest.Image
	imageErr  error
)

// testImage builds the guest image once per test binary.
func testImage(t *testing.T) guest.Image {
	t.Helper()
	imageOnce.Do(func() {
		root, err := repo.Root()
		if err != nil {
			imageErr = err
			return
		}
		image, imageErr = guest.EnsureImage(root)
	})
	if imageErr != nil {
		t.Fatal(imageErr)
	}
	return image
}

const (
	podMAC  = "0a:58:c0:a8:32:05"
	podIP   = "192.168.50.5/24"
	peerIP  = "192.168.50.9/24"
	podLink = "podabc1234567"
)

// pair makes a "pod" and a "peer" network namespace joined by a veth:
// podLink in the pod (MAC podMAC, podIP unless noIP), peer0 with peerIP
// in the peer. The pod's default route goes through the peer.
func pair(t *testing.T, noIP bool) (pod, peer string) {
	t.Helper()
	testenv.NeedsRoot(t)
	if err := guest.CheckQEMU(); err != nil {
		t.Fatal(err)
	}
	id := fmt.Sprintf("sl%d", time.Now().UnixNano()%1e8)
	pod, peer = id+"-pod", id+"-peer"
	for _, n := range []string{pod, peer} {
		if _, err := nl.CreateNamedNS(n); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { nl.DeleteNamedNS(n) })
	}
	cmds := [][]string{
		{"-n", pod, "link", "add", podLink, "address", podMAC, "type", "veth", "peer", "name", "peer0", "netns", peer},
		{"-n", pod, "link", "set", podLink, "up"},
		{"-n", peer, "addr", "add", peerIP, "dev", "peer0"},
		{"-n", peer, "link", "set", "peer0", "up"},
	}
	if !noIP {
		cmds = append(cmds,
			[]string{"-n", pod, "addr", "add", podIP, "dev", podLink},
			[]string{"-n", pod, "route", "add", "default", "via", "192.168.50.9"})
	}
	for _, c := range cmds {
		if out, err := exec.Command("ip", c...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v: %s", c, err, out)
		}
	}
	return nl.NSPath(pod), nl.NSPath(peer)
}

// boot starts a guest on p's tap in the pod namespace and waits for its
// lease on eth0.
func boot(t *testing.T, name, pod string, p *Plumbed) (*guest.VM, guest.Lease) {
	t.Helper()
	return bootNICs(t, name, pod, p)
}

// bootNICs starts a guest with a NIC on each p's tap (eth0, eth1, ...) in
// the pod namespace and waits for its lease on eth0 and for KVNET-READY
// (its services listen; the first DHCP round of every NIC is over).
func bootNICs(t *testing.T, name, pod string, ps ...*Plumbed) (*guest.VM, guest.Lease) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var nics []guest.NIC
	for _, p := range ps {
		nics = append(nics, guest.NIC{Tap: p.Tap, MAC: p.GuestMAC})
	}
	vm, err := guest.Start(ctx, guest.Config{Name: name, Image: testImage(t), NetNS: pod,
		NICs: nics, ConsoleLog: t.TempDir() + "/console.log"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { vm.Stop() })
	l, err := vm.WaitLease(ctx, "eth0")
	if err != nil {
		t.Fatal(err)
	}
	if err := vm.WaitReady(ctx); err != nil { // its services listen
		t.Fatal(err)
	}
	return vm, l
}

func echoFrom(ns string, addr netip.AddrPort) error {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	conn, err := guest.DialContext(ctx, ns, "tcp", addr.String())
	if err != nil {
		return err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(3 * time.Second))
	fmt.Fprintln(conn, "hello")
	got, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return err
	}
	if got != "hello\n" {
		return fmt.Errorf("echo %q", got)
	}
	return nil
}

// bridge binding: the guest takes the pod interface's MAC and, from the
// launcher's DHCP server, its IP; the pod interface keeps none; the peer
// reaches the guest. Plumbing again (a restarted lab) gives the same.
func TestBridgeBinding(t *testing.T) {
	pod, peer := pair(t, false)
	ifc := Iface{Name: "net1", PodIface: podLink, Binding: BindingBridge, Index: 1}
	p, err := Plumb(context.Background(), pod, ifc, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	if p.GuestMAC != podMAC || p.GuestIPv4 != netip.MustParsePrefix(podIP) || p.Tap != "tapabc1234567" {
		t.Fatalf("plumbed %+v, want guest MAC %s IP %s on tapabc1234567", p, podMAC, podIP)
	}
	p.Close()
	again, err := Plumb(context.Background(), pod, ifc, logr.Discard())
	if err != nil {
		t.Fatalf("plumbing again: %v", err)
	}
	t.Cleanup(func() { again.Close() })
	if again.GuestMAC != p.GuestMAC || again.GuestIPv4 != p.GuestIPv4 || again.Tap != p.Tap {
		t.Fatalf("plumbing again gave %+v, first %+v", again, p)
	}
	l, addrs, err := linkAddrs(pod, nicName(ifc))
	if err != nil || len(addrs) != 0 || l == podMAC {
		t.Fatalf("%s: MAC %s addresses %v (%v); want another MAC and no address", nicName(ifc), l, addrs, err)
	}
	_, lease := boot(t, "vm-bridge", pod, again)
	if lease.Addr != netip.MustParsePrefix(podIP) || lease.MAC.String() != podMAC || lease.Router != netip.MustParseAddr("192.168.50.9") {
		t.Fatalf("guest lease %+v, want %s for %s via 192.168.50.9", lease, podIP, podMAC)
	}
	if err := echoFrom(peer, netip.MustParseAddrPort("192.168.50.5:7")); err != nil {
		t.Fatalf("peer -> guest echo: %v", err)
	}
}

// bridge binding on a pod interface without an IP (a secondary network
// without IPAM): the launcher plumbs bridge, tap and renamed NIC as for any
// bridge interface but serves no DHCP, so the guest gets no lease on that
// NIC, while its other NIC, a bridge interface whose pod interface has an
// IP, does (the control). The NIC carries the guest's traffic all the
// same: given an address by hand, it reaches the network's peer with the
// pod interface's MAC.
func TestBridgeBindingWithoutIP(t *testing.T) {
	pod, peer := pair(t, false)
	const (
		secLink = "pod16477688c0e"
		secMAC  = "0a:58:c0:a8:3c:05"
	)
	for _, c := range [][]string{
		{"-n", nsName(pod), "link", "add", secLink, "address", secMAC, "type", "veth", "peer", "name", "peer1", "netns", nsName(peer)},
		{"-n", nsName(pod), "link", "set", secLink, "up"},
		{"-n", nsName(peer), "addr", "add", "192.168.60.9/24", "dev", "peer1"},
		{"-n", nsName(peer), "link", "set", "peer1", "up"},
	} {
		if out, err := exec.Command("ip", c...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v: %s", c, err, out)
		}
	}
	withIP, err := Plumb(context.Background(), pod, Iface{Name: "default", PodIface: podLink, Binding: BindingBridge}, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { withIP.Close() })
	sec := Iface{Name: "blue", PodIface: secLink, Binding: BindingBridge, Index: 1}
	p, err := Plumb(context.Background(), pod, sec, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	if p.GuestMAC != secMAC || p.GuestIPv4.IsValid() || p.GuestIPv6.IsValid() || p.Tap != "tap16477688c0e" {
		t.Fatalf("plumbed %+v, want guest MAC %s, no IP, tap16477688c0e", p, secMAC)
	}
	if p.srv != nil || p.srv6 != nil {
		t.Fatalf("plumbed %+v: the launcher serves DHCP or DHCPv6 for a pod interface without an IP", p)
	}
	// Bridge, tap and renamed NIC: the NIC and the tap are ports of the
	// bridge, which has no address (no DHCP server's).
	for _, port := range []string{nicName(sec), p.Tap} {
		out, err := ipOut(nsName(pod), "-j", "link", "show", "dev", port)
		if err != nil || !strings.Contains(string(out), `"master":"`+bridgeName(sec)+`"`) {
			t.Fatalf("%s is not a port of %s: %v %s", port, bridgeName(sec), err, out)
		}
	}
	if mac, addrs, err := linkAddrs(pod, bridgeName(sec)); err != nil || len(addrs) != 0 {
		t.Fatalf("%s (MAC %s): IPv4 addresses %v (%v), want none", bridgeName(sec), mac, addrs, err)
	}
	if mac, addrs, err := linkAddrs(pod, nicName(sec)); err != nil || len(addrs) != 0 || mac == secMAC {
		t.Fatalf("%s: MAC %s addresses %v (%v); want another MAC than %s and no address", nicName(sec), mac, addrs, err, secMAC)
	}

	// eth0 (the control) gets its lease; KVNET-READY comes after the first
	// DHCP round of every NIC, when eth1 would have had one too.
	vm, lease := bootNICs(t, "vm-noip", pod, withIP, p)
	if lease.Addr != netip.MustParsePrefix(podIP) {
		t.Fatalf("control: eth0 lease %+v, want %s", lease, podIP)
	}
	if l, ok := vm.Leases()["eth1"]; ok {
		t.Fatalf("the guest got a lease on eth1, whose pod interface has no IP: %+v", l)
	}
	if l, ok := vm.Leases6()["eth1"]; ok {
		t.Fatalf("the guest got a DHCPv6 lease on eth1, whose pod interface has no IP: %+v", l)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if out, err := guest.Exec(ctx, peer, netip.MustParseAddr("192.168.50.5"),
		"ip addr add 192.168.60.5/24 dev eth1 && ping -c 1 -W 10 192.168.60.9"); err != nil {
		t.Fatalf("guest eth1 -> peer 192.168.60.9 with an address set by hand: %v: %s", err, out)
	}
	out, err := ipOut(nsName(peer), "neigh", "show", "192.168.60.5", "dev", "peer1")
	if err != nil || !strings.Contains(string(out), secMAC) {
		t.Fatalf("the peer sees 192.168.60.5 at %q (%v), want the pod interface's MAC %s", out, err, secMAC)
	}
}

// managedTap: no DHCP server of the launcher's; the network's (here one in
// the peer, standing in for kvnet-node's) answers the guest.
func TestManagedTapBinding(t *testing.T) {
	pod, peer := pair(t, true)
	ifc := Iface{Name: "podnet", PodIface: podLink, Binding: BindingManagedTap}
	p, err := Plumb(context.Background(), pod, ifc, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	if p.GuestIPv4.IsValid() || p.srv != nil || p.Tap != "tap0" {
		t.Fatalf("plumbed %+v: a managedTap interface has no launcher DHCP and tap0", p)
	}
	leases := dhcp.NewStaticLeases()
	leases.Set(mustMAC(podMAC), dhcp.Lease{IP: netip.MustParsePrefix("192.168.50.77/24"), Router: netip.MustParseAddr("192.168.50.9"), MTU: 1400})
	srv, err := dhcp.New(dhcp.Config{NetNS: peer, Interface: "peer0", ServerIP: netip.MustParseAddr("192.168.50.9"), Leases: leases})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go srv.Serve(ctx)
	vm, lease := boot(t, "vm-managedtap", pod, p)
	if lease.Addr != netip.MustParsePrefix("192.168.50.77/24") || lease.MTU != 1400 {
		t.Fatalf("guest lease %+v, want the network server's 192.168.50.77/24 mtu 1400", lease)
	}

	// As a guest agent, the launcher reports the guest's NIC with the
	// address it leased; a guest that migrated away, or of another VMI,
	// is not asked.
	key := types.NamespacedName{Namespace: "ns", Name: "vm-managedtap"}
	l := &Launcher{guests: map[types.UID]*running{"new": {vmi: key, pod: "launcher-b", vm: vm, plumbed: []*Plumbed{p}}}}
	want := []simvirt.GuestInterface{{Name: "eth0", MAC: podMAC, IPs: []netip.Addr{netip.MustParseAddr("192.168.50.77")}}}
	if got, ok := l.GuestInterfaces("ns", "vm-managedtap"); !ok || fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("GuestInterfaces = %+v, %v; want %+v", got, ok, want)
	}
	if got, ok := l.GuestInterfaces("ns", "other"); ok {
		t.Fatalf("GuestInterfaces of a VMI without a guest = %+v, true", got)
	}
	l.guests["new"].moved = true
	if got, ok := l.GuestInterfaces("ns", "vm-managedtap"); ok {
		t.Fatalf("GuestInterfaces of a guest that migrated away = %+v, true", got)
	}
}

// masquerade: the guest has 10.0.2.2 behind NAT; only the listed ports
// reach it through the pod address; its own traffic leaves as the pod's.
func TestMasqueradeBinding(t *testing.T) {
	pod, peer := pair(t, false)
	ifc := Iface{Name: "default", PodIface: podLink, Binding: BindingMasquerade,
		Ports: []Port{{Port: int32(guest.HTTPPort)}, {Protocol: "TCP", Port: guest.ExecPort}}}
	p, err := Plumb(context.Background(), pod, ifc, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	_, lease := boot(t, "vm-masq", pod, p)
	if lease.Addr != netip.MustParsePrefix("10.0.2.2/24") || lease.Router != netip.MustParseAddr("10.0.2.1") {
		t.Fatalf("guest lease %+v, want 10.0.2.2/24 via 10.0.2.1", lease)
	}
	// A forwarded port: the guest's HTTP answers its name.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	testenv.Eventually(t, 30*time.Second, "HTTP through the pod address", func() error {
		return httpName(ctx, peer, "192.168.50.5:80", "vm-masq")
	})
	// Not forwarded (control: port 80 just answered).
	if err := echoFrom(peer, netip.MustParseAddrPort("192.168.50.5:7")); err == nil {
		t.Fatal("port 7 reached the guest though only 80 and 2323 are forwarded")
	}
	// The guest's own connection leaves as the pod's address.
	guestConnectsAs(t, ctx, peer, "192.168.50.9:8080", "wget -qO- http://192.168.50.9:8080/", "192.168.50.5:")
}

func mustMAC(s string) net.HardwareAddr {
	m, err := net.ParseMAC(s)
	if err != nil {
		panic(err)
	}
	return m
}

// linkAddrs is a link's MAC and IPv4 addresses in ns.
func linkAddrs(ns, name string) (string, []string, error) {
	l, err := link(nsName(ns), name)
	if err != nil {
		return "", nil, err
	}
	var addrs []string
	for _, a := range l.AddrInfo {
		if a.Family == "inet" {
			addrs = append(addrs, a.Local)
		}
	}
	return l.Address, addrs, nil
}

func nsName(path string) string { return path[strings.LastIndexByte(path, '/')+1:] }

// listenIn listens on TCP addr inside netns ns.
func listenIn(ns, addr string) (net.Listener, error) {
	var ln net.Listener
	err := nl.Do(ns, func() error {
		var err error
		ln, err = net.Listen("tcp", addr)
		return err
	})
	return ln, err
}

// masquerade with IPv6 on the pod, as KubeVirt v1.8.4's: NAT66 behind
// fd10:0:2::1/120 and a DHCPv6 server handing out fd10:0:2::2, but no
// router advertisements (kubevirt/kubevirt#19193). The guest's dhcpcd,
// which waits for an advertisement before it asks DHCPv6, gives up
// soliciting routers with no IPv6 address or route (its IPv4 lease is the
// control), and the pod's IPv6 address does not reach it. A dhcpcd told
// to ask for an address (ia_na) without waiting gets fd10:0:2::2, still
// without a route: a connection to the guest through the pod's IPv6
// address goes unanswered. With the static configuration KubeVirt's docs
// give for dual-stack masquerade (fd10:0:2::2/120, default route via
// fd10:0:2::1), the forwarded ports reach the guest through the pod's
// IPv6 address and its own traffic leaves as that address.
func TestMasqueradeIPv6(t *testing.T) {
	pod, peer := pair(t, false)
	for _, c := range [][]string{
		{"-n", nsName(pod), "-6", "addr", "add", "fd00:50::5/64", "dev", podLink, "nodad"},
		{"-n", nsName(pod), "-6", "route", "add", "default", "via", "fd00:50::9"},
		{"-n", nsName(peer), "-6", "addr", "add", "fd00:50::9/64", "dev", "peer0", "nodad"},
	} {
		if out, err := exec.Command("ip", c...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v: %s", c, err, out)
		}
	}
	dns := netip.MustParseAddr("fd00:96::a")
	ifc := Iface{Name: "default", PodIface: podLink, Binding: BindingMasquerade,
		Ports: []Port{{Port: int32(guest.HTTPPort)}, {Port: guest.ExecPort}},
		DNS:   []netip.Addr{netip.MustParseAddr("10.96.0.10"), dns}}
	p, err := Plumb(context.Background(), pod, ifc, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	if p.GuestIPv6 != netip.MustParsePrefix("fd10:0:2::2/120") {
		t.Fatalf("plumbed guest IPv6 %s, want fd10:0:2::2/120", p.GuestIPv6)
	}
	vm, lease := boot(t, "vm-masq6", pod, p)
	if lease.Addr != netip.MustParsePrefix("10.0.2.2/24") || lease.Router != netip.MustParseAddr("10.0.2.1") {
		t.Fatalf("control: guest lease %+v, want 10.0.2.2/24 via 10.0.2.1", lease)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	// In the guest, through the forwarded exec port of the pod's IPv4
	// address.
	run := func(command string) (string, error) {
		rctx, rcancel := context.WithTimeout(ctx, 30*time.Second)
		defer rcancel()
		return guest.Exec(rctx, peer, netip.MustParseAddr("192.168.50.5"), command)
	}
	const (
		addrs  = "ip -6 -o addr show dev eth0 scope global"
		routes = "ip -6 route show default"
	)
	// ipv6Config is what eth0 has of global IPv6 addresses and default
	// routes (empty: nothing).
	ipv6Config := func() (string, error) {
		out, err := run(addrs + "; " + routes)
		if err != nil {
			return "", fmt.Errorf("guest %q: %w: %s", addrs+"; "+routes, err, out)
		}
		return strings.TrimSpace(out), nil
	}

	// By itself: dhcpcd solicits routers, gets no advertisement and gives
	// up (MAX_RTR_SOLICITATIONS, about 12 s) without ever asking DHCPv6.
	var dhcpcdLog string
	poll(t, ctx, 90*time.Second, "the guest's dhcpcd giving up soliciting routers", func() (bool, error) {
		if cfg, err := ipv6Config(); err != nil || cfg != "" {
			if err == nil {
				t.Errorf("the guest configured IPv6 by itself, without router advertisements:\n%s", cfg)
				return true, nil
			}
			return false, err
		}
		out, err := run("cat /run/dhcpcd.log")
		dhcpcdLog = out
		if err != nil {
			return false, err
		}
		return strings.Contains(out, "eth0: no IPv6 Routers available"), nil
	})
	if cfg, err := ipv6Config(); err != nil || cfg != "" {
		t.Errorf("after dhcpcd gave up: the guest's IPv6 addresses and default routes %q (%v), want none\ndhcpcd log:\n%s", cfg, err, dhcpcdLog)
	}
	if l, ok := vm.Leases6()["eth0"]; ok {
		t.Errorf("the guest reported a DHCPv6 lease without router advertisements: %+v", l)
	}
	if err := httpName(ctx, peer, "192.168.50.5:80", "vm-masq6"); err != nil {
		t.Fatalf("control: HTTP through the pod's IPv4 address: %v", err)
	}
	if err := httpName(ctx, peer, "[fd00:50::5]:80", "vm-masq6"); err == nil {
		t.Errorf("the pod's IPv6 address reached the guest, which has no IPv6 address")
	}

	// DHCPv6 without an advertisement: dhcpcd with an explicit IA_NA asks
	// at once and gets fd10:0:2::2 (and the DNS server), but no route.
	if out, err := run("dhcpcd -f /etc/dhcpcd.conf -x eth0 && (cat /etc/dhcpcd.conf; echo ia_na) >/run/dhcpcd-ia.conf && dhcpcd -b -f /run/dhcpcd-ia.conf eth0"); err != nil {
		t.Fatalf("guest: restart dhcpcd with ia_na: %v: %s", err, out)
	}
	lctx, lcancel := context.WithTimeout(ctx, time.Minute)
	defer lcancel()
	lease6, err := vm.WaitLease6(lctx, "eth0")
	if err != nil {
		out, lerr := run("cat /run/dhcpcd.log")
		t.Fatalf("%v\nthe guest's /run/dhcpcd.log (%v):\n%s", err, lerr, out)
	}
	if lease6.IP() != netip.MustParseAddr("fd10:0:2::2") || lease6.MAC.String() != p.GuestMAC ||
		lease6.Router.IsValid() || !slices.Equal(lease6.DNS, []netip.Addr{dns}) {
		t.Errorf("guest DHCPv6 lease %+v, want fd10:0:2::2 for %s without a router, DNS %s", lease6, p.GuestMAC, dns)
	}
	// The guest holds fd10:0:2::2 (a /128: nothing tells it the /120)
	// and no default route, so it cannot answer the peer.
	if cfg, err := ipv6Config(); err != nil || !strings.Contains(cfg, " fd10:0:2::2/128 ") || strings.Contains(cfg, "default") {
		t.Errorf("with the DHCPv6 lease: the guest's IPv6 addresses and default routes %q (%v), want fd10:0:2::2/128 and no route", cfg, err)
	}
	if err := httpName(ctx, peer, "[fd00:50::5]:80", "vm-masq6"); err == nil {
		t.Errorf("the pod's IPv6 address reached the guest, which has no route back")
	}

	// The workaround: stop dhcpcd (it removes its address) and configure
	// the guest as KubeVirt's docs do.
	if out, err := run("dhcpcd -f /run/dhcpcd-ia.conf -x eth0 && ip -6 addr add fd10:0:2::2/120 dev eth0 && ip -6 route add default via fd10:0:2::1"); err != nil {
		t.Fatalf("guest: static IPv6 configuration: %v: %s", err, out)
	}
	// A forwarded port through the pod's IPv6 address (once the guest's
	// address passed DAD).
	testenv.Eventually(t, 30*time.Second, "HTTP through the pod's IPv6 address", func() error {
		return httpName(ctx, peer, "[fd00:50::5]:80", "vm-masq6")
	})
	// Port 7 is not forwarded; the guest does serve it over IPv6 (control:
	// from the pod, straight to the guest's address).
	if err := echoFrom(pod, netip.MustParseAddrPort("[fd10:0:2::2]:7")); err != nil {
		t.Fatalf("control: pod -> guest [fd10:0:2::2]:7: %v", err)
	}
	if err := echoFrom(peer, netip.MustParseAddrPort("[fd00:50::5]:7")); err == nil {
		t.Fatal("port 7 reached the guest over IPv6 though it is not forwarded")
	}
	// The guest's own connection leaves, by its static default route, as
	// the pod's address.
	guestConnectsAs(t, ctx, peer, "[fd00:50::9]:8080", "timeout 20 wget -qO- http://[fd00:50::9]:8080/", "[fd00:50::5]:")
}

// httpName fetches / from the guest's HTTP server at addr from netns ns
// (one attempt, 3 s) and returns an error unless it answers name.
func httpName(ctx context.Context, ns, addr, name string) error {
	dctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	conn, err := guest.DialContext(dctx, ns, "tcp", addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(3 * time.Second))
	fmt.Fprintf(conn, "GET / HTTP/1.0\r\n\r\n")
	b, _ := io.ReadAll(conn)
	if !strings.Contains(string(b), name) {
		return fmt.Errorf("answer %q", b)
	}
	return nil
}

// poll calls f every 500 ms until it reports done or fails the test
// after timeout (or when ctx ends) with what and f's last error.
func poll(t *testing.T, ctx context.Context, timeout time.Duration, what string, f func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for {
		done, err := f()
		if done {
			return
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			t.Fatalf("%s: not after %s (last error: %v)", what, timeout, err)
		}
		select {
		case <-ctx.Done():
		case <-tick.C:
		}
	}
}

// guestConnectsAs runs command (a wget to listen) in the guest behind
// pod address 192.168.50.5 and fails unless the peer, listening on listen
// in namespace peer, sees the connection come from an address starting
// with want (the pod's: masquerade).
func guestConnectsAs(t *testing.T, ctx context.Context, peer, listen, command, want string) {
	t.Helper()
	ln, err := listenIn(peer, listen)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	from := make(chan string, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			from <- err.Error()
			return
		}
		from <- c.RemoteAddr().String()
		c.Write([]byte("HTTP/1.0 200 OK\r\n\r\nok\n"))
		c.Close()
	}()
	if out, err := guest.Exec(ctx, peer, netip.MustParseAddr("192.168.50.5"), command); err != nil {
		t.Fatalf("guest -> %s: %v: %s", listen, err, out)
	}
	if got := <-from; !strings.HasPrefix(got, want) {
		t.Fatalf("the peer saw the guest's connection from %s, want the pod address %s*", got, want)
	}
}
