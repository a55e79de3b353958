package datapath

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/nftables"

	"kvnet.io/kvnet/internal/nl"
	"kvnet.io/kvnet/internal/testenv/netiptest"
	"kvnet.io/kvnet/internal/testenv/nstest"
)

// policyWorld is tenant A's pods a1, a2 (node 1) and a3 (node 2), and
// tenant B's b1 and b2 on node 1 with the same subnet, b2 holding a1's
// address: every pod runs an echo server.
func policyWorld(t *testing.T) (*cluster, map[string]*pod, []Network) {
	c := newCluster(t, 2)
	nets := []Network{
		primaryNet("tenant-a_udn", 1, "10.1.1.0/24", "10.1.1.1"),
		primaryNet("tenant-b_udn", 2, "10.1.1.0/24", "10.1.1.1"),
	}
	rt := gatewayRoutes("10.1.1.1")
	n1, n2 := c.nodes[0], c.nodes[1]
	pods := map[string]*pod{
		"a1": c.addPod(n1, "a1", "tenant-a_udn", nil, netiptest.MustPrefixes("10.1.1.2/24"), rt),
		"a2": c.addPod(n1, "a2", "tenant-a_udn", nil, netiptest.MustPrefixes("10.1.1.3/24"), rt),
		"a3": c.addPod(n2, "a3", "tenant-a_udn", nil, netiptest.MustPrefixes("10.1.1.4/24"), rt),
		"b1": c.addPod(n1, "b1", "tenant-b_udn", nil, netiptest.MustPrefixes("10.1.1.4/24"), rt),
		"b2": c.addPod(n1, "b2", "tenant-b_udn", nil, netiptest.MustPrefixes("10.1.1.2/24"), rt),
	}
	c.applyAll(nets)
	for _, p := range pods {
		startEcho(t, p)
	}
	return c, pods, nets
}

// applyPolicies applies every node's state with the policies of its own
// pods (by pod name).
func (c *cluster) applyPolicies(nets []Network, pols map[string]PortPolicy) {
	c.tb.Helper()
	for _, nd := range c.nodes {
		s := c.state(nd, nets)
		for _, p := range c.pods {
			if pp, ok := pols[p.name]; ok && p.node == nd {
				pp.Port = p.hostIf
				s.Policies = append(s.Policies, pp)
			}
		}
		if err := nd.dp.Apply(context.Background(), s); err != nil {
			c.tb.Fatalf("apply policies on %s: %v", nd.name, err)
		}
	}
}

// probeMatrix opens, in parallel, a connection from every pod of pairs'
// keys to every address, and reports which answered with the expected
// pod's token: "from>to" for each pair that connected.
func probeMatrix(pods map[string]*pod, pairs [][2]string) map[string]bool {
	var mu sync.Mutex
	got := map[string]bool{}
	var wg sync.WaitGroup
	for _, pr := range pairs {
		wg.Go(func() {
			from, to := pods[pr[0]], pods[pr[1]]
			token, err := echoFromTimeout(from, to.ips[0].Addr(), 1500*time.Millisecond)
			mu.Lock()
			got[pr[0]+">"+pr[1]] = err == nil && token == to.name
			mu.Unlock()
		})
	}
	wg.Wait()
	return got
}

// echoFromTimeout connects from p to dst's echo port and returns the
// token the server sends, within timeout.
func echoFromTimeout(p *pod, dst netip.Addr, timeout time.Duration) (string, error) {
	conn, err := nstest.Dial(p.ns, netip.AddrPortFrom(dst, echoPort).String(), timeout)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(timeout))
	line, err := bufio.NewReader(conn).ReadString('\n')
	return strings.TrimSpace(line), err
}

