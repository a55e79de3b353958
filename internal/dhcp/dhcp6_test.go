package dhcp

import (
	"encoding/binary"
	"errors"
	"maps"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv6"
	"github.com/insomniacslk/dhcp/iana"
)

var (
	gwMAC6    = net.HardwareAddr{0x0a, 0x58, 0xa9, 0xfe, 0x00, 0x07}
	guestMAC6 = net.HardwareAddr{0x52, 0x54, 0x00, 0x00, 0x00, 0x05}
	guestLL   = netip.MustParseAddr("fe80::5054:ff:fe00:5")
	lease6    = Lease{
		IP6:    netip.MustParseAddr("2001:db8::5"),
		DNS:    []netip.Addr{netip.MustParseAddr("10.96.0.10"), netip.MustParseAddr("fd00:10:96::a")},
		Search: []string{"ns1.svc.cluster.local", "cluster.local"},
	}
)

func leases6() *StaticLeases {
	l := NewStaticLeases()
	l.Set(guestMAC6, lease6)
	return l
}

// clientMsg builds a client message of type t with client ID and, for
// stateful types, one IA_NA holding addrs.
func clientMsg(t *testing.T, typ dhcpv6.MessageType, sid dhcpv6.DUID, addrs ...netip.Addr) *dhcpv6.Message {
	t.Helper()
	m := &dhcpv6.Message{MessageType: typ, TransactionID: dhcpv6.TransactionID{1, 2, 3}}
	m.AddOption(dhcpv6.OptClientID(&dhcpv6.DUIDLL{HWType: iana.HWTypeEthernet, LinkLayerAddr: guestMAC6}))
	if sid != nil {
		m.AddOption(dhcpv6.OptServerID(sid))
	}
	if typ != dhcpv6.MessageTypeInformationRequest {
		ia := &dhcpv6.OptIANA{IaId: [4]byte{0, 0, 0, 9}}
		for _, a := range addrs {
			ia.Options.Add(&dhcpv6.OptIAAddress{IPv6Addr: a.AsSlice(), PreferredLifetime: time.Hour, ValidLifetime: time.Hour})
		}
		m.AddOption(ia)
	}
	return m
}

// frameOf wraps a DHCPv6 message from the guest in Ethernet, IPv6 and UDP
// headers, as the packet socket reads it.
func frameOf(mac net.HardwareAddr, src netip.Addr, payload []byte) []byte {
	b := make([]byte, ethHeaderLen+ipv6HeaderLen+udpHeaderLen, ethHeaderLen+ipv6HeaderLen+udpHeaderLen+len(payload))
	copy(b[0:6], []byte{0x33, 0x33, 0, 1, 0, 2})
	copy(b[6:12], mac)
	binary.BigEndian.PutUint16(b[12:14], ethTypeIPv6)
	ip := b[ethHeaderLen:]
	ip[0] = 0x60
	binary.BigEndian.PutUint16(ip[4:6], uint16(udpHeaderLen+len(payload)))
	ip[6], ip[7] = ipProtoUDP, 1
	s := src.As16()
	copy(ip[8:24], s[:])
	d := allDHCPAgents.As16()
	copy(ip[24:40], d[:])
	udp := ip[ipv6HeaderLen:]
	binary.BigEndian.PutUint16(udp[0:2], dhcp6ClientPort)
	binary.BigEndian.PutUint16(udp[2:4], dhcp6ServerPort)
	binary.BigEndian.PutUint16(udp[4:6], uint16(udpHeaderLen+len(payload)))
	return append(b, payload...)
}

// iaAddrs returns the addresses of resp's IA_NAs with their valid
// lifetimes.
func iaAddrs(resp *dhcpv6.Message) map[netip.Addr]time.Duration {
	out := map[netip.Addr]time.Duration{}
	for _, ia := range resp.Options.IANA() {
		for _, a := range ia.Options.Addresses() {
			ip, _ := netip.AddrFromSlice(a.IPv6Addr)
			out[ip] = a.ValidLifetime
		}
	}
	return out
}

