package simnet

import (
	"regexp"
	"testing"
)

func TestRandomPrefix(t *testing.T) {
	p := RandomPrefix()
	if !regexp.MustCompile(`^kvt[0-9a-f]{6}$`).MatchString(p) {
		t.Fatalf("RandomPrefix() = %q, want kvt + 6 hex digits", p)
	}
	if err := checkPrefix(p); err != nil {
		t.Fatal(err)
	}
	if q := RandomPrefix(); q == p {
		t.Errorf("RandomPrefix() twice = %q", p) // 1 in 16M
	}
}

func TestCheckPrefix(t *testing.T) {
	for _, p := range []string{"a", "kvt0a1b2c", "lab", "kvnet1"} {
		if err := checkPrefix(p); err != nil {
			t.Errorf("checkPrefix(%q) = %v, want nil", p, err)
		}
	}
	for _, p := range []string{"", "kvnet", "a-b", "A", "a/b", "a b", "0123456789012345678901234567890123"} {
		if err := checkPrefix(p); err == nil {
			t.Errorf("checkPrefix(%q) = nil, want error", p)
		}
	}
}

func TestCheckName(t *testing.T) {
	for _, n := range []string{"n1", "p-a1", "worker_2", "Node.3"} {
		if err := checkName(n); err != nil {
			t.Errorf("checkName(%q) = %v, want nil", n, err)
		}
	}
	for _, n := range []string{"", "sw", "ext", ".", "..", "a/b", "a b"} {
		if err := checkName(n); err == nil {
			t.Errorf("checkName(%q) = nil, want error", n)
		}
	}
}

// Bad arguments are refused before anything is created (no root needed).
func TestNewRejects(t *testing.T) {
	for _, tt := range []struct {
		prefix string
		names  []string
	}{
		{"bad-prefix", []string{"n1"}},
		{"kvnet", []string{"n1"}},
		{"ok", []string{"n1", "n1"}},
		{"ok", []string{"sw"}},
		{"ok", []string{"a/b"}},
		{"ok", make([]string, MaxNodes+1)},
	} {
		if c, err := New(tt.prefix, tt.names...); err == nil {
			_ = c.Close()
			t.Errorf("New(%q, %q) succeeded, want error", tt.prefix, tt.names)
		}
	}
	if err := Cleanup("bad-prefix"); err == nil {
		t.Error(`Cleanup("bad-prefix") succeeded, want error`)
	}
}
