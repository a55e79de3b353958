package datapath

import (
	"net/netip"
	"strings"
	"testing"
)

// TestSetMasqueradeSubnets: the cluster's masquerade subnets number the
// transit addresses; too small or misordered ones are refused.
func TestSetMasqueradeSubnets(t *testing.T) {
	old4, old6 := transitPrefix4, transitPrefix6
	t.Cleanup(func() { transitPrefix4, transitPrefix6 = old4, old6 })
	if err := SetMasqueradeSubnets(netip.MustParsePrefix("169.254.128.0/17"), netip.MustParsePrefix("fd70::/112")); err != nil {
		t.Fatal(err)
	}
	r, n, err := TransitAddrs(1, false)
	if err != nil || r.String() != "169.254.128.11" || n.String() != "169.254.128.12" {
		t.Errorf("TransitAddrs(1) = %s, %s, %v: want 169.254.128.11, .12", r, n, err)
	}
	if r, _, _ := TransitAddrs(1, true); r.String() != "fd70::b" {
		t.Errorf("TransitAddrs(1, v6) = %s, want fd70::b", r)
	}
	for _, bad := range [][2]string{{"169.254.0.0/19", "fd69::/112"}, {"fd69::/112", "169.254.0.0/17"}} {
		err := SetMasqueradeSubnets(netip.MustParsePrefix(bad[0]), netip.MustParsePrefix(bad[1]))
		if err == nil || !strings.Contains(err.Error(), "masquerade subnet") {
			t.Errorf("SetMasqueradeSubnets(%s, %s) = %v, want an error", bad[0], bad[1], err)
		}
	}
	if transitPrefix4.String() != "169.254.128.0/17" {
		t.Errorf("a refused setting changed the prefix to %s", transitPrefix4)
	}
}