func TestAnswer6(t *testing.T) {
	sid := serverDUID(gwMAC6)
	other := serverDUID(net.HardwareAddr{2, 0, 0, 0, 0, 1})
	old := netip.MustParseAddr("2001:db8::99")
	rapid := clientMsg(t, dhcpv6.MessageTypeSolicit, nil)
	rapid.AddOption(&dhcpv6.OptionGeneric{OptionCode: dhcpv6.OptionRapidCommit})
	for _, tc := range []struct {
		name    string
		req     *dhcpv6.Message
		mac     net.HardwareAddr
		want    dhcpv6.MessageType
		addrs   map[netip.Addr]time.Duration
		status  iana.StatusCode // of the top-level status option; 0: none or success
		wantErr error
	}{
		{name: "solicit", req: clientMsg(t, dhcpv6.MessageTypeSolicit, nil), want: dhcpv6.MessageTypeAdvertise,
			addrs: map[netip.Addr]time.Duration{lease6.IP6: DefaultLeaseTime}},
		{name: "rapid commit", req: rapid, want: dhcpv6.MessageTypeReply,
			addrs: map[netip.Addr]time.Duration{lease6.IP6: DefaultLeaseTime}},
		{name: "request", req: clientMsg(t, dhcpv6.MessageTypeRequest, sid, lease6.IP6), want: dhcpv6.MessageTypeReply,
			addrs: map[netip.Addr]time.Duration{lease6.IP6: DefaultLeaseTime}},
		{name: "renew of a changed address", req: clientMsg(t, dhcpv6.MessageTypeRenew, sid, old), want: dhcpv6.MessageTypeReply,
			addrs: map[netip.Addr]time.Duration{lease6.IP6: DefaultLeaseTime, old: 0}},
		{name: "rebind", req: clientMsg(t, dhcpv6.MessageTypeRebind, nil, lease6.IP6), want: dhcpv6.MessageTypeReply,
			addrs: map[netip.Addr]time.Duration{lease6.IP6: DefaultLeaseTime}},
		{name: "confirm", req: clientMsg(t, dhcpv6.MessageTypeConfirm, nil, lease6.IP6), want: dhcpv6.MessageTypeReply,
			addrs: map[netip.Addr]time.Duration{}},
		{name: "confirm of another address", req: clientMsg(t, dhcpv6.MessageTypeConfirm, nil, old), want: dhcpv6.MessageTypeReply,
			addrs: map[netip.Addr]time.Duration{}, status: iana.StatusNotOnLink},
		{name: "confirm without addresses", req: clientMsg(t, dhcpv6.MessageTypeConfirm, nil), wantErr: errConfirmNoAddrs},
		{name: "release", req: clientMsg(t, dhcpv6.MessageTypeRelease, sid, lease6.IP6), want: dhcpv6.MessageTypeReply,
			addrs: map[netip.Addr]time.Duration{}},
		{name: "information request", req: clientMsg(t, dhcpv6.MessageTypeInformationRequest, nil), want: dhcpv6.MessageTypeReply,
			addrs: map[netip.Addr]time.Duration{}},
		{name: "request for another server", req: clientMsg(t, dhcpv6.MessageTypeRequest, other, lease6.IP6), wantErr: errOtherServer6},
		{name: "renew without server", req: clientMsg(t, dhcpv6.MessageTypeRenew, nil, lease6.IP6), wantErr: errOtherServer6},
		{name: "solicit naming a server", req: clientMsg(t, dhcpv6.MessageTypeSolicit, sid), wantErr: errNamesServer},
		{name: "unknown mac", req: clientMsg(t, dhcpv6.MessageTypeSolicit, nil), mac: net.HardwareAddr{2, 0, 0, 0, 0, 2}, wantErr: errUnknownClient},
		{name: "advertise is not served", req: clientMsg(t, dhcpv6.MessageTypeAdvertise, nil), wantErr: errIgnoredType6},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mac := cmpOr(tc.mac, guestMAC6)
			resp, err := answer6(tc.req, mac, leases6(), sid, nil)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) || resp != nil {
					t.Fatalf("answer6 = %v, %v; want no reply and %v", resp, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("answer6: %v", err)
			}
			if resp.MessageType != tc.want || resp.TransactionID != tc.req.TransactionID {
				t.Fatalf("reply %s xid %s, want %s xid %s", resp.MessageType, resp.TransactionID, tc.want, tc.req.TransactionID)
			}
			if !resp.Options.ServerID().Equal(sid) {
				t.Errorf("server id %v, want %v", resp.Options.ServerID(), sid)
			}
			if cid := tc.req.Options.ClientID(); cid != nil && !resp.Options.ClientID().Equal(cid) {
				t.Errorf("client id %v, want %v", resp.Options.ClientID(), cid)
			}
			if got := iaAddrs(resp); !maps.Equal(got, tc.addrs) {
				t.Errorf("addresses %v, want %v", got, tc.addrs)
			}
			var st iana.StatusCode
			if s := resp.Options.Status(); s != nil {
				st = s.StatusCode
			}
			if st != tc.status {
				t.Errorf("status %v, want %v", st, tc.status)
			}
			// RFC 8415 §18.2.1: 255 makes the client request at once.
			if pref := resp.GetOneOption(dhcpv6.OptionPreference); (resp.MessageType == dhcpv6.MessageTypeAdvertise) != (pref != nil) || (pref != nil && resp.Options.Preference() != 255) {
				t.Errorf("%s with preference option %v, want 255 in an Advertise only", resp.MessageType, pref)
			}
			if tc.req.MessageType == dhcpv6.MessageTypeRelease {
				return // a Reply to Release carries no configuration
			}
			dns := resp.Options.DNS()
			if len(dns) != 1 || !dns[0].Equal(net.ParseIP("fd00:10:96::a")) {
				t.Errorf("dns %v, want only the IPv6 server fd00:10:96::a", dns)
			}
			if l := resp.Options.DomainSearchList(); l == nil || !slices.Equal(l.Labels, lease6.Search) {
				t.Errorf("search list %v, want %v", l, lease6.Search)
			}
		})
	}
}

