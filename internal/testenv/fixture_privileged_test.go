package testenv

import (
	"fmt"
	"strings"
	"testing"
)

// fatalRecorder is a testing.TB that records Fatal calls instead of
// stopping the test.
type fatalRecorder struct {
	testing.TB
	fatals []string
}

func (r *fatalRecorder) Helper()           {}
func (r *fatalRecorder) Fatal(args ...any) { r.fatals = append(r.fatals, fmt.Sprint(args...)) }
func (r *fatalRecorder) Fatalf(format string, args ...any) {
	r.fatals = append(r.fatals, fmt.Sprintf(format, args...))
}

func TestNeedsFixture(t *testing.T) {
	NeedsRoot(t)
	r := &fatalRecorder{TB: t}
	NeedsFixture(r, true)
	if len(r.fatals) != 0 {
		t.Fatalf("built fixture failed the test: %q", r.fatals)
	}
	NeedsFixture(r, false)
	if len(r.fatals) != 1 || !strings.Contains(r.fatals[0], "TestMain did not build the fixture") {
		t.Fatalf("missing fixture: got failures %q, want one naming TestMain", r.fatals)
	}
}
