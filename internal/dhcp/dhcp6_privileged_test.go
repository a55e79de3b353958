package dhcp

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/go-logr/logr/testr"
	"github.com/vishvananda/netlink"
	"golang.org/x/net/ipv6"
	"golang.org/x/sys/unix"

	"kvnet.io/kvnet/internal/testenv"
	"kvnet.io/kvnet/internal/testenv/nstest"
)

// startServer6 plugs a router namespace's gw0 with the gateway MAC into
// the topology's bridge and runs a Server6 there. stop stops the server
// and unplugs the router, as when a VM migrates away from a node.
func (tp *topology) startServer6(t *testing.T, role string, leases Leases) (stop func()) {
	t.Helper()
	stop, _ = tp.startServer6With(t, role, leases, nil)
	return stop
}

// startServer6With is startServer6 with cfg changed by edit and the server
// given to prepare before it serves.
func (tp *topology) startServer6With(t *testing.T, role string, leases Leases, edit func(*Config6), prepare ...func(*Server6)) (stop func(), srv *Server6) {
	t.Helper()
	rtr := newNetNS(t, role)
	tp.plug(t, rtr, gwIface, "p-"+role, gwMAC6)
	cfg := Config6{
		NetNS: rtr.path, Interface: gwIface, Leases: leases,
		Prefixes: []netip.Prefix{netip.MustParsePrefix("2001:db8::/64")}, MTU: 1400, DefaultRouter: true,
		Log: testr.NewWithOptions(t, testr.Options{Verbosity: 1}),
	}
	if edit != nil {
		edit(&cfg)
	}
	srv, err := New6(cfg)
	if err != nil {
		t.Fatalf("New6: %v", err)
	}
	for _, p := range prepare {
		p(srv)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-served; err != nil {
				t.Errorf("Serve6 in %s: %v", role, err)
			}
			if err := tp.sw.nl.LinkDel(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "p-" + role}}); err != nil {
				t.Errorf("unplug %s: %v", role, err)
			}
		})
	}
	t.Cleanup(stop)
	return stop, srv
}

// TestServe6DHCPCDPrivileged runs dhcpcd, the lab guest's DHCPv6 client,
// against Server6: the guest gets its address, DNS and search list from
// DHCPv6 and its default route from the router advertisement, takes no
// SLAAC address, and renews with the same server DUID after the server
// moved to another namespace (another node after a live migration).
func TestServe6DHCPCDPrivileged(t *testing.T) {
	testenv.NeedsRoot(t)
	topo := newTopology(t)
	lease := lease6
	// A short lease: dhcpcd renews at T1, half of it.
	lease.LeaseTime = 16 * time.Second
	leases := NewStaticLeases()
	leases.Set(guestMAC6, lease)
	stopA := topo.startServer6(t, "rtra", leases)

	g := topo.addGuest(t, "v6", guestMAC6)
	client := nstest.DHCPCD6(t, g.ns.path, guestIface)
	bound := client.Event(t, "BOUND6", 30*time.Second)
	gwLL := "fe80::858:a9ff:fefe:7" // EUI-64 of gwMAC6
	want := map[string]string{
		"ip":     "2001:db8::5",
		"dns":    "fd00:10:96::a",
		"search": "ns1.svc.cluster.local cluster.local",
		"route":  "default via " + gwLL + " proto ra",
	}
	assertEnv(t, bound, want)
	// Only the leased address: the advertised prefix is not for SLAAC.
	if got := strings.Fields(bound["global"]); len(got) != 1 || !strings.HasPrefix(got[0], "2001:db8::5/") {
		t.Errorf("global addresses %q, want only 2001:db8::5", bound["global"])
	}

	// The VM migrates: its node's server goes, the target's (another
	// namespace, the same gateway MAC and so the same DUID) comes, and
	// the guest's Renew, naming the first server, gets its answer there.
	stopA()
	leases.Set(guestMAC6, lease)
	topo.startServer6(t, "rtrb", leases)
	renew := client.Event(t, "RENEW6", 30*time.Second)
	want["serverid"] = bound["serverid"]
	assertEnv(t, renew, want)
	if client.Happened("REBIND6") {
		t.Error("dhcpcd rebound: the target's server did not answer its Renew")
	}
}

