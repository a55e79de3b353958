package testenv

import (
	"fmt"
	"os"
	"testing"
)

// RequirePrivilegedEnv is the environment variable that, set to "1" (CI sets
// it), turns a privileged test that cannot run into a failure instead of a
// skip, so that a skipped privileged test can never pass as green.
const RequirePrivilegedEnv = "KVNET_REQUIRE_PRIVILEGED"

// Privileged reports whether privileged tests (network namespaces, nftables)
// can run: the process is root.
func Privileged() bool { return os.Geteuid() == 0 }

// requirePrivileged reports whether RequirePrivilegedEnv is set to "1".
func requirePrivileged() bool { return os.Getenv(RequirePrivilegedEnv) == "1" }

// NeedsRoot skips t with "needs root: <why> (CI runs it as root)" when not
// Privileged. When KVNET_REQUIRE_PRIVILEGED=1 is set (CI sets it), it fails
// the test instead of skipping, so CI can never pass a skipped privileged test
// as green.
func NeedsRoot(t testing.TB) {
	t.Helper()
	if Privileged() {
		return
	}
	why := fmt.Sprintf("needs root: %s runs as uid %d; network namespaces and nftables need root (CI runs it as root)", t.Name(), os.Geteuid())
	if requirePrivileged() {
		t.Fatalf("%s; %s=1 forbids skipping it", why, RequirePrivilegedEnv)
	}
	t.Skip(why)
}

// ReportPrivilegedNotRun prints ONE clear line to stdout for package pkg when
// not Privileged, so that a package whose unit tests pass does not hide that
// its privileged tests were skipped; it is a no-op as root. Call it from
// TestMain.
func ReportPrivilegedNotRun(pkg string) {
	if Privileged() {
		return
	}
	suffix := ""
	if requirePrivileged() {
		suffix = fmt.Sprintf("; %s=1: they FAIL", RequirePrivilegedEnv)
	}
	fmt.Printf("kvnet: privileged tests in %s NOT RUN: need root (run as root, as CI does)%s\n", pkg, suffix)
}

// NeedsFixture is NeedsRoot for a test that also needs what its package's
// TestMain builds as root (a control plane, binaries): built false fails
// the test, since running as root TestMain should have built it.
func NeedsFixture(t testing.TB, built bool) {
	t.Helper()
	NeedsRoot(t)
	if !built {
		t.Fatal("no control plane: running as root, but TestMain did not build the fixture")
	}
}
