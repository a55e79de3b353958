package lint

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"kvnet.io/kvnet/internal/repo"
)

// make verify (hack/check-subjects.sh) rejects a commit subject over 72
// characters made after the commit it is told to start from, and accepts
// short ones and older history.
func TestCheckSubjectsRejectsLongSubject(t *testing.T) {
	root, err := repo.Root()
	if err != nil {
		t.Fatal(err)
	}
	script := filepath.Join(root, "hack", "check-subjects.sh")
	dir := t.TempDir()
	git := func(args ...string) string {
		t.Helper()
		cmd := exec.Command("git", args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example.com",
			"GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@example.com", "GIT_CONFIG_GLOBAL=/dev/null")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return strings.TrimSpace(string(out))
	}
	check := func(since string) (string, error) {
		cmd := exec.Command("bash", script)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "KVNET_SUBJECTS_SINCE="+since)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	long := "area: " + strings.Repeat("x", 67) // 73 characters
	git("init", "-q")
	git("commit", "-q", "--allow-empty", "-m", long+" (old history)")
	base := git("rev-parse", "HEAD")
	git("commit", "-q", "--allow-empty", "-m", "area: a short subject", "-m", "A body line may be as long as it likes: "+strings.Repeat("y", 100))
	if out, err := check(base); err != nil {
		t.Fatalf("short subjects after the base refused: %v\n%s", err, out)
	}
	git("commit", "-q", "--allow-empty", "-m", long)
	scratch := git("rev-parse", "--short=8", "HEAD")
	out, err := check(base)
	if err == nil {
		t.Fatalf("a 73-character subject passed:\n%s", out)
	}
	if !strings.Contains(out, scratch+" "+long+" (73 characters)") || strings.Contains(out, "(old history)") {
		t.Errorf("output names the wrong commits:\n%s", out)
	}
}
