package datapath

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"kvnet.io/kvnet/internal/nl"
	"kvnet.io/kvnet/internal/testenv/nstest"
)

// transferSize is what each iteration sends over each path.
const transferSize = 256 << 20

// BenchmarkTCPThroughput compares a bulk TCP transfer between two pods on
// two nodes over the kvnet datapath (veth, bridge, nft anti-spoofing,
// VXLAN over the simulated underlay) with the same transfer over a bare
// VXLAN link between two namespaces, set up in the same run. Both
// underlays are alike: each endpoint's veth ends on a plain Linux bridge
// in a switch namespace (simnet's switch for kvnet, rawVXLANPair's own
// for the baseline), so the ratio counts only what kvnet adds on the
// nodes. It reports both in MB/s and their ratio (kvnet/raw).
func BenchmarkTCPThroughput(b *testing.B) {
	b.ReportAllocs()
	c := newCluster(b, 2)
	src, dst := c.tenantAPair("t1", "t2")
	startSink(b, dst.ns)
	kvTarget := netip.MustParseAddr("10.1.1.3")

	rawSw, rawSrc, rawDst, rawTarget := rawVXLANPair(b, c)
	startSink(b, rawDst)
	// The switch ports the senders' underlay traffic enters.
	kvPort, rawPort := switchPort{c.sim.Switch, "n1"}, switchPort{rawSw, "raw1"}

	for _, p := range []struct {
		ns string
		to netip.Addr
	}{{src.ns, kvTarget}, {rawSrc, rawTarget}} {
		if err := ping(p.ns, netip.Addr{}, p.to, 3*time.Second, true); err != nil {
			b.Fatalf("warm-up: %v", err)
		}
	}

	kvBefore, rawBefore := kvPort.rxBytes(b), rawPort.rxBytes(b)
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
	// Both transfers crossed a switch bridge, or the ratio is not like
	// with like.
	sent := uint64(transferSize) * uint64(b.N)
	if d := kvPort.rxBytes(b) - kvBefore; d < sent {
		b.Fatalf("kvnet transfer: switch port %s received %d bytes, want at least %d", kvPort.name, d, sent)
	}
	if d := rawPort.rxBytes(b) - rawBefore; d < sent {
		b.Fatalf("raw transfer: switch port %s received %d bytes, want at least %d", rawPort.name, d, sent)
	}
	mb := float64(transferSize) * float64(b.N) / 1e6
	kv, raw := mb/kvTime.Seconds(), mb/rawTime.Seconds()
	b.ReportMetric(kv, "kvnet-MB/s")
	b.ReportMetric(raw, "raw-MB/s")
	b.ReportMetric(kv/raw, "ratio")
}

// switchPort is a port of a switch bridge: a veth in namespace ns.
type switchPort struct{ ns, name string }

// rxBytes returns the bytes the port has received from its peer.
func (p switchPort) rxBytes(tb testing.TB) uint64 {
	tb.Helper()
	var n uint64
	if err := withHandle(p.ns, func(h *nl.Handle) error {
		l, err := h.LinkByName(p.name)
		if err != nil {
			return err
		}
		if st := l.Attrs().Statistics; st != nil {
			n = st.RxBytes
		}
		if m := l.Attrs().MasterIndex; m == 0 {
			return fmt.Errorf("switch port %s is on no bridge", p.name)
		}
		return nil
	}); err != nil {
		tb.Fatal(err)
	}
	return n
}

// sinkPort is where the benchmark's sinks listen.
const sinkPort = 5001

// startSink runs a TCP server in ns that reads each connection to EOF and
// then acknowledges with one byte, so the sender times full delivery.
func startSink(tb testing.TB, ns string) {
	ln := nstest.Listen(tb, ns, fmt.Sprintf(":%d", sinkPort))
	nstest.Serve(ln, func(conn net.Conn) {
		if _, err := io.Copy(io.Discard, conn); err == nil {
			_, _ = conn.Write([]byte{1})
		}
	})
}

// transfer sends transferSize bytes from ns to the sink at to and returns
// the time until the sink acknowledged.
func transfer(ns string, to netip.Addr) (time.Duration, error) {
	conn, err := nstest.Dial(ns, netip.AddrPortFrom(to, sinkPort).String(), 3*time.Second)
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

// rawVXLANPair builds the baseline: two namespaces whose eth0 (MTU 1500,
// 192.168.200.0/24) are veths to ports of a plain Linux bridge in a third,
// switch namespace built as simnet builds its switch (bridge netfilter
// off), so the underlay path is the one kvnet's traffic takes; each has a
// VXLAN device pointing at the other (VNI 42, MTU 1450, 10.200.0.0/24).
// No pod veth, no node bridge, no nftables. The namespaces belong to c and
// go away with it.
func rawVXLANPair(tb testing.TB, c *cluster) (sw, src, dst string, target netip.Addr) {
	tb.Helper()
	sw, r1, r2 := c.mkNS("rawsw"), c.mkNS("raw1"), c.mkNS("raw2")
	c.must(withHandle(sw, func(h *nl.Handle) error {
		if err := h.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "sw0"}}); err != nil {
			return err
		}
		br, err := h.LinkByName("sw0")
		if err != nil {
			return err
		}
		if err := h.LinkSetUp(br); err != nil {
			return err
		}
		for i, ns := range []string{r1, r2} {
			port := fmt.Sprintf("raw%d", i+1)
			if err := withNS(ns, func(fd int) error {
				return h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: port, MTU: 1500},
					PeerName: "eth0", PeerNamespace: netlink.NsFd(fd), PeerMTU: 1500})
			}); err != nil {
				return err
			}
			l, err := h.LinkByName(port)
			if err != nil {
				return err
			}
			if err := h.LinkSetMaster(l, br); err != nil {
				return err
			}
			if err := h.LinkSetUp(l); err != nil {
				return err
			}
		}
		return nil
	}))
	// As simnet's switch: no bridge netfilter (the keys exist only while
	// br_netfilter is loaded).
	for _, key := range []string{"net/bridge/bridge-nf-call-iptables", "net/bridge/bridge-nf-call-ip6tables", "net/bridge/bridge-nf-call-arptables"} {
		if err := nl.SetSysctl(sw, key, "0"); err != nil && !errors.Is(err, nl.ErrNotFound) {
			c.must(err)
		}
	}
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
				Port: DefaultVXLANPort, UDPCSum: true}
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
	return sw, r1, r2, netip.MustParseAddr("10.200.0.2")
}

