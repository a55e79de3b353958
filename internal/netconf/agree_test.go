package netconf

import (
	"strings"
	"testing"
)

// TestLocalnetDefault: a localnet configuration without
// "physicalNetworkName" (as the docs' hand-written localnet NADs are) is
// attached to the physical network of its own name, as OVN-Kubernetes
// does; one that names it keeps it.
func TestLocalnetDefault(t *testing.T) {
	c, err := Parse(`{"cniVersion":"1.1.0","type":"kvnet-cni","name":"tenantblue","topology":"localnet","netAttachDefName":"ns/blue"}`)
	if err != nil {
		t.Fatal(err)
	}
	if c.PhysicalNetworkName != "tenantblue" {
		t.Errorf("physicalNetworkName = %q, want the network's name", c.PhysicalNetworkName)
	}
	c, err = Parse(`{"type":"kvnet-cni","name":"tenantblue","topology":"localnet","physicalNetworkName":"physnet"}`)
	if err != nil || c.PhysicalNetworkName != "physnet" {
		t.Errorf("explicit physical network: %+v, %v", c, err)
	}
	c, err = Parse(`{"type":"kvnet-cni","name":"l2","topology":"layer2"}`)
	if err != nil || c.PhysicalNetworkName != "" {
		t.Errorf("layer2 got a physical network: %+v, %v", c, err)
	}
}

func TestDiff(t *testing.T) {
	parse := func(s string) *NetConf {
		t.Helper()
		c, err := Parse(s)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	a := parse(`{"type":"kvnet-cni","name":"n","netAttachDefName":"a/n","topology":"localnet","subnets":"10.0.0.0/24,fd00::/64","vlanID":10}`)
	same := parse(`{"cniVersion":"0.4.0","type":"kvnet-cni","name":"n","netAttachDefName":"b/n","topology":"localnet","role":"secondary","mtu":1500,"subnets":"fd00::/64,10.0.0.0/24","vlanID":10,"physicalNetworkName":"n"}`)
	if d := Diff(a, same); len(d) != 0 {
		t.Errorf("Diff of agreeing configurations = %q", d)
	}
	other := parse(`{"type":"kvnet-cni","name":"n","topology":"localnet","subnets":"10.0.1.0/24","mtu":9000,"vlanID":11}`)
	got := strings.Join(Diff(a, other), "; ")
	want := `"mtu": "1500" vs "9000"; "vlanID": "10" vs "11"; "subnets": "10.0.0.0/24,fd00::/64" vs "10.0.1.0/24"`
	if got != want {
		t.Errorf("Diff = %s\nwant   %s", got, want)
	}
	l2 := parse(`{"type":"kvnet-cni","name":"n","topology":"layer2"}`)
	if got := strings.Join(Diff(a, l2), "; "); !strings.HasPrefix(got, `"topology": "localnet" vs "layer2"`) || !strings.Contains(got, `"physicalNetworkName": "n" vs (none)`) {
		t.Errorf("Diff localnet/layer2 = %s", got)
	}
}
