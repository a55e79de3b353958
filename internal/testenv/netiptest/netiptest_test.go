package netiptest

import (
	"net/netip"
	"slices"
	"testing"
)

func TestMustPrefixes(t *testing.T) {
	got := MustPrefixes("10.0.0.0/24", "fd00::/64")
	want := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/24"), netip.MustParsePrefix("fd00::/64")}
	if !slices.Equal(got, want) {
		t.Fatalf("MustPrefixes = %v, want %v", got, want)
	}
	defer func() {
		if recover() == nil {
			t.Error("MustPrefixes of a malformed prefix did not panic")
		}
	}()
	MustPrefixes("10.0.0.0/33")
}
