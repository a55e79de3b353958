package dhcp

import (
	"bytes"
	"errors"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
)

var (
	testMAC      = net.HardwareAddr{0x02, 0x00, 0x0a, 0x00, 0x00, 0x05}
	testServerIP = netip.MustParseAddr("10.0.0.1")
	otherServer  = netip.MustParseAddr("10.0.0.2")
	leasedIP     = netip.MustParseAddr("10.0.0.5")
)

// fullLease sets every option, so the option table below covers them all.
func fullLease() Lease {
	return Lease{
		IP:     netip.MustParsePrefix("10.0.0.5/24"),
		Router: netip.MustParseAddr("10.0.0.1"),
		DNS: []netip.Addr{
			netip.MustParseAddr("10.96.0.10"),
			netip.MustParseAddr("fd00::10"), // dropped: option 6 is IPv4-only
			netip.MustParseAddr("8.8.8.8"),
		},
		MTU:      1400,
		Hostname: "vm-a",
		Domain:   "ns1.svc.cluster.local",
		Search:   []string{"ns1.svc.cluster.local", "cluster.local."},
		Routes: []Route{
			{Dst: netip.MustParsePrefix("10.1.0.0/16"), Via: netip.MustParseAddr("10.0.0.254")},
			{Dst: netip.MustParsePrefix("172.16.9.9/12"), Via: netip.MustParseAddr("10.0.0.2")}, // host bits cleared
			{Dst: netip.MustParsePrefix("10.2.3.128/25"), Via: netip.MustParseAddr("10.0.0.3")},
			{Dst: netip.MustParsePrefix("192.168.5.0/24")}, // on-link
			{Dst: netip.MustParsePrefix("192.168.7.7/32"), Via: netip.MustParseAddr("10.0.0.4")},
		},
		LeaseTime: 2 * time.Hour,
	}
}

// newReq builds a client message; fields not given stay zero.
func newReq(t *testing.T, typ dhcpv4.MessageType, mods ...dhcpv4.Modifier) *dhcpv4.DHCPv4 {
	t.Helper()
	m, err := dhcpv4.New(append([]dhcpv4.Modifier{
		dhcpv4.WithHwAddr(testMAC),
		dhcpv4.WithMessageType(typ),
	}, mods...)...)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func withRequested(a netip.Addr) dhcpv4.Modifier {
	return dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(a.AsSlice()))
}

func withServerID(a netip.Addr) dhcpv4.Modifier {
	return dhcpv4.WithOption(dhcpv4.OptServerIdentifier(a.AsSlice()))
}

// wire round-trips m through its encoding, so tests see what a client sees.
func wire(t *testing.T, m *dhcpv4.DHCPv4) *dhcpv4.DHCPv4 {
	t.Helper()
	out, err := dhcpv4.FromBytes(m.ToBytes())
	if err != nil {
		t.Fatalf("parse own reply: %v", err)
	}
	return out
}

func optionCodes(m *dhcpv4.DHCPv4) []uint8 {
	var codes []uint8
	for c := range m.Options {
		codes = append(codes, c)
	}
	slices.Sort(codes)
	return codes
}

