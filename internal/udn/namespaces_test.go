package udn

import (
	"strings"
	"testing"

	udnv1 "kvnet.io/kvnet/api/udn/v1"
	"kvnet.io/kvnet/internal/reserved"
)

func TestNamespaceRule(t *testing.T) {
	r := NamespaceRule{Global: append([]string{"infra-*"}, DefaultGlobalNamespaces...)}
	for ns, refused := range map[string]bool{
		"default": true, "openshift-monitoring": true, "kube-system": true, "kube-public": true, "kube-node-lease": true,
		"infra-logging": true, "tenant-a": false, "openshift": false, "kube-systems": false, "defaults": false,
	} {
		err := r.Check(ns)
		if (err != nil) != refused {
			t.Errorf("Check(%q) = %v, want refused=%v", ns, err, refused)
		}
		if err != nil && !strings.Contains(err.Error(), `namespace "`+ns+`" may not be served by a user-defined network`) {
			t.Errorf("Check(%q) = %v: does not name the namespace", ns, err)
		}
	}
	if (NamespaceRule{}).Check("kube-system") != nil {
		t.Errorf("an empty global list refuses kube-system")
	}
}

func TestParseGlobalNamespaces(t *testing.T) {
	got, err := ParseGlobalNamespaces(" kube-system, infra-*,,")
	if err != nil || strings.Join(got, "|") != "kube-system|infra-*" {
		t.Errorf("ParseGlobalNamespaces = %q, %v", got, err)
	}
	for _, bad := range []string{"a*b", "x/y", "*a"} {
		if _, err := ParseGlobalNamespaces(bad); err == nil || !strings.Contains(err.Error(), "--global-namespaces value") {
			t.Errorf("ParseGlobalNamespaces(%q) = %v, want an error naming the flag", bad, err)
		}
	}
}

// TestRenderReservedOverlap: subnets overlapping the cluster's reserved
// subnets are refused, naming both; the configured values are used.
func TestRenderReservedOverlap(t *testing.T) {
	custom, err := reserved.Parse("169.254.0.0/17,fd69::/112", "100.70.0.0/16,fd9a::/64", "100.90.0.0/16,fd9b::/64")
	if err != nil {
		t.Fatal(err)
	}
	l2 := func(role udnv1.NetworkRole, subnets ...udnv1.CIDR) Spec {
		return Spec{Topology: udnv1.NetworkTopologyLayer2, Layer2: &udnv1.Layer2Config{Role: role, Subnets: subnets}}
	}
	l3 := func(subnet udnv1.CIDR) Spec {
		return Spec{Topology: udnv1.NetworkTopologyLayer3, Layer3: &udnv1.Layer3Config{Role: udnv1.NetworkRoleSecondary, Subnets: []udnv1.Layer3Subnet{{CIDR: subnet}}}}
	}
	for _, tt := range []struct {
		name string
		spec Spec
		want string
	}{
		{"masquerade", l2(udnv1.NetworkRoleSecondary, "169.254.10.0/24"), `masquerade subnet "169.254.0.0/17" (kvnet-controller --masquerade-subnets) overlaps user defined subnet "169.254.10.0/24"`},
		{"masquerade v6", l2(udnv1.NetworkRoleSecondary, "10.0.0.0/24", "fd69::/120"), `masquerade subnet "fd69::/112" (kvnet-controller --masquerade-subnets) overlaps user defined subnet "fd69::/120"`},
		{"join", l2(udnv1.NetworkRolePrimary, "100.70.1.0/24"), `join subnet "100.70.0.0/16" (kvnet-controller --join-subnets) overlaps user defined subnet "100.70.1.0/24"`},
		{"layer3 transit", l3("100.90.0.0/20"), `transit subnet "100.90.0.0/16" (kvnet-controller --transit-subnets) overlaps user defined subnet "100.90.0.0/20"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := RenderReserved(tt.spec, "ns_n", "ns/n", custom)
			if err == nil || !strings.Contains(err.Error(), "invalid subnet configuration: pod or join subnet overlaps with already configured internal subnets: "+tt.want) {
				t.Errorf("RenderReserved = %v, want an error ending %q", err, tt.want)
			}
		})
	}
	// The default join subnets are not reserved elsewhere: a secondary
	// network may use them; a primary network gets the configured ones.
	if _, err := RenderReserved(l2(udnv1.NetworkRoleSecondary, "100.70.0.0/24"), "ns_n", "ns/n", custom); err != nil {
		t.Errorf("secondary network on the join range: %v", err)
	}
	c, err := RenderReserved(l2(udnv1.NetworkRolePrimary, "10.0.0.0/24"), "ns_n", "ns/n", custom)
	if err != nil || c.JoinSubnet != "100.70.0.0/16,fd9a::/64" || c.TransitSubnet != "100.90.0.0/16,fd9b::/64" {
		t.Errorf("primary network: %+v, %v: want the configured join and transit subnets", c, err)
	}
}
