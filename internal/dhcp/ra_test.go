package dhcp

import (
	"bytes"
	"errors"
	"net"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestAdvertisement(t *testing.T) {
	prefix := netip.MustParsePrefix("2001:db8::/60")
	dns := []netip.Addr{netip.MustParseAddr("fd00:10:96::a"), netip.MustParseAddr("2001:db8:53::53")}
	search := []string{"ns1.svc.cluster.local", "svc.cluster.local", "cluster.local"}
	b, err := advertisement(raContent{prefixes: []netip.Prefix{prefix}, mac: gwMAC6, mtu: 1400, defaultRouter: true,
		dns: dns, search: search, dnsLifetime: 3 * time.Minute}).marshal()
	if err != nil {
		t.Fatalf("marshal: %v", err)
	}
	ra, err := parseRA(b)
	if err != nil {
		t.Fatalf("parseRA: %v", err)
	}
	want := &routerAdvert{HopLimit: 64, Managed: true, Other: true, RouterLifetime: DefaultRouterLifetime,
		SourceMAC: gwMAC6, MTU: 1400,
		Prefixes: []raPrefix{{Prefix: prefix, OnLink: true, ValidLifetime: raPrefixLifetime, Preferred: raPrefixLifetime}},
		DNS:      dns, DNSLifetime: 3 * time.Minute, Search: search, SearchLifetime: 3 * time.Minute}
	if !reflect.DeepEqual(ra, want) {
		t.Errorf("advertisement %+v, want %+v (managed, on-link, never autonomous, RDNSS and DNSSL)", ra, want)
	}
	// The options as RFC 8106 lays them out, byte for byte.
	rdnss := []byte{ndOptRDNSS, 5, 0, 0, 0, 0, 0, 180}
	for _, a := range dns {
		a16 := a.As16()
		rdnss = append(rdnss, a16[:]...)
	}
	dnssl := append([]byte{ndOptDNSSL, 9, 0, 0, 0, 0, 0, 180},
		"\x03ns1\x03svc\x07cluster\x05local\x00\x03svc\x07cluster\x05local\x00\x07cluster\x05local\x00"...)
	dnssl = append(dnssl, make([]byte, 72-len(dnssl))...) // 8 + 57 bytes of names, padded
	if tail := b[len(b)-len(rdnss)-len(dnssl):]; !bytes.Equal(tail, append(rdnss, dnssl...)) {
		t.Errorf("RDNSS and DNSSL options % x, want % x", tail, append(rdnss, dnssl...))
	}

	secondary, err := advertisement(raContent{prefixes: []netip.Prefix{prefix}, mac: gwMAC6}).marshal()
	if err != nil {
		t.Fatal(err)
	}
	if ra, err := parseRA(secondary); err != nil || ra.RouterLifetime != 0 || ra.MTU != 0 || ra.DNS != nil || ra.Search != nil {
		t.Errorf("secondary network's advertisement %+v, %v: want router lifetime 0, no MTU, no DNS", ra, err)
	}
	for name, tc := range map[string]struct {
		ra   routerAdvert
		want error
	}{
		"ipv4 dns server": {routerAdvert{DNS: []netip.Addr{netip.MustParseAddr("10.0.0.1")}}, errBadRDNSS},
		"empty domain":    {routerAdvert{Search: []string{"a", ""}}, errBadDNSSL},
		"empty label":     {routerAdvert{Search: []string{"a..b"}}, errBadDNSSL},
		"long label":      {routerAdvert{Search: []string{strings.Repeat("a", 64) + ".com"}}, errBadDNSSL},
		"long list":       {routerAdvert{Search: slices.Repeat([]string{strings.Repeat("a", 60) + ".example"}, 40)}, errRAOverflow},
	} {
		if _, err := tc.ra.marshal(); !errors.Is(err, tc.want) {
			t.Errorf("%s: marshal error %v, want %v", name, err, tc.want)
		}
	}
	if _, err := (&routerAdvert{Prefixes: []raPrefix{{Prefix: netip.MustParsePrefix("10.0.0.0/24")}}}).marshal(); !errors.Is(err, errBadPrefix) {
		t.Errorf("marshal of an IPv4 prefix: %v, want %v", err, errBadPrefix)
	}
	if _, err := (&routerAdvert{RouterLifetime: 20 * time.Hour}).marshal(); err == nil {
		t.Error("marshal of a 20h router lifetime: no error")
	}
}

func TestParseRS(t *testing.T) {
	rs := []byte{icmp6RouterSolicitation, 0, 0, 0, 0, 0, 0, 0, ndOptSourceLinkAddr, 1, 0x52, 0x54, 0, 0, 0, 5}
	mac, err := parseRS(rs)
	if err != nil || mac.String() != guestMAC6.String() {
		t.Fatalf("parseRS = %v, %v; want %s", mac, err, guestMAC6)
	}
	for name, tc := range map[string]struct {
		b    []byte
		want error
	}{
		"short":            {rs[:4], errShortND},
		"advertisement":    {append([]byte{icmp6RouterAdvertisement}, rs[1:]...), errNotRS},
		"zero-length opt":  {append(rs[:8:8], 1, 0), errBadNDOpt},
		"opt past the end": {append(rs[:8:8], 1, 2, 0, 0), errBadNDOpt},
		"long lladdr":      {append(rs[:8:8], 1, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), errBadLLAddr},
	} {
		if _, err := parseRS(tc.b); !errors.Is(err, tc.want) {
			t.Errorf("%s: parseRS error %v, want %v", name, err, tc.want)
		}
	}
}

// FuzzND parses arbitrary bytes as a router advertisement and as a router
// solicitation. Neither parser panics, and an advertisement that parses
// encodes back to one that parses the same.
func FuzzND(f *testing.F) {
	ra, _ := advertisement(raContent{prefixes: []netip.Prefix{netip.MustParsePrefix("2001:db8::/64"), netip.MustParsePrefix("fd00::/48")}, mac: gwMAC6, mtu: 1500, defaultRouter: true,
		dns: []netip.Addr{netip.MustParseAddr("fd00::53")}, search: []string{"cluster.local", "example.com"}, dnsLifetime: time.Hour}).marshal()
	f.Add(ra)
	f.Add(ra[:raHeaderLen])
	f.Add(append(ra[:raHeaderLen:raHeaderLen], 1, 0))
	f.Add(append(ra[:raHeaderLen:raHeaderLen], 99, 1, 0, 0, 0, 0, 0, 0)) // unknown option
	f.Add(append(ra[:raHeaderLen:raHeaderLen], ndOptPrefixInfo, 4, 200, 0xc0, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0,
		0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)) // prefix length 200
	f.Add(append(ra[:raHeaderLen:raHeaderLen], ndOptRDNSS, 1, 0, 0, 0, 0, 0, 1))                               // RDNSS without a server
	f.Add(append(ra[:raHeaderLen:raHeaderLen], ndOptDNSSL, 2, 0, 0, 0, 0, 0, 1, 0xc0, 0x0c, 0, 0, 0, 0, 0, 0)) // a compression pointer
	f.Add(append(ra[:raHeaderLen:raHeaderLen], ndOptDNSSL, 2, 0, 0, 0, 0, 0, 1, 1, 'a', 0, 0, 1, 0, 0, 0))     // data after padding
	f.Add(append(ra[:raHeaderLen:raHeaderLen], ndOptDNSSL, 2, 0, 0, 0, 0, 0, 1, 3, 'a', '.', 'b', 0, 0, 0, 0)) // a dot in a label
	f.Add([]byte{icmp6RouterSolicitation, 0, 0, 0, 0, 0, 0, 0, ndOptSourceLinkAddr, 1, 0x52, 0x54, 0, 0, 0, 5})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		if mac, err := parseRS(b); err == nil && mac != nil && len(mac) != 6 {
			t.Fatalf("parseRS returned a %d-byte MAC", len(mac))
		}
		ra, err := parseRA(b)
		if err != nil {
			if ra != nil {
				t.Fatalf("parseRA returned %+v with error %v", ra, err)
			}
			return
		}
		enc, err := ra.marshal()
		if errors.Is(err, errRAOverflow) {
			return // the input was large: many prefixes
		}
		if err != nil {
			t.Fatalf("marshal of parsed %+v: %v", ra, err)
		}
		again, err := parseRA(enc)
		if err != nil || !reflect.DeepEqual(again, ra) {
			t.Fatalf("round trip: %+v, %v; want %+v", again, err, ra)
		}
	})
}

