package datapath

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mdlayher/netlink"
	vnetlink "github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"kvnet.io/kvnet/internal/lab/simnet"
	"kvnet.io/kvnet/internal/nl"
	"kvnet.io/kvnet/internal/testenv/nstest"
)

// TestServices: on twoTenants' networks, a service of tenant A with
// endpoints a1 (node 1) and a2 (node 2) is reached by tenant A's pods at
// its virtual address, both endpoints answer over repeated connections,
// from the endpoint's own node and from the other one (and a1 reaches
// itself through it: hairpin); a service without endpoints refuses at
// once; tenant B, whose router has no such service, never reaches tenant
// A's endpoints through the address.
func TestServices(t *testing.T) {
	t.Parallel()
	c, pods, nets := twoTenants(t)
	ap := netip.MustParseAddrPort
	svcs := []Service{
		{Network: "tenant-a_udn", Name: "a/web:echo", Protocol: "TCP", VIP: ap("10.96.0.10:80"),
			Endpoints: []netip.AddrPort{ap("10.1.1.2:7"), ap("10.1.1.3:7")}},
		{Network: "tenant-a_udn", Name: "a/empty:echo", Protocol: "TCP", VIP: ap("10.96.0.11:80")},
	}
	apply := func() { t.Helper(); c.applyServices(nets, svcs) }
	apply()
	vip := ap("10.96.0.10:80")
	for _, client := range []string{"a1", "a2"} {
		seen := map[string]int{}
		for range 24 {
			token, err := echoSessionTo(pods[client], vip, 1)
			if err != nil {
				t.Fatalf("%s to %s: %v", client, vip, err)
			}
			seen[token]++
		}
		if seen["a1"] == 0 || seen["a2"] == 0 || len(seen) != 2 {
			t.Errorf("%s's 24 connections to %s were answered by %v, want both a1 and a2 and nobody else", client, vip, seen)
		}
	}
	// No endpoints: refused at once (TCP reset), not a timeout.
	start := time.Now()
	if _, err := nstest.Dial(pods["a1"].ns, "10.96.0.11:80", 3*time.Second); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("service without endpoints: %v, want connection refused", err)
	} else if time.Since(start) > time.Second {
		t.Errorf("refusal took %s", time.Since(start))
	}
	// Tenant B's router has no service there: tenant A's endpoints stay
	// out of its reach.
	if token, err := echoSessionTo(pods["b1"], vip, 1); err == nil {
		t.Errorf("tenant B reached tenant A's service: answered by %q", token)
	}
	// Endpoints change: only a2 left.
	svcs[0].Endpoints = svcs[0].Endpoints[1:]
	apply()
	for range 6 {
		if token, err := echoSessionTo(pods["a1"], vip, 1); err != nil || token != "a2" {
			t.Fatalf("after a1 left the service: %q, %v; want a2", token, err)
		}
	}
}