// TestAnswer6Decline: a client that declines its address (its duplicate
// address detection failed) is not offered it again while the hold lasts,
// so it does not loop Solicit, Request, Decline; the conflict is reported
// once; the hold ends, and concerns that client and that address only.
func TestAnswer6Decline(t *testing.T) {
	sid := serverDUID(gwMAC6)
	now := time.Unix(1000, 0)
	type report struct {
		mac  string
		addr netip.Addr
	}
	var reports []report
	dec := newDeclines(time.Minute, func() time.Time { return now }, func(mac net.HardwareAddr, a netip.Addr) {
		reports = append(reports, report{mac.String(), a})
	})
	otherMAC := net.HardwareAddr{0x52, 0x54, 0, 0, 0, 6}
	leases := leases6()
	leases.Set(otherMAC, Lease{IP6: netip.MustParseAddr("2001:db8::6")})
	ask := func(req *dhcpv6.Message, mac net.HardwareAddr) *dhcpv6.Message {
		t.Helper()
		resp, err := answer6(req, mac, leases, sid, dec)
		if err != nil {
			t.Fatalf("answer6 %s: %v", req.MessageType, err)
		}
		return resp
	}
	status := func(resp *dhcpv6.Message) iana.StatusCode {
		if s := resp.Options.Status(); s != nil {
			return s.StatusCode
		}
		return iana.StatusSuccess
	}
	offered := func(resp *dhcpv6.Message) bool {
		for _, life := range iaAddrs(resp) {
			if life != 0 {
				return true
			}
		}
		return false
	}

	decline := clientMsg(t, dhcpv6.MessageTypeDecline, sid, lease6.IP6)
	resp := ask(decline, guestMAC6)
	if resp.MessageType != dhcpv6.MessageTypeReply || status(resp) != iana.StatusSuccess || len(resp.Options.IANA()) != 0 {
		t.Fatalf("reply to Decline: %s, want a Reply with status Success and no IA", resp.Summary())
	}
	ask(decline, guestMAC6) // retransmitted
	if want := []report{{guestMAC6.String(), lease6.IP6}}; !slices.Equal(reports, want) {
		t.Errorf("reports %v, want %v: the conflict reported once", reports, want)
	}

	rapid := clientMsg(t, dhcpv6.MessageTypeSolicit, nil)
	rapid.AddOption(&dhcpv6.OptionGeneric{OptionCode: dhcpv6.OptionRapidCommit})
	for _, req := range []*dhcpv6.Message{clientMsg(t, dhcpv6.MessageTypeSolicit, nil), rapid} {
		resp := ask(req, guestMAC6)
		if resp.MessageType != dhcpv6.MessageTypeAdvertise || status(resp) != iana.StatusNoAddrsAvail || len(resp.Options.IANA()) != 0 || resp.GetOneOption(dhcpv6.OptionRapidCommit) != nil {
			t.Errorf("Solicit after the Decline: %s, want an Advertise with NoAddrsAvail only", resp.Summary())
		}
	}
	for _, req := range []*dhcpv6.Message{
		clientMsg(t, dhcpv6.MessageTypeRequest, sid, lease6.IP6),
		clientMsg(t, dhcpv6.MessageTypeRenew, sid, lease6.IP6),
		clientMsg(t, dhcpv6.MessageTypeRebind, nil, lease6.IP6),
	} {
		resp := ask(req, guestMAC6)
		ias := resp.Options.IANA()
		if offered(resp) || len(ias) != 1 || ias[0].Options.Status() == nil || ias[0].Options.Status().StatusCode != iana.StatusNoAddrsAvail {
			t.Errorf("%s after the Decline: %s, want its IA_NA with NoAddrsAvail and no address to use", req.MessageType, resp.Summary())
		}
	}
	if !offered(ask(clientMsg(t, dhcpv6.MessageTypeSolicit, nil), otherMAC)) {
		t.Error("another client is not offered its own address")
	}

	// A Decline of an address the client does not have: NoBinding.
	resp = ask(clientMsg(t, dhcpv6.MessageTypeDecline, sid, netip.MustParseAddr("2001:db8::99")), otherMAC)
	if ias := resp.Options.IANA(); len(ias) != 1 || ias[0].Options.Status() == nil || ias[0].Options.Status().StatusCode != iana.StatusNoBinding {
		t.Errorf("Decline of an address not the client's: %s, want its IA with NoBinding", resp.Summary())
	}
	if len(reports) != 1 {
		t.Errorf("reports %v: a Decline of no binding reported", reports)
	}

	// The claim changed: the new address is offered at once.
	moved := lease6
	moved.IP6 = netip.MustParseAddr("2001:db8::77")
	leases.Set(guestMAC6, moved)
	if got := iaAddrs(ask(clientMsg(t, dhcpv6.MessageTypeSolicit, nil), guestMAC6)); got[moved.IP6] == 0 {
		t.Errorf("after the claim changed: offered %v, want %s", got, moved.IP6)
	}
	// The hold ends: the declined address is offered again.
	leases.Set(guestMAC6, lease6)
	now = now.Add(time.Minute)
	if got := iaAddrs(ask(clientMsg(t, dhcpv6.MessageTypeSolicit, nil), guestMAC6)); got[lease6.IP6] == 0 {
		t.Errorf("after the hold: offered %v, want %s again", got, lease6.IP6)
	}
}