// BenchmarkApplyServices: Apply on one simulated node with one primary
// network (10.1.0.0/16) and no pods, with services Services (TCP, one
// port, 3 endpoints each on the network's subnet), all load-balanced by
// the network's router, for services=500 (the cluster the issue asks
// about) and services=20 (a small baseline). The first Apply at 500
// sends one transaction of ~2,000 messages: 500 chains, 1,500 endpoint
// rules, and the map with its 500 elements (see the log):
//
//   - add: from the state without Services to the one with them (the
//     network has its service address in both, so what is timed is the
//     Services, not the service veth); the state without them is
//     applied again, untimed, before each op;
//   - noop: the state with the Services applied again, unchanged;
//   - change-one: one Service's endpoints change (one replaced), back
//     and forth, one change per op.
//
// Each reports the size of the router's table with the Services: its
// rules, and the netlink encoding of their expressions and comments, plus
// the keys, target chains and comments of its map elements, in bytes
// (without message headers), also logged before anything is applied.
func BenchmarkApplyServices(b *testing.B) {
	for _, services := range []int{20, 500} {
		b.Run(fmt.Sprintf("services=%d", services), func(b *testing.B) { benchApplyServices(b, services, 3) })
	}
}

func benchApplyServices(b *testing.B, services, endpoints int) {
	c := newCluster(b, 1)
	nd := c.nodes[0]
	n := primaryNet("svc-bench_udn", 1, "10.1.0.0/16", "10.1.0.1")
	setServicePort(&n, transit16, 0)
	base := c.state(nd, []Network{n})
	with := base
	for i := range services {
		sv := Service{Network: n.Name, Name: fmt.Sprintf("bench/svc%d:http", i), Protocol: "TCP",
			VIP: netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 96, byte((i + 1) >> 8), byte(i + 1)}), 80)}
		for e := range endpoints {
			host := 2 + i*endpoints + e
			sv.Endpoints = append(sv.Endpoints, netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 1, byte(host >> 8), byte(host)}), 8080))
		}
		with.Services = append(with.Services, sv)
	}
	// changed differs from with in one endpoint of one Service.
	changed := with
	changed.Services = slices.Clone(with.Services)
	sv := &changed.Services[services/2]
	sv.Endpoints = append(slices.Clone(sv.Endpoints[:endpoints-1]), netip.MustParseAddrPort("10.1.250.1:8080"))
	for _, s := range []State{base, with, changed} {
		if err := Validate(s); err != nil {
			b.Fatal(err)
		}
	}
	rules, size, elems := 0, 0, 0
	for _, t := range routerRules(n, with.Services, nil) {
		for _, m := range t.vmaps {
			for _, e := range m.elems {
				elems, size = elems+1, size+len(e.key)+len(e.chain)+len(e.comment)
			}
		}
		for _, ch := range t.chains {
			for _, r := range ch.rules {
				key, err := exprsKey(t.family, r.exprs)
				if err != nil {
					b.Fatal(err)
				}
				rules, size = rules+1, size+len(key)+len(ruleUserData(r))
			}
		}
	}
	b.Logf("router table with %d services: %d rules, %d map elements, %d bytes of expressions, elements and comments", services, rules, elems, size)
	apply := func(b *testing.B, s State) {
		if err := nd.dp.Apply(context.Background(), s); err != nil {
			b.Fatal(err)
		}
	}
	report := func(b *testing.B) {
		b.ReportMetric(float64(rules), "router-rules")
		b.ReportMetric(float64(size), "router-rule-bytes")
	}

	b.Run("add", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			b.StopTimer()
			apply(b, base)
			b.StartTimer()
			apply(b, with)
		}
		report(b)
	})
	b.Run("noop", func(b *testing.B) {
		b.ReportAllocs()
		apply(b, with)
		for b.Loop() {
			apply(b, with)
		}
		report(b)
	})
	b.Run("change-one", func(b *testing.B) {
		b.ReportAllocs()
		apply(b, with)
		next := []State{changed, with}
		i := 0
		for b.Loop() {
			apply(b, next[i%2])
			i++
		}
		report(b)
	})
}
