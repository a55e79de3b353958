package netconf

import (
	"errors"
	"strings"
	"testing"
)

func TestParseServed(t *testing.T) {
	tests := []struct {
		name       string
		config     string
		wantName   string
		wantPlugin string
		persistent bool
		want       string // error substring
	}{
		{name: "kvnet-cni", config: `{"type":"kvnet-cni","name":"ns_n","topology":"layer2","subnets":"10.0.0.0/24","allowPersistentIPs":true}`, wantName: "ns_n", persistent: true},
		{name: "layer3 never persistent", config: `{"type":"kvnet-cni","name":"ns_n","topology":"layer3","subnets":"10.0.0.0/16/24","allowPersistentIPs":true}`, wantName: "ns_n"},
		{name: "bridge with kvnet-ipam", config: `{"cniVersion":"1.0.0","type":"bridge","name":"migration","bridge":"br-mig","ipam":{"type":"kvnet-ipam","subnets":"10.200.0.0/24","excludeSubnets":"10.200.0.0/30","gatewayIPs":"10.200.0.1"}}`, wantName: "migration", wantPlugin: "bridge"},
		{name: "conflist macvlan", config: `{"cniVersion":"1.0.0","name":"mv","plugins":[{"type":"macvlan","master":"eth0","ipam":{"type":"kvnet-ipam","subnets":"10.1.0.0/24","allowPersistentIPs":true}},{"type":"tuning"}]}`, wantName: "mv", wantPlugin: "macvlan", persistent: true},
		{name: "host-local is not ours", config: `{"type":"bridge","name":"x","ipam":{"type":"host-local"}}`},
		{name: "no ipam", config: `{"type":"bridge","name":"x"}`},
		{name: "kvnet-ipam without subnets", config: `{"type":"bridge","name":"x","ipam":{"type":"kvnet-ipam"}}`, want: `"ipam.subnets" must be set`},
		{name: "kvnet-ipam bad subnet", config: `{"type":"bridge","name":"x","ipam":{"type":"kvnet-ipam","subnets":"10.0.0.0/40"}}`, want: `"ipam.subnets" value "10.0.0.0/40"`},
		{name: "kvnet-ipam bad gateway", config: `{"type":"bridge","name":"x","ipam":{"type":"kvnet-ipam","subnets":"10.0.0.0/24","gatewayIPs":"gw"}}`, want: `"ipam.gatewayIPs" value "gw"`},
		{name: "kvnet-ipam no name", config: `{"type":"bridge","ipam":{"type":"kvnet-ipam","subnets":"10.0.0.0/24"}}`, want: `"name" must be set`},
		{name: "bad plugin", config: `{"name":"x","plugins":[1]}`, want: "plugins[0] is not a JSON object"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := ParseServed(tt.config)
			if tt.want != "" {
				if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tt.want) {
					t.Fatalf("err = %v, want %q", err, tt.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tt.wantName == "" {
				if s != nil {
					t.Fatalf("served %+v, want not served", s)
				}
				return
			}
			if s == nil || s.Name != tt.wantName || s.Plugin != tt.wantPlugin || s.AllowsPersistentIPs() != tt.persistent {
				t.Fatalf("got %+v (persistent %v)", s, s != nil && s.AllowsPersistentIPs())
			}
		})
	}
}

func FuzzParseServed(f *testing.F) {
	f.Add(`{"type":"bridge","name":"m","ipam":{"type":"kvnet-ipam","subnets":"10.0.0.0/24"}}`)
	f.Add(`{"name":"m","plugins":[{"type":"macvlan","ipam":{"type":"kvnet-ipam","subnets":"fd00::/64"}}]}`)
	f.Add(`{"type":"kvnet-cni","name":"n","topology":"layer2"}`)
	f.Fuzz(func(t *testing.T, config string) {
		s, err := ParseServed(config)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error without ErrInvalid: %v", err)
			}
			return
		}
		if s != nil && s.Name == "" {
			t.Fatalf("served network without a name: %+v", s)
		}
	})
}

func TestForeignOverlay(t *testing.T) {
	for _, tc := range []struct {
		config string
		want   bool
	}{
		{`{"type":"ovn-k8s-cni-overlay","name":"n","topology":"layer2"}`, true},
		{`{"plugins":[{"type":"ovn-k8s-cni-overlay"},{"type":"tuning"}]}`, true},
		{`{"plugins":[{"type":"tuning"},{"type":"ovn-k8s-cni-overlay"}]}`, false},
		{`{"type":"kvnet-cni","name":"n"}`, false},
		{`{"type":"bridge","name":"n"}`, false},
		{`not json`, false},
		{``, false},
	} {
		if got := ForeignOverlay(tc.config); got != tc.want {
			t.Errorf("ForeignOverlay(%q) = %v, want %v", tc.config, got, tc.want)
		}
	}
}
