package datapath

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"kvnet.io/kvnet/internal/lab/simnet"
	"kvnet.io/kvnet/internal/nl"
	"kvnet.io/kvnet/internal/testenv"
	"kvnet.io/kvnet/internal/testenv/netiptest"
	"kvnet.io/kvnet/internal/testenv/nstest"
)

// This file runs the datapath on a cluster simulated by package simnet
// (a switch, nodes on the 192.168.100.0/24 underlay, an external namespace
// standing for the internet), one Datapath per node, and adds pods as
// namespaces wired with SetupPodInterface.

// Short names for the simulated underlay.
const underlayDev = simnet.UnderlayDev

var internetIP = simnet.InternetIP

// TestMain reports, as any user but root, that the privileged tests of the
// package did not run; the unit tests run as any user.
func TestMain(m *testing.M) {
	testenv.ReportPrivilegedNotRun("kvnet.io/kvnet/internal/datapath")
	os.Exit(m.Run())
}

// cluster is a simulated set of nodes running the datapath.
type cluster struct {
	tb    testing.TB
	sim   *simnet.Cluster
	ext   string // external namespace path (sim.External)
	nodes []*node
	pods  []*pod
}

type node struct {
	name string
	ns   string // namespace path
	ip   netip.Addr
	dp   *Datapath
}

type pod struct {
	name    string
	ns      string // namespace path
	node    *node
	network string
	hostIf  string
	mac     net.HardwareAddr
	ips     []netip.Prefix
	l2only  bool // Port.IPs left empty (secondary network without IPAM)
}

// newCluster builds a simulated cluster of n nodes (n1, n2, …) with a
// Datapath on each; all of it is removed when the test ends.
func newCluster(tb testing.TB, n int) *cluster {
	tb.Helper()
	return newClusterWith(tb, n, nil)
}

// newClusterWith is newCluster with each node's configuration changed by
// configure (if not nil) before its Datapath is made.
func newClusterWith(tb testing.TB, n int, configure func(*NodeConfig)) *cluster {
	tb.Helper()
	testenv.NeedsRoot(tb)
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("n%d", i+1)
	}
	sim, err := simnet.New(simnet.RandomPrefix(), names...)
	if err != nil {
		tb.Fatal(err)
	}
	c := &cluster{tb: tb, sim: sim, ext: sim.External}
	tb.Cleanup(c.cleanup)
	for _, sn := range sim.Nodes {
		nd := &node{name: sn.Name, ns: sn.NS, ip: sn.IP}
		cfg := NodeConfig{Name: nd.name, NetNS: nd.ns, UnderlayIP: nd.ip, UnderlayDev: underlayDev}
		if configure != nil {
			configure(&cfg)
		}
		dp, err := New(cfg)
		c.must(err)
		nd.dp = dp
		c.nodes = append(c.nodes, nd)
	}
	return c
}

func (c *cluster) must(err error) {
	c.tb.Helper()
	if err != nil {
		c.tb.Fatal(err)
	}
}

// mkNS creates a namespace of the cluster and returns its path.
func (c *cluster) mkNS(name string) string {
	c.tb.Helper()
	path, err := c.sim.NewNS(name)
	c.must(err)
	return path
}

// cleanup empties every node's datapath, then deletes every namespace of
// the cluster, router namespaces included.
func (c *cluster) cleanup() {
	for _, nd := range c.nodes {
		if nd.dp != nil {
			if err := nd.dp.Apply(context.Background(), State{}); err != nil {
				c.tb.Errorf("clean up node %s: %v", nd.name, err)
			}
			nd.dp.Close()
		}
	}
	if err := c.sim.Close(); err != nil {
		c.tb.Error(err)
	}
}

// addPod creates a pod namespace wired to nd with SetupPodInterface. mac is
// derived from the pod's index unless given.
func (c *cluster) addPod(nd *node, name, network string, mac net.HardwareAddr, ips []netip.Prefix, routes []Route) *pod {
	c.tb.Helper()
	if mac == nil {
		mac = net.HardwareAddr{0x02, 0x6b, 0x76, 0, byte(len(c.pods) >> 8), byte(len(c.pods) + 1)}
	}
	p := &pod{name: name, node: nd, network: network, hostIf: "v" + name, mac: mac, ips: ips}
	p.ns = c.mkNS("p-" + name)
	c.must(nl.Do(nd.ns, func() error {
		return SetupPodInterface(p.ns, "eth0", p.hostIf, mac, ips, routes, nd.dp.MTU())
	}))
	c.pods = append(c.pods, p)
	return p
}

