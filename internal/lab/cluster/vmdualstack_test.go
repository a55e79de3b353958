package cluster

import (
	"strings"
	"testing"
)

func TestParseGuestExec(t *testing.T) {
	for _, tc := range []struct {
		name, answer, out, err string
	}{
		{name: "output and success", answer: "inet6 fd10:0:2::2/120\nKVNET-EXIT 0\n", out: "inet6 fd10:0:2::2/120\n"},
		{name: "no output", answer: "KVNET-EXIT 0\n", out: ""},
		{name: "no trailing newline", answer: "x\nKVNET-EXIT 0", out: "x\n"},
		{name: "failure", answer: "ping: sendto: Network unreachable\nKVNET-EXIT 1\n", err: "exit status 1: ping: sendto: Network unreachable"},
		{name: "cut short", answer: "partial output\n", err: "no exit status"},
		{name: "empty", answer: "", err: "no exit status"},
		{name: "marker inside a line", answer: "echo KVNET-EXIT 0\n", err: "no exit status"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := parseGuestExec(tc.answer)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("parseGuestExec(%q) = %q, %v; want an error with %q", tc.answer, out, err, tc.err)
				}
				return
			}
			if err != nil || out != tc.out {
				t.Fatalf("parseGuestExec(%q) = %q, %v; want %q", tc.answer, out, err, tc.out)
			}
		})
	}
}
