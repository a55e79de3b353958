package netconf

import (
	"errors"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	tests := []struct {
		name    string
		config  string
		want    string // substring of the error; "" means valid
		foreign bool
	}{
		{name: "layer2", config: `{"cniVersion":"1.1.0","type":"kvnet-cni","name":"ns_a","topology":"layer2","role":"primary","subnets":"10.0.0.0/24,fd00::/64","allowPersistentIPs":true}`},
		{name: "layer3 host subnet", config: `{"type":"kvnet-cni","name":"n","topology":"layer3","subnets":"10.0.0.0/16/24"}`},
		{name: "bridge is foreign", config: `{"type":"bridge","name":"br"}`, foreign: true},
		{name: "not json", config: `{`, want: "spec.config is not a JSON object"},
		{name: "no name", config: `{"type":"kvnet-cni","topology":"layer2"}`, want: `"name" must be set`},
		{name: "bad topology", config: `{"type":"kvnet-cni","name":"n","topology":"mesh"}`, want: `"topology" "mesh"`},
		{name: "bad role", config: `{"type":"kvnet-cni","name":"n","topology":"layer2","role":"boss"}`, want: `"role" "boss"`},
		{name: "bad subnet", config: `{"type":"kvnet-cni","name":"n","topology":"layer2","subnets":"10.0.0.0/24,nope"}`, want: `"subnets" value "nope"`},
		{name: "bad gateway", config: `{"type":"kvnet-cni","name":"n","topology":"layer2","defaultGatewayIPs":"10.0.0.256"}`, want: `"defaultGatewayIPs" value "10.0.0.256"`},
		{name: "bad mtu", config: `{"type":"kvnet-cni","name":"n","topology":"layer2","mtu":-1}`, want: `"mtu" -1`},
		{name: "bad vlan", config: `{"type":"kvnet-cni","name":"n","topology":"localnet","vlanID":5000}`, want: `"vlanID" 5000`},
		{name: "persistent without subnets", config: `{"type":"kvnet-cni","name":"n","topology":"layer2","allowPersistentIPs":true}`, want: `"allowPersistentIPs" needs "subnets"`},
		{name: "bad layer3 host", config: `{"type":"kvnet-cni","name":"n","topology":"layer3","subnets":"10.0.0.0/16/200"}`, want: "bad host subnet length"},
		{name: "wrong field type", config: `{"type":"kvnet-cni","name":"n","topology":"layer2","mtu":"big"}`, want: "invalid network configuration"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Parse(tt.config)
			switch {
			case tt.want != "":
				if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tt.want) {
					t.Fatalf("err = %v, want ErrInvalid containing %q", err, tt.want)
				}
			case err != nil:
				t.Fatal(err)
			case tt.foreign != (c == nil):
				t.Fatalf("got %+v, foreign=%v", c, tt.foreign)
			}
		})
	}
}

func TestRoundTrip(t *testing.T) {
	c := &NetConf{CNIVersion: CNIVersion, Type: PluginType, Name: "ns_n", Topology: TopologyLayer2, Role: RolePrimary, Subnets: "10.0.0.0/24", MTU: 1400}
	s, err := c.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	back, err := Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	if *back != *c {
		t.Fatalf("round trip: %+v != %+v", back, c)
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{
		`{"type":"kvnet-cni","name":"n","topology":"layer2","subnets":"10.0.0.0/24"}`,
		`{"type":"kvnet-cni","name":"n","topology":"layer3","subnets":"10.0.0.0/16/24,fd00::/48/64"}`,
		`{"type":"kvnet-cni","name":"n","topology":"localnet","vlanID":3,"excludeSubnets":"1.2.3.4/32"}`,
		`{"type":"bridge"}`, `[]`, `null`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, config string) {
		c, err := Parse(config)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error without ErrInvalid: %v", err)
			}
			return
		}
		if c == nil {
			return
		}
		if c.Topology == TopologyLocalnet && c.PhysicalNetworkName == "" {
			t.Fatalf("localnet network %q parsed without a physical network", c.Name)
		}
		// Whatever parses must render and parse back the same.
		s, err := c.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		back, err := Parse(s)
		if err != nil || *back != *c {
			t.Fatalf("round trip of %q: %+v, %v", config, back, err)
		}
	})
}
