package datapath

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"kvnet.io/kvnet/internal/nl"
	"kvnet.io/kvnet/internal/testenv/netiptest"
	"kvnet.io/kvnet/internal/testenv/nstest"
)

func primaryNet(name string, id int, subnet, gw string) Network {
	return Network{Name: name, ID: id, Primary: true,
		Subnets:  []netip.Prefix{netip.MustParsePrefix(subnet)},
		Gateways: []netip.Addr{netip.MustParseAddr(gw)}}
}

func addr(s string) netip.Addr { return netip.MustParseAddr(s) }

// twoTenants builds three nodes and two primary networks that both use
// 10.1.1.0/24 with gateway 10.1.1.1. The pods share addresses across
// tenants on purpose, some on the same node:
//
//	a1 n1 10.1.1.2 (A)   b1 n1 10.1.1.3 (B)
//	a2 n2 10.1.1.3 (A)   b3 n2 10.1.1.4 (B)
//	                     b2 n3 10.1.1.2 (B)
func twoTenants(t *testing.T) (*cluster, map[string]*pod, []Network) {
	c := newCluster(t, 3)
	nets := []Network{
		primaryNet("tenant-a_udn", 1, "10.1.1.0/24", "10.1.1.1"),
		primaryNet("tenant-b_udn", 2, "10.1.1.0/24", "10.1.1.1"),
	}
	rt := gatewayRoutes("10.1.1.1")
	n1, n2, n3 := c.nodes[0], c.nodes[1], c.nodes[2]
	pods := map[string]*pod{
		"a1": c.addPod(n1, "a1", "tenant-a_udn", nil, netiptest.MustPrefixes("10.1.1.2/24"), rt),
		"b1": c.addPod(n1, "b1", "tenant-b_udn", nil, netiptest.MustPrefixes("10.1.1.3/24"), rt),
		"a2": c.addPod(n2, "a2", "tenant-a_udn", nil, netiptest.MustPrefixes("10.1.1.3/24"), rt),
		"b3": c.addPod(n2, "b3", "tenant-b_udn", nil, netiptest.MustPrefixes("10.1.1.4/24"), rt),
		"b2": c.addPod(n3, "b2", "tenant-b_udn", nil, netiptest.MustPrefixes("10.1.1.2/24"), rt),
	}
	c.applyAll(nets)
	for _, p := range pods {
		startEcho(t, p)
	}
	return c, pods, nets
}

