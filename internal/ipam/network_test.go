package ipam

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"kvnet.io/kvnet/internal/ipam/allocator"
	"kvnet.io/kvnet/internal/netconf"
)

// FuzzNetworkConfig feeds NAD configurations (hand-written ones are user
// input) through the allocator's path: served configuration, allocator
// configuration, network. Every error names the network; a network that
// builds hands out addresses inside its subnets.
func FuzzNetworkConfig(f *testing.F) {
	for _, s := range []string{
		`{"type":"kvnet-cni","name":"ns_a","topology":"layer2","role":"primary","subnets":"10.0.0.0/24,fd00::/64","infrastructureSubnets":"10.0.0.0/30","defaultGatewayIPs":"10.0.0.1","reservedSubnets":"10.0.0.16/28","excludeSubnets":"10.0.0.200/29"}`,
		`{"type":"kvnet-cni","name":"ns_b","topology":"localnet","subnets":"192.168.0.0/24","excludeSubnets":"192.168.0.1/32"}`,
		`{"type":"kvnet-cni","name":"ns_c","topology":"layer3","subnets":"10.0.0.0/16/24"}`,
		`{"type":"kvnet-cni","name":"ns_d","topology":"layer2"}`,
		`{"type":"bridge","name":"mig","ipam":{"type":"kvnet-ipam","subnets":"10.200.0.0/24","excludeSubnets":"10.200.0.0/28","gatewayIPs":"10.200.0.254"}}`,
		`{"type":"kvnet-cni","name":"e","topology":"layer2","role":"primary","subnets":"10.0.0.0/24","defaultGatewayIPs":"10.1.0.1"}`,
		`{"type":"kvnet-cni","name":"f","topology":"layer2","subnets":"10.0.0.0/24,10.1.0.0/24"}`,
		`{"type":"kvnet-cni","name":"g","topology":"layer2","subnets":"10.0.0.0/31"}`,
		`{"type":"kvnet-cni","name":"h","topology":"layer2","subnets":"::ffff:10.0.0.0/120"}`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, config string) {
		s, err := netconf.ParseServed(config)
		if err != nil || s == nil {
			return // FuzzParseServed covers these
		}
		cfg, err := NetworkConfig(s)
		if err != nil {
			if !strings.Contains(err.Error(), fmt.Sprintf("network %q", s.Name)) {
				t.Fatalf("error does not name the network: %v", err)
			}
			return
		}
		for _, p := range cfg.Subnets {
			if p.Addr().Is4() && p.Bits() < 12 {
				return // valid, but a 2 MiB bitmap per run slows the fuzzer down
			}
		}
		n, err := allocator.NewNetwork(cfg)
		if err != nil {
			if !errors.Is(err, allocator.ErrInvalid) || !strings.Contains(err.Error(), fmt.Sprintf("%q", s.Name)) {
				t.Fatalf("error without ErrInvalid or the network: %v", err)
			}
			return
		}
		a, err := n.Allocate(allocator.Request{Owner: "pod/1"})
		if err != nil {
			return // a network may be too small for any pod
		}
		for _, ip := range a.IPs {
			inside := false
			for _, p := range cfg.Subnets {
				inside = inside || (p.Masked().Contains(ip.Addr()) && p.Bits() == ip.Bits())
			}
			if !inside {
				t.Fatalf("%s is outside the subnets %v", ip, cfg.Subnets)
			}
		}
	})
}