func TestReplyMessageFlow(t *testing.T) {
	ip := func(s string) netip.Addr { return netip.MustParseAddr(s) }
	tests := []struct {
		name    string
		req     func(t *testing.T) *dhcpv4.DHCPv4
		want    dhcpv4.MessageType
		wantErr error
		// wantCI is the ciaddr the reply must echo.
		wantCI netip.Addr
	}{
		{
			name: "discover gets offer",
			req:  func(t *testing.T) *dhcpv4.DHCPv4 { return newReq(t, dhcpv4.MessageTypeDiscover) },
			want: dhcpv4.MessageTypeOffer,
		},
		{
			name: "discover asking for another address still gets the lease",
			req: func(t *testing.T) *dhcpv4.DHCPv4 {
				return newReq(t, dhcpv4.MessageTypeDiscover, withRequested(ip("10.0.0.99")))
			},
			want: dhcpv4.MessageTypeOffer,
		},
		{
			name: "selecting request for the lease gets ack",
			req: func(t *testing.T) *dhcpv4.DHCPv4 {
				return newReq(t, dhcpv4.MessageTypeRequest, withRequested(leasedIP), withServerID(testServerIP))
			},
			want: dhcpv4.MessageTypeAck,
		},
		{
			name: "init-reboot request for the lease gets ack",
			req: func(t *testing.T) *dhcpv4.DHCPv4 {
				return newReq(t, dhcpv4.MessageTypeRequest, withRequested(leasedIP))
			},
			want: dhcpv4.MessageTypeAck,
		},
		{
			name: "renewing request gets ack echoing ciaddr",
			req: func(t *testing.T) *dhcpv4.DHCPv4 {
				return newReq(t, dhcpv4.MessageTypeRequest, dhcpv4.WithClientIP(leasedIP.AsSlice()))
			},
			want:   dhcpv4.MessageTypeAck,
			wantCI: leasedIP,
		},
		{
			name: "selecting request for another address gets nak",
			req: func(t *testing.T) *dhcpv4.DHCPv4 {
				return newReq(t, dhcpv4.MessageTypeRequest, withRequested(ip("10.0.0.6")), withServerID(testServerIP))
			},
			want: dhcpv4.MessageTypeNak,
		},
		{
			name: "init-reboot from another network gets nak",
			req: func(t *testing.T) *dhcpv4.DHCPv4 {
				return newReq(t, dhcpv4.MessageTypeRequest, withRequested(ip("192.168.1.20")))
			},
			want: dhcpv4.MessageTypeNak,
		},
		{
			name: "renewing another address gets nak",
			req: func(t *testing.T) *dhcpv4.DHCPv4 {
				return newReq(t, dhcpv4.MessageTypeRequest, dhcpv4.WithClientIP(ip("10.0.0.7").AsSlice()))
			},
			want: dhcpv4.MessageTypeNak,
		},
		{
			name: "request selecting another server is ignored",
			req: func(t *testing.T) *dhcpv4.DHCPv4 {
				return newReq(t, dhcpv4.MessageTypeRequest, withRequested(leasedIP), withServerID(otherServer))
			},
			wantErr: errOtherServer,
		},
		{
			name:    "request naming no address is ignored",
			req:     func(t *testing.T) *dhcpv4.DHCPv4 { return newReq(t, dhcpv4.MessageTypeRequest) },
			wantErr: errNoRequestedIP,
		},
		{
			name:    "release is ignored",
			req:     func(t *testing.T) *dhcpv4.DHCPv4 { return newReq(t, dhcpv4.MessageTypeRelease) },
			wantErr: errIgnoredType,
		},
		{
			name:    "decline is ignored",
			req:     func(t *testing.T) *dhcpv4.DHCPv4 { return newReq(t, dhcpv4.MessageTypeDecline) },
			wantErr: errIgnoredType,
		},
		{
			name:    "inform is ignored",
			req:     func(t *testing.T) *dhcpv4.DHCPv4 { return newReq(t, dhcpv4.MessageTypeInform) },
			wantErr: errIgnoredType,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req := tc.req(t)
			resp, err := reply(req, fullLease(), testServerIP)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) || resp != nil {
					t.Fatalf("reply = %v, %v; want nil, %v", resp, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("reply: %v", err)
			}
			got := wire(t, resp)
			if got.MessageType() != tc.want {
				t.Fatalf("message type = %s, want %s", got.MessageType(), tc.want)
			}
			if got.OpCode != dhcpv4.OpcodeBootReply || got.TransactionID != req.TransactionID || !bytes.Equal(got.ClientHWAddr, testMAC) {
				t.Errorf("header = op %s xid %s mac %s; want BootReply, %s, %s", got.OpCode, got.TransactionID, got.ClientHWAddr, req.TransactionID, testMAC)
			}
			if sid, _ := addrOf(got.ServerIdentifier()); sid != testServerIP {
				t.Errorf("server identifier = %s, want %s", sid, testServerIP)
			}
			yi, _ := addrOf(got.YourIPAddr)
			ci, _ := addrOf(got.ClientIPAddr)
			if tc.want == dhcpv4.MessageTypeNak {
				// RFC 2131 table 3: NAK has no yiaddr and no lease options.
				if yi.IsValid() {
					t.Errorf("nak yiaddr = %s, want 0.0.0.0", yi)
				}
				if codes, want := optionCodes(got), []uint8{53, 54, 56}; !slices.Equal(codes, want) {
					t.Errorf("nak options = %v, want %v", codes, want)
				}
				return
			}
			if yi != leasedIP {
				t.Errorf("yiaddr = %s, want %s", yi, leasedIP)
			}
			if ci != tc.wantCI {
				t.Errorf("ciaddr = %s, want %s", ci, tc.wantCI)
			}
		})
	}
}

