package cluster

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"kvnet.io/kvnet/internal/testenv"
)

// TestSourceCleanupScripts runs the scripts cleanupMigrationSource runs in
// virt-handler's pod against what KubeVirt's skipped cleanup leaves: a
// containerDisk image bind-mounted into a finished launcher pod's
// container-disks emptyDir, and the VMI's ghost record (in a mount
// namespace of its own). The leftovers script must name both and exit 3;
// the cleanup script must unmount the image and remove the record; then
// the leftovers script exits 0. Another pod's mount stays.
func TestSourceCleanupScripts(t *testing.T) {
	testenv.NeedsRoot(t)
	dir := t.TempDir()
	pods, ghosts := filepath.Join(dir, "pods"), filepath.Join(dir, "ghost-records")
	const podUID, otherUID, vmiUID = "2271207f-8bdb-4280-942d-f837ace2013a", "cf7d3884-bc54-4ac9-8ff2-1723fc465edb", "9e18534e-e910-4f88-9bc4-833edf0e9df1"
	disk := func(uid string) string {
		return filepath.Join(pods, uid, "volumes", "kubernetes.io~empty-dir", "container-disks", "disk_0.img")
	}
	image := filepath.Join(dir, "image.img")
	for _, f := range []string{disk(podUID), disk(otherUID), image, filepath.Join(ghosts, vmiUID)} {
		if err := os.MkdirAll(filepath.Dir(f), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(f, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	leftovers := sourceLeftoversScript(pods, podUID, ghosts, vmiUID)
	script := strings.Join([]string{
		"mount --bind " + image + " " + disk(podUID),
		"mount --bind " + image + " " + disk(otherUID),
		"sh -c '" + strings.ReplaceAll(leftovers, "'", `'\''`) + "'; echo \"before: exit $?\"",
		"sh -c '" + strings.ReplaceAll(sourceCleanupScript(pods, podUID, ghosts, vmiUID), "'", `'\''`) + "'; echo \"cleanup: exit $?\"",
		"sh -c '" + strings.ReplaceAll(leftovers, "'", `'\''`) + "'; echo \"after: exit $?\"",
		"grep -c " + otherUID + " /proc/self/mountinfo",
	}, "\n")
	out, err := exec.Command("unshare", "--mount", "--propagation", "private", "sh", "-c", script).CombinedOutput()
	if err != nil {
		t.Fatalf("unshare: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	want := []string{
		disk(podUID) + " " + filepath.Join(ghosts, vmiUID),
		"before: exit 3",
		"cleanup: exit 0",
		"after: exit 0",
		"1", // the other pod's mount
	}
	if strings.Join(lines, "\n") != strings.Join(want, "\n") {
		t.Errorf("got:\n%s\nwant:\n%s", out, strings.Join(want, "\n"))
	}
	if _, err := os.Stat(filepath.Join(ghosts, vmiUID)); !os.IsNotExist(err) {
		t.Errorf("ghost record still there: %v", err)
	}
}