func TestParseRADNS(t *testing.T) {
	hdr := make([]byte, raHeaderLen)
	hdr[0] = icmp6RouterAdvertisement
	for name, tc := range map[string]struct {
		opt  []byte
		want error
	}{
		"rdnss without a server": {[]byte{ndOptRDNSS, 1, 0, 0, 0, 0, 0, 1}, errBadRDNSS},
		"rdnss of even length":   {append([]byte{ndOptRDNSS, 2, 0, 0, 0, 0, 0, 1}, make([]byte, 8)...), errBadRDNSS},
		"dnssl without a name":   {[]byte{ndOptDNSSL, 2, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0}, errBadDNSSL},
		"dnssl pointer":          {[]byte{ndOptDNSSL, 2, 0, 0, 0, 0, 0, 1, 0xc0, 0x0c, 0, 0, 0, 0, 0, 0}, errBadDNSSL},
		"dnssl label past end":   {[]byte{ndOptDNSSL, 2, 0, 0, 0, 0, 0, 1, 9, 'a', 'b', 0, 0, 0, 0, 0}, errBadDNSSL},
		"dnssl unterminated":     {[]byte{ndOptDNSSL, 2, 0, 0, 0, 0, 0, 1, 7, 'a', 'b', 'c', 'd', 'e', 'f', 'g'}, errBadDNSSL},
		"dnssl after padding":    {[]byte{ndOptDNSSL, 2, 0, 0, 0, 0, 0, 1, 1, 'a', 0, 0, 1, 0, 0, 0}, errBadDNSSL},
	} {
		if ra, err := parseRA(append(slices.Clone(hdr), tc.opt...)); !errors.Is(err, tc.want) || ra != nil {
			t.Errorf("%s: parseRA = %+v, %v; want %v", name, ra, err, tc.want)
		}
	}
}

