package webhooks

import (
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"kvnet.io/kvnet/internal/netconf"
	"kvnet.io/kvnet/internal/vmclaims"
)

func TestClaimSubnets(t *testing.T) {
	got, err := claimSubnets("ns/tenant", &netconf.Served{Conf: &netconf.NetConf{Subnets: "10.0.0.0/16, fd00::/64"}})
	if err != nil {
		t.Fatal(err)
	}
	if want := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/16"), netip.MustParsePrefix("fd00::/64")}; !slices.Equal(got, want) {
		t.Fatalf("subnets %v, want %v", got, want)
	}
	// A subnet that does not parse denies the pod, naming the NAD, the
	// field and the value, instead of dropping the requested IPs' check.
	_, err = claimSubnets("ns/tenant", &netconf.Served{Conf: &netconf.NetConf{Subnets: "10.0.0.0/16,10.1.0.0/33"}})
	if !errors.Is(err, vmclaims.ErrDeny) {
		t.Fatalf("err = %v, want a denial", err)
	}
	for _, want := range []string{"NAD ns/tenant", `"subnets"`, `"10.1.0.0/33"`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("err = %q, want it to name %s", err, want)
		}
	}
}
