package simnet

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
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

// Bad arguments are refused, each for its own reason, before anything is
// created (no root needed).
func TestNewRejects(t *testing.T) {
	tooMany := make([]string, MaxNodes+1) // valid names, one too many
	for i := range tooMany {
		tooMany[i] = fmt.Sprintf("n%d", i+1)
	}
	for _, tt := range []struct {
		prefix string
		names  []string
		want   string // in the error
	}{
		{"bad-prefix", []string{"n1"}, `invalid prefix "bad-prefix"`},
		{"kvnet", []string{"n1"}, `invalid prefix "kvnet"`},
		{"ok", []string{"n1", "n1"}, `node name "n1" given twice`},
		{"ok", []string{"sw"}, `invalid name "sw"`},
		{"ok", []string{"a/b"}, `invalid name "a/b"`},
		{"ok", tooMany, fmt.Sprintf("%d nodes, at most %d", MaxNodes+1, MaxNodes)},
	} {
		c, err := New(tt.prefix, tt.names...)
		if err == nil {
			_ = c.Close()
			t.Errorf("New(%q, %d names) succeeded, want error", tt.prefix, len(tt.names))
			continue
		}
		if !strings.Contains(err.Error(), tt.want) {
			t.Errorf("New(%q, %d names) = %v, want an error with %q", tt.prefix, len(tt.names), err, tt.want)
		}
		if tooMany := len(tt.names) > MaxNodes; tooMany != errors.Is(err, ErrTooManyNodes) {
			t.Errorf("New(%q, %d names) = %v: errors.Is ErrTooManyNodes = %v, want %v", tt.prefix, len(tt.names), err, !tooMany, tooMany)
		}
	}
	if err := Cleanup("bad-prefix"); err == nil {
		t.Error(`Cleanup("bad-prefix") succeeded, want error`)
	}
}
