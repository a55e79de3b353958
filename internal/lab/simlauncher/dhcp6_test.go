package simlauncher

import (
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv6"
	"github.com/insomniacslk/dhcp/iana"
	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv6"
)

var (
	testLease6 = dhcp6Lease{
		Addr:     netip.MustParseAddr("fd10:0:2::2"),
		DNS:      []netip.Addr{netip.MustParseAddr("fd00:96::a")},
		ServerID: serverDUID(mustMAC(masqBridgeMAC)),
	}
	clientMAC = mustMAC("02:6b:36:a8:32:04")
)

// solicit is a client's Solicit with IAID 0x01020304.
func solicit(t testing.TB, mods ...dhcpv6.Modifier) *dhcpv6.Message {
	t.Helper()
	m, err := dhcpv6.NewSolicit(clientMAC, append([]dhcpv6.Modifier{dhcpv6.WithIAID([4]byte{1, 2, 3, 4})}, mods...)...)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// withType is m as another message type, with server ID sid (nil: none).
func withType(m *dhcpv6.Message, typ dhcpv6.MessageType, sid dhcpv6.DUID) *dhcpv6.Message {
	out := &dhcpv6.Message{MessageType: typ, TransactionID: m.TransactionID}
	for _, o := range m.Options.Options {
		if o.Code() != dhcpv6.OptionServerID && o.Code() != dhcpv6.OptionRapidCommit {
			out.AddOption(o)
		}
	}
	if sid != nil {
		out.AddOption(dhcpv6.OptServerID(sid))
	}
	return out
}

// checkLease fails unless resp hands out testLease6 in an IA_NA with IAID
// 01020304 and names the DNS server.
func checkLease(t *testing.T, what string, resp *dhcpv6.Message) {
	t.Helper()
	ia := resp.Options.OneIANA()
	if ia == nil || ia.IaId != [4]byte{1, 2, 3, 4} || ia.T1 != dhcp6T1 || ia.T2 != dhcp6T2 {
		t.Fatalf("%s: IA_NA %v, want IAID 01020304 with T1 %v T2 %v", what, ia, dhcp6T1, dhcp6T2)
	}
	a := ia.Options.OneAddress()
	if a == nil || !a.IPv6Addr.Equal(net.ParseIP("fd10:0:2::2")) || a.ValidLifetime != dhcp6Lifetime || a.PreferredLifetime != dhcp6Lifetime {
		t.Fatalf("%s: IA address %v, want fd10:0:2::2 for %v", what, a, dhcp6Lifetime)
	}
	if dns := resp.Options.DNS(); len(dns) != 1 || !dns[0].Equal(net.ParseIP("fd00:96::a")) {
		t.Fatalf("%s: DNS %v, want fd00:96::a", what, dns)
	}
	if sid := resp.Options.ServerID(); sid == nil || !sid.Equal(testLease6.ServerID) {
		t.Fatalf("%s: server ID %v, want %v", what, sid, testLease6.ServerID)
	}
}

func answer(t *testing.T, m *dhcpv6.Message) (*dhcpv6.Message, error) {
	t.Helper()
	resp, err := answer6(m.ToBytes(), testLease6)
	if err != nil {
		if !errors.Is(err, errNoAnswer) {
			t.Fatalf("%s: error %v does not wrap errNoAnswer", m.MessageType, err)
		}
		return nil, err
	}
	// What goes on the wire parses, for this client.
	back, perr := dhcpv6.MessageFromBytes(resp.ToBytes())
	if perr != nil {
		t.Fatalf("%s: the answer does not parse: %v", m.MessageType, perr)
	}
	if back.TransactionID != m.TransactionID || !back.Options.ClientID().Equal(m.Options.ClientID()) {
		t.Fatalf("%s: answer %s for another transaction or client", m.MessageType, back.Summary())
	}
	return back, nil
}

// The exchanges of a stateful client: Solicit, Request, Renew, Rebind,
// Confirm, Release, each answered with the one lease.
func TestAnswer6Exchanges(t *testing.T) {
	sol := solicit(t)
	adv, err := answer(t, sol)
	if err != nil {
		t.Fatal(err)
	}
	if adv.MessageType != dhcpv6.MessageTypeAdvertise {
		t.Fatalf("Solicit answered with %s, want Advertise", adv.MessageType)
	}
	checkLease(t, "Advertise", adv)

	req, err := dhcpv6.NewRequestFromAdvertise(adv)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []*dhcpv6.Message{
		req,
		withType(req, dhcpv6.MessageTypeRenew, testLease6.ServerID),
		withType(req, dhcpv6.MessageTypeRebind, nil),
		withType(req, dhcpv6.MessageTypeConfirm, nil),
	} {
		rep, err := answer(t, m)
		if err != nil {
			t.Fatalf("%s: %v", m.MessageType, err)
		}
		if rep.MessageType != dhcpv6.MessageTypeReply {
			t.Fatalf("%s answered with %s, want Reply", m.MessageType, rep.MessageType)
		}
		checkLease(t, "Reply to "+m.MessageType.String(), rep)
		if st := rep.Options.Status(); st != nil && st.StatusCode != iana.StatusSuccess {
			t.Fatalf("Reply to %s: status %v", m.MessageType, st)
		}
	}

	rel, err := answer(t, withType(req, dhcpv6.MessageTypeRelease, testLease6.ServerID))
	if err != nil || rel.MessageType != dhcpv6.MessageTypeReply || rel.Options.Status() == nil || rel.Options.Status().StatusCode != iana.StatusSuccess {
		t.Fatalf("Release: answer %v (%v), want Reply with status Success", rel, err)
	}

	// Rapid Commit: the Solicit gets the Reply at once.
	rc, err := answer(t, solicit(t, dhcpv6.WithRapidCommit))
	if err != nil || rc.MessageType != dhcpv6.MessageTypeReply || rc.GetOneOption(dhcpv6.OptionRapidCommit) == nil {
		t.Fatalf("Solicit with Rapid Commit: answer %v (%v), want Reply with Rapid Commit", rc, err)
	}
	checkLease(t, "rapid Reply", rc)
}

func TestAnswer6Refuses(t *testing.T) {
	sol := solicit(t)
	adv, err := answer(t, sol)
	if err != nil {
		t.Fatal(err)
	}
	req, err := dhcpv6.NewRequestFromAdvertise(adv)
	if err != nil {
		t.Fatal(err)
	}
	other := serverDUID(mustMAC("02:00:00:00:00:99"))
	noCID := withType(sol, dhcpv6.MessageTypeSolicit, nil)
	noCID.Options.Del(dhcpv6.OptionClientID)
	for what, m := range map[string]*dhcpv6.Message{
		"a Request for another server":   withType(req, dhcpv6.MessageTypeRequest, other),
		"a Renew without a server ID":    withType(req, dhcpv6.MessageTypeRenew, nil),
		"a Solicit naming a server":      withType(sol, dhcpv6.MessageTypeSolicit, testLease6.ServerID),
		"a Solicit without a client ID":  noCID,
		"a server's Advertise":           adv,
		"a server's Reply":               withType(req, dhcpv6.MessageTypeReply, testLease6.ServerID),
		"a Rebind naming another server": withType(req, dhcpv6.MessageTypeRebind, other),
	} {
		if resp, err := answer(t, m); err == nil {
			t.Errorf("%s answered: %s", what, resp.Summary())
		}
	}
	if _, err := answer6([]byte{1, 2}, testLease6); !errors.Is(err, errNoAnswer) {
		t.Errorf("a short datagram: error %v, want errNoAnswer", err)
	}
}

// Confirm of an address that is not the lease's: NotOnLink, no IA.
func TestAnswer6ConfirmOtherAddress(t *testing.T) {
	m := withType(solicit(t), dhcpv6.MessageTypeConfirm, nil)
	m.UpdateOption(&dhcpv6.OptIANA{IaId: [4]byte{1, 2, 3, 4}, Options: dhcpv6.IdentityOptions{Options: dhcpv6.Options{
		&dhcpv6.OptIAAddress{IPv6Addr: net.ParseIP("fd99::7"), ValidLifetime: time.Hour, PreferredLifetime: time.Hour},
	}}})
	rep, err := answer(t, m)
	if err != nil {
		t.Fatal(err)
	}
	if st := rep.Options.Status(); st == nil || st.StatusCode != iana.StatusNotOnLink || rep.Options.OneIANA() != nil {
		t.Fatalf("Confirm of fd99::7: %s, want status NotOnLink without IA_NA", rep.Summary())
	}
}

// One address: a second IA_NA of the same client gets NoAddrsAvail.
func TestAnswer6SecondIANA(t *testing.T) {
	m := solicit(t)
	m.AddOption(&dhcpv6.OptIANA{IaId: [4]byte{9, 9, 9, 9}})
	adv, err := answer(t, m)
	if err != nil {
		t.Fatal(err)
	}
	ias := adv.Options.IANA()
	if len(ias) != 2 || ias[0].IaId != [4]byte{1, 2, 3, 4} || ias[0].Options.OneAddress() == nil ||
		ias[1].IaId != [4]byte{9, 9, 9, 9} || ias[1].Options.OneAddress() != nil ||
		ias[1].Options.Status() == nil || ias[1].Options.Status().StatusCode != iana.StatusNoAddrsAvail {
		t.Fatalf("IA_NAs %v, want the address in 01020304 and NoAddrsAvail in 09090909", ias)
	}
}

// The advertisement: Managed and Other flags, a router lifetime, the
// bridge's MAC and the MTU, and no prefix (no SLAAC).
func TestRouterAdvertisement(t *testing.T) {
	b, err := routerAdvertisement(mustMAC(masqBridgeMAC), 1400)
	if err != nil {
		t.Fatal(err)
	}
	m, err := icmp.ParseMessage(58, b)
	if err != nil || m.Type != ipv6.ICMPTypeRouterAdvertisement || m.Code != 0 {
		t.Fatalf("parsed %+v (%v), want a router advertisement", m, err)
	}
	body := b[4:]
	if body[1] != 0xc0 || binary.BigEndian.Uint16(body[2:]) != uint16(raRouterLifetime/time.Second) {
		t.Fatalf("flags %#x lifetime %d, want M and O, %v", body[1], binary.BigEndian.Uint16(body[2:]), raRouterLifetime)
	}
	opts := map[byte][]byte{}
	for o := body[12:]; len(o) > 0; {
		if len(o) < 2 || o[1] == 0 || len(o) < int(o[1])*8 {
			t.Fatalf("malformed options %x", body[12:])
		}
		opts[o[0]] = o[2 : int(o[1])*8]
		o = o[int(o[1])*8:]
	}
	if net.HardwareAddr(opts[1]).String() != masqBridgeMAC {
		t.Errorf("source link-layer address option %x, want %s", opts[1], masqBridgeMAC)
	}
	if v, ok := opts[5]; !ok || binary.BigEndian.Uint32(v[2:]) != 1400 {
		t.Errorf("MTU option %x, want 1400", v)
	}
	if _, ok := opts[3]; ok {
		t.Errorf("a prefix information option: the guest is to use DHCPv6, not SLAAC")
	}
}

// DHCPv6 packets come from the guest: whatever it sends, answer6 answers
// with an error wrapping errNoAnswer or a message for the same transaction
// that parses again, carries the server's ID and binds the address only to
// an IAID the client sent.
func FuzzAnswer6(f *testing.F) {
	sol := solicit(f)
	f.Add(sol.ToBytes())
	f.Add(solicit(f, dhcpv6.WithRapidCommit).ToBytes())
	adv, err := answer6(sol.ToBytes(), testLease6)
	if err != nil {
		f.Fatal(err)
	}
	req, err := dhcpv6.NewRequestFromAdvertise(adv)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(req.ToBytes())
	f.Add(withType(req, dhcpv6.MessageTypeConfirm, nil).ToBytes())
	f.Add(withType(req, dhcpv6.MessageTypeInformationRequest, nil).ToBytes())
	f.Add(adv.ToBytes())
	f.Add([]byte{})
	f.Add([]byte{1, 0, 0, 1, 0, 1, 0, 255})
	f.Fuzz(func(t *testing.T, pkt []byte) {
		resp, err := answer6(pkt, testLease6)
		if err != nil {
			if resp != nil || !errors.Is(err, errNoAnswer) {
				t.Fatalf("answer %v with error %v (want none, wrapping errNoAnswer)", resp, err)
			}
			return
		}
		in, err := dhcpv6.MessageFromBytes(pkt)
		if err != nil {
			t.Fatalf("answered a datagram that does not parse: %v", err)
		}
		out, err := dhcpv6.MessageFromBytes(resp.ToBytes())
		if err != nil {
			t.Fatalf("the answer does not parse: %v", err)
		}
		if out.TransactionID != in.TransactionID || out.Options.ServerID() == nil || !out.Options.ServerID().Equal(testLease6.ServerID) {
			t.Fatalf("answer %s: another transaction or server", out.Summary())
		}
		asked := map[[4]byte]bool{}
		for _, ia := range in.Options.IANA() {
			asked[ia.IaId] = true
		}
		for _, ia := range out.Options.IANA() {
			if !asked[ia.IaId] {
				t.Fatalf("answer binds IAID %x, which the client did not send", ia.IaId)
			}
		}
	})
}
