package nstest_test

import (
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"kvnet.io/kvnet/internal/nl"
	"kvnet.io/kvnet/internal/testenv"
	"kvnet.io/kvnet/internal/testenv/nstest"
)

// newNS makes a namespace with lo up, deleted when the test ends.
func newNS(t *testing.T) string {
	t.Helper()
	name := fmt.Sprintf("kvnet-nstest-%d", time.Now().UnixNano()%1e9)
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v: %s", name, err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	path := filepath.Join(nl.NetNSDir, name)
	if err := nstest.Exec(path, "ip", "link", "set", "lo", "up"); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestServeAndReadLine(t *testing.T) {
	testenv.NeedsRoot(t)
	ns := newNS(t)
	nstest.ServeLine(t, ns, "127.0.0.1:7070", func(c net.Conn) string { return "hello " + c.LocalAddr().String() })
	got, err := nstest.ReadLine(ns, "127.0.0.1:7070", 2*time.Second)
	if err != nil || got != "hello 127.0.0.1:7070" {
		t.Fatalf("ReadLine = %q, %v; want %q", got, err, "hello 127.0.0.1:7070")
	}
	// The server lives in ns only: the test's own namespace has no listener.
	if _, err := nstest.ReadLine("", "127.0.0.1:7070", time.Second); err == nil {
		t.Error("ReadLine from the host namespace reached the namespace's server")
	}
}

func TestServeUDPLine(t *testing.T) {
	testenv.NeedsRoot(t)
	ns := newNS(t)
	nstest.ServeUDPLine(t, ns, "127.0.0.1:7071", func(from net.Addr) string { return "udp hello" })
	if got, err := nstest.UDPReadLine(ns, "127.0.0.1:7071", 2*time.Second); err != nil || got != "udp hello" {
		t.Fatalf("UDPReadLine = %q, %v; want %q", got, err, "udp hello")
	}
	if _, err := nstest.UDPReadLine(ns, "127.0.0.1:7072", time.Second); err == nil {
		t.Error("UDPReadLine got an answer from a port nobody serves")
	}
}

func TestPingAndExec(t *testing.T) {
	testenv.NeedsRoot(t)
	ns := newNS(t)
	if err := nstest.Ping(ns, "127.0.0.1"); err != nil {
		t.Fatal(err)
	}
	if err := nstest.Ping(ns, "192.0.2.1"); err == nil {
		t.Error("ping to an unroutable address succeeded")
	}
	err := nstest.Exec(filepath.Base(ns), "false")
	if err == nil || !strings.Contains(err.Error(), "false in "+filepath.Base(ns)) {
		t.Errorf("Exec of false: %v, want an error naming the command and namespace", err)
	}
}