// TestTenantIsolation: same-tenant pods on different nodes ping each other
// and hold TCP connections; the same address in the other tenant is never
// the one answering, and nothing of tenant B (pods, router, transit) is
// reachable from tenant A.
func TestTenantIsolation(t *testing.T) {
	t.Parallel()
	c, pods, _ := twoTenants(t)

	reach := []struct {
		from string
		to   netip.Addr
		want string // pod whose token must answer
	}{
		{"a1", addr("10.1.1.3"), "a2"}, // b1 holds 10.1.1.3 too, on a1's own node
		{"a2", addr("10.1.1.2"), "a1"}, // b2 holds 10.1.1.2 too
		{"b2", addr("10.1.1.3"), "b1"}, // a2 holds 10.1.1.3 too
		{"b1", addr("10.1.1.2"), "b2"},
		{"b1", addr("10.1.1.4"), "b3"},
	}
	for _, r := range reach {
		t.Run(fmt.Sprintf("%s to %s", r.from, r.to), func(t *testing.T) {
			if err := ping(pods[r.from].ns, netip.Addr{}, r.to, 3*time.Second, true); err != nil {
				t.Fatal(err)
			}
			token, err := echoSession(pods[r.from], r.to, 5)
			if err != nil {
				t.Fatal(err)
			}
			if token != r.want {
				t.Fatalf("answered by %q, want %q", token, r.want)
			}
		})
	}

	routerB, nodeB, _ := TransitAddrs(2, false)
	unreachable := []struct {
		why     string
		to      netip.Addr
		counter string // node 1 rule that must count the attempt ("" = none, L2 miss)
	}{
		{"tenant B pod address not used in A", addr("10.1.1.4"), ""},
		{"tenant B router transit address", routerB, "no forwarding between tenant routers"},
		{"tenant B node-side transit address", nodeB, "network tenant-a_udn: no other network's IPv4 transit address"},
	}
	for _, u := range unreachable {
		t.Run("a1 cannot reach "+u.why, func(t *testing.T) {
			before := counters(t, c.nodes[0])[u.counter]
			if err := ping(pods["a1"].ns, netip.Addr{}, u.to, time.Second, true); !errors.Is(err, errTimeout) {
				t.Fatalf("ping %s: %v, want a timeout", u.to, err)
			}
			if conn, err := nstest.Dial(pods["a1"].ns, netip.AddrPortFrom(u.to, echoPort).String(), time.Second); err == nil {
				conn.Close()
				t.Fatalf("TCP to %s connected", u.to)
			}
			if after := counters(t, c.nodes[0])[u.counter]; u.counter != "" && after <= before {
				t.Errorf("counter %q %d -> %d: the attempt was not stopped by the rule meant for it", u.counter, before, after)
			}
		})
	}
	t.Run("a1 reaches its own gateway", func(t *testing.T) {
		if err := ping(pods["a1"].ns, netip.Addr{}, addr("10.1.1.1"), 3*time.Second, true); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("gateway stays off the overlay", func(t *testing.T) {
		// Every router answered ARP for 10.1.1.1 broadcasts from remote
		// pods; those answers must have died at their own VXLAN port.
		var stopped uint64
		for _, nd := range c.nodes {
			stopped += counters(t, nd)["network tenant-a_udn: gateway MAC never leaves on the overlay"]
			if err := withHandle(nd.ns, func(h *nl.Handle) error {
				entries, err := vxlanFDB(h, 1)
				if err != nil {
					return err
				}
				for _, e := range entries {
					if e.HardwareAddr.String() == GatewayMAC(1).String() {
						return fmt.Errorf("%s: gateway MAC in the FDB of %s: %+v", nd.name, VXLANName(1), e)
					}
				}
				return nil
			}); err != nil {
				t.Error(err)
			}
		}
		if stopped == 0 {
			t.Errorf("no gateway frame was stopped at a VXLAN port; expected the remote routers' ARP replies")
		}
	})
}

// TestEgress: pods reach the external namespace, which sees the node's
// underlay address as the source; two tenants with the same pod address
// do so at the same time.
func TestEgress(t *testing.T) {
	t.Parallel()
	c, pods, _ := twoTenants(t)
	ln := nstest.Listen(t, c.ext, netip.AddrPortFrom(internetIP, 8080).String())
	nstest.Serve(ln, func(conn net.Conn) {
		host, _, _ := net.SplitHostPort(conn.RemoteAddr().String())
		fmt.Fprintf(conn, "%s\n", host)
	})
	for _, tc := range []struct {
		pod  string
		node netip.Addr
	}{
		{"a1", c.nodes[0].ip}, // 10.1.1.2 in tenant A on n1
		{"b2", c.nodes[2].ip}, // 10.1.1.2 in tenant B on n3
		{"b1", c.nodes[0].ip}, // tenant B on n1, next to a1
	} {
		t.Run(tc.pod, func(t *testing.T) {
			p := pods[tc.pod]
			if err := ping(p.ns, netip.Addr{}, internetIP, 3*time.Second, true); err != nil {
				t.Fatal(err)
			}
			conn, err := nstest.Dial(p.ns, netip.AddrPortFrom(internetIP, 8080).String(), 2*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			_ = conn.SetDeadline(time.Now().Add(3 * time.Second))
			buf := make([]byte, 64)
			n, err := conn.Read(buf)
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.TrimSpace(string(buf[:n])); got != tc.node.String() {
				t.Fatalf("external side saw source %s, want node address %s", got, tc.node)
			}
		})
	}
	t.Run("outside cannot open connections into a router", func(t *testing.T) {
		routerA, _, _ := TransitAddrs(1, false)
		// The external host routes the router's transit address to node 1
		// and tries to come in.
		if err := withHandle(c.ext, func(h *nl.Handle) error {
			dev, err := h.LinkByName(underlayDev)
			if err != nil {
				return err
			}
			return h.RouteAdd(&netlink.Route{LinkIndex: dev.Attrs().Index, Dst: ipNet(hostPrefix(routerA)), Gw: net.IP(c.nodes[0].ip.AsSlice())})
		}); err != nil {
			t.Fatal(err)
		}
		before := counters(t, c.nodes[0])["only replies enter tenant routers"]
		if err := ping(c.ext, netip.Addr{}, routerA, time.Second, true); !errors.Is(err, errTimeout) {
			t.Fatalf("ping router transit address from outside: %v, want a timeout", err)
		}
		if after := counters(t, c.nodes[0])["only replies enter tenant routers"]; after <= before {
			t.Errorf("counter %d -> %d: not stopped by the node's forward rule", before, after)
		}
	})
}

// TestAntiSpoofing: a pod using an address or MAC it was not given cannot
// reach its peer and the drop counters say why; DHCP from 0.0.0.0 passes.
func TestAntiSpoofing(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 2)
	a1, a2 := c.tenantAPair("a1", "a2")
	peer := addr("10.1.1.3")
	dp := c.nodes[0].dp
	counter := func(what string) uint64 {
		t.Helper()
		ctrs, err := dp.Counters()
		if err != nil {
			t.Fatal(err)
		}
		key := fmt.Sprintf("port %s: %s", a1.hostIf, what)
		v, ok := ctrs[key]
		if !ok {
			t.Fatalf("no counter %q in %v", key, ctrs)
		}
		return v
	}

	if err := ping(a1.ns, netip.Addr{}, peer, 3*time.Second, true); err != nil {
		t.Fatalf("baseline: %v", err)
	}

	t.Run("foreign source IP", func(t *testing.T) {
		before := counter("spoofed IPv4 source")
		spoofed := addr("10.1.1.99")
		if err := podLink(a1, func(h *nl.Handle, l netlink.Link) error {
			return h.AddrAdd(l, &netlink.Addr{IPNet: ipNet(netip.PrefixFrom(spoofed, 32))})
		}); err != nil {
			t.Fatal(err)
		}
		if err := ping(a1.ns, spoofed, peer, time.Second, true); !errors.Is(err, errTimeout) {
			t.Fatalf("ping from %s: %v, want a timeout", spoofed, err)
		}
		if after := counter("spoofed IPv4 source"); after <= before {
			t.Errorf("spoofed IPv4 source counter %d -> %d, want an increase", before, after)
		}
		if err := ping(a1.ns, netip.Addr{}, peer, 3*time.Second, true); err != nil {
			t.Errorf("own address no longer works: %v", err)
		}
	})

	t.Run("foreign MAC", func(t *testing.T) {
		before := counter("spoofed source MAC")
		setMAC := func(mac net.HardwareAddr) error {
			return podLink(a1, func(h *nl.Handle, l netlink.Link) error {
				if err := h.LinkSetDown(l); err != nil {
					return err
				}
				if err := h.LinkSetHardwareAddr(l, mac); err != nil {
					return err
				}
				return h.LinkSetUp(l)
			})
		}
		if err := setMAC(net.HardwareAddr{0x02, 0xba, 0xd0, 0, 0, 1}); err != nil {
			t.Fatal(err)
		}
		if err := ping(a1.ns, netip.Addr{}, peer, time.Second, true); !errors.Is(err, errTimeout) {
			t.Fatalf("ping with a foreign MAC: %v, want a timeout", err)
		}
		if after := counter("spoofed source MAC"); after <= before {
			t.Errorf("spoofed source MAC counter %d -> %d, want an increase", before, after)
		}
		if err := setMAC(a1.mac); err != nil {
			t.Fatal(err)
		}
		if err := ping(a1.ns, netip.Addr{}, peer, 3*time.Second, true); err != nil {
			t.Errorf("own MAC no longer works: %v", err)
		}
	})

	t.Run("DHCP from 0.0.0.0 passes", func(t *testing.T) {
		var pc net.PacketConn
		if err := nl.Do(a2.ns, func() (err error) {
			pc, err = net.ListenPacket("udp4", "0.0.0.0:67")
			return err
		}); err != nil {
			t.Fatal(err)
		}
		defer pc.Close()
		before := counter("spoofed IPv4 source")
		payload := []byte("kvnet dhcp discover")
		frame := udpFrame(a1.mac, net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff},
			netip.IPv4Unspecified(), addr("255.255.255.255"), 68, 67, payload)
		if err := sendRawFrame(a1, frame); err != nil {
			t.Fatal(err)
		}
		_ = pc.SetReadDeadline(time.Now().Add(3 * time.Second))
		buf := make([]byte, 1500)
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			t.Fatalf("DHCP broadcast did not reach the peer on the other node: %v", err)
		}
		if string(buf[:n]) != string(payload) || !strings.HasPrefix(from.String(), "0.0.0.0:68") {
			t.Errorf("peer got %q from %s", buf[:n], from)
		}
		if after := counter("spoofed IPv4 source"); after != before {
			t.Errorf("spoofed IPv4 source counter %d -> %d, want unchanged", before, after)
		}
	})

	t.Run("forged UDP from a foreign IP is dropped", func(t *testing.T) {
		var pc net.PacketConn
		if err := nl.Do(a2.ns, func() (err error) {
			pc, err = net.ListenPacket("udp4", "0.0.0.0:9999")
			return err
		}); err != nil {
			t.Fatal(err)
		}
		defer pc.Close()
		frame := udpFrame(a1.mac, a2.mac, addr("10.1.1.77"), peer, 1234, 9999, []byte("forged"))
		if err := sendRawFrame(a1, frame); err != nil {
			t.Fatal(err)
		}
		_ = pc.SetReadDeadline(time.Now().Add(time.Second))
		if _, _, err := pc.ReadFrom(make([]byte, 100)); err == nil {
			t.Fatal("forged datagram reached the peer")
		}
	})
}