// gatewayRoutes returns a default route via gw.
func gatewayRoutes(gw string) []Route {
	return []Route{{Dst: netip.MustParsePrefix("0.0.0.0/0"), Via: netip.MustParseAddr(gw)}}
}

// state returns the State of node nd for networks nets: every network on
// every node, remotes = the other nodes, ports = pods on nd, remote MACs =
// pods elsewhere.
func (c *cluster) state(nd *node, nets []Network) State {
	var s State
	for _, n := range nets {
		n.Remotes = nil
		for _, other := range c.nodes {
			if other != nd {
				n.Remotes = append(n.Remotes, other.ip)
			}
		}
		s.Networks = append(s.Networks, n)
	}
	for _, p := range c.pods {
		if p.node == nil {
			continue // torn down
		}
		if p.node == nd {
			port := Port{Network: p.network, HostIfName: p.hostIf, MAC: p.mac}
			if !p.l2only {
				port.IPs = p.ips
			}
			s.Ports = append(s.Ports, port)
		} else {
			s.RemoteMACs = append(s.RemoteMACs, RemoteMAC{Network: p.network, MAC: p.mac, VTEP: p.node.ip})
		}
	}
	return s
}

// tenantA is a primary network, 10.1.1.0/24 behind gateway 10.1.1.1.
var tenantA = primaryNet("tenant-a_udn", 1, "10.1.1.0/24", "10.1.1.1")

// tenantAPair adds pods a (10.1.1.2, node 0) and b (10.1.1.3, node 1) on
// tenantA, applies it on every node and returns the pods.
func (c *cluster) tenantAPair(a, b string) (*pod, *pod) {
	c.tb.Helper()
	rt := gatewayRoutes("10.1.1.1")
	pa := c.addPod(c.nodes[0], a, "tenant-a_udn", nil, netiptest.MustPrefixes("10.1.1.2/24"), rt)
	pb := c.addPod(c.nodes[1], b, "tenant-a_udn", nil, netiptest.MustPrefixes("10.1.1.3/24"), rt)
	c.applyAll([]Network{tenantA})
	return pa, pb
}

// applyAll applies each node's state for nets.
func (c *cluster) applyAll(nets []Network) {
	c.tb.Helper()
	for _, nd := range c.nodes {
		if err := nd.dp.Apply(context.Background(), c.state(nd, nets)); err != nil {
			c.tb.Fatalf("apply on %s: %v", nd.name, err)
		}
	}
}

// withHandle runs f with a netlink handle in the namespace at path.
func withHandle(path string, f func(h *nl.Handle) error) error {
	h, err := nl.NewHandle(path)
	if err != nil {
		return err
	}
	defer h.Close()
	return f(h)
}

// errTimeout is returned by ping when no reply came in time.
var errTimeout = errors.New("timeout")

// ping sends ICMP (ICMPv6) echo requests from the namespace at ns (from
// src if valid) to dst and waits up to timeout for a reply from dst. With
// resend it sends a request every 200ms, otherwise exactly one.
func ping(ns string, src, dst netip.Addr, timeout time.Duration, resend bool) error {
	network, laddr, reqType, replyType := "ip4:icmp", "0.0.0.0", byte(8), byte(0)
	if dst.Is6() {
		// The kernel computes ICMPv6 checksums on raw sockets itself.
		network, laddr, reqType, replyType = "ip6:ipv6-icmp", "::", 128, 129
	}
	if src.IsValid() {
		laddr = src.String()
	}
	return nl.Do(ns, func() error {
		conn, err := net.ListenPacket(network, laddr)
		if err != nil {
			return err
		}
		defer conn.Close()
		var idb [2]byte
		_, _ = rand.Read(idb[:])
		id := binary.BigEndian.Uint16(idb[:])
		deadline := time.Now().Add(timeout)
		buf := make([]byte, 1500)
		for seq := uint16(1); ; seq++ {
			if _, err := conn.WriteTo(echoRequest(reqType, id, seq), &net.IPAddr{IP: net.IP(dst.AsSlice())}); err != nil {
				return err
			}
			wait := deadline
			if resend && time.Until(deadline) > 200*time.Millisecond {
				wait = time.Now().Add(200 * time.Millisecond)
			}
			for {
				_ = conn.SetReadDeadline(wait)
				n, from, err := conn.ReadFrom(buf)
				if err != nil {
					break // read deadline
				}
				ip, _ := from.(*net.IPAddr)
				if n >= 8 && buf[0] == replyType && binary.BigEndian.Uint16(buf[4:]) == id && ip != nil && ip.IP.Equal(net.IP(dst.AsSlice())) {
					return nil
				}
			}
			if !time.Now().Before(deadline) {
				return fmt.Errorf("ping %s from %s: %w", dst, laddr, errTimeout)
			}
		}
	})
}

