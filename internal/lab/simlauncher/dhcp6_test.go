package simlauncher

import (
	"errors"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv6"
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

// checkLease fails unless resp hands out testLease6 as KubeVirt's server
// does: one IA_NA with IAID iaid, T1 and T2 0, the address for 999 days,
// the DNS server and the server ID.
func checkLease(t *testing.T, what string, resp *dhcpv6.Message, iaid [4]byte) {
	t.Helper()
	ias := resp.Options.IANA()
	if len(ias) != 1 || ias[0].IaId != iaid || ias[0].T1 != 0 || ias[0].T2 != 0 {
		t.Fatalf("%s: IA_NAs %v, want one with IAID %x, T1 and T2 0", what, ias, iaid)
	}
	a := ias[0].Options.Addresses()
	if len(a) != 1 || !a[0].IPv6Addr.Equal(net.ParseIP("fd10:0:2::2")) ||
		a[0].ValidLifetime != 999*24*time.Hour || a[0].PreferredLifetime != 999*24*time.Hour {
		t.Fatalf("%s: IA addresses %v, want fd10:0:2::2 for 999 days", what, a)
	}
	if st := ias[0].Options.Status(); st != nil {
		t.Fatalf("%s: IA_NA status %v, want none", what, st)
	}
	if dns := resp.Options.DNS(); len(dns) != 1 || !dns[0].Equal(net.ParseIP("fd00:96::a")) {
		t.Fatalf("%s: DNS %v, want fd00:96::a", what, dns)
	}
	if sid := resp.Options.ServerID(); sid == nil || !sid.Equal(testLease6.ServerID) {
		t.Fatalf("%s: server ID %v, want %v", what, sid, testLease6.ServerID)
	}
	if st := resp.Options.Status(); st != nil {
		t.Fatalf("%s: status %v, want none", what, st)
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
	if cid := back.Options.ClientID(); back.TransactionID != m.TransactionID || cid == nil || !cid.Equal(m.Options.ClientID()) {
		t.Fatalf("%s: answer %s for another transaction or client", m.MessageType, back.Summary())
	}
	return back, nil
}

var iaid1234 = [4]byte{1, 2, 3, 4}

// The exchanges of a stateful client, each answered with the one lease as
// KubeVirt's server answers them: an Advertise for the Solicit, a Reply
// for Request, Renew, Rebind, Confirm, Release and Information-request.
func TestAnswer6Exchanges(t *testing.T) {
	sol := solicit(t)
	adv, err := answer(t, sol)
	if err != nil {
		t.Fatal(err)
	}
	if adv.MessageType != dhcpv6.MessageTypeAdvertise || adv.GetOneOption(dhcpv6.OptionRapidCommit) != nil {
		t.Fatalf("Solicit answered with %s, want Advertise without Rapid Commit", adv.Summary())
	}
	checkLease(t, "Advertise", adv, iaid1234)

	req, err := dhcpv6.NewRequestFromAdvertise(adv)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []*dhcpv6.Message{
		req,
		withType(req, dhcpv6.MessageTypeRenew, testLease6.ServerID),
		withType(req, dhcpv6.MessageTypeRebind, nil),
		withType(req, dhcpv6.MessageTypeConfirm, nil),
		withType(req, dhcpv6.MessageTypeRelease, testLease6.ServerID),
		withType(req, dhcpv6.MessageTypeInformationRequest, nil),
	} {
		rep, err := answer(t, m)
		if err != nil {
			t.Fatalf("%s: %v", m.MessageType, err)
		}
		if rep.MessageType != dhcpv6.MessageTypeReply || rep.GetOneOption(dhcpv6.OptionRapidCommit) != nil {
			t.Fatalf("%s answered with %s, want Reply without Rapid Commit", m.MessageType, rep.Summary())
		}
		checkLease(t, "Reply to "+m.MessageType.String(), rep, iaid1234)
	}

	// Rapid Commit: the Solicit gets the Reply at once.
	rc, err := answer(t, solicit(t, dhcpv6.WithRapidCommit))
	if err != nil || rc.MessageType != dhcpv6.MessageTypeReply || rc.GetOneOption(dhcpv6.OptionRapidCommit) == nil {
		t.Fatalf("Solicit with Rapid Commit: answer %v (%v), want Reply with Rapid Commit", rc, err)
	}
	checkLease(t, "rapid Reply", rc, iaid1234)
}

// KubeVirt's server does not look at the server ID a message names, nor
// at the addresses a Confirm names: each gets the lease.
func TestAnswer6IgnoresServerIDAndAddresses(t *testing.T) {
	other := serverDUID(mustMAC("02:00:00:00:00:99"))
	sol := solicit(t)
	conf := withType(sol, dhcpv6.MessageTypeConfirm, nil)
	conf.UpdateOption(&dhcpv6.OptIANA{IaId: iaid1234, Options: dhcpv6.IdentityOptions{Options: dhcpv6.Options{
		&dhcpv6.OptIAAddress{IPv6Addr: net.ParseIP("fd99::7"), ValidLifetime: time.Hour, PreferredLifetime: time.Hour},
	}}})
	for what, m := range map[string]*dhcpv6.Message{
		"a Request for another server": withType(sol, dhcpv6.MessageTypeRequest, other),
		"a Renew without a server ID":  withType(sol, dhcpv6.MessageTypeRenew, nil),
		"a Rebind naming a server":     withType(sol, dhcpv6.MessageTypeRebind, other),
		"a Confirm of fd99::7":         conf,
	} {
		rep, err := answer(t, m)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if rep.MessageType != dhcpv6.MessageTypeReply {
			t.Fatalf("%s answered with %s, want Reply", what, rep.Summary())
		}
		checkLease(t, what, rep, iaid1234)
	}
	adv, err := answer(t, withType(sol, dhcpv6.MessageTypeSolicit, other))
	if err != nil || adv.MessageType != dhcpv6.MessageTypeAdvertise {
		t.Fatalf("a Solicit naming a server: answer %v (%v), want Advertise", adv, err)
	}
	checkLease(t, "Advertise to a Solicit naming a server", adv, iaid1234)
}

// A Solicit without an IA_NA gets the address all the same, in an IA_NA
// with IAID 0; one with two IA_NAs gets one, in the first's IAID.
func TestAnswer6IANAs(t *testing.T) {
	none := solicit(t)
	none.Options.Del(dhcpv6.OptionIANA)
	adv, err := answer(t, none)
	if err != nil {
		t.Fatal(err)
	}
	checkLease(t, "Advertise to a Solicit without IA_NA", adv, [4]byte{})

	two := solicit(t)
	two.AddOption(&dhcpv6.OptIANA{IaId: [4]byte{9, 9, 9, 9}})
	if adv, err = answer(t, two); err != nil {
		t.Fatal(err)
	}
	checkLease(t, "Advertise to a Solicit with two IA_NAs", adv, iaid1234)
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
	noCID := func(m *dhcpv6.Message) *dhcpv6.Message {
		m.Options.Del(dhcpv6.OptionClientID)
		return m
	}
	for what, m := range map[string]*dhcpv6.Message{
		"a Solicit without a client ID":            noCID(withType(sol, dhcpv6.MessageTypeSolicit, nil)),
		"a Request without a client ID":            noCID(withType(req, dhcpv6.MessageTypeRequest, testLease6.ServerID)),
		"an Information-request without client ID": noCID(withType(req, dhcpv6.MessageTypeInformationRequest, nil)),
		"a Decline":            withType(req, dhcpv6.MessageTypeDecline, testLease6.ServerID),
		"a server's Advertise": adv,
		"a server's Reply":     withType(req, dhcpv6.MessageTypeReply, testLease6.ServerID),
		"a Reconfigure":        withType(req, dhcpv6.MessageTypeReconfigure, testLease6.ServerID),
	} {
		if resp, err := answer(t, m); err == nil {
			t.Errorf("%s answered: %s", what, resp.Summary())
		}
	}
	if _, err := answer6([]byte{1, 2}, testLease6); !errors.Is(err, errNoAnswer) {
		t.Errorf("a short datagram: error %v, want errNoAnswer", err)
	}
}

// DHCPv6 packets come from the guest: whatever it sends, answer6 answers
// with an error wrapping errNoAnswer or a message for the same transaction
// and client that parses again, carries the server's ID and binds the
// address in one IA_NA, with the IAID of the client's first IA_NA (0 when
// it sent none).
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
		if out.TransactionID != in.TransactionID || out.Options.ServerID() == nil || !out.Options.ServerID().Equal(testLease6.ServerID) ||
			in.Options.ClientID() == nil || !out.Options.ClientID().Equal(in.Options.ClientID()) {
			t.Fatalf("answer %s: another transaction, client or server", out.Summary())
		}
		var want [4]byte
		if ia := in.Options.OneIANA(); ia != nil {
			want = ia.IaId
		}
		if ias := out.Options.IANA(); len(ias) != 1 || ias[0].IaId != want || len(ias[0].Options.Addresses()) != 1 {
			t.Fatalf("answer's IA_NAs %v, want one with IAID %x and the address", ias, want)
		}
	})
}
