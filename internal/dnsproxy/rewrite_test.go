package dnsproxy

import (
	"bytes"
	"net/netip"
	"slices"
	"testing"

	"golang.org/x/net/dns/dnsmessage"
)

var (
	podA   = netip.MustParseAddr("10.244.1.5")     // a pod's default-network address
	udnA   = netip.MustParseAddr("10.100.0.7")     // the same pod on its UDN
	podA6  = netip.MustParseAddr("fd00:10:244::5") // ... of IPv6
	udnA6  = netip.MustParseAddr("fd99::7")
	other  = netip.MustParseAddr("10.244.2.9") // a pod of another network
	mapped = map[netip.Addr]netip.Addr{podA: udnA, podA6: udnA6, netip.MustParseAddr("10.244.3.3"): udnA6}
)

func lookup(a netip.Addr) (netip.Addr, bool) { b, ok := mapped[a]; return b, ok }

func name(s string) dnsmessage.Name { return dnsmessage.MustNewName(s) }

func hdr(n string, t dnsmessage.Type) dnsmessage.ResourceHeader {
	return dnsmessage.ResourceHeader{Name: name(n), Type: t, Class: dnsmessage.ClassINET, TTL: 30}
}

func pack(t *testing.T, m dnsmessage.Message) []byte {
	t.Helper()
	b, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// addrsOf returns the A and AAAA addresses of every section of msg.
func addrsOf(t *testing.T, msg []byte) []netip.Addr {
	t.Helper()
	var m dnsmessage.Message
	if err := m.Unpack(msg); err != nil {
		t.Fatalf("unpack the rewritten message: %v", err)
	}
	var out []netip.Addr
	for _, r := range slices.Concat(m.Answers, m.Authorities, m.Additionals) {
		switch b := r.Body.(type) {
		case *dnsmessage.AResource:
			out = append(out, netip.AddrFrom4(b.A))
		case *dnsmessage.AAAAResource:
			out = append(out, netip.AddrFrom16(b.AAAA))
		}
	}
	return out
}

func TestRewrite(t *testing.T) {
	q := []dnsmessage.Question{{Name: name("web.ns.svc.cluster.local."), Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET}}
	for _, tc := range []struct {
		name string
		msg  dnsmessage.Message
		want []netip.Addr
		n    int
	}{{
		name: "headless answer: the network's pod rewritten, another's kept",
		msg: dnsmessage.Message{Header: dnsmessage.Header{ID: 7, Response: true}, Questions: q, Answers: []dnsmessage.Resource{
			{Header: hdr("web.ns.svc.cluster.local.", dnsmessage.TypeA), Body: &dnsmessage.AResource{A: podA.As4()}},
			{Header: hdr("web.ns.svc.cluster.local.", dnsmessage.TypeA), Body: &dnsmessage.AResource{A: other.As4()}},
		}},
		want: []netip.Addr{udnA, other}, n: 1,
	}, {
		name: "IPv6",
		msg: dnsmessage.Message{Header: dnsmessage.Header{Response: true}, Answers: []dnsmessage.Resource{
			{Header: hdr("web.ns.svc.cluster.local.", dnsmessage.TypeAAAA), Body: &dnsmessage.AAAAResource{AAAA: podA6.As16()}},
		}},
		want: []netip.Addr{udnA6}, n: 1,
	}, {
		name: "a replacement of the other family is not used",
		msg: dnsmessage.Message{Header: dnsmessage.Header{Response: true}, Answers: []dnsmessage.Resource{
			{Header: hdr("x.ns.svc.cluster.local.", dnsmessage.TypeA), Body: &dnsmessage.AResource{A: [4]byte{10, 244, 3, 3}}},
		}},
		want: []netip.Addr{netip.MustParseAddr("10.244.3.3")},
	}, {
		name: "CNAME, SRV with additional records and EDNS: only the addresses change",
		msg: dnsmessage.Message{Header: dnsmessage.Header{Response: true}, Questions: q, Answers: []dnsmessage.Resource{
			{Header: hdr("alias.ns.svc.cluster.local.", dnsmessage.TypeCNAME), Body: &dnsmessage.CNAMEResource{CNAME: name("web.ns.svc.cluster.local.")}},
			{Header: hdr("web.ns.svc.cluster.local.", dnsmessage.TypeSRV), Body: &dnsmessage.SRVResource{Priority: 0, Weight: 50, Port: 80, Target: name("a.web.ns.svc.cluster.local.")}},
		}, Additionals: []dnsmessage.Resource{
			{Header: hdr("a.web.ns.svc.cluster.local.", dnsmessage.TypeA), Body: &dnsmessage.AResource{A: podA.As4()}},
			{Header: dnsmessage.ResourceHeader{Name: name("."), Type: dnsmessage.TypeOPT, Class: 1232}, Body: &dnsmessage.OPTResource{}},
		}},
		want: []netip.Addr{udnA}, n: 1,
	}, {
		name: "NXDOMAIN with an SOA",
		msg: dnsmessage.Message{Header: dnsmessage.Header{Response: true, RCode: dnsmessage.RCodeNameError}, Questions: q, Authorities: []dnsmessage.Resource{
			{Header: hdr("cluster.local.", dnsmessage.TypeSOA), Body: &dnsmessage.SOAResource{NS: name("ns.dns.cluster.local."), MBox: name("hostmaster.cluster.local."), Serial: 1}},
		}},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			msg := pack(t, tc.msg)
			orig := slices.Clone(msg)
			n, err := Rewrite(msg, lookup)
			if err != nil {
				t.Fatal(err)
			}
			if n != tc.n {
				t.Errorf("rewrote %d records, want %d", n, tc.n)
			}
			if got := addrsOf(t, msg); !slices.Equal(got, tc.want) {
				t.Errorf("addresses %v, want %v", got, tc.want)
			}
			if n == 0 && !bytes.Equal(msg, orig) {
				t.Error("a message with nothing to rewrite changed")
			}
		})
	}
}