// TestServe6DHClientPrivileged is TestServe6DHCPCDPrivileged with a
// second client, ISC dhclient -6 (Debian's isc-dhcp-client), which does
// no router solicitation of its own: the guest's kernel takes the
// advertisement (default route, on-link prefix, no SLAAC) and dhclient
// the address (a /128), DNS and search list; it renews with the same
// server DUID from a server in another namespace.
func TestServe6DHClientPrivileged(t *testing.T) {
	testenv.NeedsRoot(t)
	topo := newTopology(t)
	lease := lease6
	// A short lease: dhclient renews at T1, half of it.
	lease.LeaseTime = 16 * time.Second
	leases := NewStaticLeases()
	leases.Set(guestMAC6, lease)
	stopA := topo.startServer6(t, "rtra", leases)

	g := topo.addGuest(t, "v6", guestMAC6)
	client := nstest.DHClient6(t, g.ns.path, guestIface)
	bound := client.Event(t, "BOUND6", 30*time.Second)
	assertEnv(t, bound, map[string]string{
		"ip":     "2001:db8::5",
		"dns":    "fd00:10:96::a",
		"search": "ns1.svc.cluster.local. cluster.local.", // dhclient writes names absolute
	})
	gwLL := "fe80::858:a9ff:fefe:7" // EUI-64 of gwMAC6
	testenv.Eventually(t, 30*time.Second, "the guest's default route and addresses", func() error {
		route, err := exec.Command("nsenter", "-n"+g.ns.path, "ip", "-6", "route", "show", "default").CombinedOutput()
		if err != nil {
			return fmt.Errorf("%v: %s", err, route)
		}
		if f := strings.Fields(string(route)); len(f) < 5 || strings.Join(f[:5], " ") != "default via "+gwLL+" dev "+guestIface {
			return fmt.Errorf("default route %q, want via %s", route, gwLL)
		}
		if !strings.Contains(string(route), "proto ra") {
			return fmt.Errorf("default route %q not from the advertisement", route)
		}
		addrs, err := exec.Command("nsenter", "-n"+g.ns.path, "ip", "-6", "-o", "addr", "show", "dev", guestIface, "scope", "global").CombinedOutput()
		if err != nil {
			return fmt.Errorf("%v: %s", err, addrs)
		}
		// Only the leased address, as a /128: the prefix is not for SLAAC.
		if n := strings.Count(string(addrs), "inet6 "); n != 1 || !strings.Contains(string(addrs), "inet6 2001:db8::5/128 ") {
			return fmt.Errorf("global addresses %q, want only 2001:db8::5/128", addrs)
		}
		return nil
	})

	stopA()
	leases.Set(guestMAC6, lease)
	topo.startServer6(t, "rtrb", leases)
	renew := client.Event(t, "RENEW6", 30*time.Second)
	assertEnv(t, renew, map[string]string{"ip": "2001:db8::5", "serverid": bound["serverid"]})
	if client.Happened("REBIND6") {
		t.Error("dhclient rebound: the target's server did not answer its Renew")
	}
}

