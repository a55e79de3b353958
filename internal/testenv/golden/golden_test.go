package golden

import (
	"fmt"
	"strings"
	"testing"
)

// recorder is a testing.TB that records failures instead of failing.
type recorder struct {
	testing.TB
	failed []string
}

func (r *recorder) Helper() {}
func (r *recorder) Errorf(format string, args ...any) {
	r.failed = append(r.failed, fmt.Sprintf(format, args...))
}
func (r *recorder) Fatalf(format string, args ...any) { r.Errorf(format, args...) }

func TestCheck(t *testing.T) {
	// Under -update Check would rewrite the fixture; this test checks the
	// comparison, so it runs with updating off whatever the flags say.
	defer func(was bool) { *update = was }(*update)
	*update = false
	r := &recorder{TB: t}
	CheckString(r, "hello.golden", "hello\n")
	if len(r.failed) != 0 {
		t.Fatalf("equal output failed: %v", r.failed)
	}
	CheckString(r, "hello.golden", "goodbye\n")
	if len(r.failed) != 1 || !strings.Contains(r.failed[0], "testdata/hello.golden differs") || !strings.Contains(r.failed[0], "goodbye") {
		t.Fatalf("different output: got failures %q", r.failed)
	}
	r.failed = nil
	CheckString(r, "missing.golden", "x")
	if len(r.failed) != 1 || !strings.Contains(r.failed[0], "-update to create it") {
		t.Fatalf("missing file: got failures %q", r.failed)
	}
}
