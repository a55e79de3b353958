package chaos

import (
	"os"
	"testing"

	"kvnet.io/kvnet/internal/testenv"
)

// TestMain says in one line, as any user but root, that the chaos runs
// (which need root: the lab's namespaces, nftables and QEMU guests) did
// not run; go test alone would print only "ok".
func TestMain(m *testing.M) {
	testenv.ReportPrivilegedNotRun("kvnet.io/kvnet/test/chaos")
	os.Exit(m.Run())
}

// buildKvnet builds kvnet and the lab's binaries (testenv.BuildLab) and
// returns the repository root and a runner of kvnet-lab that fails the
// test on a non-zero exit.
func buildKvnet(t testing.TB) (string, func(args ...string) string) {
	t.Helper()
	root, _, run := testenv.BuildLab(t)
	return root, run
}