// TestRAPacer drives the advertisement schedule with a simulated clock: a
// guest flooding solicitations (100 in a second) gets few multicast
// advertisements, never two within MIN_DELAY_BETWEEN_RAS, and every
// solicitation is still answered by an advertisement after it.
func TestRAPacer(t *testing.T) {
	t0 := time.Unix(0, 0)
	p := newRAPacer(t0, DefaultRAInterval)
	var sent []time.Time
	// run advances the simulated clock to until, sending what is due.
	run := func(until time.Time) {
		for !p.next.After(until) {
			sent = append(sent, p.next)
			p.sent(p.next, 0.5)
		}
	}
	// The first advertisement goes at once.
	run(t0)
	if len(sent) != 1 || !sent[0].Equal(t0) {
		t.Fatalf("advertisements at start %v, want one at once", sent)
	}
	// A solicitation a while later is answered within MAX_RA_DELAY_TIME.
	rs := t0.Add(10 * time.Second)
	run(rs)
	before := len(sent)
	p.solicit(rs, 100*time.Millisecond)
	run(rs.Add(maxRADelay))
	if len(sent) != before+1 || !sent[len(sent)-1].Equal(rs.Add(100*time.Millisecond)) {
		t.Fatalf("answer to a lone solicitation: %v, want one at %v", sent[before:], rs.Add(100*time.Millisecond))
	}

	// 100 solicitations within one second, each with its random delay.
	flood := rs.Add(time.Second)
	before = len(sent)
	var last time.Time
	for i := range 100 {
		at := flood.Add(time.Duration(i) * 10 * time.Millisecond)
		run(at)
		p.solicit(at, time.Duration(i*37%500)*time.Millisecond)
		last = at
	}
	// Until the last solicitation is sure to be answered.
	run(last.Add(minDelayBetweenRAs + maxRADelay))
	during := sent[before:]
	if len(during) == 0 || len(during) > 2 {
		t.Errorf("%d multicast advertisements for 100 solicitations in a second (%v), want 1 or 2", len(during), during)
	}
	if a := during[len(during)-1]; a.Before(last) {
		t.Errorf("the last solicitation (at %v) is never answered: last advertisement at %v", last, a)
	}
	for i := 1; i < len(sent); i++ {
		if gap := sent[i].Sub(sent[i-1]); gap < minDelayBetweenRAs {
			t.Errorf("advertisements %d and %d %s apart, below %s", i-1, i, gap, minDelayBetweenRAs)
		}
	}

	// Unsolicited ones: the first few at most 16 s apart, then between a
	// third of the interval and the interval.
	q := newRAPacer(t0, DefaultRAInterval)
	now := t0
	for i := range 6 {
		q.sent(now, 0.99)
		gap := q.next.Sub(now)
		lo, hi := DefaultRAInterval/3, DefaultRAInterval
		if i < maxInitialRAs {
			lo, hi = minDelayBetweenRAs, maxInitialRAInterval
		}
		if gap < lo || gap > hi {
			t.Errorf("unsolicited advertisement %d: next after %s, want %s-%s", i+1, gap, lo, hi)
		}
		now = q.next
	}
}

func TestSharedDNS(t *testing.T) {
	l := NewStaticLeases()
	if dns, search := sharedDNS(l); dns != nil || search != nil {
		t.Errorf("no lease: %v %v, want none", dns, search)
	}
	a6, b6 := netip.MustParseAddr("fd00::a"), netip.MustParseAddr("fd00::b")
	l.Set(net.HardwareAddr{2, 0, 0, 0, 0, 1}, Lease{DNS: []netip.Addr{netip.MustParseAddr("10.96.0.10"), a6, b6}, Search: []string{"ns1.svc.cluster.local", "svc.cluster.local", "cluster.local"}})
	l.Set(net.HardwareAddr{2, 0, 0, 0, 0, 2}, Lease{DNS: []netip.Addr{a6, b6}, Search: []string{"ns2.svc.cluster.local", "svc.cluster.local", "cluster.local"}})
	dns, search := sharedDNS(l)
	if !slices.Equal(dns, []netip.Addr{a6, b6}) || !slices.Equal(search, []string{"svc.cluster.local", "cluster.local"}) {
		t.Errorf("sharedDNS = %v %v, want the IPv6 servers and the domains both leases have", dns, search)
	}
	if dns, search := sharedDNS(staticLookup{}); dns != nil || search != nil {
		t.Errorf("leases that cannot be listed: %v %v, want none", dns, search)
	}
}

// staticLookup is a Leases without Range.
type staticLookup struct{}

func (staticLookup) Lookup(net.HardwareAddr) (Lease, bool) { return Lease{}, false }