// TestServiceAffinity: a service with client affinity (sessionAffinity:
// ClientIP) over endpoints a1 and a2 sends every connection of one client
// to one endpoint, where a service without it over the same endpoints
// spreads them; a no-op Apply leaves the router's nftables alone (the
// affinity sets' elements stay); when the client's endpoint leaves, its
// connections go to the other one; the client affinity sets of a service
// that drops affinity are gone.
func TestServiceAffinity(t *testing.T) {
	t.Parallel()
	c, pods, nets := twoTenants(t)
	ap := netip.MustParseAddrPort
	eps := []netip.AddrPort{ap("10.1.1.2:7"), ap("10.1.1.3:7")}
	sticky, spread := ap("10.96.0.20:80"), ap("10.96.0.21:80")
	svcs := []Service{
		{Network: "tenant-a_udn", Name: "a/sticky:echo", Protocol: "TCP", VIP: sticky, Endpoints: eps, Affinity: 3 * time.Hour},
		{Network: "tenant-a_udn", Name: "a/spread:echo", Protocol: "TCP", VIP: spread, Endpoints: eps},
	}
	c.applyServices(nets, svcs)
	answers := func(client string, vip netip.AddrPort, n int) map[string]int {
		t.Helper()
		seen := map[string]int{}
		for range n {
			token, err := echoSessionTo(pods[client], vip, 1)
			if err != nil {
				t.Fatalf("%s to %s: %v", client, vip, err)
			}
			seen[token]++
		}
		return seen
	}
	// The positive control: without affinity both endpoints answer.
	if seen := answers("a1", spread, 24); len(seen) != 2 {
		t.Fatalf("a1's 24 connections to %s (no affinity) were answered by %v, want a1 and a2", spread, seen)
	}
	first := answers("a1", sticky, 1)
	var pinned string
	for token := range first {
		pinned = token
	}
	if seen := answers("a1", sticky, 24); len(seen) != 1 || seen[pinned] != 24 {
		t.Fatalf("a1's 24 connections to %s (client affinity) were answered by %v, want %s only", sticky, seen, pinned)
	}
	nd := c.nodes[0] // a1's node
	gen := routerGenID(t, nd.dp, nets[0].ID)
	c.applyServices(nets, svcs)
	if g := routerGenID(t, nd.dp, nets[0].ID); g != gen {
		t.Errorf("a no-op Apply committed to the router's nftables: generation %d, was %d", g, gen)
	}
	if seen := answers("a1", sticky, 6); len(seen) != 1 || seen[pinned] != 6 {
		t.Errorf("after a no-op Apply a1's connections to %s were answered by %v, want %s only", sticky, seen, pinned)
	}
	// A new timeout: the client starts afresh, and is kept again.
	svcs[0].Affinity = time.Hour
	c.applyServices(nets, svcs)
	if seen := answers("a1", sticky, 12); len(seen) != 1 {
		t.Fatalf("after the timeout changed, a1's connections to %s were answered by %v, want one endpoint", sticky, seen)
	} else {
		for token := range seen {
			pinned = token
		}
	}
	// The pinned endpoint leaves: the other one takes the client.
	other := map[string]string{"a1": "a2", "a2": "a1"}[pinned]
	addrOf := map[string]netip.Addr{"a1": eps[0].Addr(), "a2": eps[1].Addr()}
	left := slices.DeleteFunc(slices.Clone(eps), func(ep netip.AddrPort) bool { return ep.Addr() == addrOf[pinned] })
	svcs[0].Endpoints = left
	c.applyServices(nets, svcs)
	if seen := answers("a1", sticky, 6); len(seen) != 1 || seen[other] != 6 {
		t.Errorf("after %s left, a1's connections to %s were answered by %v, want %s only", pinned, sticky, seen, other)
	}
	// Affinity dropped: no client affinity set is left in the router.
	svcs[0].Endpoints, svcs[0].Affinity = eps, 0
	c.applyServices(nets, svcs)
	if sets := routerSetNames(t, nd.dp, nets[0].ID); slices.ContainsFunc(sets, func(n string) bool { return strings.HasPrefix(n, affinitySetPrefix) }) {
		t.Errorf("client affinity sets left after the service dropped affinity: %v", sets)
	}
	if seen := answers("a1", sticky, 24); len(seen) != 2 {
		t.Errorf("a1's 24 connections to %s after it dropped affinity were answered by %v, want a1 and a2", sticky, seen)
	}
}

// transit16 is the /16 of the default transit subnet, 100.88.0.0/16.
var transit16 = [2]byte{100, 88}

// setServicePort gives n the service address of node index i: the
// (i+1)-th address of the /16 base.0.0 and the MAC 0a:58 + its bytes, as
// kvnet-node derives them from node IDs.
func setServicePort(n *Network, base [2]byte, i int) {
	n.ServiceAddrs = []netip.Prefix{netip.PrefixFrom(netip.AddrFrom4([4]byte{base[0], base[1], 0, byte(i + 1)}), 16)}
	n.ServiceMAC = net.HardwareAddr{0x0a, 0x58, base[0], base[1], 0, byte(i + 1)}
}

// applyServices applies on every node its state for nets with the
// services svcs, each node's routers with their own service address and
// MAC in their network's transit subnet.
func (c *cluster) applyServices(nets []Network, svcs []Service) {
	c.tb.Helper()
	c.applyNodeServices(nets, func(*node) []Service { return svcs })
}

