package datapath

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"kvnet.io/kvnet/internal/nl"
	"kvnet.io/kvnet/internal/testenv/netiptest"
	"kvnet.io/kvnet/internal/testenv/nstest"
)

// pushPort is where the server s of TestPolicyConnectionAcrossMigration
// listens; echoPort+1 is allowed to c but closed on x.
const pushPort = 9000

// TestPolicyConnectionAcrossMigration: VM x, whose ingress is isolated
// (only c may connect, on the echo port and the closed port next to it),
// has a connection open to server s when it moves to another node (its
// port is torn down on n2 and made again on n3 into the same namespace,
// so the guest's socket lives on and n3's conntrack has never seen the
// connection). After the move the server sends first: every byte arrives,
// then every byte x sends back. s's own connections to x stay refused
// (timing out, where c's to a closed port are reset), before and after.
// A policy change that still allows the connection (x's egress isolated
// to s's port) keeps it; one that no longer does cuts it, both ways.
func TestPolicyConnectionAcrossMigration(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 3)
	rt := gatewayRoutes("10.1.1.1")
	n1, n2, n3 := c.nodes[0], c.nodes[1], c.nodes[2]
	s := c.addPod(n1, "s", "tenant-a_udn", nil, netiptest.MustPrefixes("10.1.1.2/24"), rt)
	x := c.addPod(n2, "x", "tenant-a_udn", nil, netiptest.MustPrefixes("10.1.1.3/24"), rt)
	cl := c.addPod(n1, "c", "tenant-a_udn", nil, netiptest.MustPrefixes("10.1.1.4/24"), rt)
	nets := []Network{tenantA}
	c.applyAll(nets)
	startEcho(t, x)
	accepted, done := make(chan net.Conn, 1), make(chan struct{})
	t.Cleanup(func() { close(done) })
	ln := nstest.Listen(t, s.ns, fmt.Sprintf(":%d", pushPort))
	nstest.Serve(ln, func(conn net.Conn) { accepted <- conn; <-done }) // open until the test ends

	pp := netip.MustParsePrefix
	fromC := PolicyRule{Name: "x/x-from-c ingress[0]", Peers: []netip.Prefix{pp("10.1.1.4/32")},
		Ports: []PolicyPort{{Protocol: "TCP", Port: echoPort, EndPort: echoPort + 1}}}
	pols := map[string]PortPolicy{"x": {Ingress: &PolicyDirection{Policies: []string{"x/x-from-c"}, Rules: []PolicyRule{fromC}}}}
	c.applyPolicies(nets, pols)
	xIP := x.ips[0].Addr()
	checkRefusals := func(when string) {
		t.Helper()
		// Positive control first: c reaches x's echo server, and is reset
		// on the closed port its rule allows.
		if token, err := echoSession(cl, xIP, 1); err != nil || token != "x" {
			t.Fatalf("%s: c to x's echo port: %q, %v; want x's answer", when, token, err)
		}
		if err := dialOutcome(cl, netip.AddrPortFrom(xIP, echoPort+1)); !errors.Is(err, syscall.ECONNREFUSED) {
			t.Fatalf("%s: c to x's closed port: %v; want a reset (connection refused)", when, err)
		}
		if err := dialOutcome(s, netip.AddrPortFrom(xIP, echoPort)); !isTimeout(err) {
			t.Fatalf("%s: s to x's echo port: %v; want a time-out (refused by x's ingress policy)", when, err)
		}
	}
	checkRefusals("before the migration")

	// x opens its connection to s (x's egress is not isolated).
	conn, err := nstest.Dial(x.ns, netip.AddrPortFrom(s.ips[0].Addr(), pushPort).String(), 5*time.Second)
	if err != nil {
		t.Fatalf("x to s: %v", err)
	}
	t.Cleanup(func() { conn.Close() })
	var sconn net.Conn
	select {
	case sconn = <-accepted:
		t.Cleanup(func() { sconn.Close() })
	case <-time.After(10 * time.Second):
		t.Fatal("s accepted no connection from x")
	}
	// No keep-alive probes (Go's default, every 15 s): x's would let the
	// connection on n3 start from x's side.
	for _, cn := range []net.Conn{conn, sconn} {
		c.must(cn.(*net.TCPConn).SetKeepAlive(false))
	}
	exchange(t, "before the migration", sconn, conn, 1024)

	// The migration: x's port leaves n2 and is made on n3, into x's own
	// namespace (the guest, with its socket); every node applies its new
	// state with x's policy on n3.
	c.must(nl.Do(n2.ns, func() error { return TeardownPodInterface(x.hostIf) }))
	x.node, x.hostIf = n3, "vxmig"
	c.must(nl.Do(n3.ns, func() error {
		return SetupPodInterface(x.ns, "eth0", x.hostIf, x.mac, x.ips, rt, n3.dp.MTU())
	}))
	c.applyPolicies(nets, pols)

	// The server speaks first on n3, which never saw the connection open.
	exchange(t, "after the migration", sconn, conn, 256<<10)
	checkRefusals("after the migration")

	// x's egress isolated to s's port: the connection, picked up on n3 as
	// s's, is judged both ways and kept.
	toS := PolicyRule{Name: "x/x-to-s egress[0]", Peers: []netip.Prefix{pp("10.1.1.2/32")},
		Ports: []PolicyPort{{Protocol: "TCP", Port: pushPort}}}
	pols["x"] = PortPolicy{Ingress: pols["x"].Ingress, Egress: &PolicyDirection{Policies: []string{"x/x-to-s"}, Rules: []PolicyRule{toS}}}
	c.applyPolicies(nets, pols)
	exchange(t, "with x's egress allowing s's port", sconn, conn, 64<<10)
	checkRefusals("with x's egress allowing s's port")

	// x's egress to another port only: the connection is cut, both ways,
	// and stays cut as the server keeps trying.
	toS.Ports = []PolicyPort{{Protocol: "TCP", Port: pushPort + 1}}
	toS.Name = "x/x-to-s egress[1]"
	pols["x"] = PortPolicy{Ingress: pols["x"].Ingress, Egress: &PolicyDirection{Policies: []string{"x/x-to-s"}, Rules: []PolicyRule{toS}}}
	c.applyPolicies(nets, pols)
	for _, d := range []struct {
		what     string
		from, to net.Conn
	}{{"s to x", sconn, conn}, {"x to s", conn, sconn}, {"s to x again", sconn, conn}} {
		if _, err := d.from.Write([]byte("cut?\n")); err != nil {
			continue // reset: cut all the same
		}
		_ = d.to.SetReadDeadline(time.Now().Add(2 * time.Second))
		if n, err := d.to.Read(make([]byte, 16)); err == nil {
			t.Fatalf("%s after the policy stopped allowing the connection: %d bytes arrived", d.what, n)
		}
	}
	checkRefusals("after the cut")
}

