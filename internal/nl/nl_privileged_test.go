package nl

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	"kvnet.io/kvnet/internal/testenv"
)

// TestMain reports, as any user but root, that the privileged tests of the
// package did not run; the unit tests run as any user.
func TestMain(m *testing.M) {
	testenv.ReportPrivilegedNotRun("kvnet.io/kvnet/internal/nl")
	os.Exit(m.Run())
}

func TestNamedNSAndHandle(t *testing.T) {
	testenv.NeedsRoot(t)
	name := fmt.Sprintf("kvtnl%d", os.Getpid())
	path, err := CreateNamedNS(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = DeleteNamedNS(name) })
	if again, err := CreateNamedNS(name); err != nil || again != path {
		t.Fatalf("second CreateNamedNS = %q, %v; want %q, nil", again, err, path)
	}
	names, err := ListNamedNS(name)
	if err != nil || len(names) != 1 || names[0] != name {
		t.Fatalf("ListNamedNS = %v, %v", names, err)
	}

	h, err := NewHandle(path)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	if lo.Attrs().Flags&1 == 0 {
		t.Errorf("lo is down in a new namespace")
	}
	if _, err := h.LinkByName("nosuchlink"); !errors.Is(err, ErrNotFound) {
		t.Errorf("LinkByName(missing) = %v, want ErrNotFound", err)
	}
	if err := h.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "br-test"}}); err != nil {
		t.Fatal(err)
	}
	if err := h.LinkDelByName("br-test"); err != nil {
		t.Fatal(err)
	}
	if err := h.LinkDelByName("br-test"); err != nil {
		t.Errorf("second delete: %v, want no-op", err)
	}

	// The sysctl lands in the namespace, not in the test's own.
	if err := SetSysctl(path, "net/ipv4/ip_forward", "1"); err != nil {
		t.Fatal(err)
	}
	var got []byte
	if err := Do(path, func() (err error) {
		got, err = os.ReadFile("/proc/sys/net/ipv4/ip_forward")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(string(got)) != "1" {
		t.Errorf("ip_forward in netns = %q, want 1", got)
	}
	if err := Do(NSPath(name+"-missing"), func() error { return nil }); !errors.Is(err, ErrNotFound) {
		t.Errorf("Do(missing ns) = %v, want ErrNotFound", err)
	}

	if err := DeleteNamedNS(name); err != nil {
		t.Fatal(err)
	}
	if err := DeleteNamedNS(name); err != nil {
		t.Errorf("second delete: %v, want no-op", err)
	}
	if _, err := NewHandle(path); !errors.Is(err, ErrNotFound) {
		t.Errorf("NewHandle(deleted ns) = %v, want ErrNotFound", err)
	}
}

func TestPeerLinkAcrossNamespaces(t *testing.T) {
	testenv.NeedsRoot(t)
	a, b := fmt.Sprintf("kvtnlpa%d", os.Getpid()), fmt.Sprintf("kvtnlpb%d", os.Getpid())
	pa, err := CreateNamedNS(a)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = DeleteNamedNS(a) })
	pb, err := CreateNamedNS(b)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = DeleteNamedNS(b) })
	nsb, err := OpenNS(pb)
	if err != nil {
		t.Fatal(err)
	}
	defer nsb.Close()
	h, err := NewHandle(pa)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if err := h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "host0"}, PeerName: "pod0",
		PeerNamespace: netlink.NsFd(int(nsb))}); err != nil {
		t.Fatal(err)
	}
	host, err := h.LinkByName("host0")
	if err != nil {
		t.Fatal(err)
	}
	peer, err := h.PeerLink(host)
	if err != nil {
		t.Fatal(err)
	}
	if peer.Attrs().Name != "pod0" {
		t.Errorf("PeerLink = %q, want pod0", peer.Attrs().Name)
	}
	if err := h.LinkSetUp(host); err != nil {
		t.Fatal(err)
	}
	// The peer is down: the host end has no carrier, and PeerLink sees it.
	if peer, err = h.PeerLink(host); err != nil || peer.Attrs().Flags&net.FlagUp != 0 {
		t.Errorf("PeerLink after host up = %v, %v; want pod0 still admin down", peer, err)
	}
}
