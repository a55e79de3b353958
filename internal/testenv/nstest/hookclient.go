package nstest

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// hookClient is a DHCP client run in the foreground whose hook script
// records each event's variables in a file named after its reason under
// out (DHCPCD, DHClient).
type hookClient struct {
	name string // the client, in messages
	out  string // where the events are recorded
	log  string // its output
}

// start runs cmd with its output in c.log, in a process group of its own
// (helpers that outlive a SIGTERM die with it), killed when the test
// ends. A file, not a pipe: helpers inherit its stdio, and Wait would
// wait for them to close a pipe.
func (c *hookClient) start(tb testing.TB, cmd *exec.Cmd) {
	tb.Helper()
	logFile, err := os.Create(c.log)
	if err != nil {
		tb.Fatal(err)
	}
	defer logFile.Close()
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		tb.Fatalf("start %s: %v", c.name, err)
	}
	tb.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		_ = cmd.Wait()
	})
}

// Event waits up to timeout for the client's first event of reason
// (BOUND6, RENEW6, ...) and returns its variables (see the client's
// constructor for which). It fails the test, with the client's output,
// if none comes.
func (c *hookClient) Event(tb testing.TB, reason string, timeout time.Duration) map[string]string {
	tb.Helper()
	path := filepath.Join(c.out, reason)
	deadline := time.Now().Add(timeout)
	for !c.Happened(reason) {
		if time.Now().After(deadline) {
			tb.Fatalf("%s: no %s after %s; its output:\n%s", c.name, reason, timeout, c.Log())
		}
		time.Sleep(50 * time.Millisecond)
	}
	f, err := os.Open(path)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	env := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), "=")
		env[k] = strings.TrimSpace(v)
	}
	tb.Logf("%s event %s: %v", c.name, reason, env)
	return env
}

// Happened reports whether the client has had an event of reason.
func (c *hookClient) Happened(reason string) bool {
	_, err := os.Stat(filepath.Join(c.out, reason))
	return err == nil
}

// Log returns the client's output so far.
func (c *hookClient) Log() string {
	b, err := os.ReadFile(c.log)
	if err != nil {
		return err.Error()
	}
	return string(b)
}