func TestRewriteRefusesMalformedAndChangesNothing(t *testing.T) {
	good := pack(t, dnsmessage.Message{Header: dnsmessage.Header{Response: true}, Answers: []dnsmessage.Resource{
		{Header: hdr("web.ns.svc.cluster.local.", dnsmessage.TypeA), Body: &dnsmessage.AResource{A: podA.As4()}},
		{Header: hdr("web.ns.svc.cluster.local.", dnsmessage.TypeA), Body: &dnsmessage.AResource{A: podA.As4()}},
	}})
	for _, tc := range []struct {
		name string
		msg  []byte
	}{
		{"short header", good[:5]},
		{"cut in the second record", good[:len(good)-2]},
		{"record count past the end", func() []byte { b := slices.Clone(good); b[7] = 3; return b }()},
		{"reserved label type", func() []byte { b := slices.Clone(good); b[headerLen] = 0x80; return b }()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			orig := slices.Clone(tc.msg)
			if _, err := Rewrite(tc.msg, lookup); err == nil {
				t.Fatal("no error")
			}
			if !bytes.Equal(tc.msg, orig) {
				t.Error("a refused message changed")
			}
		})
	}
}

// FuzzRewrite: never a panic; the length never changes; what Rewrite
// refuses is unchanged, and what it rewrites differs from the original
// only in A and AAAA data.
func FuzzRewrite(f *testing.F) {
	f.Add(pack(&testing.T{}, dnsmessage.Message{Header: dnsmessage.Header{Response: true}, Answers: []dnsmessage.Resource{
		{Header: hdr("web.ns.svc.cluster.local.", dnsmessage.TypeA), Body: &dnsmessage.AResource{A: podA.As4()}},
		{Header: hdr("web.ns.svc.cluster.local.", dnsmessage.TypeAAAA), Body: &dnsmessage.AAAAResource{AAAA: podA6.As16()}},
	}}))
	f.Add([]byte{0, 1, 0x81, 0x80, 0, 0, 0, 1, 0, 0, 0, 0, 0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0, 30, 0, 4, 10, 244, 1, 5})
	f.Fuzz(func(t *testing.T, msg []byte) {
		orig := slices.Clone(msg)
		n, err := Rewrite(msg, lookup)
		if len(msg) != len(orig) {
			t.Fatal("length changed")
		}
		if err != nil || n == 0 {
			if !bytes.Equal(msg, orig) {
				t.Fatalf("unchanged expected (n=%d, err=%v)", n, err)
			}
			return
		}
		var before, after dnsmessage.Message
		if before.Unpack(orig) != nil {
			return // Rewrite walks less strictly than a full parse
		}
		if err := after.Unpack(msg); err != nil {
			t.Fatalf("a rewritten message no longer parses: %v", err)
		}
		if len(before.Answers)+len(before.Authorities)+len(before.Additionals) != len(after.Answers)+len(after.Authorities)+len(after.Additionals) {
			t.Fatal("record count changed")
		}
	})
}