// TestReplyOptions checks the exact wire bytes of every option.
func TestReplyOptions(t *testing.T) {
	label := func(parts ...string) []byte {
		var b []byte
		for _, p := range parts {
			b = append(b, byte(len(p)))
			b = append(b, p...)
		}
		return append(b, 0)
	}
	searchBytes := append(label("ns1", "svc", "cluster", "local"), label("cluster", "local")...)
	tests := []struct {
		name  string
		lease func() Lease
		want  map[uint8][]byte // option code -> exact value; nil value = must be absent
	}{
		{
			name:  "full lease",
			lease: fullLease,
			want: map[uint8][]byte{
				1:   {255, 255, 255, 0},
				3:   {10, 0, 0, 1},
				6:   {10, 96, 0, 10, 8, 8, 8, 8},
				12:  []byte("vm-a"),
				15:  []byte("ns1.svc.cluster.local"),
				26:  {0x05, 0x78},       // 1400
				51:  {0, 0, 0x1c, 0x20}, // 7200 s
				53:  {byte(dhcpv4.MessageTypeOffer)},
				54:  {10, 0, 0, 1},
				119: searchBytes,
				// RFC 3442: width, significant destination octets, router.
				121: {
					16, 10, 1, 10, 0, 0, 254,
					12, 172, 16, 10, 0, 0, 2,
					25, 10, 2, 3, 128, 10, 0, 0, 3,
					24, 192, 168, 5, 0, 0, 0, 0,
					32, 192, 168, 7, 7, 10, 0, 0, 4,
					0, 10, 0, 0, 1, // default route via Router, last
				},
			},
		},
		{
			name:  "only an address",
			lease: func() Lease { return Lease{IP: netip.MustParsePrefix("10.0.0.5/16")} },
			want: map[uint8][]byte{
				1:   {255, 255, 0, 0},
				51:  {0, 0, 0x0e, 0x10}, // DefaultLeaseTime, 3600 s
				53:  {byte(dhcpv4.MessageTypeOffer)},
				54:  {10, 0, 0, 1},
				3:   nil,
				6:   nil,
				12:  nil,
				15:  nil,
				26:  nil,
				119: nil,
				121: nil,
			},
		},
		{
			name: "router without routes sends no option 121",
			lease: func() Lease {
				return Lease{IP: netip.MustParsePrefix("10.0.0.5/24"), Router: testServerIP}
			},
			want: map[uint8][]byte{3: {10, 0, 0, 1}, 121: nil},
		},
		{
			name: "explicit default route is not duplicated",
			lease: func() Lease {
				l := Lease{IP: netip.MustParsePrefix("10.0.0.5/24"), Router: testServerIP}
				l.Routes = []Route{
					{Dst: netip.MustParsePrefix("0.0.0.0/0"), Via: netip.MustParseAddr("10.0.0.9")},
					{Dst: netip.MustParsePrefix("10.1.0.0/16"), Via: netip.MustParseAddr("10.0.0.254")},
				}
				return l
			},
			want: map[uint8][]byte{121: {0, 10, 0, 0, 9, 16, 10, 1, 10, 0, 0, 254}},
		},
		{
			name: "routes without router get no default route",
			lease: func() Lease {
				return Lease{
					IP:     netip.MustParsePrefix("10.0.0.5/24"),
					Routes: []Route{{Dst: netip.MustParsePrefix("10.1.0.0/16"), Via: netip.MustParseAddr("10.0.0.254")}},
				}
			},
			want: map[uint8][]byte{3: nil, 121: {16, 10, 1, 10, 0, 0, 254}},
		},
		{
			name: "only ipv6 dns sends no option 6",
			lease: func() Lease {
				return Lease{IP: netip.MustParsePrefix("10.0.0.5/24"), DNS: []netip.Addr{netip.MustParseAddr("fd00::10")}}
			},
			want: map[uint8][]byte{6: nil},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := reply(newReq(t, dhcpv4.MessageTypeDiscover), tc.lease(), testServerIP)
			if err != nil {
				t.Fatalf("reply: %v", err)
			}
			got := wire(t, resp)
			for code, want := range tc.want {
				val, present := got.Options[code]
				switch {
				case want == nil && present:
					t.Errorf("option %d = %v, want absent", code, val)
				case want != nil && !bytes.Equal(val, want):
					t.Errorf("option %d = %v, want %v", code, val, want)
				}
			}
		})
	}
}

