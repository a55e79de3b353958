package main

import (
	"fmt"
	"strings"
	"testing"

	"kvnet.io/kvnet/internal/node"
)

// TestConfigureClusterDNS: --cluster-dns-service and --cluster-domain are
// taken when valid, and refused with the flag and value named otherwise.
func TestConfigureClusterDNS(t *testing.T) {
	for _, tt := range []struct {
		svc, domain, want string
	}{
		{"openshift-dns/dns-default", "cluster.local", ""},
		{"kube-dns", "cluster.local", `--cluster-dns-service "kube-dns": want namespace/name`},
		{"kube-system/", "cluster.local", `--cluster-dns-service "kube-system/": want namespace/name`},
		{"kube-system/a/b", "cluster.local", `want namespace/name`},
		{"Kube_System/kube-dns", "cluster.local", `--cluster-dns-service "Kube_System/kube-dns": namespace:`},
		{"kube-system/kube-dns", "not a domain", `--cluster-domain "not a domain"`},
	} {
		cfg := node.Config{ClusterDomain: tt.domain}
		cfg.Datapath.NetNS = "lab" // no underlay lookup
		err := configure(&cfg, flagValues{dns: "192.0.2.53", clusterDNS: tt.svc})
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("%q %q: %v", tt.svc, tt.domain, err)
		case tt.want == "" && cfg.ClusterDNS.String() != tt.svc:
			t.Errorf("%q: cluster DNS %s", tt.svc, cfg.ClusterDNS)
		case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("%q %q: %v, want an error containing %q", tt.svc, tt.domain, err, tt.want)
		}
	}
}

// TestConfigureCIDRs: --service-cidrs and --default-network-cidrs are
// parsed (masked), and a bad entry is refused with the flag and value
// named.
func TestConfigureCIDRs(t *testing.T) {
	for _, tc := range []struct {
		f                  flagValues
		services, defaults string
		err                string
	}{
		{f: flagValues{serviceCIDRs: "10.96.0.1/12, fd00:96::/108"}, services: "[10.96.0.0/12 fd00:96::/108]", defaults: "[]"},
		{f: flagValues{defaultNetworkCIDRs: "192.168.0.0/16,fd00:10:244::1/56"}, services: "[]", defaults: "[192.168.0.0/16 fd00:10:244::/56]"},
		{f: flagValues{serviceCIDRs: "10.96.0.0/12,10.300.0.0/16"}, err: `--service-cidrs "10.300.0.0/16"`},
		{f: flagValues{defaultNetworkCIDRs: "192.168.0.0/16,calico"}, err: `--default-network-cidrs "calico"`},
		{f: flagValues{defaultNetworkCIDRs: "192.168.0.0/16,"}, err: `--default-network-cidrs ""`},
	} {
		cfg := node.Config{ClusterDomain: "cluster.local"}
		cfg.Datapath.NetNS = "lab"
		tc.f.dns, tc.f.clusterDNS = "192.0.2.53", "kube-system/kube-dns"
		err := configure(&cfg, tc.f)
		switch {
		case tc.err != "":
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%+v: %v, want an error naming %s", tc.f, err, tc.err)
			}
		case err != nil:
			t.Errorf("%+v: %v", tc.f, err)
		case fmt.Sprint(cfg.ServiceCIDRs) != tc.services || fmt.Sprint(cfg.DefaultNetworkCIDRs) != tc.defaults:
			t.Errorf("%+v: service CIDRs %v, default network CIDRs %v; want %s, %s", tc.f, cfg.ServiceCIDRs, cfg.DefaultNetworkCIDRs, tc.services, tc.defaults)
		}
	}
}
