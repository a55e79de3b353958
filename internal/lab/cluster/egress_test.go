package cluster

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

func tcpFlow(origSrc, origDst, replySrc, replyDst string) *netlink.ConntrackFlow {
	ap := func(s string) (net.IP, uint16) {
		a := netip.MustParseAddrPort(s)
		return net.IP(a.Addr().AsSlice()), a.Port()
	}
	f := &netlink.ConntrackFlow{FamilyType: unix.AF_INET}
	f.Forward.Protocol, f.Reverse.Protocol = unix.IPPROTO_TCP, unix.IPPROTO_TCP
	f.Forward.SrcIP, f.Forward.SrcPort = ap(origSrc)
	f.Forward.DstIP, f.Forward.DstPort = ap(origDst)
	f.Reverse.SrcIP, f.Reverse.SrcPort = ap(replySrc)
	f.Reverse.DstIP, f.Reverse.DstPort = ap(replyDst)
	return f
}

// TestEgressPath: the node's conntrack entry of the very connection the
// egress server saw names the way out: kvnet's router's transit address
// for the UDN's egress, the pod IP for eth0's (Flannel's). A pod whose
// egress went over eth0 is told apart from one whose went through its
// router.
func TestEgressPath(t *testing.T) {
	server := netip.MustParseAddrPort("10.89.0.1:41000")
	flows := []*netlink.ConntrackFlow{
		// containerd pulling from the registry: the node itself.
		tcpFlow("10.89.0.11:50000", "10.89.0.1:5000", "10.89.0.1:5000", "10.89.0.11:50000"),
		// a-1 through its router: transit address masqueraded to the node's.
		tcpFlow("169.254.0.12:43210", "10.89.0.1:41000", "10.89.0.1:41000", "10.89.0.11:43210"),
		// a-1 over eth0 (Flannel): its pod IP masqueraded, port randomised.
		tcpFlow("10.244.1.5:39000", "10.89.0.1:41000", "10.89.0.1:41000", "10.89.0.11:61111"),
		// the same port from another server.
		tcpFlow("10.244.1.9:38000", "10.89.0.1:42000", "10.89.0.1:42000", "10.89.0.11:43210"),
	}
	eth0 := netip.MustParseAddr("10.244.1.5")
	for _, c := range []struct {
		seen, want string
	}{
		{"10.89.0.11:43210", egressUDN},
		{"10.89.0.11:61111", egressEth0},
	} {
		origin, ok := flowOrigin(flows, netip.MustParseAddrPort(c.seen), server)
		if !ok {
			t.Fatalf("seen %s: no flow", c.seen)
		}
		path, err := egressPath(origin, eth0)
		if err != nil || path != c.want {
			t.Errorf("seen %s: origin %s: path %q (%v), want %q", c.seen, origin, path, err, c.want)
		}
	}
	if _, ok := flowOrigin(flows, netip.MustParseAddrPort("10.89.0.12:43210"), server); ok {
		t.Error("a flow found for an address the node never translated to")
	}
	// Neither the pod IP nor a transit address (another pod's IP, the
	// node's own): an error naming it.
	if _, err := egressPath(netip.MustParseAddr("10.244.1.9"), eth0); err == nil || !strings.Contains(err.Error(), "10.244.1.9") {
		t.Errorf("another pod's IP: %v", err)
	}
}

func TestParseEgressReport(t *testing.T) {
	_, seen, origin, err := parseEgressReport(`{"seen":"10.89.0.11:43210","origin":"169.254.0.12"}` + "\n")
	if err != nil || seen.String() != "10.89.0.11:43210" || origin.String() != "169.254.0.12" {
		t.Errorf("parseEgressReport: %s %s %v", seen, origin, err)
	}
	if _, _, _, err := parseEgressReport(`{"seen":"10.89.0.11:43210","error":"no conntrack entry"}`); err == nil || !strings.Contains(err.Error(), "no conntrack entry") {
		t.Errorf("server error: %v", err)
	}
	if _, _, _, err := parseEgressReport(`{"v2":"registry"}`); err == nil {
		t.Error("the registry's answer parsed as a report")
	}
}

func TestNodeNetnsPath(t *testing.T) {
	if p, err := nodeNetnsPath("node-2"); err != nil || p != "/run/netns/"+Netns(2) {
		t.Errorf("node-2: %q, %v", p, err)
	}
	for _, n := range []string{"", "node-x", "worker-1", "node-2x"} {
		if _, err := nodeNetnsPath(n); err == nil {
			t.Errorf("%q: no error", n)
		}
	}
}

// TestReachAll: both backends must answer; a Service that only ever
// reaches one backend fails, naming the other; a stranger's answer
// fails at once; failed fetches count as tries.
func TestReachAll(t *testing.T) {
	want := []string{"hello from a-1", "hello from a-2"}
	seq := func(bodies ...string) func(context.Context) (string, error) {
		i := 0
		return func(context.Context) (string, error) {
			b := bodies[i%len(bodies)]
			i++
			if b == "" {
				return "", errors.New("timeout")
			}
			return b, nil
		}
	}
	got, err := reachAll(context.Background(), 10, seq("", "hello from a-1", "hello from a-1", "hello from a-2"), want)
	if err != nil || got != `"hello from a-1" ×2, "hello from a-2" ×1` {
		t.Errorf("both: %q, %v", got, err)
	}
	calls := 0
	one := func(context.Context) (string, error) { calls++; return "hello from a-1", nil }
	if _, err := reachAll(context.Background(), 10, one, want); err == nil || !strings.Contains(err.Error(), `no answer "hello from a-2" in 10 tries`) {
		t.Errorf("one backend only: %v", err)
	}
	if calls != 10 {
		t.Errorf("one backend only: %d fetches, want 10", calls)
	}
	if _, err := reachAll(context.Background(), 10, seq("hello from b-1"), want); err == nil || !strings.Contains(err.Error(), "b-1") {
		t.Errorf("a stranger: %v", err)
	}
	if _, err := reachAll(context.Background(), 3, seq(""), want); err == nil || !strings.Contains(err.Error(), "3 failed, last: timeout") {
		t.Errorf("all failing: %v", err)
	}
}