// TestServe6RAFloodPrivileged: a guest sends 100 router solicitations
// within about a second; the server answers with at most one multicast
// advertisement per MIN_DELAY_BETWEEN_RAS (3 s) of the flood, plus the
// one that may be due at its start, and does answer: the guest receives
// an advertisement once the flood has begun. The advertisements carry
// the leases' DNS servers and search list (RDNSS, DNSSL).
func TestServe6RAFloodPrivileged(t *testing.T) {
	testenv.NeedsRoot(t)
	topo := newTopology(t)
	_, srv := topo.startServer6With(t, "rtra", leases6(), nil)
	g := topo.addGuest(t, "v6", guestMAC6)

	var conn *ipv6.PacketConn
	var raw net.PacketConn
	if err := ns.WithNetNSPath(g.ns.path, func(ns.NetNS) error {
		var err error
		raw, err = net.ListenPacket("ip6:ipv6-icmp", "::")
		if err != nil {
			return err
		}
		conn = ipv6.NewPacketConn(raw)
		var f ipv6.ICMPFilter
		f.SetAll(true)
		f.Accept(ipv6.ICMPTypeRouterAdvertisement)
		ifc, err := net.InterfaceByName(guestIface)
		if err != nil {
			return err
		}
		return errors.Join(conn.SetICMPFilter(&f), conn.SetMulticastHopLimit(255), conn.SetMulticastInterface(ifc))
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = raw.Close() })
	// Every advertisement the guest receives, from now on.
	ras := make(chan []byte, 1024)
	go func() {
		buf := make([]byte, 1500)
		for {
			n, _, _, err := conn.ReadFrom(buf)
			if err != nil {
				close(ras)
				return
			}
			ras <- slices.Clone(buf[:n])
		}
	}()
	rs := []byte{icmp6RouterSolicitation, 0, 0, 0, 0, 0, 0, 0, ndOptSourceLinkAddr, 1}
	rs = append(rs, guestMAC6...)
	dst := &net.IPAddr{IP: allRouters.AsSlice()} // the interface is cm's: a zone would name the host's
	ifc, err := g.ns.nl.LinkByName(guestIface)
	if err != nil {
		t.Fatal(err)
	}
	// The solicitations go from the guest's link-local address once it
	// has left duplicate address detection.
	testenv.Eventually(t, 30*time.Second, "the guest's link-local address", func() error {
		addrs, err := g.ns.nl.AddrList(ifc, netlink.FAMILY_V6)
		if err != nil {
			return err
		}
		for _, a := range addrs {
			if a.IP.IsLinkLocalUnicast() && a.Flags&unix.IFA_F_TENTATIVE == 0 {
				return nil
			}
		}
		return fmt.Errorf("addresses %v", addrs)
	})
	cm := &ipv6.ControlMessage{HopLimit: 255, IfIndex: ifc.Attrs().Index}

	before := srv.raSent.Load()
	start := time.Now()
	tick := time.NewTicker(10 * time.Millisecond) // pacing the flood: 100 in about a second
	for range 100 {
		<-tick.C
		if _, err := conn.WriteTo(rs, cm, dst); err != nil {
			t.Fatalf("send router solicitation: %v", err)
		}
	}
	tick.Stop()
	// Positive control: the flood is answered.
	var got []*routerAdvert
	testenv.Eventually(t, 30*time.Second, "an advertisement after the solicitations", func() error {
		for {
			select {
			case b := <-ras:
				ra, err := parseRA(b)
				if err != nil {
					return err
				}
				got = append(got, ra)
			default:
				if srv.raSent.Load() == before || len(got) == 0 {
					return fmt.Errorf("no advertisement yet (%d sent)", srv.raSent.Load()-before)
				}
				return nil
			}
		}
	})
	sent := srv.raSent.Load() - before
	elapsed := time.Since(start)
	// One may be due as the flood begins; then one per 3 s at most.
	if limit := 2 + int64(elapsed/minDelayBetweenRAs); sent > limit {
		t.Errorf("%d multicast advertisements for 100 solicitations over %s, want at most %d", sent, elapsed, limit)
	}
	t.Logf("%d multicast advertisements for 100 solicitations over %s", sent, elapsed)
	ra := got[len(got)-1]
	if fmt.Sprint(ra.DNS) != "[fd00:10:96::a]" || !slices.Equal(ra.Search, lease6.Search) {
		t.Errorf("advertisement DNS %v search %v, want the lease's IPv6 server and search list", ra.DNS, ra.Search)
	}
}