// applyNodeServices is applyServices with each node's own services,
// svcs(node).
func (c *cluster) applyNodeServices(nets []Network, svcs func(*node) []Service) {
	c.tb.Helper()
	for i, nd := range c.nodes {
		s := c.state(nd, nets)
		for j := range s.Networks {
			setServicePort(&s.Networks[j], transit16, i)
		}
		for _, other := range c.nodes {
			s.NodeAddrs = append(s.NodeAddrs, other.ip)
		}
		s.Services = svcs(nd)
		if err := nd.dp.Apply(context.Background(), s); err != nil {
			c.tb.Fatalf("apply %d services on %s: %v", len(s.Services), nd.name, err)
		}
	}
}

// TestManyServices: a router with 400 Services (a map of 400 elements and
// 400 chains of 3 endpoint rules, in one nftables transaction) is
// programmed, and its last Service answers. With the default netlink
// buffers Apply failed from some 30 Services on.
func TestManyServices(t *testing.T) {
	t.Parallel()
	c, pods, nets := twoTenants(t)
	ap := netip.MustParseAddrPort
	var svcs []Service
	for i := range 400 {
		svcs = append(svcs, Service{Network: "tenant-a_udn", Name: fmt.Sprintf("a/svc-%d:echo", i), Protocol: "TCP",
			VIP:       netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 96, byte(1 + i/250), byte(1 + i%250)}), 80),
			Endpoints: []netip.AddrPort{ap("10.1.1.2:7"), ap("10.1.1.3:7"), ap("10.1.1.3:7")}})
	}
	c.applyServices(nets, svcs)
	last := svcs[len(svcs)-1].VIP
	if token, err := echoSessionTo(pods["a1"], last, 1); err != nil || (token != "a1" && token != "a2") {
		t.Fatalf("a1 to the 400th service %s: %q, %v", last, token, err)
	}
}

// TestServicesIncremental: Apply rewrites only what changed in a router's
// service rules. With 20 services of 3 endpoints and one without any,
// applying the same state again commits no nftables transaction at all
// (the router's ruleset generation stays), and replacing one endpoint of
// one service rewrites that service's chain only: every other rule, the
// dispatch rules and the other services' chains included, keeps its
// handle. Adding a service adds its chain (and map element) and removing
// it removes them, without rewriting any other chain.
func TestServicesIncremental(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 1)
	nd := c.nodes[0]
	n := primaryNet("svc-inc_udn", 1, "10.1.0.0/16", "10.1.0.1")
	setServicePort(&n, transit16, 0)
	s := c.state(nd, []Network{n})
	for i := range 20 {
		sv := Service{Network: n.Name, Name: fmt.Sprintf("inc/svc%d:http", i), Protocol: "TCP",
			VIP: netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 96, 0, byte(i + 1)}), 80)}
		for e := range 3 {
			sv.Endpoints = append(sv.Endpoints, netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 1, byte(i), byte(e + 2)}), 8080))
		}
		s.Services = append(s.Services, sv)
	}
	s.Services = append(s.Services, Service{Network: n.Name, Name: "inc/empty:dns", Protocol: "UDP",
		VIP: netip.MustParseAddrPort("10.96.1.1:53")})
	apply := func(s State) map[string][]string {
		t.Helper()
		if err := nd.dp.Apply(context.Background(), s); err != nil {
			t.Fatal(err)
		}
		return routerRulesByChain(t, nd.dp, n.ID)
	}
	before := apply(s)
	if len(before) < 20 {
		t.Fatalf("router has %d chains with rules, want a chain per service: %v", len(before), before)
	}
	gen := routerGenID(t, nd.dp, n.ID)
	if again := apply(s); !maps.EqualFunc(again, before, slices.Equal) {
		t.Fatalf("a no-op Apply rewrote rules:\n--- after\n%v\n--- before\n%v", again, before)
	}
	if g := routerGenID(t, nd.dp, n.ID); g != gen {
		t.Errorf("a no-op Apply committed to the router's nftables: generation %d, was %d", g, gen)
	}

	changed := s
	changed.Services = slices.Clone(s.Services)
	sv := &changed.Services[7]
	sv.Endpoints = slices.Clone(sv.Endpoints)
	sv.Endpoints[1] = netip.MustParseAddrPort("10.1.200.1:8080")
	touched := serviceChainName(*sv)
	after := apply(changed)
	if g := routerGenID(t, nd.dp, n.ID); g == gen {
		t.Errorf("an endpoint change committed nothing (generation %d)", g)
	}
	if !maps.Equal(keySet(after), keySet(before)) {
		t.Fatalf("chains changed: %v, were %v", slices.Sorted(maps.Keys(after)), slices.Sorted(maps.Keys(before)))
	}
	for chain, rules := range before {
		switch {
		case chain != touched && !slices.Equal(after[chain], rules):
			t.Errorf("chain %s rewritten by a change of another service's endpoints:\n%v\nwas\n%v", chain, after[chain], rules)
		case chain == touched && (len(after[chain]) != 3 || slices.ContainsFunc(after[chain], func(r string) bool { return slices.Contains(rules, r) })):
			t.Errorf("chain %s of the changed service not rewritten: %v, was %v", chain, after[chain], rules)
		}
	}

	// One service more, then one less: its chain comes and goes, no
	// other chain is rewritten.
	added := changed
	added.Services = append(slices.Clone(changed.Services), Service{Network: n.Name, Name: "inc/new:http", Protocol: "TCP",
		VIP: netip.MustParseAddrPort("10.96.2.1:80"), Endpoints: []netip.AddrPort{netip.MustParseAddrPort("10.1.201.1:8080")}})
	newChain := serviceChainName(added.Services[len(added.Services)-1])
	withNew := apply(added)
	if len(withNew[newChain]) != 1 {
		t.Errorf("added service's chain %s: %v", newChain, withNew[newChain])
	}
	delete(withNew, newChain)
	if !maps.EqualFunc(withNew, after, slices.Equal) {
		t.Errorf("adding a service rewrote other chains:\n--- after\n%v\n--- before\n%v", withNew, after)
	}
	if removed := apply(changed); !maps.EqualFunc(removed, after, slices.Equal) {
		t.Errorf("removing a service rewrote other chains or left its own:\n--- after\n%v\n--- before\n%v", removed, after)
	}
}

