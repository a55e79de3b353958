// Package netiptest has tiny helpers that write addresses in tests. It
// imports nothing but the standard library, so that a light package's
// tests can use it without pulling in internal/testenv's control plane.
package netiptest

import "net/netip"

// MustPrefixes parses each of ss as a prefix ("10.0.0.0/24"), panicking on
// a malformed one: the strings are the test's own constants.
func MustPrefixes(ss ...string) []netip.Prefix {
	out := make([]netip.Prefix, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParsePrefix(s)
	}
	return out
}