// exchange sends n bytes from the server side (sconn) first, then n from
// the client (conn), and fails unless every byte arrives in order.
func exchange(t *testing.T, when string, sconn, conn net.Conn, n int) {
	t.Helper()
	for _, d := range []struct {
		what     string
		from, to net.Conn
	}{{"server to client", sconn, conn}, {"client to server", conn, sconn}} {
		data := make([]byte, n)
		for i := range data {
			data[i] = byte(i % 251)
		}
		werr := make(chan error, 1)
		go func() {
			_ = d.from.SetWriteDeadline(time.Now().Add(60 * time.Second))
			_, err := d.from.Write(data)
			werr <- err
		}()
		_ = d.to.SetReadDeadline(time.Now().Add(60 * time.Second))
		got := make([]byte, n)
		if k, err := io.ReadFull(d.to, got); err != nil {
			t.Fatalf("%s, %s: %d of %d bytes arrived: %v", when, d.what, k, n, err)
		}
		if !bytes.Equal(got, data) {
			t.Fatalf("%s, %s: the bytes differ", when, d.what)
		}
		if err := <-werr; err != nil {
			t.Fatalf("%s, %s: write: %v", when, d.what, err)
		}
	}
}

// dialOutcome connects from p to dst and returns nil if it connected, or
// the error: a reset is syscall.ECONNREFUSED, a policy drop a time-out.
func dialOutcome(p *pod, dst netip.AddrPort) error {
	conn, err := nstest.Dial(p.ns, dst.String(), 3*time.Second)
	if err != nil {
		return err
	}
	conn.Close()
	return nil
}

// isTimeout reports whether err is a dial's time-out.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