// TestMACMove: pod X moves from node 2 to node 3 with its MAC and IP (as
// a live-migrated VM does); right after Apply on all nodes, pod Y on node
// 1 reaches it with a single 1-second ping.
func TestMACMove(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 3)
	y, x := c.tenantAPair("y", "x")
	nets, rt := []Network{tenantA}, gatewayRoutes("10.1.1.1")
	xIP := addr("10.1.1.3")
	for range 3 {
		if err := ping(y.ns, netip.Addr{}, xIP, 3*time.Second, true); err != nil {
			t.Fatalf("before the move: %v", err)
		}
	}
	if err := ping(x.ns, netip.Addr{}, addr("10.1.1.2"), 3*time.Second, true); err != nil {
		t.Fatalf("before the move, x to y: %v", err)
	}

	// Tear X down on node 2, bring it up with the same MAC and IP on node 3.
	if err := nl.Do(x.node.ns, func() error { return TeardownPodInterface(x.hostIf) }); err != nil {
		t.Fatal(err)
	}
	x.node = nil
	x2 := c.addPod(c.nodes[2], "x2", "tenant-a_udn", x.mac, x.ips, rt)
	startEcho(t, x2)
	c.applyAll(nets)

	if err := ping(y.ns, netip.Addr{}, xIP, time.Second, false); err != nil {
		t.Fatalf("right after the move, one ping: %v", err)
	}
	token, err := echoSession(y, xIP, 2)
	if err != nil || token != "x2" {
		t.Fatalf("after the move: answered by %q (%v), want x2", token, err)
	}
	// The FDB entry moved rather than being added next to the old one.
	if err := withHandle(c.nodes[0].ns, func(h *nl.Handle) error {
		entries, err := vxlanFDB(h, 1)
		if err != nil {
			return err
		}
		var dsts []string
		for _, e := range entries {
			if isSelf(e) && e.HardwareAddr.String() == x.mac.String() {
				dsts = append(dsts, e.IP.String())
			}
		}
		if !slices.Equal(dsts, []string{c.nodes[2].ip.String()}) {
			return fmt.Errorf("FDB destinations of %s on n1 = %v, want [%s]", x.mac, dsts, c.nodes[2].ip)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// TestReconcileFromScratch: a new Datapath object applying a smaller state
// removes what the first one made for the dropped networks, plus planted
// leftovers; applying again changes nothing.
func TestReconcileFromScratch(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 2)
	n1 := c.nodes[0]
	a := primaryNet("tenant-a_udn", 1, "10.1.1.0/24", "10.1.1.1")
	b := primaryNet("tenant-b_udn", 2, "10.2.2.0/24", "10.2.2.1")
	l2 := Network{Name: "l2", ID: 3}
	pa := c.addPod(n1, "pa", a.Name, nil, netiptest.MustPrefixes("10.1.1.2/24"), gatewayRoutes("10.1.1.1"))
	pb := c.addPod(n1, "pb", b.Name, nil, netiptest.MustPrefixes("10.2.2.2/24"), gatewayRoutes("10.2.2.1"))
	pl := c.addPod(n1, "pl", l2.Name, nil, netiptest.MustPrefixes("192.0.2.1/24"), nil)
	pl.l2only = true
	c.applyAll([]Network{a, b, l2})
	if err := ping(pb.ns, netip.Addr{}, addr("10.2.2.1"), 3*time.Second, true); err != nil {
		t.Fatalf("tenant B before: %v", err)
	}

	// Leftovers a previous run could have left: a stale remote MAC on
	// kvvx1 and an unknown interface on kvbr1.
	stale := net.HardwareAddr{0x02, 0xde, 0xad, 0, 0, 1}
	if err := withHandle(n1.ns, func(h *nl.Handle) error {
		vx, err := h.LinkByName(VXLANName(1))
		if err != nil {
			return err
		}
		if err := h.NeighSet(&netlink.Neigh{LinkIndex: vx.Attrs().Index, Family: unix.AF_BRIDGE,
			State: netlink.NUD_PERMANENT, Flags: netlink.NTF_SELF, HardwareAddr: stale, IP: net.ParseIP("192.168.100.77")}); err != nil {
			return err
		}
		if err := h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "stray0"}, PeerName: "stray1"}); err != nil {
			return err
		}
		stray, err := h.LinkByName("stray0")
		if err != nil {
			return err
		}
		br, err := h.LinkByName(BridgeName(1))
		if err != nil {
			return err
		}
		if err := h.LinkSetMaster(stray, br); err != nil {
			return err
		}
		return h.LinkSetUp(stray)
	}); err != nil {
		t.Fatal(err)
	}

	// A new process: fresh Datapath, no memory of the first.
	n1.dp.Close()
	dp, err := New(NodeConfig{Name: n1.name, NetNS: n1.ns, UnderlayIP: n1.ip, UnderlayDev: underlayDev})
	if err != nil {
		t.Fatal(err)
	}
	n1.dp = dp
	pb.node, pl.node = nil, nil // their networks are gone from this node's state
	small := c.state(n1, []Network{a})
	if err := dp.Apply(context.Background(), small); err != nil {
		t.Fatal(err)
	}

	if err := withHandle(n1.ns, func(h *nl.Handle) error {
		for _, gone := range []string{BridgeName(2), VXLANName(2), gwPortName(2), transitName(2), BridgeName(3), VXLANName(3)} {
			if _, err := h.LinkByName(gone); !errors.Is(err, nl.ErrNotFound) {
				return fmt.Errorf("link %s still there (%v)", gone, err)
			}
		}
		for _, kept := range []string{BridgeName(1), VXLANName(1), gwPortName(1), transitName(1)} {
			if _, err := h.LinkByName(kept); err != nil {
				return fmt.Errorf("link %s of the kept network: %w", kept, err)
			}
		}
		stray, err := h.LinkByName("stray0")
		if err != nil {
			return err
		}
		if stray.Attrs().MasterIndex != 0 || stray.Attrs().Flags&net.FlagUp != 0 {
			return fmt.Errorf("stray0 still attached (master %d) or up", stray.Attrs().MasterIndex)
		}
		for _, p := range []*pod{pb, pl} {
			l, err := h.LinkByName(p.hostIf)
			if err != nil {
				return err
			}
			if l.Attrs().MasterIndex != 0 || l.Attrs().Flags&net.FlagUp != 0 {
				return fmt.Errorf("port %s of a removed network still attached or up", p.hostIf)
			}
		}
		entries, err := vxlanFDB(h, 1)
		if err != nil {
			return err
		}
		for _, e := range entries {
			if e.HardwareAddr.String() == stale.String() {
				return fmt.Errorf("stale FDB entry %s -> %s still there", stale, e.IP)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if nl.NamedNSExists(RouterNSName(dp.cfg, 2)) {
		t.Errorf("router namespace of the removed network still exists")
	}
	if !nl.NamedNSExists(RouterNSName(dp.cfg, 1)) {
		t.Errorf("router namespace of the kept network is gone")
	}
	rules := nodeRuleDump(t, dp)
	for _, gone := range []string{pb.hostIf, pl.hostIf, "tenant-b_udn"} {
		if strings.Contains(rules, gone) {
			t.Errorf("node rules still mention %q:\n%s", gone, rules)
		}
	}
	if !strings.Contains(rules, pa.hostIf) {
		t.Errorf("node rules lost port %s:\n%s", pa.hostIf, rules)
	}
	if err := ping(pa.ns, netip.Addr{}, addr("10.1.1.1"), 3*time.Second, true); err != nil {
		t.Errorf("kept network broken: %v", err)
	}

	// Applying the same state again is a no-op: no errors, same links,
	// same rule handles (no chain was rewritten, so counters survive).
	linksBefore := linkIndexes(t, n1.ns)
	rulesBefore := nodeRuleDump(t, dp)
	routerBefore := routerRuleDump(t, dp, 1)
	if routerBefore == "" {
		t.Fatal("no rules in the router namespace")
	}
	for range 2 {
		if err := dp.Apply(context.Background(), small); err != nil {
			t.Fatal(err)
		}
	}
	if after := linkIndexes(t, n1.ns); !mapsEqual(linksBefore, after) {
		t.Errorf("links changed on a repeated Apply:\n%v\n%v", linksBefore, after)
	}
	if after := nodeRuleDump(t, dp); after != rulesBefore {
		t.Errorf("rules changed on a repeated Apply:\n%s\n---\n%s", rulesBefore, after)
	}
	if after := routerRuleDump(t, dp, 1); after != routerBefore {
		t.Errorf("router rules changed on a repeated Apply:\n%s\n---\n%s", routerBefore, after)
	}

	// And the empty state removes everything kvnet owns.
	if err := dp.Apply(context.Background(), State{}); err != nil {
		t.Fatal(err)
	}
	if names, _ := nl.ListNamedNS(routerNSPrefix(dp.cfg)); len(names) != 0 {
		t.Errorf("router namespaces left: %v", names)
	}
	if rules := nodeRuleDump(t, dp); rules != "" {
		t.Errorf("rules left:\n%s", rules)
	}
	if err := withHandle(n1.ns, func(h *nl.Handle) error {
		links, err := h.LinkList()
		if err != nil {
			return err
		}
		for _, l := range links {
			if _, _, owned := parseOwnedLink(l.Attrs().Name); owned {
				return fmt.Errorf("link %s left", l.Attrs().Name)
			}
		}
		return nil
	}); err != nil {
		t.Error(err)
	}
}

// counters returns node nd's rule counters.
func counters(t *testing.T, nd *node) map[string]uint64 {
	t.Helper()
	ctrs, err := nd.dp.Counters()
	if err != nil {
		t.Fatal(err)
	}
	return ctrs
}

// nodeRuleDump lists the node's kvnet rules with their handles.
func nodeRuleDump(t *testing.T, dp *Datapath) string {
	t.Helper()
	return ruleDump(t, int(dp.nsh))
}

// routerRuleDump lists the kvnet rules of a router namespace.
func routerRuleDump(t *testing.T, dp *Datapath, id int) string {
	t.Helper()
	var out string
	if err := withNS(nl.NSPath(RouterNSName(dp.cfg, id)), func(fd int) error {
		out = ruleDump(t, fd)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

// ruleDump lists the kvnet rules in the namespace of fd with their handles.
func ruleDump(t *testing.T, fd int) string {
	t.Helper()
	conn, err := nftConn(fd)
	if err != nil {
		t.Fatal(err)
	}
	tables, err := conn.ListTables()
	if err != nil {
		t.Fatal(err)
	}
	var sb strings.Builder
	for _, tb := range tables {
		if tb.Name != tableName {
			continue
		}
		chains, err := conn.ListChainsOfTableFamily(tb.Family)
		if err != nil {
			t.Fatal(err)
		}
		for _, ch := range chains {
			if ch.Table.Name != tableName {
				continue
			}
			rules, err := conn.GetRules(tb, ch)
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range rules {
				fmt.Fprintf(&sb, "%s %s #%d %q\n", familyNames[tb.Family], ch.Name, r.Handle, r.UserData)
			}
		}
	}
	return sb.String()
}

func linkIndexes(t *testing.T, ns string) map[string]int {
	t.Helper()
	out := map[string]int{}
	if err := withHandle(ns, func(h *nl.Handle) error {
		links, err := h.LinkList()
		for _, l := range links {
			out[l.Attrs().Name] = l.Attrs().Index
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

func mapsEqual(a, b map[string]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// TestSecondaryL2: a secondary network without subnets carries traffic
// between pods on two nodes that the test addressed statically.
func TestSecondaryL2(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 2)
	nets := []Network{{Name: "ns1/l2", ID: 10}}
	p1 := c.addPod(c.nodes[0], "s1", "ns1/l2", nil, netiptest.MustPrefixes("192.0.2.1/24"), nil)
	p2 := c.addPod(c.nodes[1], "s2", "ns1/l2", nil, netiptest.MustPrefixes("192.0.2.2/24"), nil)
	p1.l2only, p2.l2only = true, true
	c.applyAll(nets)
	startEcho(t, p2)
	if err := ping(p1.ns, netip.Addr{}, addr("192.0.2.2"), 3*time.Second, true); err != nil {
		t.Fatal(err)
	}
	token, err := echoSession(p1, addr("192.0.2.2"), 3)
	if err != nil || token != "s2" {
		t.Fatalf("echo: %q, %v", token, err)
	}
	// No router for a secondary network.
	if names, _ := nl.ListNamedNS(routerNSPrefix(c.nodes[0].dp.cfg)); len(names) != 0 {
		t.Errorf("router namespaces for a secondary network: %v", names)
	}
	// Pure L2: the port may use any IP; its MAC is still enforced.
	if err := podLink(p1, func(h *nl.Handle, l netlink.Link) error {
		return h.AddrAdd(l, &netlink.Addr{IPNet: ipNet(netip.MustParsePrefix("198.18.0.1/24"))})
	}); err != nil {
		t.Fatal(err)
	}
	if err := podLink(p2, func(h *nl.Handle, l netlink.Link) error {
		return h.AddrAdd(l, &netlink.Addr{IPNet: ipNet(netip.MustParsePrefix("198.18.0.2/24"))})
	}); err != nil {
		t.Fatal(err)
	}
	if err := ping(p1.ns, netip.Addr{}, addr("198.18.0.2"), 3*time.Second, true); err != nil {
		t.Fatalf("second subnet on an L2 network: %v", err)
	}
}

// TestSetupPodInterfaceIdempotent: SetupPodInterface twice leaves one
// correctly configured pair; Teardown twice is fine.
func TestSetupPodInterfaceIdempotent(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 1)
	nd := c.nodes[0]
	p := c.addPod(nd, "i1", "x", nil, netiptest.MustPrefixes("10.9.0.2/24"), gatewayRoutes("10.9.0.1"))
	setup := func(ips []netip.Prefix) error {
		return nl.Do(nd.ns, func() error {
			return SetupPodInterface(p.ns, "eth0", p.hostIf, p.mac, ips, gatewayRoutes("10.9.0.1"), 1400)
		})
	}
	if err := setup(netiptest.MustPrefixes("10.9.0.3/24")); err != nil {
		t.Fatal(err)
	}
	if err := podLink(p, func(h *nl.Handle, l netlink.Link) error {
		addrs, err := h.AddrList(l, unix.AF_INET)
		if err != nil {
			return err
		}
		if len(addrs) != 1 || addrs[0].IPNet.String() != "10.9.0.3/24" {
			return fmt.Errorf("addresses %v, want only 10.9.0.3/24", addrs)
		}
		if l.Attrs().MTU != 1400 || l.Attrs().HardwareAddr.String() != p.mac.String() {
			return fmt.Errorf("mtu %d mac %s", l.Attrs().MTU, l.Attrs().HardwareAddr)
		}
		routes, err := h.RouteListFiltered(unix.AF_INET, &netlink.Route{Dst: nil}, 0)
		if err != nil {
			return err
		}
		for _, r := range routes {
			if r.Dst == nil || r.Dst.String() == "0.0.0.0/0" {
				return nil
			}
		}
		return fmt.Errorf("no default route: %v", routes)
	}); err != nil {
		t.Fatal(err)
	}
	if err := withHandle(nd.ns, func(h *nl.Handle) error {
		l, err := h.LinkByName(p.hostIf)
		if err != nil {
			return err
		}
		if l.Attrs().Flags&net.FlagUp != 0 {
			return fmt.Errorf("host end is up before Apply attached it")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := nl.Do(nd.ns, func() error { return TeardownPodInterface(p.hostIf) }); err != nil {
			t.Fatal(err)
		}
	}
	if err := podLink(p, func(*nl.Handle, netlink.Link) error { return nil }); !errors.Is(err, nl.ErrNotFound) {
		t.Fatalf("pod end after teardown: %v, want gone", err)
	}
}

// TestDualStack: a primary network with an IPv4 and an IPv6 subnet routes
// both families on the overlay and at the gateway, and the IPv6 source
// check holds.
func TestDualStack(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 2)
	n := Network{Name: "ds", ID: 7, Primary: true,
		Subnets:  []netip.Prefix{netip.MustParsePrefix("10.7.0.0/24"), netip.MustParsePrefix("fd00:7::/64")},
		Gateways: []netip.Addr{addr("10.7.0.1"), addr("fd00:7::1")}}
	rt := []Route{{Dst: netip.MustParsePrefix("0.0.0.0/0"), Via: addr("10.7.0.1")},
		{Dst: netip.MustParsePrefix("::/0"), Via: addr("fd00:7::1")}}
	p1 := c.addPod(c.nodes[0], "d1", n.Name, nil, []netip.Prefix{netip.MustParsePrefix("10.7.0.2/24"), netip.MustParsePrefix("fd00:7::2/64")}, rt)
	c.addPod(c.nodes[1], "d2", n.Name, nil, []netip.Prefix{netip.MustParsePrefix("10.7.0.3/24"), netip.MustParsePrefix("fd00:7::3/64")}, rt)
	c.applyAll([]Network{n})
	for _, dst := range []string{"10.7.0.3", "fd00:7::3", "10.7.0.1", "fd00:7::1"} {
		if err := ping(p1.ns, netip.Addr{}, addr(dst), 3*time.Second, true); err != nil {
			t.Errorf("ping %s: %v", dst, err)
		}
	}
	key := fmt.Sprintf("port %s: spoofed IPv6 source", p1.hostIf)
	before := counters(t, c.nodes[0])[key]
	spoofed := addr("fd00:7::99")
	if err := podLink(p1, func(h *nl.Handle, l netlink.Link) error {
		return h.AddrAdd(l, &netlink.Addr{IPNet: ipNet(netip.PrefixFrom(spoofed, 128)), Flags: unix.IFA_F_NODAD})
	}); err != nil {
		t.Fatal(err)
	}
	if err := ping(p1.ns, spoofed, addr("fd00:7::3"), time.Second, true); !errors.Is(err, errTimeout) {
		t.Fatalf("ping from %s: %v, want a timeout", spoofed, err)
	}
	if after := counters(t, c.nodes[0])[key]; after <= before {
		t.Errorf("%q %d -> %d, want an increase", key, before, after)
	}
}

// vxlanFDB returns the bridge FDB entries of network id's VXLAN device.
func vxlanFDB(h *nl.Handle, id int) ([]netlink.Neigh, error) {
	vx, err := h.LinkByName(VXLANName(id))
	if err != nil {
		return nil, err
	}
	return h.NeighList(vx.Attrs().Index, unix.AF_BRIDGE)
}