// TestReplyOptionsDecode reads the full lease back through the library's
// decoders, as a client would.
func TestReplyOptionsDecode(t *testing.T) {
	resp, err := reply(newReq(t, dhcpv4.MessageTypeDiscover), fullLease(), testServerIP)
	if err != nil {
		t.Fatal(err)
	}
	got := wire(t, resp)
	if s := got.DomainSearch(); s == nil || !slices.Equal(s.Labels, []string{"ns1.svc.cluster.local", "cluster.local"}) {
		t.Errorf("search = %v", s)
	}
	var routes []string
	for _, r := range got.ClasslessStaticRoute() {
		routes = append(routes, r.Dest.String()+" via "+r.Router.String())
	}
	want := []string{
		"10.1.0.0/16 via 10.0.0.254",
		"172.16.0.0/12 via 10.0.0.2",
		"10.2.3.128/25 via 10.0.0.3",
		"192.168.5.0/24 via 0.0.0.0",
		"192.168.7.7/32 via 10.0.0.4",
		"0.0.0.0/0 via 10.0.0.1",
	}
	if !slices.Equal(routes, want) {
		t.Errorf("routes = %q, want %q", routes, want)
	}
	if lt := got.IPAddressLeaseTime(0); lt != 2*time.Hour {
		t.Errorf("lease time = %s, want 2h", lt)
	}
}

