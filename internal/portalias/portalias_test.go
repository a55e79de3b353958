package portalias

import (
	"strings"
	"testing"
)

func TestFormatParse(t *testing.T) {
	a := Format("ns/virt-launcher-vm1-x7k2p", "ns/udn")
	if a != "kvnet:ns/virt-launcher-vm1-x7k2p:ns/udn" {
		t.Errorf("Format = %q", a)
	}
	got, err := Parse(a)
	if err != nil || got != (Alias{Pod: "ns/virt-launcher-vm1-x7k2p", NAD: "ns/udn"}) || got.String() != a || !Has(a) {
		t.Errorf("Parse(%q) = %+v, %v", a, got, err)
	}
	for _, tc := range []struct{ alias, part string }{
		{"", `does not start with "kvnet:"`},
		{"other:ns/p:ns/n", `does not start with "kvnet:"`},
		{"kvnet:ns/p", "want"},
		{"kvnet::ns/n", `pod ""`},
		{"kvnet:p:ns/n", `pod "p"`},
		{"kvnet:/p:ns/n", `pod "/p"`},
		{"kvnet:ns/:ns/n", `pod "ns/"`},
		{"kvnet:ns/a/b:ns/n", `pod "ns/a/b"`},
		{"kvnet:ns/p:", `nad ""`},
		{"kvnet:ns/p:ns/n:x", `nad "ns/n:x"`},
	} {
		if _, err := Parse(tc.alias); err == nil || !strings.Contains(err.Error(), tc.part) {
			t.Errorf("Parse(%q) = %v, want an error naming %s", tc.alias, err, tc.part)
		}
	}
	if Has("kvnetx") || Has("") {
		t.Error("Has: an alias without the prefix is kvnet's")
	}
}

// FuzzParse: Parse never panics; what it accepts formats back to the same
// alias, and an error quotes the alias.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"kvnet:ns/pod:ns/nad", "kvnet:ns/pod:net_name", "kvnet:ns/pod", "kvnet:", "kvnet::", "kvnet:a/b/c:d", "eth0", "kvnet:ns/p:a:b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		a, err := Parse(s)
		if err != nil {
			if !strings.Contains(err.Error(), "port alias") {
				t.Fatalf("Parse(%q): error %q does not say what it parsed", s, err)
			}
			return
		}
		if a.String() != s || !Has(s) {
			t.Fatalf("Parse(%q) = %+v, which formats as %q", s, a, a.String())
		}
		if b, err := Parse(Format(a.Pod, a.NAD)); err != nil || b != a {
			t.Fatalf("round trip of %+v: %+v, %v", a, b, err)
		}
	})
}
