package dhcp

import (
	"context"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/vishvananda/netlink"

	"kvnet.io/kvnet/internal/testenv"
	"kvnet.io/kvnet/internal/testenv/nstest"
)

// startServer6 plugs a router namespace's gw0 with the gateway MAC into
// the topology's bridge and runs a Server6 there. stop stops the server
// and unplugs the router, as when a VM migrates away from a node.
func (tp *topology) startServer6(t *testing.T, role string, leases Leases) (stop func()) {
	t.Helper()
	rtr := newNetNS(t, role)
	tp.plug(t, rtr, gwIface, "p-"+role, gwMAC6)
	srv, err := New6(Config6{
		NetNS: rtr.path, Interface: gwIface, Leases: leases,
		Prefixes: []netip.Prefix{netip.MustParsePrefix("2001:db8::/64")}, MTU: 1400, DefaultRouter: true,
		Log: testr.NewWithOptions(t, testr.Options{Verbosity: 1}),
	})
	if err != nil {
		t.Fatalf("New6: %v", err)
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
	return stop
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
