package podnetworks

import (
	"errors"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"
)

func TestParse(t *testing.T) {
	good := `{"ns/net":{"ip_addresses":["10.0.0.5/24","fd00::5/64"],"mac_address":"0a:58:0a:00:00:05","gateway_ips":["10.0.0.1"],"routes":[{"dest":"0.0.0.0/0","nextHop":"10.0.0.1"}],"role":"primary","network":"ns_net","ipam_claim":"vm.pod"}}`
	tests := []struct {
		name, value, want string
	}{
		{"valid", good, ""},
		{"not json", `{`, "invalid kvnet.io/pod-networks annotation"},
		{"bad key", strings.Replace(good, `"ns/net"`, `"net"`, 1), `key "net" is not <namespace>/<name>`},
		{"bad ip", strings.Replace(good, `10.0.0.5/24`, `10.0.0.500/24`, 1), `"ns/net" ip_addresses value "10.0.0.500/24"`},
		{"bad mac", strings.Replace(good, `0a:58:0a:00:00:05`, `zz`, 1), `mac_address "zz"`},
		{"bad gateway", strings.Replace(good, `["10.0.0.1"]`, `["x"]`, 1), `gateway_ips value "x"`},
		{"bad route", strings.Replace(good, `0.0.0.0/0`, `default`, 1), `route dest "default"`},
		{"bad role", strings.Replace(good, `"primary"`, `"boss"`, 1), `role "boss"`},
		{"no network", strings.Replace(good, `"network":"ns_net"`, `"network":""`, 1), `network is empty`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n, err := Parse(tt.value)
			if tt.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				a := n["ns/net"]
				if len(a.Addrs()) != 2 || a.MAC().String() != "0a:58:0a:00:00:05" || a.IPAMClaim != "vm.pod" {
					t.Fatalf("parsed %+v", a)
				}
				s, err := n.Marshal()
				if err != nil {
					t.Fatal(err)
				}
				if back, err := Parse(s); err != nil || back["ns/net"].MACAddress != a.MACAddress {
					t.Fatalf("round trip: %v %+v", err, back)
				}
				return
			}
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want ErrInvalid containing %q", err, tt.want)
			}
		})
	}
}

func FuzzParse(f *testing.F) {
	f.Add(`{"ns/net":{"ip_addresses":["10.0.0.5/24"],"mac_address":"0a:58:0a:00:00:05","role":"secondary","network":"n"}}`)
	f.Add(`{}`)
	f.Add(`null`)
	f.Fuzz(func(t *testing.T, v string) {
		n, err := Parse(v)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error without ErrInvalid: %v", err)
			}
			return
		}
		s, err := n.Marshal()
		if err != nil {
			t.Fatalf("parsed value does not marshal: %v", err)
		}
		if _, err := Parse(s); err != nil {
			t.Fatalf("round trip: %v", err)
		}
	})
}

func TestNetworkLabels(t *testing.T) {
	long := strings.Repeat("cluster_udn_a-very-long-tenant-network-name", 3)
	n := Networks{
		"a/p": {Network: "a_primary", Role: RolePrimary},
		"a/s": {Network: long, Role: RoleSecondary},
		"b/s": {Network: long, Role: RoleSecondary}, // a CUDN's other NAD: one label
	}
	labels := n.Labels()
	if len(labels) != 2 {
		t.Fatalf("labels %v: want one per network (2)", labels)
	}
	for k, v := range labels {
		errs := validation.IsQualifiedName(k)
		if len(errs) > 0 || v != "" || !strings.HasPrefix(k, NetworkLabelPrefix) {
			t.Errorf("label %q=%q: %v", k, v, errs)
		}
	}
	if NetworkLabel("a_primary") == NetworkLabel(long) {
		t.Error("two networks share a label")
	}
	// The same key for a network wherever it is computed: nodes select
	// what the controller wrote.
	if got, want := NetworkLabel("a_primary"), "network.kvnet.io/90e62d7a213f481f"; got != want {
		t.Errorf("NetworkLabel(a_primary) = %q, want %q", got, want)
	}
	if !HasLabels(map[string]string{"x": "1", NetworkLabel("a_primary"): "", NetworkLabel(long): ""}, labels) {
		t.Error("HasLabels: a superset does not have them")
	}
	if HasLabels(map[string]string{NetworkLabel("a_primary"): ""}, labels) {
		t.Error("HasLabels: a subset has them")
	}
}