// routerGenID returns the nftables ruleset generation of network id's
// router, which each committed transaction advances (NFT_MSG_GETGEN).
func routerGenID(t *testing.T, dp *Datapath, id int) uint32 {
	t.Helper()
	return nsGenID(t, nl.NSPath(RouterNSName(dp.cfg, id)))
}

// nsGenID returns the nftables generation of the namespace at path,
// which every committed transaction increments.
func nsGenID(t *testing.T, path string) uint32 {
	t.Helper()
	var gen uint32
	if err := withNS(path, func(fd int) error {
		conn, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: fd})
		if err != nil {
			return err
		}
		defer conn.Close()
		msgs, err := conn.Execute(netlink.Message{
			Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETGEN), Flags: netlink.Request},
			Data:   []byte{unix.AF_UNSPEC, unix.NFNETLINK_V0, 0, 0}, // nfgenmsg
		})
		if err != nil {
			return fmt.Errorf("NFT_MSG_GETGEN: %w", err)
		}
		if len(msgs) != 1 || len(msgs[0].Data) < 4 {
			return fmt.Errorf("NFT_MSG_GETGEN: %d replies", len(msgs))
		}
		ad, err := netlink.NewAttributeDecoder(msgs[0].Data[4:])
		if err != nil {
			return err
		}
		ad.ByteOrder = binary.BigEndian
		for ad.Next() {
			if ad.Type() == unix.NFTA_GEN_ID {
				gen = ad.Uint32()
				return nil
			}
		}
		return fmt.Errorf("NFT_MSG_GETGEN: no generation ID (%v)", ad.Err())
	}); err != nil {
		t.Fatal(err)
	}
	return gen
}

