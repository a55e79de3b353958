package policy

import (
	"slices"
	"testing"
)

func TestPolicyFor(t *testing.T) {
	for _, tc := range []struct {
		value string
		want  []string
	}{
		{"", nil},
		{"blue", []string{"ns/blue"}},
		{" blue , other/red,,", []string{"ns/blue", "other/red"}},
	} {
		if got := PolicyFor("ns", tc.value); !slices.Equal(got, tc.want) {
			t.Errorf("PolicyFor(ns, %q) = %q, want %q", tc.value, got, tc.want)
		}
	}
}