// checkMatrix probes tenant A's 3x3 matrix and tenant B's pair, and
// fails with both tables when the result differs from want ("from>to"
// pairs that must connect; every other pair must not).
func checkMatrix(t *testing.T, pods map[string]*pod, step string, want ...string) {
	t.Helper()
	var pairs [][2]string
	a := []string{"a1", "a2", "a3"}
	for _, f := range a {
		for _, to := range a {
			if f != to {
				pairs = append(pairs, [2]string{f, to})
			}
		}
	}
	pairs = append(pairs, [2]string{"b1", "b2"}, [2]string{"b2", "b1"})
	got := probeMatrix(pods, pairs)
	// On a loaded machine an allowed connection may time out: a pair
	// want allows is probed again, up to three times, before it counts as
	// refused (a connection made is decisive; a refusal is not retried).
	for try := 0; try < 3; try++ {
		var again [][2]string
		for _, pr := range pairs {
			if k := pr[0] + ">" + pr[1]; slices.Contains(want, k) && !got[k] {
				again = append(again, pr)
			}
		}
		if len(again) == 0 {
			break
		}
		for k, v := range probeMatrix(pods, again) {
			got[k] = v
		}
	}
	var sb strings.Builder
	bad := false
	fmt.Fprintf(&sb, "%s: want/got (. connects, X does not)\n", step)
	for _, pr := range pairs {
		k := pr[0] + ">" + pr[1]
		w := slices.Contains(want, k)
		mark := map[bool]string{true: ".", false: "X"}
		fmt.Fprintf(&sb, "  %-6s %s/%s", k, mark[w], mark[got[k]])
		if w != got[k] {
			bad = true
			sb.WriteString("  <-- differs")
		}
		sb.WriteString("\n")
	}
	if bad {
		t.Fatal(sb.String())
	}
}

// session is an open echo connection: each round trip proves it alive.
type session struct {
	conn net.Conn
	r    *bufio.Reader
}

func openSession(t *testing.T, from, to *pod) *session {
	t.Helper()
	conn, err := nstest.Dial(from.ns, netip.AddrPortFrom(to.ips[0].Addr(), echoPort).String(), 2*time.Second)
	if err != nil {
		t.Fatalf("%s to %s: %v", from.name, to.name, err)
	}
	t.Cleanup(func() { conn.Close() })
	s := &session{conn: conn, r: bufio.NewReader(conn)}
	if err := s.roundTrip(); err != nil {
		t.Fatalf("%s to %s: %v", from.name, to.name, err)
	}
	return s
}

// roundTrip reads the server's token the first time, then echoes a line.
func (s *session) roundTrip() error {
	_ = s.conn.SetDeadline(time.Now().Add(1500 * time.Millisecond))
	if _, err := fmt.Fprintln(s.conn, "ping"); err != nil {
		return err
	}
	for {
		line, err := s.r.ReadString('\n')
		if err != nil {
			return err
		}
		if strings.TrimSpace(line) == "ping" {
			return nil
		}
	}
}