// routerSetNames returns the names of the named sets and maps of
// network id's router.
func routerSetNames(t *testing.T, dp *Datapath, id int) []string {
	t.Helper()
	var names []string
	if err := withNS(nl.NSPath(RouterNSName(dp.cfg, id)), func(fd int) error {
		conn, err := nftConn(fd)
		if err != nil {
			return err
		}
		tables, err := conn.ListTables()
		if err != nil {
			return err
		}
		for _, tb := range tables {
			if tb.Name != tableName {
				continue
			}
			sets, err := conn.GetSets(tb)
			if err != nil {
				return err
			}
			for _, s := range sets {
				names = append(names, s.Name)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return names
}

// routerRulesByChain returns the kvnet rules of network id's router, each
// as its handle and comment, by chain.
func routerRulesByChain(t *testing.T, dp *Datapath, id int) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for line := range strings.Lines(routerRuleDump(t, dp, id)) {
		fields := strings.SplitN(strings.TrimSpace(line), " ", 3) // family chain #handle comment
		if len(fields) != 3 {
			t.Fatalf("rule dump line %q", line)
		}
		out[fields[1]] = append(out[fields[1]], fields[2])
	}
	return out
}

func keySet[V any](m map[string]V) map[string]bool {
	out := map[string]bool{}
	for k := range m {
		out[k] = true
	}
	return out
}

// TestNodePorts: tenant A's service with endpoints a1 (node 1) and a2
// (node 2) is reached at its node port on any node's address, from that
// node itself, from another node and from outside the cluster, and at its
// load balancer address (routed by the external network to node 2, as a
// load balancer implementation announces it), each time answered by both
// endpoints; a node port without endpoints refuses; tenant B's node port
// leads to tenant B's pod only; neither tenant's pods reach the other's
// service through a node port, at any node's address; a node port taken
// away is closed.
func TestNodePorts(t *testing.T) {
	t.Parallel()
	c, pods, nets := twoTenants(t)
	ap := netip.MustParseAddrPort
	lb := addr("198.51.100.10")
	svcs := []Service{
		{Network: "tenant-a_udn", Name: "a/web:echo", Protocol: "TCP", VIP: ap("10.96.0.10:80"), NodePort: 30080,
			External: []netip.Addr{lb}, Endpoints: []netip.AddrPort{ap("10.1.1.2:7"), ap("10.1.1.3:7")}},
		{Network: "tenant-a_udn", Name: "a/empty:echo", Protocol: "TCP", VIP: ap("10.96.0.11:80"), NodePort: 30081},
		{Network: "tenant-b_udn", Name: "b/web:echo", Protocol: "TCP", VIP: ap("10.96.0.20:80"), NodePort: 30082,
			Endpoints: []netip.AddrPort{ap("10.1.1.2:7")}}, // b2, on node 3
	}
	c.applyServices(nets, svcs)
	n1, n2, n3 := c.nodes[0], c.nodes[1], c.nodes[2]
	// The external network sends the load balancer address to node 2.
	c.must(withHandle(c.ext, func(h *nl.Handle) error {
		return h.RouteAdd(&vnetlink.Route{Dst: ipNet(hostPrefix(lb)), Gw: net.IP(n2.ip.AsSlice())})
	}))
	clients := []struct {
		what, ns string
		dst      netip.AddrPort
	}{
		{"node 1 to its own address", n1.ns, netip.AddrPortFrom(n1.ip, 30080)},
		{"node 2 to node 1", n2.ns, netip.AddrPortFrom(n1.ip, 30080)},
		{"outside to node 3", c.ext, netip.AddrPortFrom(n3.ip, 30080)},
		{"outside to the load balancer address", c.ext, netip.AddrPortFrom(lb, 80)},
	}
	for _, cl := range clients {
		seen := map[string]int{}
		for range 16 {
			token, err := echoFrom(cl.ns, cl.what, cl.dst, 1)
			if err != nil {
				t.Fatalf("%s (%s): %v", cl.what, cl.dst, err)
			}
			seen[token]++
		}
		if seen["a1"] == 0 || seen["a2"] == 0 || len(seen) != 2 {
			t.Errorf("%s (%s): 16 connections answered by %v, want both a1 and a2 and nobody else", cl.what, cl.dst, seen)
		}
	}
	// No endpoints: refused at once.
	if _, err := nstest.Dial(n2.ns, netip.AddrPortFrom(n1.ip, 30081).String(), 3*time.Second); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("node port without endpoints: %v, want connection refused", err)
	}
	// Tenant B's node port: tenant B's pod, on another node.
	if token, err := echoFrom(n1.ns, "node 1", netip.AddrPortFrom(n1.ip, 30082), 1); err != nil || token != "b2" {
		t.Errorf("node 1 to tenant B's node port: %q, %v; want b2", token, err)
	}
	// Pods never cross to the other tenant through a node port, at their
	// own node's address or another's.
	for _, x := range []struct {
		pod  string
		at   netip.Addr
		port uint16
	}{{"b1", n1.ip, 30080}, {"a1", n1.ip, 30082}, {"b1", n2.ip, 30080}, {"a1", n3.ip, 30082}, {"b3", n1.ip, 30080}} {
		if token, err := echoSessionTo(pods[x.pod], netip.AddrPortFrom(x.at, x.port), 1); err == nil {
			t.Errorf("%s reached the other tenant's node port %s:%d: answered by %q", x.pod, x.at, x.port, token)
		}
	}
	// The node port and address go: closed.
	svcs[0].NodePort, svcs[0].External = 0, nil
	c.applyServices(nets, svcs)
	for _, cl := range clients[:3] {
		if token, err := echoFrom(cl.ns, cl.what, cl.dst, 1); err == nil {
			t.Errorf("%s (%s) after the node port went: answered by %q", cl.what, cl.dst, token)
		}
	}
	// The cluster IP is unchanged.
	if token, err := echoSessionTo(pods["a1"], ap("10.96.0.10:80"), 1); err != nil || (token != "a1" && token != "a2") {
		t.Errorf("a1 to the cluster IP after the node port went: %q, %v", token, err)
	}
}

// TestNodePortsLocal: tenant A's NodePort service over a1 (node 1) and
// a2 (node 2) with externalTrafficPolicy Local is answered at node 1's
// address by a1 only and at node 2's by a2 only, each seeing the client's
// own address; node 3, without a local endpoint, drops the connection
// (no answer, no refusal). The control, the same service with policy
// Cluster: node 1 answers from both endpoints, which see the router's
// address instead of the client's. The cluster IP keeps both endpoints.
func TestNodePortsLocal(t *testing.T) {
	t.Parallel()
	c, pods, nets := twoTenants(t)
	for _, name := range []string{"a1", "a2"} {
		startWhoami(t, pods[name])
	}
	ap := netip.MustParseAddrPort
	eps := []netip.AddrPort{ap("10.1.1.2:8"), ap("10.1.1.3:8")} // a1, a2's whoami
	svc := Service{Network: "tenant-a_udn", Name: "a/web:whoami", Protocol: "TCP", VIP: ap("10.96.0.30:80"), NodePort: 30090, Endpoints: eps}
	n1, n2, n3 := c.nodes[0], c.nodes[1], c.nodes[2]
	ask := func(at netip.Addr) (who string, seen, client netip.Addr, err error) {
		return whoamiFrom(c.ext, netip.AddrPortFrom(at, 30090))
	}

	// The control: policy Cluster.
	c.applyServices(nets, []Service{svc})
	answered := map[string]bool{}
	for range 16 {
		who, seen, client, err := ask(n1.ip)
		if err != nil {
			t.Fatalf("control, outside to node 1's node port: %v", err)
		}
		answered[who] = true
		if seen == client {
			t.Fatalf("control (policy Cluster): %s saw the client's own address %s, want the router's", who, seen)
		}
	}
	if !answered["a1"] || !answered["a2"] {
		t.Fatalf("control (policy Cluster): node 1's node port answered by %v, want a1 and a2", answered)
	}

	// Policy Local: each node's state has its own local endpoints.
	local := map[*node][]netip.AddrPort{n1: eps[:1], n2: eps[1:]}
	c.applyNodeServices(nets, func(nd *node) []Service {
		sv := svc
		sv.ExternalLocal, sv.LocalEndpoints = true, local[nd]
		return []Service{sv}
	})
	for _, x := range []struct {
		nd   *node
		want string
	}{{n1, "a1"}, {n2, "a2"}} {
		for range 8 {
			who, seen, client, err := ask(x.nd.ip)
			if err != nil {
				t.Fatalf("outside to %s's node port (policy Local): %v", x.nd.name, err)
			}
			if who != x.want || seen != client {
				t.Fatalf("outside to %s's node port (policy Local): answered by %s seeing %s, want %s seeing the client's %s", x.nd.name, who, seen, x.want, client)
			}
		}
	}
	if who, _, _, err := ask(n3.ip); err == nil {
		t.Errorf("node 3, without a local endpoint, answered its node port (policy Local): by %s", who)
	} else if errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("node 3, without a local endpoint: %v, want the connection dropped as kube-proxy drops it", err)
	}
	// The cluster IP is not affected by the policy.
	seen := map[string]bool{}
	for range 16 {
		who, _, _, err := whoamiFrom(pods["a1"].ns, ap("10.96.0.30:80"))
		if err != nil {
			t.Fatalf("a1 to the cluster IP: %v", err)
		}
		seen[who] = true
	}
	if !seen["a1"] || !seen["a2"] {
		t.Errorf("cluster IP under policy Local answered by %v, want a1 and a2", seen)
	}
}

// whoamiPort is where startWhoami serves.
const whoamiPort = 8

// startWhoami serves, at whoamiPort in p, one line per connection: p's
// name and the client's address as p sees it.
func startWhoami(tb testing.TB, p *pod) {
	ln := nstest.Listen(tb, p.ns, fmt.Sprintf(":%d", whoamiPort))
	nstest.Serve(ln, func(conn net.Conn) {
		host, _, _ := net.SplitHostPort(conn.RemoteAddr().String())
		fmt.Fprintf(conn, "%s %s\n", p.name, host)
	})
}

// whoamiFrom connects from the namespace at ns to a whoami server at dst
// and returns who answered, the client address it saw, and the client's
// own address.
func whoamiFrom(ns string, dst netip.AddrPort) (who string, seen, client netip.Addr, err error) {
	conn, err := nstest.Dial(ns, dst.String(), 2*time.Second)
	if err != nil {
		return "", seen, client, err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(3 * time.Second))
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return "", seen, client, fmt.Errorf("read whoami: %w", err)
	}
	name, addr, ok := strings.Cut(strings.TrimSpace(line), " ")
	if seen, err = netip.ParseAddr(addr); !ok || err != nil {
		return "", seen, client, fmt.Errorf("whoami line %q", line)
	}
	local, err := netip.ParseAddrPort(conn.LocalAddr().String())
	if err != nil {
		return "", seen, client, err
	}
	return name, seen.Unmap(), local.Addr().Unmap(), nil
}