func TestAnswer6NoIPv6Lease(t *testing.T) {
	l := NewStaticLeases()
	l.Set(guestMAC6, Lease{IP: netip.MustParsePrefix("10.0.0.5/24")})
	if resp, err := answer6(clientMsg(t, dhcpv6.MessageTypeSolicit, nil), guestMAC6, l, serverDUID(gwMAC6), nil); !errors.Is(err, errNoIPv6Lease) {
		t.Fatalf("answer6 = %v, %v; want no reply for an IPv4-only lease", resp, err)
	}
}

func TestRespond6Frame(t *testing.T) {
	sid := serverDUID(gwMAC6)
	req := clientMsg(t, dhcpv6.MessageTypeSolicit, nil)
	f, _, resp, err := respond6(frameOf(guestMAC6, guestLL, req.ToBytes()), leases6(), sid, nil)
	if err != nil {
		t.Fatalf("respond6: %v", err)
	}
	if f.src != guestLL || f.srcPort != dhcp6ClientPort || f.mac.String() != guestMAC6.String() {
		t.Errorf("frame %+v: want from %s port %d mac %s", f, guestLL, dhcp6ClientPort, guestMAC6)
	}
	if resp.MessageType != dhcpv6.MessageTypeAdvertise {
		t.Errorf("reply %s, want ADVERTISE", resp.MessageType)
	}

	good := frameOf(guestMAC6, guestLL, req.ToBytes())
	for name, mutate := range map[string]func([]byte) []byte{
		"short":               func(b []byte) []byte { return b[:ethHeaderLen+ipv6HeaderLen] },
		"ipv4 ethertype":      func(b []byte) []byte { b[12], b[13] = 0x08, 0x00; return b },
		"tcp":                 func(b []byte) []byte { b[ethHeaderLen+6] = 6; return b },
		"other port":          func(b []byte) []byte { b[ethHeaderLen+ipv6HeaderLen+3] = 0x24; return b },
		"payload past frame":  func(b []byte) []byte { b[ethHeaderLen+4] = 0xff; return b },
		"udp length mismatch": func(b []byte) []byte { b[ethHeaderLen+ipv6HeaderLen+5]++; return b },
	} {
		if _, _, resp, err := respond6(mutate(slices.Clone(good)), leases6(), sid, nil); err == nil || resp != nil {
			t.Errorf("%s: respond6 = %v, %v; want an error", name, resp, err)
		}
	}
}

