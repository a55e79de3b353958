package reserved

import (
	"flag"
	"net/netip"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	d := Default()
	if Join(d.Masquerade) != DefaultMasquerade || Join(d.Join) != DefaultJoin || Join(d.Transit) != DefaultTransit {
		t.Fatalf("defaults %+v", d)
	}
	// IPv6 first is fine; the result is IPv4 first.
	s, err := Parse("fd70::/112,169.254.128.0/17", DefaultJoin, DefaultTransit)
	if err != nil || s.Masquerade[0] != netip.MustParsePrefix("169.254.128.0/17") {
		t.Fatalf("Parse = %+v, %v", s, err)
	}
	for _, tt := range []struct{ m, j, tr, want string }{
		{"169.254.0.0/17", DefaultJoin, DefaultTransit, `--masquerade-subnets "169.254.0.0/17": want one IPv4 and one IPv6 subnet`},
		{"169.254.0.0/19,fd69::/112", DefaultJoin, DefaultTransit, `--masquerade-subnets value "169.254.0.0/19": too small`},
		{DefaultMasquerade, "100.65.0.1/16,fd99::/64", DefaultTransit, `--join-subnets value "100.65.0.1/16": not a network address (want 100.65.0.0/16)`},
		{DefaultMasquerade, DefaultJoin, "100.65.0.0/24,fd97::/64", `--join-subnets value "100.65.0.0/16" overlaps --transit-subnets value "100.65.0.0/24"`},
		{DefaultMasquerade, "nonsense", DefaultTransit, `--join-subnets value "nonsense"`},
		{DefaultMasquerade, DefaultJoin, "100.88.0.0/16,100.89.0.0/16,fd97::/64", `--transit-subnets "100.88.0.0/16,100.89.0.0/16,fd97::/64": more than one subnet of a family`},
	} {
		if _, err := Parse(tt.m, tt.j, tt.tr); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("Parse(%q, %q, %q) = %v, want an error containing %q", tt.m, tt.j, tt.tr, err, tt.want)
		}
	}
}

func TestFlagsFromEnvironment(t *testing.T) {
	t.Setenv(EnvJoin, "100.70.0.0/16,fd9a::/64")
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	get := Flags(fs)
	if err := fs.Parse([]string{"--transit-subnets=100.90.0.0/16,fd9b::/64"}); err != nil {
		t.Fatal(err)
	}
	s, err := get()
	if err != nil {
		t.Fatal(err)
	}
	if Join(s.Join) != "100.70.0.0/16,fd9a::/64" || Join(s.Transit) != "100.90.0.0/16,fd9b::/64" || Join(s.Masquerade) != DefaultMasquerade {
		t.Errorf("got %+v: want join from the environment, transit from the flag, masquerade the default", s)
	}
}

func TestOverlap(t *testing.T) {
	d := Default()
	got := Overlap(d.Masquerade, "masquerade-subnets", []netip.Prefix{netip.MustParsePrefix("10.0.0.0/24"), netip.MustParsePrefix("169.254.3.0/24")}, "user defined subnet")
	want := `masquerade subnet "169.254.0.0/17" (kvnet-controller --masquerade-subnets) overlaps user defined subnet "169.254.3.0/24"`
	if got != want {
		t.Errorf("Overlap = %q, want %q", got, want)
	}
	if got := Overlap(d.Masquerade, "masquerade-subnets", []netip.Prefix{netip.MustParsePrefix("10.0.0.0/24")}, "x"); got != "" {
		t.Errorf("Overlap of disjoint subnets = %q", got)
	}
}
