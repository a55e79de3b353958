package datapath

import (
	"bufio"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"kvnet.io/kvnet/internal/nl"
	"kvnet.io/kvnet/internal/testenv/nstest"
)

// TestDefaultNetworkRestriction: pods a and b are on primary UDNs of two
// tenants and, as under Multus, also have eth0 on the cluster default
// network (a bridge cni0 on the node, 10.88.0.0/24); pod c is on the
// default network only and runs the stand-in cluster DNS. Before the
// restriction everything reaches everything over eth0 (the control);
// after it, only the node (kubelet probes) reaches a and b there, c and
// the other tenant do not, and a and b open nothing there (not to c, c's
// DNS or the node).
func TestDefaultNetworkRestriction(t *testing.T) {
	c := newCluster(t, 1)
	nd := c.nodes[0]
	c.must(withHandle(nd.ns, func(h *nl.Handle) error {
		br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "cni0"}}
		if err := h.LinkAdd(br); err != nil {
			return err
		}
		if err := h.AddrAdd(br, &netlink.Addr{IPNet: &net.IPNet{IP: net.IPv4(10, 88, 0, 1), Mask: net.CIDRMask(24, 32)}}); err != nil {
			return err
		}
		return h.LinkSetUp(br)
	}))
	type defPod struct{ name, ns, ip string }
	mk := func(name, ip string, mac byte) defPod {
		p := defPod{name: name, ns: c.mkNS("d-" + name), ip: ip}
		host := "vd" + name
		c.must(nl.Do(nd.ns, func() error {
			return SetupPodInterface(p.ns, DefaultNetworkIfName, host, net.HardwareAddr{2, 0x88, 0, 0, 0, mac},
				[]netip.Prefix{netip.MustParsePrefix(ip + "/24")}, nil, 1500)
		}))
		c.must(withHandle(nd.ns, func(h *nl.Handle) error {
			l, err := h.LinkByName(host)
			if err != nil {
				return err
			}
			br, err := h.LinkByName("cni0")
			if err != nil {
				return err
			}
			if err := h.LinkSetMaster(l, br); err != nil {
				return err
			}
			return h.LinkSetUp(l)
		}))
		ln := nstest.Listen(t, p.ns, ip+":8080")
		nstest.Serve(ln, func(conn net.Conn) { fmt.Fprintf(conn, "%s\n", name) })
		return p
	}
	a, b, cp := mk("a", "10.88.0.10", 10), mk("b", "10.88.0.11", 11), mk("c", "10.88.0.12", 12)
	startDNS(t, cp.ns, cp.ip+":53")

	reach := func(fromNS string, to defPod) error {
		conn, err := nstest.Dial(fromNS, to.ip+":8080", 500*time.Millisecond)
		if err != nil {
			return err
		}
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(time.Second))
		line, err := bufio.NewReader(conn).ReadString('\n')
		if err != nil {
			return err
		}
		if got := strings.TrimSpace(line); got != to.name {
			return fmt.Errorf("answered by %q, not %s", got, to.name)
		}
		return nil
	}
	type path struct {
		from, fromNS string
		to           defPod
	}
	paths := []path{{"node", nd.ns, a}, {"c", cp.ns, a}, {"b", b.ns, a}, {"a", a.ns, b}, {"node", nd.ns, b}, {"a", a.ns, cp}}
	for _, p := range paths {
		// A fresh bridge and its ports may take a moment (ARP, port
		// state) on a busy machine: the control waits for the path.
		var err error
		for deadline := time.Now().Add(5 * time.Second); ; {
			if err = reach(p.fromNS, p.to); err == nil || time.Now().After(deadline) {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if err != nil {
			out, _ := exec.Command("sh", "-c", "ip netns exec "+filepath.Base(nd.ns)+" sh -c 'ip -br link; ip -br addr; ip route; nft list ruleset | head -50; sysctl net.bridge.bridge-nf-call-iptables'; ip netns exec "+filepath.Base(a.ns)+" sh -c 'ip -br link; ip -br addr; ip route'").CombinedOutput()
			t.Fatalf("control, before the restriction: %s -> %s over eth0: %v\n%s", p.from, p.to.name, err, out)
		}
	}

	if err := ping(a.ns, netip.MustParseAddr(a.ip), netip.MustParseAddr("10.88.0.1"), time.Second, false); err != nil {
		t.Fatalf("control, before the restriction: a pings the node over eth0: %v", err)
	}

	node := []netip.Addr{netip.MustParseAddr("10.88.0.1"), nd.ip}
	for _, p := range []defPod{a, b} {
		c.must(RestrictDefaultNetwork(p.ns, DefaultNetworkIfName, node))
		// Applying again replaces, not duplicates.
		c.must(RestrictDefaultNetwork(p.ns, DefaultNetworkIfName, node))
	}
	want := map[string]bool{"node->a": true, "c->a": false, "b->a": false, "a->b": false, "node->b": true, "a->c": false}
	for _, p := range paths {
		key := p.from + "->" + p.to.name
		err := reach(p.fromNS, p.to)
		if want[key] && err != nil {
			t.Errorf("%s over eth0 after the restriction: %v, want it to connect", key, err)
		}
		if !want[key] && err == nil {
			t.Errorf("%s over eth0 after the restriction connected; only the node may", key)
		}
	}
	// a opens nothing to the node over eth0 either: there the node's
	// ports are the cluster default network's, other tenants' node ports
	// included (its traffic to the node goes by its primary network).
	if err := ping(a.ns, netip.MustParseAddr(a.ip), netip.MustParseAddr("10.88.0.1"), 500*time.Millisecond, false); err == nil {
		t.Error("a pings the node over eth0 after the restriction")
	}
	if err := ping(cp.ns, netip.MustParseAddr(cp.ip), netip.MustParseAddr(a.ip), 500*time.Millisecond, false); err == nil {
		t.Error("c pings a over eth0 after the restriction")
	}
	// a opens nothing to pods over eth0, UDP included (its DNS goes by
	// its primary network's router).
	if got, err := queryDNS(a.ns, cp.ip+":53"); err == nil {
		t.Errorf("a queried c's DNS over eth0: answered %q; a primary-UDN pod reaches only the node there", got)
	}

	// A pod without eth0 has nothing to restrict, and says so.
	bare := c.mkNS("d-bare")
	if err := RestrictDefaultNetwork(bare, DefaultNetworkIfName, node); err == nil || !strings.Contains(err.Error(), "no eth0") {
		t.Errorf("RestrictDefaultNetwork without eth0: %v", err)
	}
}

// startDNS answers every UDP datagram at addr in namespace ns with
// "answer from c" (a stand-in for the cluster DNS).
func startDNS(t *testing.T, ns, addr string) {
	t.Helper()
	startUDPAnswer(t, ns, addr, "answer from c")
}

// startUDPAnswer answers every UDP datagram at addr in namespace ns with
// answer.
func startUDPAnswer(t *testing.T, ns, addr, answer string) {
	t.Helper()
	var pc net.PacketConn
	if err := nl.Do(ns, func() (err error) {
		pc, err = net.ListenPacket("udp4", addr)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 512)
		for {
			_, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = pc.WriteTo([]byte(answer), from)
		}
	}()
}

func queryDNS(ns, server string) (string, error) {
	var conn net.Conn
	if err := nl.Do(ns, func() (err error) {
		conn, err = net.Dial("udp4", server)
		return err
	}); err != nil {
		return "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(time.Second))
	if _, err := conn.Write([]byte("query")); err != nil {
		return "", err
	}
	buf := make([]byte, 512)
	n, err := conn.Read(buf)
	return string(buf[:n]), err
}