func FuzzRespond6(f *testing.F) {
	sid := serverDUID(gwMAC6)
	t := &testing.T{}
	for _, m := range []*dhcpv6.Message{
		clientMsg(t, dhcpv6.MessageTypeSolicit, nil),
		clientMsg(t, dhcpv6.MessageTypeRequest, sid, lease6.IP6),
		clientMsg(t, dhcpv6.MessageTypeRenew, sid, netip.MustParseAddr("2001:db8::1")),
		clientMsg(t, dhcpv6.MessageTypeConfirm, nil, lease6.IP6),
		clientMsg(t, dhcpv6.MessageTypeConfirm, nil),
		clientMsg(t, dhcpv6.MessageTypeDecline, sid, lease6.IP6),
		clientMsg(t, dhcpv6.MessageTypeInformationRequest, nil),
	} {
		f.Add(frameOf(guestMAC6, guestLL, m.ToBytes()))
	}
	f.Add(frameOf(guestMAC6, guestLL, []byte{1, 2, 3}))
	f.Add([]byte{})
	f.Add(make([]byte, ethHeaderLen+ipv6HeaderLen+udpHeaderLen))
	f.Fuzz(func(t *testing.T, b []byte) {
		// Declines are withheld for the rest of this input's run.
		dec := newDeclines(time.Hour, time.Now, nil)
		_, req, resp, err := respond6(b, leases6(), sid, dec)
		if resp == nil {
			if err == nil {
				t.Fatal("no reply and no reason")
			}
			return
		}
		if err != nil || req == nil {
			t.Fatalf("reply %v with error %v", resp, err)
		}
		// Whatever the request, a reply carries our DUID, the
		// request's transaction, and no address but the lease's with a
		// non-zero lifetime.
		if !resp.Options.ServerID().Equal(sid) || resp.TransactionID != req.TransactionID {
			t.Fatalf("reply %s: server id %v xid %s", resp.Summary(), resp.Options.ServerID(), resp.TransactionID)
		}
		for a, life := range iaAddrs(resp) {
			if life != 0 && a != lease6.IP6 {
				t.Fatalf("reply hands out %s, lease is %s", a, lease6.IP6)
			}
		}
		// A Confirm without addresses gets no reply (RFC 8415 §18.3.3).
		if req.MessageType == dhcpv6.MessageTypeConfirm && !hasAddresses(req) {
			t.Fatalf("reply %s to a Confirm without addresses", resp.Summary())
		}
		back, err := dhcpv6.MessageFromBytes(resp.ToBytes())
		if err != nil || back.MessageType != resp.MessageType {
			t.Fatalf("reply does not decode: %v", err)
		}
	})
}

func cmpOr(a, b net.HardwareAddr) net.HardwareAddr {
	if a != nil {
		return a
	}
	return b
}