// TestPolicyEnforcement: with real traffic between pods on two nodes,
// ingress and egress isolation allow exactly what their rules say
// (replies of connections an isolated pod opened included); tenant B's
// pod with an isolated pod's address is untouched; a policy change cuts
// the established connections it no longer allows and keeps the others;
// a no-op Apply commits nothing, and a peer change rewrites set elements
// only; removing the policies opens everything again.
func TestPolicyEnforcement(t *testing.T) {
	t.Parallel()
	c, pods, nets := policyWorld(t)
	pp := netip.MustParsePrefix
	all := []string{"a1>a2", "a1>a3", "a2>a1", "a2>a3", "a3>a1", "a3>a2", "b1>b2", "b2>b1"}
	checkMatrix(t, pods, "no policy", all...)

	echo := []PolicyPort{{Protocol: "TCP", Port: echoPort}}
	fromA3 := PolicyRule{Name: "x/a1-from-a3 ingress[0]", Peers: []netip.Prefix{pp("10.1.1.4/32")}, Ports: echo}
	pols := map[string]PortPolicy{
		"a1": {Ingress: &PolicyDirection{Policies: []string{"x/a1-from-a3"}, Rules: []PolicyRule{fromA3}}},
	}
	c.applyPolicies(nets, pols)
	// a1 takes connections from a3 only, and still opens its own.
	checkMatrix(t, pods, "a1 ingress from a3", "a1>a2", "a1>a3", "a2>a3", "a3>a1", "a3>a2", "b1>b2", "b2>b1")
	// The node reaches a1 on its cluster default network interface (the
	// kubelet's probes): policies are about the UDN port only.
	eth0 := addEth0(t, c.nodes[0], pods["a1"])
	if token, err := echoFrom(c.nodes[0].ns, "node", netip.AddrPortFrom(eth0, echoPort), 1); err != nil || token != "a1" {
		t.Errorf("node to a1's eth0 under a1's ingress policy: %q, %v; want a1's answer", token, err)
	}

	// a2 may only connect to 10.1.1.0/24 except a1, on the echo port.
	pols["a2"] = PortPolicy{Egress: &PolicyDirection{Policies: []string{"x/a2-out"}, Rules: []PolicyRule{{
		Name: "x/a2-out egress[0]", Peers: []netip.Prefix{pp("10.1.1.0/31"), pp("10.1.1.3/32"), pp("10.1.1.4/30"), pp("10.1.1.8/29")},
		Ports: echo}}}}
	c.applyPolicies(nets, pols)
	checkMatrix(t, pods, "a2 egress except a1", "a1>a2", "a1>a3", "a2>a3", "a3>a1", "a3>a2", "b1>b2", "b2>b1")
	// DHCP with the router passes isolated ports both ways (a1's
	// ingress, a2's egress: no rule of theirs allows UDP); other UDP
	// from the router's port 67 does not.
	router := nl.NSPath(RouterNSName(c.nodes[0].dp.cfg, 1))
	for _, d := range []struct {
		what         string
		fromNS, toNS string
		from, to     string
		want         bool
	}{
		{"router to a1, DHCP server to client", router, pods["a1"].ns, "10.1.1.1:67", "10.1.1.2:68", true},
		{"a2 to router, DHCP client to server", pods["a2"].ns, router, "10.1.1.3:68", "10.1.1.1:67", true},
		{"router to a1, UDP 67 to 69", router, pods["a1"].ns, "10.1.1.1:67", "10.1.1.2:69", false},
	} {
		if err := udpDatagram(d.fromNS, d.toNS, d.from, d.to); (err == nil) != d.want {
			t.Errorf("%s: %v, want delivered %v", d.what, err, d.want)
		}
	}

	// Established connections: a3 to a1 (allowed by a1's rule) and a1
	// to a3 (a1's own); the rule then allows a2 instead of a3.
	cut := openSession(t, pods["a3"], pods["a1"])
	kept := openSession(t, pods["a1"], pods["a3"])
	n1 := c.nodes[0]
	before := nodeRulesByChain(t, n1.dp)
	gen := nsGenID(t, n1.dp.nsPath)
	c.applyPolicies(nets, pols)
	if g := nsGenID(t, n1.dp.nsPath); g != gen {
		t.Errorf("a no-op Apply committed to the node's nftables: generation %d, was %d", g, gen)
	}
	// A set changed behind kvnet's back is healed by the next Apply
	// (its remembered sets are not trusted after a foreign commit).
	setName := policySetName("tenant-a_udn", fromA3.Name, false)
	setElems := func() []string {
		t.Helper()
		var out []string
		if err := withNS(n1.dp.nsPath, func(fd int) error {
			conn, err := nftConn(fd)
			if err != nil {
				return err
			}
			set, err := conn.GetSetByName(&nftables.Table{Family: nftables.TableFamilyINet, Name: tableName}, setName)
			if err != nil {
				return err
			}
			elems, err := conn.GetSetElements(set)
			for _, e := range elems {
				a, _ := netip.AddrFromSlice(e.Key)
				out = append(out, a.String())
			}
			if len(out) > 0 && len(elems) > 0 {
				conn.SetDeleteElements(set, elems[:1]) //nolint:errcheck // checked by Flush
				err = errors.Join(err, conn.Flush())
			}
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return out
	}
	if got := setElems(); !slices.Equal(got, []string{"10.1.1.4"}) { // and deletes it
		t.Fatalf("set %s: %v, want [10.1.1.4]", setName, got)
	}
	c.applyPolicies(nets, pols)
	if got := setElems(); !slices.Equal(got, []string{"10.1.1.4"}) {
		t.Fatalf("set %s after an element was deleted behind kvnet's back and Apply: %v, want [10.1.1.4]", setName, got)
	}
	c.applyPolicies(nets, pols)
	fromA2 := fromA3
	fromA2.Peers = []netip.Prefix{pp("10.1.1.3/32")}
	pols["a1"] = PortPolicy{Ingress: &PolicyDirection{Policies: []string{"x/a1-from-a3"}, Rules: []PolicyRule{fromA2}}}
	c.applyPolicies(nets, pols)
	if after := nodeRulesByChain(t, n1.dp); !maps.EqualFunc(after, before, slices.Equal) {
		t.Errorf("a peer change rewrote rules, not only set elements:\n--- after\n%v\n--- before\n%v", after, before)
	}
	if err := cut.roundTrip(); err == nil {
		t.Error("a3's established connection to a1 survived the policy that no longer allows it")
	}
	if err := kept.roundTrip(); err != nil {
		t.Errorf("a1's own connection to a3 was cut by a change of a1's ingress: %v", err)
	}
	// a2 is allowed by a1 but its own egress refuses a1.
	checkMatrix(t, pods, "a1 ingress from a2", "a1>a2", "a1>a3", "a2>a3", "a3>a2", "b1>b2", "b2>b1")

	c.applyPolicies(nets, nil)
	checkMatrix(t, pods, "policies removed", all...)
}

// nodeRulesByChain returns the node namespace's kvnet rules by chain.
func nodeRulesByChain(t *testing.T, dp *Datapath) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	if err := withNS(dp.nsPath, func(fd int) error {
		for line := range strings.Lines(ruleDump(t, fd)) {
			fields := strings.SplitN(strings.TrimSpace(line), " ", 3)
			if len(fields) == 3 {
				out[fields[0]+" "+fields[1]] = append(out[fields[0]+" "+fields[1]], fields[2])
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

// addEth0 gives p a stand-in for its cluster default network interface
// (eth0 in a real pod; here "dflt0", as p's kvnet interface is eth0):
// 192.168.250.2/30 on a veth to its node's namespace (192.168.250.1/30),
// outside every kvnet bridge. It returns p's address.
func addEth0(t *testing.T, nd *node, p *pod) netip.Addr {
	t.Helper()
	host := "e0" + p.name
	for _, cmd := range []struct {
		ns   string
		args []string
	}{
		{nd.ns, []string{"ip", "link", "add", host, "type", "veth", "peer", "name", "dflt0", "netns", filepath.Base(p.ns)}},
		{nd.ns, []string{"ip", "addr", "add", "192.168.250.1/30", "dev", host}},
		{nd.ns, []string{"ip", "link", "set", host, "up"}},
		{p.ns, []string{"ip", "addr", "add", "192.168.250.2/30", "dev", "dflt0"}},
		{p.ns, []string{"ip", "link", "set", "dflt0", "up"}},
	} {
		if err := nstest.Exec(cmd.ns, cmd.args...); err != nil {
			t.Fatal(err)
		}
	}
	return netip.MustParseAddr("192.168.250.2")
}

// BenchmarkApplyPolicies: Apply on one simulated node with one primary
// network and 100 local ports (their interfaces absent: rules only) under
// 1,000 policies, ten per port, each one ingress rule from its own 100
// peer addresses on TCP 8080 (1,000 sets, 100,000 elements):
//
//   - add: from the state without policies to the one with them;
//   - noop: the state with them applied again (noop-without-policies:
//     the state without them, the rest of Apply's cost);
//   - change-one: one policy's peers change (one address replaced), back
//     and forth: one set's elements, nothing else.
func BenchmarkApplyPolicies(b *testing.B) {
	c := newCluster(b, 1)
	nd := c.nodes[0]
	n := primaryNet("pol-bench_udn", 1, "10.1.0.0/16", "10.1.0.1")
	base := c.state(nd, []Network{n})
	for i := range 100 {
		base.Ports = append(base.Ports, Port{Network: n.Name, HostIfName: fmt.Sprintf("kvpbench%d", i),
			MAC: net.HardwareAddr{0x02, 0, 0, 0, 1, byte(i)},
			IPs: []netip.Prefix{netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 1, 0, byte(i + 2)}), 16)}})
	}
	rule := func(i, variant int) PolicyRule {
		r := PolicyRule{Name: fmt.Sprintf("bench/p%d ingress[0]", i), Ports: []PolicyPort{{Protocol: "TCP", Port: 8080}}}
		for j := range 100 {
			host := 1000 + i*100 + j
			if j == 0 && variant == 1 {
				host = 60000
			}
			r.Peers = append(r.Peers, netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 1, byte(host >> 8), byte(host)}), 32))
		}
		return r
	}
	policies := func(changed int) State {
		s := base
		for p := range 100 {
			d := &PolicyDirection{}
			for k := range 10 {
				i := p*10 + k
				variant := 0
				if i == changed {
					variant = 1
				}
				d.Policies = append(d.Policies, fmt.Sprintf("bench/p%d", i))
				d.Rules = append(d.Rules, rule(i, variant))
			}
			s.Policies = append(s.Policies, PortPolicy{Port: base.Ports[p].HostIfName, Ingress: d})
		}
		return s
	}
	with, changed := policies(-1), policies(555)
	for _, s := range []State{base, with, changed} {
		if err := Validate(s); err != nil {
			b.Fatal(err)
		}
	}
	apply := func(b *testing.B, s State) {
		if err := nd.dp.Apply(context.Background(), s); err != nil && !errors.Is(err, ErrPortNotFound) {
			b.Fatal(err)
		}
	}
	b.Run("add", func(b *testing.B) {
		for b.Loop() {
			b.StopTimer()
			apply(b, base)
			b.StartTimer()
			apply(b, with)
		}
	})
	b.Run("noop-without-policies", func(b *testing.B) {
		apply(b, base)
		for b.Loop() {
			apply(b, base)
		}
	})
	b.Run("noop", func(b *testing.B) {
		apply(b, with)
		for b.Loop() {
			apply(b, with)
		}
	})
	b.Run("change-one", func(b *testing.B) {
		apply(b, with)
		next := []State{changed, with}
		i := 0
		for b.Loop() {
			apply(b, next[i%2])
			i++
		}
	})
}

// udpDatagram sends one datagram from src (bound in the namespace at
// fromNS) to dst and reports whether a socket bound to dst in the
// namespace at toNS received it within a second.
func udpDatagram(fromNS, toNS, src, dst string) error {
	var rx, tx net.PacketConn
	if err := nl.Do(toNS, func() (err error) {
		rx, err = net.ListenPacket("udp4", dst)
		return err
	}); err != nil {
		return err
	}
	defer rx.Close()
	if err := nl.Do(fromNS, func() (err error) {
		tx, err = net.ListenPacket("udp4", src)
		return err
	}); err != nil {
		return err
	}
	defer tx.Close()
	to, err := net.ResolveUDPAddr("udp4", dst)
	if err != nil {
		return err
	}
	if _, err := tx.WriteTo([]byte("dhcp?"), to); err != nil {
		return err
	}
	_ = rx.SetReadDeadline(time.Now().Add(time.Second))
	buf := make([]byte, 64)
	_, _, err = rx.ReadFrom(buf)
	return err
}
