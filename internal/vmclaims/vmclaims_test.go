package vmclaims_test

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"

	"kvnet.io/kvnet/internal/vmclaims"
)

func TestClaimName(t *testing.T) {
	long := func(c string, n int) string { return strings.Repeat(c, n) }
	for _, tc := range []struct {
		name, vm, network, want string
	}{
		{"vm dot network", "vm1", "blue-net", "vm1.blue-net"},
		{"lowercased", "MyVM", "Blue", "myvm.blue"},
		{"dotted vm name", "web.prod", "net", "web.prod.net"},
		// Only the parts that are DNS subdomains are kept (as ipam-extensions).
		{"invalid network dropped", "vm1", "blue_net", "vm1"},
		{"invalid vm dropped", "-vm", "net", "net"},
		{"nothing valid", "a_b", "c d", ""},
		{"fits exactly", long("a", 249), "net", long("a", 249) + ".net"},
		// Truncated to 253 characters, then trailing dots and dashes trimmed
		// so the result stays a DNS subdomain.
		{"truncated", long("a", 240), long("b", 63), long("a", 240) + "." + long("b", 12)},
		{"trailing dot trimmed", long("a", 252), "net", long("a", 252)},
		{"trailing dash trimmed", long("a", 250), "b-c", long("a", 250) + ".b"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := vmclaims.ClaimName(tc.vm, tc.network)
			if got != tc.want {
				t.Fatalf("ClaimName(%q, %q) = %q, want %q", tc.vm, tc.network, got, tc.want)
			}
			if got != "" {
				if errs := validation.IsDNS1123Subdomain(got); len(errs) > 0 {
					t.Errorf("%q is no DNS subdomain: %v", got, errs)
				}
			}
			if again := vmclaims.ClaimName(tc.vm, tc.network); again != got {
				t.Errorf("not deterministic: %q then %q", got, again)
			}
		})
	}
}
