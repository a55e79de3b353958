package dhcp

import (
	"errors"
	"net/netip"
	"reflect"
	"testing"
	"time"
)

func TestAdvertisement(t *testing.T) {
	prefix := netip.MustParsePrefix("2001:db8::/60")
	b, err := advertisement([]netip.Prefix{prefix}, gwMAC6, 1400, true).marshal()
	if err != nil {
		t.Fatalf("marshal: %v", err)
	}
	ra, err := parseRA(b)
	if err != nil {
		t.Fatalf("parseRA: %v", err)
	}
	want := &routerAdvert{HopLimit: 64, Managed: true, Other: true, RouterLifetime: DefaultRouterLifetime,
		SourceMAC: gwMAC6, MTU: 1400,
		Prefixes: []raPrefix{{Prefix: prefix, OnLink: true, ValidLifetime: raPrefixLifetime, Preferred: raPrefixLifetime}}}
	if !reflect.DeepEqual(ra, want) {
		t.Errorf("advertisement %+v, want %+v (managed, on-link, never autonomous)", ra, want)
	}

	secondary, err := advertisement([]netip.Prefix{prefix}, gwMAC6, 0, false).marshal()
	if err != nil {
		t.Fatal(err)
	}
	if ra, err := parseRA(secondary); err != nil || ra.RouterLifetime != 0 || ra.MTU != 0 {
		t.Errorf("secondary network's advertisement %+v, %v: want router lifetime 0, no MTU", ra, err)
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
	ra, _ := advertisement([]netip.Prefix{netip.MustParsePrefix("2001:db8::/64"), netip.MustParsePrefix("fd00::/48")}, gwMAC6, 1500, true).marshal()
	f.Add(ra)
	f.Add(ra[:raHeaderLen])
	f.Add(append(ra[:raHeaderLen:raHeaderLen], 1, 0))
	f.Add(append(ra[:raHeaderLen:raHeaderLen], 99, 1, 0, 0, 0, 0, 0, 0)) // unknown option
	f.Add(append(ra[:raHeaderLen:raHeaderLen], ndOptPrefixInfo, 4, 200, 0xc0, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0,
		0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)) // prefix length 200
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
