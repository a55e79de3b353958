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
		err := configure(&cfg, "", "192.0.2.53", tt.svc, "")
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

// TestConfigureServiceCIDRs: --service-cidrs is parsed (masked), and a
// bad entry is refused with the flag and value named.
func TestConfigureServiceCIDRs(t *testing.T) {
	cfg := node.Config{ClusterDomain: "cluster.local"}
	cfg.Datapath.NetNS = "lab"
	if err := configure(&cfg, "", "192.0.2.53", "kube-system/kube-dns", "10.96.0.1/12, fd00:96::/108"); err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(cfg.ServiceCIDRs); got != "[10.96.0.0/12 fd00:96::/108]" {
		t.Errorf("service CIDRs %s", got)
	}
	cfg = node.Config{ClusterDomain: "cluster.local"}
	cfg.Datapath.NetNS = "lab"
	if err := configure(&cfg, "", "192.0.2.53", "kube-system/kube-dns", "10.96.0.0/12,10.300.0.0/16"); err == nil || !strings.Contains(err.Error(), `--service-cidrs "10.300.0.0/16"`) {
		t.Errorf("bad CIDR: %v", err)
	}
}
