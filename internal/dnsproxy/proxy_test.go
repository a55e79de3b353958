package dnsproxy

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"slices"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

// upstream runs a stand-in cluster DNS on UDP and TCP at addr answering
// every A query with answer.
func upstream(t *testing.T, addr string, answer netip.Addr) {
	t.Helper()
	reply := func(q []byte) []byte {
		var m dnsmessage.Message
		if m.Unpack(q) != nil || len(m.Questions) != 1 {
			return nil
		}
		m.Response = true
		m.Answers = []dnsmessage.Resource{{Header: hdr(m.Questions[0].Name.String(), dnsmessage.TypeA), Body: &dnsmessage.AResource{A: answer.As4()}}}
		b, _ := m.Pack()
		return b
	}
	pc, err := net.ListenPacket("udp4", addr)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp4", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close(); ln.Close() })
	go func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			if b := reply(buf[:n]); b != nil {
				_, _ = pc.WriteTo(b, from)
			}
		}
	}()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				for {
					q, err := readFramed(c)
					if err != nil {
						return
					}
					if err := writeFramed(c, reply(q)); err != nil {
						return
					}
				}
			}()
		}
	}()
}

func query(t *testing.T, id uint16) []byte {
	t.Helper()
	return pack(t, dnsmessage.Message{Header: dnsmessage.Header{ID: id, RecursionDesired: true},
		Questions: []dnsmessage.Question{{Name: name("web.ns.svc.cluster.local."), Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET}}})
}

// askUDP sends a query from laddr to the proxy at addr and returns the
// answer's addresses.
func askUDP(t *testing.T, laddr, addr string) []netip.Addr {
	t.Helper()
	c, err := net.DialUDP("udp4", net.UDPAddrFromAddrPort(netip.MustParseAddrPort(laddr)), net.UDPAddrFromAddrPort(netip.MustParseAddrPort(addr)))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := c.Write(query(t, 42)); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1500)
	n, err := c.Read(buf)
	if err != nil {
		t.Fatal(err)
	}
	return addrsOf(t, buf[:n])
}

func askTCP(t *testing.T, addr string) ([]netip.Addr, error) {
	t.Helper()
	c, err := net.Dial("tcp4", addr)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	if err := writeFramed(c, query(t, 43)); err != nil {
		return nil, err
	}
	resp, err := readFramed(c)
	if err != nil {
		return nil, err
	}
	return addrsOf(t, resp), nil
}

// TestProxyRewritesAndFollowsSync: a client's UDP and TCP queries get
// the upstream's answer with the pod's address rewritten; a source not
// named a client gets nothing; Sync changes the rewrite in place and
// closes an address no network lists.
func TestProxyRewritesAndFollowsSync(t *testing.T) {
	upstream(t, "127.77.0.53:5300", podA)
	outcomes := make(chan string, 16)
	p := New(Config{Observe: func(o string, _ int) { outcomes <- o }})
	t.Cleanup(p.Close)
	listen := netip.MustParseAddrPort("127.77.0.12:5301")
	n := Network{Name: "tenant-a", Listen: []netip.AddrPort{listen}, Clients: []netip.Addr{netip.MustParseAddr("127.77.0.11")},
		UDP: []netip.AddrPort{netip.MustParseAddrPort("127.77.0.53:5300")}, TCP: []netip.AddrPort{netip.MustParseAddrPort("127.77.0.53:5300")},
		Rewrite: map[netip.Addr]netip.Addr{podA: udnA}}
	served, err := p.Sync(context.Background(), []Network{n})
	if err != nil || !served["tenant-a"] {
		t.Fatalf("Sync: served %v, %v", served, err)
	}

	if got := askUDP(t, "127.77.0.11:0", listen.String()); !slices.Equal(got, []netip.Addr{udnA}) {
		t.Errorf("UDP answer %v, want %v", got, udnA)
	}
	if o := <-outcomes; o != OutcomeAnswered {
		t.Errorf("outcome %q", o)
	}
	// TCP connections come from the loopback's first address: not a
	// client yet.
	if got, err := askTCP(t, listen.String()); err == nil {
		t.Errorf("a TCP query from a stranger got %v", got)
	}
	if o := <-outcomes; o != OutcomeDropped {
		t.Errorf("outcome of a stranger's query %q, want %q", o, OutcomeDropped)
	}

	n.Clients = append(n.Clients, netip.MustParseAddr("127.0.0.1"))
	n.Rewrite = map[netip.Addr]netip.Addr{podA: netip.MustParseAddr("10.100.0.8")}
	if _, err := p.Sync(context.Background(), []Network{n}); err != nil {
		t.Fatal(err)
	}
	got, err := askTCP(t, listen.String())
	if err != nil || !slices.Equal(got, []netip.Addr{netip.MustParseAddr("10.100.0.8")}) {
		t.Errorf("TCP answer after Sync %v, %v; want 10.100.0.8", got, err)
	}

	if _, err := p.Sync(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	if _, err := askTCP(t, listen.String()); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("a query after the network left: %v, want connection refused", err)
	}
}

// TestProxySyncRefusesAnAddressTwice: two networks at one address are
// both reported, and neither is served.
func TestProxySyncRefusesAnAddressTwice(t *testing.T) {
	p := New(Config{})
	t.Cleanup(p.Close)
	a := netip.MustParseAddrPort("127.77.0.14:5301")
	served, err := p.Sync(context.Background(), []Network{{Name: "x", Listen: []netip.AddrPort{a}}, {Name: "y", Listen: []netip.AddrPort{a}}})
	if err == nil || served["x"] || served["y"] {
		t.Fatalf("served %v, err %v; want an error and neither served", served, err)
	}
}