// TestServicesViaNode: tenant A's pods reach a service of the cluster
// default network (the cluster DNS, here two UDP endpoints outside the
// cluster) at its cluster IP through their router and node, from either
// node, answered by both endpoints; tenant B's router has no such service
// and its pods get no answer there.
func TestServicesViaNode(t *testing.T) {
	t.Parallel()
	c, pods, nets := twoTenants(t)
	ep1 := netip.AddrPortFrom(simnet.ExternalIP, 5353)
	ep2 := netip.AddrPortFrom(simnet.InternetIP, 5353)
	startUDPAnswer(t, c.ext, ep1.String(), "ep1")
	startUDPAnswer(t, c.ext, ep2.String(), "ep2")
	vip := netip.MustParseAddrPort("10.96.0.10:53")
	c.applyServices(nets, []Service{{Network: "tenant-a_udn", Name: "kube-system/kube-dns:dns", Protocol: "UDP", VIP: vip,
		ViaNode: true, Endpoints: []netip.AddrPort{ep1, ep2}}})
	for _, client := range []string{"a1", "a2"} {
		seen := map[string]int{}
		for range 16 {
			answer, err := queryDNS(pods[client].ns, vip.String())
			if err != nil {
				t.Fatalf("%s to %s: %v", client, vip, err)
			}
			seen[answer]++
		}
		if seen["ep1"] == 0 || seen["ep2"] == 0 || len(seen) != 2 {
			t.Errorf("%s's 16 queries to %s were answered by %v, want both endpoints", client, vip, seen)
		}
	}
	if answer, err := queryDNS(pods["b1"].ns, vip.String()); err == nil {
		t.Errorf("tenant B, without the service, got an answer at %s: %q", vip, answer)
	}
}

