// Package golden compares test output with files under a package's
// testdata/ directory. `go test -update` rewrites the files from what the
// tests produce; review the diff before committing it. It is for tests only.
package golden

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"testing"
)

var update = flag.Bool("update", false, "rewrite golden files under testdata/ from the tests' output")

// Updating reports whether the run rewrites golden files (-update).
func Updating() bool { return *update }

// Check compares got with testdata/<name>; with -update it writes got
// there first. A difference fails the test, showing both.
func Check(t testing.TB, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -run '%s' -update to create it)", err, t.Name())
		return
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from its golden file (go test -update rewrites it):\n--- got\n%s\n--- want\n%s", path, got, want)
	}
}

// CheckString is Check for text.
func CheckString(t testing.TB, name, got string) {
	t.Helper()
	Check(t, name, []byte(got))
}
