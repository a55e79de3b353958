package ipam

import (
	"net/netip"
	"strings"
	"testing"

	"kvnet.io/kvnet/internal/ipam/allocator"
)

func TestChainValid(t *testing.T) {
	for _, tc := range []struct {
		name      string
		marker    map[string]string
		epoch     int64
		fenced    bool
		wantFrom  int64
		wantValid bool
	}{
		{"no marker", nil, 5, true, 5, false},
		{"previous leader marked", map[string]string{"from": "2", "to": "4"}, 5, true, 2, true},
		{"a leader in between did not", map[string]string{"from": "2", "to": "3"}, 5, true, 5, false},
		{"marker from a later epoch", map[string]string{"from": "2", "to": "7"}, 5, true, 5, false},
		{"from after to", map[string]string{"from": "4", "to": "3"}, 4, true, 4, false},
		{"unreadable", map[string]string{"from": "x", "to": "4"}, 5, true, 5, false},
		{"empty", map[string]string{}, 5, true, 5, false},
		{"one replica", map[string]string{"from": "0", "to": "0"}, 0, false, 0, true},
		{"one replica after a fenced chain", map[string]string{"from": "0", "to": "4"}, 0, false, 0, false},
	} {
		from, valid := chainValid(tc.marker, tc.epoch, tc.fenced)
		if from != tc.wantFrom || valid != tc.wantValid {
			t.Errorf("%s: chainValid = %d, %v; want %d, %v", tc.name, from, valid, tc.wantFrom, tc.wantValid)
		}
	}
}

func TestTuplesRoundTrip(t *testing.T) {
	cfg := allocator.Config{Subnets: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/24"), netip.MustParsePrefix("fd00::/64")}}
	in := []reserveTuple{
		{ips: []netip.Addr{netip.MustParseAddr("10.0.0.5"), netip.MustParseAddr("fd00::5")}},
		{ips: []netip.Addr{netip.MustParseAddr("10.0.0.6"), netip.MustParseAddr("fd00::6")}},
	}
	v := encodeTuples(in)
	if v != "10.0.0.5,fd00::5\n10.0.0.6,fd00::6" {
		t.Fatalf("encoded %q", v)
	}
	out, err := decodeTuples(v, cfg)
	if err != nil || len(out) != 2 || out[1][1] != in[1].ips[1] {
		t.Fatalf("decoded %v, %v", out, err)
	}
	if out, err := decodeTuples("", cfg); err != nil || out != nil {
		t.Fatalf("empty: %v, %v", out, err)
	}
	for v, want := range map[string]string{
		"10.0.0.5":            "addresses line 1 \"10.0.0.5\": 1 addresses, want one per subnet (2)",
		"10.0.0.5,fd00::5\nx": "addresses line 2 \"x\": 1 addresses",
		"10.0.1.5,fd00::5":    "addresses line 1: 10.0.1.5 is not in subnet 10.0.0.0/24",
		"fd00::5,10.0.0.5":    "is not in subnet 10.0.0.0/24",
		"10.0.0.5,zz":         "addresses line 1: ParseAddr(\"zz\")",
	} {
		if _, err := decodeTuples(v, cfg); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("decodeTuples(%q) = %v, want %q", v, err, want)
		}
	}
	if fingerprint(cfg) == fingerprint(allocator.Config{Subnets: cfg.Subnets[:1]}) {
		t.Error("fingerprint ignores the subnets")
	}
	named := cfg
	named.Name = "other"
	if fingerprint(cfg) != fingerprint(named) {
		t.Error("fingerprint depends on the network's name")
	}
}

// FuzzDecodeTuples: whatever a record holds, decoding returns an error or
// sets of one address per subnet, each in its subnet; never a panic.
func FuzzDecodeTuples(f *testing.F) {
	for _, s := range []string{"", "10.0.0.5,fd00::5", "10.0.0.5,fd00::5\n10.0.0.6,fd00::6", ",", "\n", "10.0.0.5,fd00::5,", "::ffff:10.0.0.5,fd00::5", "10.0.0.5%eth0,fd00::5"} {
		f.Add(s)
	}
	cfg := allocator.Config{Subnets: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/24"), netip.MustParsePrefix("fd00::/64")}}
	f.Fuzz(func(t *testing.T, v string) {
		out, err := decodeTuples(v, cfg)
		if err != nil {
			return
		}
		for _, ips := range out {
			if len(ips) != 2 || !cfg.Subnets[0].Contains(ips[0]) || !cfg.Subnets[1].Contains(ips[1]) {
				t.Fatalf("decodeTuples(%q) = %v", v, out)
			}
		}
	})
}