// TestServiceCIDRs: the node's default route leads to a Service range
// (the external namespace answers at 10.96.0.99, as a node's service proxy
// would lead to another tenant's Service). Tenant A, without the range in
// its state, reaches it (the control); tenant B, with it, is refused at its
// router, yet still reaches its own service through the node inside the
// range and the internet outside it.
func TestServiceCIDRs(t *testing.T) {
	t.Parallel()
	c, pods, nets := twoTenants(t)
	leak := netip.AddrPortFrom(netip.MustParseAddr("10.96.0.99"), 53)
	c.must(withHandle(c.ext, func(h *nl.Handle) error {
		lo, err := h.LinkByName("lo")
		if err != nil {
			return err
		}
		return h.AddrAdd(lo, &vnetlink.Addr{IPNet: ipNet(hostPrefix(leak.Addr()))})
	}))
	startUDPAnswer(t, c.ext, leak.String(), "leaked")
	ep := netip.AddrPortFrom(simnet.InternetIP, 5353)
	startUDPAnswer(t, c.ext, ep.String(), "dns")
	dns := netip.MustParseAddrPort("10.96.0.10:53")
	nets[1].ServiceCIDRs = []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16")}
	c.applyServices(nets, []Service{{Network: "tenant-b_udn", Name: "kube-system/kube-dns:dns", Protocol: "UDP", VIP: dns,
		ViaNode: true, Endpoints: []netip.AddrPort{ep}}})
	if answer, err := queryDNS(pods["a1"].ns, leak.String()); err != nil || answer != "leaked" {
		t.Fatalf("control: tenant A, without service CIDRs, to %s: %q, %v", leak, answer, err)
	}
	for _, p := range []string{"b1", "b2"} {
		if answer, err := queryDNS(pods[p].ns, leak.String()); err == nil {
			t.Errorf("%s reached %s in the service CIDR: %q", p, leak, answer)
		}
		if answer, err := queryDNS(pods[p].ns, dns.String()); err != nil || answer != "dns" {
			t.Errorf("%s to its cluster DNS %s: %q, %v", p, dns, answer, err)
		}
		if err := ping(pods[p].ns, pods[p].ips[0].Addr(), internetIP, 2*time.Second, true); err != nil {
			t.Errorf("%s to the internet: %v", p, err)
		}
	}
}