func TestReplyInvalidLease(t *testing.T) {
	tests := []struct {
		name     string
		mutate   func(*Lease)
		serverIP netip.Addr
		wantMsg  string
	}{
		{name: "ipv6 lease", mutate: func(l *Lease) { l.IP = netip.MustParsePrefix("fd00::5/64") }, wantMsg: `lease ip "fd00::5/64"`},
		{name: "no lease ip", mutate: func(l *Lease) { l.IP = netip.Prefix{} }, wantMsg: "lease ip"},
		{name: "ipv6 router", mutate: func(l *Lease) { l.Router = netip.MustParseAddr("fd00::1") }, wantMsg: `router "fd00::1"`},
		{name: "mtu too small", mutate: func(l *Lease) { l.MTU = 67 }, wantMsg: "mtu 67"},
		{name: "mtu too large", mutate: func(l *Lease) { l.MTU = 70000 }, wantMsg: "mtu 70000"},
		{name: "negative lease time", mutate: func(l *Lease) { l.LeaseTime = -time.Second }, wantMsg: "lease time -1s"},
		{name: "empty search label", mutate: func(l *Lease) { l.Search = []string{"a..b"} }, wantMsg: `search domain "a..b"`},
		{name: "long search label", mutate: func(l *Lease) { l.Search = []string{strings.Repeat("x", 64) + ".com"} }, wantMsg: "invalid label"},
		{name: "ipv6 route", mutate: func(l *Lease) { l.Routes = []Route{{Dst: netip.MustParsePrefix("fd00::/8")}} }, wantMsg: `route destination "fd00::/8"`},
		{name: "ipv6 route via", mutate: func(l *Lease) {
			l.Routes = []Route{{Dst: netip.MustParsePrefix("10.1.0.0/16"), Via: netip.MustParseAddr("fd00::1")}}
		}, wantMsg: `via "fd00::1"`},
		{name: "reply over 576 bytes", mutate: func(l *Lease) {
			l.Search = nil
			for i := range 30 {
				l.Search = append(l.Search, strings.Repeat("d", 10)+string(rune('a'+i%26))+".example")
			}
		}, wantMsg: "over the client's limit of 548"},
		{name: "ipv6 server", serverIP: netip.MustParseAddr("fd00::1"), wantMsg: `server ip "fd00::1"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l := fullLease()
			if tc.mutate != nil {
				tc.mutate(&l)
			}
			sip := testServerIP
			if tc.serverIP.IsValid() {
				sip = tc.serverIP
			}
			resp, err := reply(newReq(t, dhcpv4.MessageTypeDiscover), l, sip)
			if err == nil || resp != nil || !strings.Contains(err.Error(), tc.wantMsg) {
				t.Fatalf("reply = %v, %v; want error containing %q", resp, err, tc.wantMsg)
			}
		})
	}
}

func TestReplyHonoursClientMaxMessageSize(t *testing.T) {
	l := fullLease()
	for i := range 30 {
		l.Search = append(l.Search, strings.Repeat("d", 10)+string(rune('a'+i%26))+".example")
	}
	req := newReq(t, dhcpv4.MessageTypeDiscover, dhcpv4.WithOption(dhcpv4.OptMaxMessageSize(1500)))
	if _, err := reply(req, l, testServerIP); err != nil {
		t.Fatalf("reply with max message size 1500: %v", err)
	}
}

func TestDestination(t *testing.T) {
	bcast := "255.255.255.255:68"
	tests := []struct {
		name string
		req  []dhcpv4.Modifier
		nak  bool
		want string
	}{
		{name: "no address, no flag: broadcast", want: bcast},
		{name: "broadcast flag", req: []dhcpv4.Modifier{dhcpv4.WithBroadcast(true)}, want: bcast},
		{name: "renewing: unicast to ciaddr", req: []dhcpv4.Modifier{dhcpv4.WithClientIP(leasedIP.AsSlice())}, want: "10.0.0.5:68"},
		{name: "rebinding with broadcast flag: still ciaddr", req: []dhcpv4.Modifier{dhcpv4.WithClientIP(leasedIP.AsSlice()), dhcpv4.WithBroadcast(true)}, want: "10.0.0.5:68"},
		{name: "nak: broadcast even with ciaddr", req: []dhcpv4.Modifier{dhcpv4.WithClientIP(leasedIP.AsSlice())}, nak: true, want: bcast},
		{name: "relayed: to the relay's server port", req: []dhcpv4.Modifier{dhcpv4.WithGatewayIP(net.IPv4(10, 9, 0, 1))}, want: "10.9.0.1:67"},
		{name: "relayed nak: to the relay", req: []dhcpv4.Modifier{dhcpv4.WithGatewayIP(net.IPv4(10, 9, 0, 1))}, nak: true, want: "10.9.0.1:67"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req := newReq(t, dhcpv4.MessageTypeRequest, tc.req...)
			typ := dhcpv4.MessageTypeAck
			if tc.nak {
				typ = dhcpv4.MessageTypeNak
			}
			resp, err := dhcpv4.NewReplyFromRequest(req, dhcpv4.WithMessageType(typ))
			if err != nil {
				t.Fatal(err)
			}
			if got := destination(req, resp).String(); got != tc.want {
				t.Errorf("destination = %s, want %s", got, tc.want)
			}
		})
	}
}

func TestAnswer(t *testing.T) {
	leases := NewStaticLeases()
	leases.Set(testMAC, fullLease())
	unknown := net.HardwareAddr{0x02, 0, 0, 0, 0, 0x99}
	tests := []struct {
		name    string
		req     func(t *testing.T) *dhcpv4.DHCPv4
		want    dhcpv4.MessageType
		wantDst string
		wantErr error
	}{
		{
			name:    "known mac discover",
			req:     func(t *testing.T) *dhcpv4.DHCPv4 { return newReq(t, dhcpv4.MessageTypeDiscover) },
			want:    dhcpv4.MessageTypeOffer,
			wantDst: "255.255.255.255:68",
		},
		{
			name: "known mac renewal",
			req: func(t *testing.T) *dhcpv4.DHCPv4 {
				return newReq(t, dhcpv4.MessageTypeRequest, dhcpv4.WithClientIP(leasedIP.AsSlice()))
			},
			want:    dhcpv4.MessageTypeAck,
			wantDst: "10.0.0.5:68",
		},
		{
			name: "unknown mac discover gets nothing",
			req: func(t *testing.T) *dhcpv4.DHCPv4 {
				return newReq(t, dhcpv4.MessageTypeDiscover, dhcpv4.WithHwAddr(unknown))
			},
			wantErr: errUnknownClient,
		},
		{
			name: "unknown mac request gets nothing, not even a nak",
			req: func(t *testing.T) *dhcpv4.DHCPv4 {
				return newReq(t, dhcpv4.MessageTypeRequest, dhcpv4.WithHwAddr(unknown), withRequested(leasedIP))
			},
			wantErr: errUnknownClient,
		},
		{
			name: "server-to-server reply is ignored",
			req: func(t *testing.T) *dhcpv4.DHCPv4 {
				m := newReq(t, dhcpv4.MessageTypeOffer)
				m.OpCode = dhcpv4.OpcodeBootReply
				return m
			},
			wantErr: errNotRequest,
		},
		{
			name: "non-ethernet hardware address is ignored",
			req: func(t *testing.T) *dhcpv4.DHCPv4 {
				return newReq(t, dhcpv4.MessageTypeDiscover, dhcpv4.WithHwAddr(net.HardwareAddr{1, 2, 3, 4, 5, 6, 7, 8}))
			},
			wantErr: errNotEthernet,
		},
		{
			name:    "release is ignored",
			req:     func(t *testing.T) *dhcpv4.DHCPv4 { return newReq(t, dhcpv4.MessageTypeRelease) },
			wantErr: errIgnoredType,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp, dst, err := answer(tc.req(t), leases, testServerIP)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) || resp != nil || dst != nil {
					t.Fatalf("answer = %v, %v, %v; want nil, nil, %v", resp, dst, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("answer: %v", err)
			}
			if resp.MessageType() != tc.want || dst.String() != tc.wantDst {
				t.Errorf("answer = %s to %s, want %s to %s", resp.MessageType(), dst, tc.want, tc.wantDst)
			}
		})
	}
}

// seedPacket encodes a client message for a fuzz seed corpus.
func seedPacket(f *testing.F, mods ...dhcpv4.Modifier) []byte {
	f.Helper()
	m, err := dhcpv4.New(mods...)
	if err != nil {
		f.Fatal(err)
	}
	return m.ToBytes()
}

// FuzzRespond feeds the server's datagram handling (decode, policy, reply
// building) with arbitrary packets. A packet gets a reply only when it is
// a DISCOVER or REQUEST from a MAC with a lease, and the reply is a
// well-formed OFFER, ACK or NAK for exactly that client and lease, within
// the client's size limit.
func FuzzRespond(f *testing.F) {
	minimal := net.HardwareAddr{0x02, 0, 0, 0, 0, 0x42}
	leases := NewStaticLeases()
	leases.Set(testMAC, fullLease())
	leases.Set(minimal, Lease{IP: netip.MustParsePrefix("10.0.0.42/24")})
	hw := dhcpv4.WithHwAddr(testMAC)
	for _, pkt := range [][]byte{
		seedPacket(f, hw, dhcpv4.WithMessageType(dhcpv4.MessageTypeDiscover)),
		seedPacket(f, dhcpv4.WithHwAddr(minimal), dhcpv4.WithMessageType(dhcpv4.MessageTypeDiscover)),
		seedPacket(f, hw, dhcpv4.WithMessageType(dhcpv4.MessageTypeRequest), withRequested(leasedIP), withServerID(testServerIP)),
		seedPacket(f, hw, dhcpv4.WithMessageType(dhcpv4.MessageTypeRequest), withRequested(leasedIP), withServerID(otherServer)),
		seedPacket(f, hw, dhcpv4.WithMessageType(dhcpv4.MessageTypeRequest), withRequested(netip.MustParseAddr("10.0.0.9"))),
		seedPacket(f, hw, dhcpv4.WithMessageType(dhcpv4.MessageTypeRequest), dhcpv4.WithClientIP(leasedIP.AsSlice())),
		seedPacket(f, hw, dhcpv4.WithMessageType(dhcpv4.MessageTypeRequest)),
		seedPacket(f, hw, dhcpv4.WithMessageType(dhcpv4.MessageTypeDiscover), dhcpv4.WithGatewayIP(net.IPv4(10, 9, 0, 1))),
		seedPacket(f, hw, dhcpv4.WithMessageType(dhcpv4.MessageTypeDiscover), dhcpv4.WithOption(dhcpv4.OptMaxMessageSize(1500))),
		seedPacket(f, hw, dhcpv4.WithMessageType(dhcpv4.MessageTypeInform)),
		seedPacket(f, dhcpv4.WithHwAddr(net.HardwareAddr{2, 0, 0, 0, 0, 0x99}), dhcpv4.WithMessageType(dhcpv4.MessageTypeDiscover)),
		seedPacket(f, dhcpv4.WithHwAddr(net.HardwareAddr{1, 2, 3, 4, 5, 6, 7, 8}), dhcpv4.WithMessageType(dhcpv4.MessageTypeDiscover)),
		seedPacket(f, hw, dhcpv4.WithMessageType(dhcpv4.MessageTypeOffer), dhcpv4.WithReply(&dhcpv4.DHCPv4{OpCode: dhcpv4.OpcodeBootRequest})),
		seedPacket(f, hw)[:100], // truncated header
		{}, {0x01},
	} {
		f.Add(pkt)
	}
	f.Fuzz(func(t *testing.T, pkt []byte) {
		req, resp, dst, err := respond(pkt, leases, testServerIP)
		if resp == nil {
			if err == nil || dst != nil {
				t.Fatalf("no reply, dst %v, err %v", dst, err)
			}
			return
		}
		if err != nil || dst == nil || req == nil {
			t.Fatalf("reply with dst %v, err %v", dst, err)
		}
		lease, ok := leases.Lookup(req.ClientHWAddr)
		if !ok {
			t.Fatalf("reply to %s, which has no lease", req.ClientHWAddr)
		}
		if resp.OpCode != dhcpv4.OpcodeBootReply || resp.TransactionID != req.TransactionID || !bytes.Equal(resp.ClientHWAddr, req.ClientHWAddr) {
			t.Fatalf("reply %s does not answer request %s", resp.Summary(), req.Summary())
		}
		switch typ := resp.MessageType(); {
		case typ == dhcpv4.MessageTypeOffer && req.MessageType() == dhcpv4.MessageTypeDiscover,
			typ == dhcpv4.MessageTypeAck && req.MessageType() == dhcpv4.MessageTypeRequest:
			if got, _ := addrOf(resp.YourIPAddr); got != lease.IP.Addr() {
				t.Fatalf("%s gives %s, lease is %s", typ, resp.YourIPAddr, lease.IP)
			}
		case typ == dhcpv4.MessageTypeNak && req.MessageType() == dhcpv4.MessageTypeRequest:
			if dst.Port == dhcpv4.ClientPort && !dst.IP.Equal(net.IPv4bcast) {
				t.Fatalf("nak unicast to %s", dst)
			}
		default:
			t.Fatalf("%s in reply to %s", typ, req.MessageType())
		}
		if sid, _ := addrOf(resp.ServerIdentifier()); sid != testServerIP {
			t.Fatalf("server identifier %v", resp.ServerIdentifier())
		}
		if gi, ok := addrOf(req.GatewayIPAddr); ok && (dst.Port != dhcpv4.ServerPort || !dst.IP.Equal(gi.AsSlice())) {
			t.Fatalf("relayed request answered to %s, relay is %s", dst, gi)
		}
		// What goes on the wire decodes to the same reply, within the
		// client's size limit.
		b := resp.ToBytes()
		limit := minMaxMessageSize
		if m, err := req.MaxMessageSize(); err == nil && int(m) > limit {
			limit = int(m)
		}
		if resp.MessageType() != dhcpv4.MessageTypeNak && len(b) > limit {
			t.Fatalf("%d-byte reply over the client's limit %d", len(b), limit)
		}
		back, err := dhcpv4.FromBytes(b)
		if err != nil || back.MessageType() != resp.MessageType() || !back.YourIPAddr.Equal(resp.YourIPAddr) || back.TransactionID != resp.TransactionID {
			t.Fatalf("reply %s decodes to %v, %v", resp.Summary(), back, err)
		}
	})
}
