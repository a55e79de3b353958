package simnet

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"kvnet.io/kvnet/internal/nl"
	"kvnet.io/kvnet/internal/testenv"
)

// TestMain reports, as any user but root, that the privileged tests of the
// package did not run; the unit tests run as any user.
func TestMain(m *testing.M) {
	testenv.ReportPrivilegedNotRun("kvnet.io/kvnet/internal/lab/simnet")
	os.Exit(m.Run())
}

// pingCommand returns the command line that pings dst once from the
// namespace at ns: `ip netns exec <name> busybox ping -c 1 -W 1 <dst>`
// (busybox's: a fresh machine has no iputils-ping).
func pingCommand(t *testing.T, ns string, dst netip.Addr) []string {
	t.Helper()
	ip, err := exec.LookPath("ip")
	if err != nil {
		t.Fatal("needs iproute2's ip in PATH: ", err)
	}
	bb, err := exec.LookPath("busybox")
	if err != nil {
		t.Fatal("needs busybox in PATH (hack/install-deps.sh installs it): ", err)
	}
	return []string{ip, "netns", "exec", filepath.Base(ns), bb, "ping", "-c", "1", "-W", "1", dst.String()}
}

// pingOnce sends one echo request to dst from the namespace at ns and
// waits a second for the reply.
func pingOnce(t *testing.T, ns string, dst netip.Addr) error {
	t.Helper()
	argv := pingCommand(t, ns, dst)
	if out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput(); err != nil {
		return fmt.Errorf("%s: %w: %s", strings.Join(argv, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// ping pings dst from the namespace at ns, up to three times (the first
// echo may wait for ARP).
func ping(t *testing.T, ns string, dst netip.Addr) error {
	t.Helper()
	var err error
	for range 3 {
		if err = pingOnce(t, ns, dst); err == nil {
			return nil
		}
		t.Log(err)
		time.Sleep(100 * time.Millisecond)
	}
	return err
}

// leftovers returns the names of the namespaces of the cluster prefix.
func leftovers(t *testing.T, prefix string) []string {
	t.Helper()
	names, err := owned(prefix)
	if err != nil {
		t.Fatal(err)
	}
	return names
}

func TestCluster(t *testing.T) {
	testenv.NeedsRoot(t)
	prefix := RandomPrefix()
	c, err := New(prefix, "n1", "n2")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = Cleanup(prefix) })

	if c.Prefix != prefix || c.Switch != nl.NSPath(prefix+"-sw") || c.External != nl.NSPath(prefix+"-ext") || len(c.Nodes) != 2 {
		t.Fatalf("cluster = %+v", c)
	}
	for i, want := range []Node{
		{Name: "n1", NS: nl.NSPath(prefix + "-n1"), IP: netip.MustParseAddr("192.168.100.1")},
		{Name: "n2", NS: nl.NSPath(prefix + "-n2"), IP: netip.MustParseAddr("192.168.100.2")},
	} {
		if *c.Nodes[i] != want {
			t.Errorf("node %d = %+v, want %+v", i, *c.Nodes[i], want)
		}
	}
	n1, n2 := c.Nodes[0], c.Nodes[1]

	// The underlay device as the datapath will find it.
	h, err := nl.NewHandle(n1.NS)
	if err != nil {
		t.Fatal(err)
	}
	dev, err := h.LinkByName(UnderlayDev)
	h.Close()
	if err != nil {
		t.Fatal(err)
	}
	if dev.Attrs().MTU != UnderlayMTU {
		t.Errorf("MTU of %s in n1 = %d, want %d", UnderlayDev, dev.Attrs().MTU, UnderlayMTU)
	}

	for _, tt := range []struct {
		from string
		dst  netip.Addr
	}{
		{n1.NS, n2.IP},
		{n2.NS, n1.IP},
		{n1.NS, ExternalIP},
		{n1.NS, InternetIP}, // via the default route
		{c.External, n2.IP}, // the way back
		{n2.NS, InternetIP},
	} {
		if err := ping(t, tt.from, tt.dst); err != nil {
			t.Errorf("ping %s from %s: %v", tt.dst, filepath.Base(tt.from), err)
		}
	}

	// The check above can fail: nothing answers for an unused address.
	if err := pingOnce(t, n1.NS, netip.MustParseAddr("192.168.100.200")); err == nil {
		t.Error("ping of an unused underlay address succeeded")
	}

	// A second cluster with the same prefix is refused and leaves the
	// first alone.
	if _, err := New(prefix, "n1"); err == nil {
		t.Fatal("New with a prefix in use succeeded")
	}
	if err := ping(t, n1.NS, n2.IP); err != nil {
		t.Errorf("after the refused New: %v", err)
	}

	// Namespaces added later belong to the cluster too: a pod, and a
	// router namespace as the datapath names it.
	pod, err := c.NewNS("p-a")
	if err != nil {
		t.Fatal(err)
	}
	if pod != nl.NSPath(prefix+"-p-a") {
		t.Errorf("NewNS(p-a) = %q", pod)
	}
	if _, err := c.NewNS("p-a"); err == nil {
		t.Error("NewNS of an existing namespace succeeded")
	}
	if _, err := nl.CreateNamedNS("kvnet-" + prefix + "-n1-r7"); err != nil {
		t.Fatal(err)
	}
	if got := leftovers(t, prefix); len(got) != 7 {
		t.Errorf("namespaces before Close = %v, want 7 (sw, ext, phys, 2 nodes, pod, router)", got)
	}

	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{prefix, "kvnet-" + prefix} {
		if names, err := nl.ListNamedNS(p); err != nil || len(names) != 0 {
			t.Errorf("ListNamedNS(%q) after Close = %v, %v; want none", p, names, err)
		}
	}
	if err := c.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

// Cleanup removes what a cluster that was never closed (a crashed lab)
// left behind, after which the prefix can be used again.
func TestCleanup(t *testing.T) {
	testenv.NeedsRoot(t)
	prefix := RandomPrefix()
	if _, err := New(prefix, "a"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = Cleanup(prefix) })
	if got := leftovers(t, prefix); len(got) != 4 {
		t.Fatalf("namespaces = %v, want 4 (sw, ext, phys, a)", got)
	}
	if err := Cleanup(prefix); err != nil {
		t.Fatal(err)
	}
	if got := leftovers(t, prefix); len(got) != 0 {
		t.Fatalf("after Cleanup: %v", got)
	}
	c, err := New(prefix, "a")
	if err != nil {
		t.Fatalf("New after Cleanup: %v", err)
	}
	if err := ping(t, c.Nodes[0].NS, InternetIP); err != nil {
		t.Error(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
}