// TestDefaultNetworkSubnets: the node routes to a default-network pod (the
// external namespace answers at 10.244.9.9, as another node's pod would
// be reached through the node), and a tenant pod whose eth0 has no route
// there (a /32 layout) sends to it through its router. Tenant A, without
// the default network's subnets in its state, reaches it (the control);
// tenant B, with them, is refused at its router, yet still reaches its
// cluster DNS through the node, whose endpoint is such a pod, and the
// internet.
func TestDefaultNetworkSubnets(t *testing.T) {
	t.Parallel()
	c, pods, nets := twoTenants(t)
	podAddr := netip.AddrPortFrom(netip.MustParseAddr("10.244.9.9"), 53)
	dnsEP := netip.AddrPortFrom(netip.MustParseAddr("10.244.9.53"), 53)
	c.must(withHandle(c.ext, func(h *nl.Handle) error {
		lo, err := h.LinkByName("lo")
		if err != nil {
			return err
		}
		for _, a := range []netip.Addr{podAddr.Addr(), dnsEP.Addr()} {
			if err := h.AddrAdd(lo, &vnetlink.Addr{IPNet: ipNet(hostPrefix(a))}); err != nil {
				return err
			}
		}
		return nil
	}))
	startUDPAnswer(t, c.ext, podAddr.String(), "default-network pod")
	startUDPAnswer(t, c.ext, dnsEP.String(), "dns")
	dns := netip.MustParseAddrPort("10.96.0.10:53")
	nets[1].DefaultNetworkSubnets = []netip.Prefix{netip.MustParsePrefix("10.244.9.0/24")}
	c.applyServices(nets, []Service{{Network: "tenant-b_udn", Name: "kube-system/kube-dns:dns", Protocol: "UDP", VIP: dns,
		ViaNode: true, Endpoints: []netip.AddrPort{dnsEP}}})
	if answer, err := queryDNS(pods["a1"].ns, podAddr.String()); err != nil || answer != "default-network pod" {
		t.Fatalf("control: tenant A, without the default network's subnets, to %s: %q, %v", podAddr, answer, err)
	}
	for _, p := range []string{"b1", "b2"} {
		if answer, err := queryDNS(pods[p].ns, podAddr.String()); err == nil {
			t.Errorf("%s reached the default network's pod %s: %q", p, podAddr, answer)
		}
		if answer, err := queryDNS(pods[p].ns, dns.String()); err != nil || answer != "dns" {
			t.Errorf("%s to its cluster DNS %s (endpoint %s): %q, %v", p, dns, dnsEP, answer, err)
		}
		if err := ping(pods[p].ns, pods[p].ips[0].Addr(), internetIP, 2*time.Second, true); err != nil {
			t.Errorf("%s to the internet: %v", p, err)
		}
	}
}
