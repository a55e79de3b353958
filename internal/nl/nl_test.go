package nl

import (
	"errors"
	"fmt"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

func TestRetry(t *testing.T) {
	tests := []struct {
		name      string
		failures  int // interrupted dumps before success
		wantCalls int
		wantErr   bool
	}{
		{name: "first try", failures: 0, wantCalls: 1},
		{name: "interrupted twice", failures: 2, wantCalls: 3},
		{name: "always interrupted", failures: 100, wantCalls: maxAttempts, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			calls := 0
			err := Retry(func() error {
				calls++
				if calls <= tt.failures {
					return netlink.ErrDumpInterrupted
				}
				return nil
			})
			if calls != tt.wantCalls {
				t.Errorf("calls = %d, want %d", calls, tt.wantCalls)
			}
			if (err != nil) != tt.wantErr {
				t.Errorf("err = %v, wantErr %v", err, tt.wantErr)
			}
			if tt.wantErr && !errors.Is(err, netlink.ErrDumpInterrupted) {
				t.Errorf("err = %v, want it to wrap ErrDumpInterrupted", err)
			}
		})
	}
}

func TestRetryKeepsOtherErrors(t *testing.T) {
	calls := 0
	err := Retry(func() error { calls++; return unix.EPERM })
	if calls != 1 || !errors.Is(err, unix.EPERM) {
		t.Fatalf("calls=%d err=%v, want one call and EPERM", calls, err)
	}
}

func TestNotFound(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"ENODEV", fmt.Errorf("x: %w", unix.ENODEV), true},
		{"ESRCH", unix.ESRCH, true},
		{"ENOENT", unix.ENOENT, true},
		{"EADDRNOTAVAIL", unix.EADDRNOTAVAIL, true},
		{"link not found", netlink.LinkNotFoundError{}, true},
		{"EPERM", unix.EPERM, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := IsNotFound(tt.err); got != tt.want {
				t.Errorf("IsNotFound = %v, want %v", got, tt.want)
			}
			mapped := notFound(tt.err)
			if got := errors.Is(mapped, ErrNotFound); got != tt.want {
				t.Errorf("errors.Is(notFound(err), ErrNotFound) = %v, want %v", got, tt.want)
			}
			if tt.err != nil && !errors.Is(mapped, tt.err) {
				t.Errorf("notFound(err) lost the kernel error: %v", mapped)
			}
		})
	}
}
