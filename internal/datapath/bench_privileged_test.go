package datapath

import (
	"fmt"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"kvnet.io/kvnet/internal/nl"
)

// transferSize is what each iteration sends over each path.
const transferSize = 256 << 20

// BenchmarkTCPThroughput compares a bulk TCP transfer between two pods on
// two nodes over the kvnet datapath (veth, bridge, nft anti-spoofing,
// VXLAN over the simulated underlay) with the same transfer over a bare
// VXLAN-over-veth pair between two namespaces, set up in the same run. It
// reports both in MB/s and their ratio (kvnet/raw).
func BenchmarkTCPThroughput(b *testing.B) {
	b.ReportAllocs()
	c := newCluster(b, 2)
	src, dst := c.tenantAPair("t1", "t2")
	startSink(b, dst.ns)
	kvTarget := netip.MustParseAddr("10.1.1.3")

	rawSrc, rawDst, rawTarget := rawVXLANPair(b, c)
	startSink(b, rawDst)

	for _, p := range []struct {
		ns string
		to netip.Addr
	}{{src.ns, kvTarget}, {rawSrc, rawTarget}} {
		if err := ping(p.ns, netip.Addr{}, p.to, 3*time.Second, true); err != nil {
			b.Fatalf("warm-up: %v", err)
		}
	}

	b.ResetTimer()
	var kvTime, rawTime time.Duration
	for range b.N {
		d, err := transfer(src.ns, kvTarget)
		if err != nil {
			b.Fatalf("kvnet transfer: %v", err)
		}
		kvTime += d
		if d, err = transfer(rawSrc, rawTarget); err != nil {
			b.Fatalf("raw transfer: %v", err)
		}
		rawTime += d
	}
	b.StopTimer()
	mb := float64(transferSize) * float64(b.N) / 1e6
	kv, raw := mb/kvTime.Seconds(), mb/rawTime.Seconds()
	b.ReportMetric(kv, "kvnet-MB/s")
	b.ReportMetric(raw, "raw-MB/s")
	b.ReportMetric(kv/raw, "ratio")
}

// sinkPort is where the benchmark's sinks listen.
const sinkPort = 5001

// startSink runs a TCP server in ns that reads each connection to EOF and
// then acknowledges with one byte, so the sender times full delivery.
func startSink(tb testing.TB, ns string) {
	ln := listen(tb, ns, fmt.Sprintf(":%d", sinkPort))
	serve(ln, func(conn net.Conn) {
		if _, err := io.Copy(io.Discard, conn); err == nil {
			_, _ = conn.Write([]byte{1})
		}
	})
}

// transfer sends transferSize bytes from ns to the sink at to and returns
// the time until the sink acknowledged.
func transfer(ns string, to netip.Addr) (time.Duration, error) {
	conn, err := dial(ns, netip.AddrPortFrom(to, sinkPort).String(), 3*time.Second)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	buf := make([]byte, 1<<20)
	start := time.Now()
	for sent := 0; sent < transferSize; sent += len(buf) {
		if _, err := conn.Write(buf); err != nil {
			return 0, err
		}
	}
	if err := conn.(*net.TCPConn).CloseWrite(); err != nil {
		return 0, err
	}
	if _, err := io.ReadFull(conn, make([]byte, 1)); err != nil {
		return 0, fmt.Errorf("read ack: %w", err)
	}
	return time.Since(start), nil
}

// rawVXLANPair builds the baseline: two namespaces joined by a veth
// (192.168.200.0/24, MTU 1500), each with a VXLAN device pointing at the
// other (VNI 42, MTU 1450, 10.200.0.0/24); no bridge, no nftables. The
// namespaces belong to c and go away with it.
func rawVXLANPair(tb testing.TB, c *cluster) (src, dst string, target netip.Addr) {
	tb.Helper()
	r1, r2 := c.mkNS("raw1"), c.mkNS("raw2")
	c.must(withHandle(r1, func(h *nl.Handle) error {
		return withNS(r2, func(fd int) error {
			return h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0", MTU: 1500},
				PeerName: "eth0", PeerNamespace: netlink.NsFd(fd), PeerMTU: 1500})
		})
	}))
	for i, ns := range []string{r1, r2} {
		local := netip.AddrFrom4([4]byte{192, 168, 200, byte(i + 1)})
		remote := netip.AddrFrom4([4]byte{192, 168, 200, byte(2 - i)})
		inner := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 200, 0, byte(i + 1)}), 24)
		c.must(withHandle(ns, func(h *nl.Handle) error {
			eth, err := h.LinkByName("eth0")
			if err != nil {
				return err
			}
			if err := h.AddrAdd(eth, &netlink.Addr{IPNet: ipNet(netip.PrefixFrom(local, 24))}); err != nil {
				return err
			}
			if err := h.LinkSetUp(eth); err != nil {
				return err
			}
			vx := &netlink.Vxlan{LinkAttrs: netlink.LinkAttrs{Name: "vx0", MTU: PodMTU(1500)}, VxlanId: 42,
				VtepDevIndex: eth.Attrs().Index, SrcAddr: net.IP(local.AsSlice()), Group: net.IP(remote.AsSlice()),
				Port: vxlanPort, UDPCSum: true}
			if err := h.LinkAdd(vx); err != nil {
				return err
			}
			l, err := h.LinkByName("vx0")
			if err != nil {
				return err
			}
			if err := h.AddrAdd(l, &netlink.Addr{IPNet: ipNet(inner)}); err != nil {
				return err
			}
			return h.LinkSetUp(l)
		}))
	}
	return r1, r2, netip.MustParseAddr("10.200.0.2")
}
