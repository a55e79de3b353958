package physnet

import (
	"errors"
	"maps"
	"strings"
	"testing"
)

func TestParseBridgeMappings(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want map[string]string
		err  string
	}{
		{"", map[string]string{}, ""},
		{"physnet:br-phys", map[string]string{"physnet": "br-phys"}, ""},
		{" physnet : br-phys , dc2:br2,", map[string]string{"physnet": "br-phys", "dc2": "br2"}, ""},
		{"physnet", nil, `entry 0 "physnet": want <physical network>:<bridge>`},
		{"a:br1,:br2", nil, `entry 1 ":br2": want`},
		{"a:", nil, `entry 0 "a:": want`},
		{"a:br1,a:br2", nil, `physical network "a" mapped twice`},
		{"a:0123456789abcdef", nil, `bridge "0123456789abcdef" is not an interface name`},
		{"a:br/1", nil, `bridge "br/1" is not an interface name`},
		{"a:b:c", nil, `bridge "b:c" is not an interface name`},
	} {
		got, err := ParseBridgeMappings(tt.in)
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) || !errors.Is(err, ErrBridgeMappings) {
				t.Errorf("ParseBridgeMappings(%q) = %v, %v; want an error containing %q", tt.in, got, err, tt.err)
			}
			continue
		}
		if err != nil || !maps.Equal(got, tt.want) {
			t.Errorf("ParseBridgeMappings(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
		}
	}
}

func FuzzParseBridgeMappings(f *testing.F) {
	for _, s := range []string{"", "physnet:br-phys", "a:b,c:d", "a", ":", "a:b,a:c", "a:b:c"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		m, err := ParseBridgeMappings(s)
		if err != nil {
			if m != nil || !errors.Is(err, ErrBridgeMappings) {
				t.Fatalf("error %v with result %v", err, m)
			}
			return
		}
		for phys, br := range m {
			if phys == "" || br == "" || len(br) > 15 || strings.ContainsAny(br, "/: \t\x00") {
				t.Fatalf("accepted %q -> %q from %q", phys, br, s)
			}
		}
	})
}
