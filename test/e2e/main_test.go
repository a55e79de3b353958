package e2e

import (
	"os"
	"testing"

	"kvnet.io/kvnet/internal/testenv"
)

// TestMain says in one line, as any user but root, that the end-to-end
// tests (all of which need root: the lab's namespaces, nftables and QEMU
// guests) did not run; go test alone would print only "ok".
func TestMain(m *testing.M) {
	testenv.ReportPrivilegedNotRun("kvnet.io/kvnet/test/e2e")
	os.Exit(m.Run())
}
