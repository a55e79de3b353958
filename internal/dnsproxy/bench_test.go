package dnsproxy

import (
	"context"
	"net"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

// BenchmarkRewrite: a headless Service's answer of 10 A records, all of
// the network's pods.
func BenchmarkRewrite(b *testing.B) {
	m := dnsmessage.Message{Header: dnsmessage.Header{Response: true}}
	rw := map[netip.Addr]netip.Addr{}
	for i := range 10 {
		a := netip.AddrFrom4([4]byte{10, 244, 1, byte(i + 1)})
		rw[a] = netip.AddrFrom4([4]byte{10, 100, 0, byte(i + 1)})
		m.Answers = append(m.Answers, dnsmessage.Resource{Header: hdr("web.ns.svc.cluster.local.", dnsmessage.TypeA), Body: &dnsmessage.AResource{A: a.As4()}})
	}
	msg, err := m.Pack()
	if err != nil {
		b.Fatal(err)
	}
	to := func(a netip.Addr) (netip.Addr, bool) { x, ok := rw[a]; return x, ok }
	rev := map[netip.Addr]netip.Addr{}
	for k, v := range rw {
		rev[v] = k
	}
	back := func(a netip.Addr) (netip.Addr, bool) { x, ok := rev[a]; return x, ok }
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		f := to
		if i%2 == 1 {
			f = back
		}
		if n, err := Rewrite(msg, f); err != nil || n != 10 {
			b.Fatal(n, err)
		}
	}
}

// BenchmarkProxyUDP: one query and its rewritten answer through the
// proxy and a loopback upstream, one at a time (the proxy's added
// latency plus the upstream's).
func BenchmarkProxyUDP(b *testing.B) {
	t := &testing.T{}
	upstream(t, "127.77.1.53:5300", podA)
	p := New(Config{})
	defer p.Close()
	listen := netip.MustParseAddrPort("127.77.1.12:5301")
	if _, err := p.Sync(context.Background(), []Network{{Name: "n", Listen: []netip.AddrPort{listen}, Clients: []netip.Addr{netip.MustParseAddr("127.77.1.11")},
		UDP: []netip.AddrPort{netip.MustParseAddrPort("127.77.1.53:5300")}, Rewrite: map[netip.Addr]netip.Addr{podA: udnA}}}); err != nil {
		b.Fatal(err)
	}
	c, err := net.DialUDP("udp4", net.UDPAddrFromAddrPort(netip.MustParseAddrPort("127.77.1.11:0")), net.UDPAddrFromAddrPort(listen))
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	q := query(t, 42)
	buf := make([]byte, 1500)
	b.ReportAllocs()
	for b.Loop() {
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := c.Write(q); err != nil {
			b.Fatal(err)
		}
		if _, err := c.Read(buf); err != nil {
			b.Fatal(err)
		}
	}
}
