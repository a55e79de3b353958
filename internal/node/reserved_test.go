package node

import (
	"testing"

	"kvnet.io/kvnet/internal/netconf"
	"kvnet.io/kvnet/internal/reserved"
)

// TestFillReserved: a primary network whose NAD names no join or transit
// subnet gets the cluster's configured ones (kvnet-node's flags), not the
// built-in defaults; a NAD's own are kept.
func TestFillReserved(t *testing.T) {
	r, err := reserved.Parse(reserved.DefaultMasquerade, "100.70.0.0/16,fd9a::/64", "100.90.0.0/16,fd9b::/64")
	if err != nil {
		t.Fatal(err)
	}
	c := &netconf.NetConf{Topology: netconf.TopologyLayer3, Role: netconf.RolePrimary}
	fillReserved(c, r)
	if c.JoinSubnet != "100.70.0.0/16,fd9a::/64" || c.TransitSubnet != "100.90.0.0/16,fd9b::/64" {
		t.Errorf("filled %q, %q: want the configured subnets", c.JoinSubnet, c.TransitSubnet)
	}
	addrs, _, err := serviceAddrs(c.TransitSubnet, 3)
	if err != nil || addrs[0].String() != "100.90.0.3/16" {
		t.Errorf("service address on node 3 = %v, %v: want 100.90.0.3/16", addrs, err)
	}
	own := &netconf.NetConf{Role: netconf.RolePrimary, JoinSubnet: "100.66.0.0/16", TransitSubnet: "100.89.0.0/16"}
	fillReserved(own, r)
	if own.JoinSubnet != "100.66.0.0/16" || own.TransitSubnet != "100.89.0.0/16" {
		t.Errorf("a NAD's own subnets were replaced: %q, %q", own.JoinSubnet, own.TransitSubnet)
	}
	def := &netconf.NetConf{Role: netconf.RolePrimary}
	fillReserved(def, reserved.Subnets{})
	if def.TransitSubnet != reserved.DefaultTransit {
		t.Errorf("zero config: transit %q, want the default", def.TransitSubnet)
	}
}