// echoRequest builds an ICMP echo request of type typ (8, or 128 for
// ICMPv6, whose checksum the kernel fills in).
func echoRequest(typ byte, id, seq uint16) []byte {
	b := []byte{typ, 0, 0, 0, byte(id >> 8), byte(id), byte(seq >> 8), byte(seq)}
	b = append(b, []byte("kvnet-ping")...)
	if typ == 8 {
		binary.BigEndian.PutUint16(b[2:], inetChecksum(b))
	}
	return b
}

func inetChecksum(b []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		sum += uint32(b[len(b)-1]) << 8
	}
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	return ^uint16(sum)
}

// echoPort is where every test pod runs its echo server.
const echoPort = 7

// startEcho runs a TCP echo server in pod p that first sends p's name (the
// token telling which pod answered), then echoes every line.
func startEcho(tb testing.TB, p *pod) {
	ln := nstest.Listen(tb, p.ns, fmt.Sprintf(":%d", echoPort))
	nstest.Serve(ln, func(conn net.Conn) {
		fmt.Fprintf(conn, "%s\n", p.name)
		_, _ = io.Copy(conn, conn)
	})
}

// echoSession connects from p to dst's echo server, returns the token it
// announces and keeps the connection for rounds round trips spaced by
// 100ms, checking each echo.
func echoSession(p *pod, dst netip.Addr, rounds int) (string, error) {
	return echoSessionTo(p, netip.AddrPortFrom(dst, echoPort), rounds)
}

// echoSessionTo is echoSession to an echo server at dst (a service's
// address in front of echo servers, say).
func echoSessionTo(p *pod, dst netip.AddrPort, rounds int) (string, error) {
	return echoFrom(p.ns, p.name, dst, rounds)
}

// echoFrom is echoSessionTo from the namespace at ns, a client called who.
func echoFrom(ns, who string, dst netip.AddrPort, rounds int) (string, error) {
	conn, err := nstest.Dial(ns, dst.String(), 2*time.Second)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(time.Duration(rounds)*200*time.Millisecond + 3*time.Second))
	r := bufio.NewReader(conn)
	token, err := r.ReadString('\n')
	if err != nil {
		return "", fmt.Errorf("read token: %w", err)
	}
	for i := range rounds {
		msg := fmt.Sprintf("round %d from %s\n", i, who)
		if _, err := io.WriteString(conn, msg); err != nil {
			return "", err
		}
		got, err := r.ReadString('\n')
		if err != nil {
			return "", fmt.Errorf("round %d: %w", i, err)
		}
		if got != msg {
			return "", fmt.Errorf("round %d: echo %q, want %q", i, got, msg)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return strings.TrimSpace(token), nil
}

// podLink runs f on pod p's eth0.
func podLink(p *pod, f func(h *nl.Handle, l netlink.Link) error) error {
	return withHandle(p.ns, func(h *nl.Handle) error {
		l, err := h.LinkByName("eth0")
		if err != nil {
			return err
		}
		return f(h, l)
	})
}

// sendRawFrame sends an Ethernet frame out of eth0 in pod p.
func sendRawFrame(p *pod, frame []byte) error {
	return nl.Do(p.ns, func() error {
		l, err := net.InterfaceByName("eth0")
		if err != nil {
			return err
		}
		proto := htons(unix.ETH_P_ALL)
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, int(proto))
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: proto, Ifindex: l.Index}); err != nil {
			return err
		}
		_, err = unix.Write(fd, frame)
		return err
	})
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// udpFrame builds an Ethernet/IPv4/UDP frame.
func udpFrame(srcMAC, dstMAC net.HardwareAddr, src, dst netip.Addr, sport, dport uint16, payload []byte) []byte {
	f := append(append(append([]byte{}, dstMAC...), srcMAC...), 0x08, 0x00)
	ip := make([]byte, 20)
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:], uint16(20+8+len(payload)))
	ip[8] = 64
	ip[9] = unix.IPPROTO_UDP
	s4, d4 := src.As4(), dst.As4()
	copy(ip[12:], s4[:])
	copy(ip[16:], d4[:])
	binary.BigEndian.PutUint16(ip[10:], inetChecksum(ip))
	udp := make([]byte, 8)
	binary.BigEndian.PutUint16(udp[0:], sport)
	binary.BigEndian.PutUint16(udp[2:], dport)
	binary.BigEndian.PutUint16(udp[4:], uint16(8+len(payload)))
	return append(append(append(f, ip...), udp...), payload...)
}
