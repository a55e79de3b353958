package datapath

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"kvnet.io/kvnet/internal/nl"
	"kvnet.io/kvnet/internal/testenv/netiptest"
	"kvnet.io/kvnet/internal/testenv/nstest"
)

// layer3Net is network id on node i (0-based) of a Layer3 cluster where
// node k holds host subnet 10.100.k.0/24 and overlay address
// 100.88.0.(k+1); peers lists the other nodes (VTEPs by index).
func layer3Net(name string, id, i int, vteps []netip.Addr, peers []int) Network {
	overlay := func(k int) (netip.Prefix, net.HardwareAddr) {
		return netip.PrefixFrom(netip.AddrFrom4([4]byte{100, 88, 0, byte(k + 1)}), 16), net.HardwareAddr{0x0a, 0x58, 100, 88, 0, byte(k + 1)}
	}
	host := func(k int) netip.Prefix { return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 100, byte(k), 0}), 24) }
	own, mac := overlay(i)
	n := Network{Name: name, ID: id, Primary: true, Subnets: []netip.Prefix{host(i)}, Gateways: []netip.Addr{host(i).Addr().Next()},
		Layer3: &Layer3{ClusterSubnets: netiptest.MustPrefixes("10.100.0.0/16"), Addrs: []netip.Prefix{own}, MAC: mac}}
	for _, k := range peers {
		a, m := overlay(k)
		n.Layer3.Peers = append(n.Layer3.Peers, Layer3Peer{VTEP: vteps[k], Addrs: []netip.Addr{a.Addr()}, MAC: m, Subnets: []netip.Prefix{host(k)}})
	}
	return n
}

// TestLayer3: two tenants' Layer3 networks with the same cluster subnet on
// two nodes, each node with its own host subnet and the pods of both
// tenants holding the same addresses: pods reach their own tenant's pods
// on the other node by routing (no VXLAN port on the bridges), never the
// other tenant's; they egress through their node; a Service reaches
// endpoints on both nodes at its cluster IP and node port; a peer dropped
// from the state is unreachable and its route gone, and comes back when
// listed again.
func TestLayer3(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 2)
	vteps := []netip.Addr{c.nodes[0].ip, c.nodes[1].ip}
	netsOf := func(i int, peers ...int) []Network {
		return []Network{layer3Net("l3-a", 1, i, vteps, peers), layer3Net("l3-b", 2, i, vteps, peers)}
	}
	pods := map[string]*pod{
		"a1": c.addPod(c.nodes[0], "a1", "l3-a", nil, netiptest.MustPrefixes("10.100.0.5/24"), gatewayRoutes("10.100.0.1")),
		"b1": c.addPod(c.nodes[0], "b1", "l3-b", nil, netiptest.MustPrefixes("10.100.0.6/24"), gatewayRoutes("10.100.0.1")),
		"a2": c.addPod(c.nodes[1], "a2", "l3-a", nil, netiptest.MustPrefixes("10.100.1.5/24"), gatewayRoutes("10.100.1.1")),
		"b2": c.addPod(c.nodes[1], "b2", "l3-b", nil, netiptest.MustPrefixes("10.100.1.5/24"), gatewayRoutes("10.100.1.1")),
	}
	// apply applies s on node i with the node's pods as ports.
	apply := func(i int, s State) {
		t.Helper()
		for _, p := range c.pods {
			if p.node == c.nodes[i] {
				s.Ports = append(s.Ports, Port{Network: p.network, HostIfName: p.hostIf, MAC: p.mac, IPs: p.ips})
			}
		}
		if err := c.nodes[i].dp.Apply(context.Background(), s); err != nil {
			t.Fatalf("apply on %s: %v", c.nodes[i].name, err)
		}
	}
	apply(0, State{Networks: netsOf(0, 1)})
	apply(1, State{Networks: netsOf(1, 0)})
	for _, p := range pods {
		startEcho(t, p)
	}

	for _, r := range []struct {
		from string
		to   netip.Addr
		want string
	}{
		{"a1", addr("10.100.1.5"), "a2"}, // b2 holds 10.100.1.5 too
		{"b1", addr("10.100.1.5"), "b2"},
		{"a2", addr("10.100.0.5"), "a1"},
		{"b2", addr("10.100.0.6"), "b1"},
	} {
		if err := ping(pods[r.from].ns, netip.Addr{}, r.to, 3*time.Second, true); err != nil {
			t.Fatalf("%s to %s: %v", r.from, r.to, err)
		}
		if token, err := echoSession(pods[r.from], r.to, 3); err != nil || token != r.want {
			t.Fatalf("%s to %s: answered by %q (%v), want %q", r.from, r.to, token, err, r.want)
		}
	}
	// The other tenant's pod on the same node and host subnet: unreachable.
	if err := ping(pods["a1"].ns, netip.Addr{}, addr("10.100.0.6"), time.Second, true); err == nil {
		t.Error("a1 reached b1, a pod of another tenant")
	}
	// Routed, not bridged: no VXLAN device on the nodes' bridges.
	for _, nd := range c.nodes {
		if err := withHandle(nd.ns, func(h *nl.Handle) error {
			links, err := h.LinkList()
			if err != nil {
				return err
			}
			for _, l := range links {
				if l.Type() == "vxlan" || strings.HasPrefix(l.Attrs().Name, vxlanPrefix) {
					return fmt.Errorf("node namespace has VXLAN device %q", l.Attrs().Name)
				}
			}
			return nil
		}); err != nil {
			t.Fatalf("%s: %v", nd.name, err)
		}
	}

	// Egress through the pod's own node.
	ln := nstest.Listen(t, c.ext, netip.AddrPortFrom(internetIP, 8080).String())
	nstest.Serve(ln, func(conn net.Conn) {
		host, _, _ := net.SplitHostPort(conn.RemoteAddr().String())
		fmt.Fprintf(conn, "%s\n", host)
	})
	conn, err := nstest.Dial(pods["a2"].ns, netip.AddrPortFrom(internetIP, 8080).String(), 3*time.Second)
	if err != nil {
		t.Fatalf("a2 egress: %v", err)
	}
	buf := make([]byte, 64)
	_ = conn.SetDeadline(time.Now().Add(3 * time.Second))
	n, _ := conn.Read(buf)
	conn.Close()
	if got := strings.TrimSpace(string(buf[:n])); got != c.nodes[1].ip.String() {
		t.Errorf("a2's egress seen from %q, want its node's %s", got, c.nodes[1].ip)
	}

	// A Service of tenant A with one endpoint per node: reached from both
	// nodes, through the local router, answered by both endpoints (one
	// local, one over the overlay); tenant B's routers know no such
	// address.
	vip := netip.MustParseAddrPort("10.96.0.30:80")
	for i := range c.nodes {
		s := State{Networks: netsOf(i, 1-i)}
		setServicePort(&s.Networks[0], [2]byte{100, 65}, i) // the join subnet: the overlay holds the transit one
		s.Services = []Service{{Network: "l3-a", Name: "a/web:echo", Protocol: "TCP", VIP: vip, NodePort: 30090,
			Endpoints: []netip.AddrPort{netip.MustParseAddrPort("10.100.0.5:7"), netip.MustParseAddrPort("10.100.1.5:7")}}}
		apply(i, s)
	}
	for _, client := range []string{"a1", "a2"} {
		seen := map[string]int{}
		for range 16 {
			token, err := echoSessionTo(pods[client], vip, 1)
			if err != nil {
				t.Fatalf("%s to the service %s: %v", client, vip, err)
			}
			seen[token]++
		}
		if seen["a1"] == 0 || seen["a2"] == 0 || len(seen) != 2 {
			t.Errorf("%s's connections to %s were answered by %v, want a1 and a2 only", client, vip, seen)
		}
	}
	if token, err := echoSessionTo(pods["b1"], vip, 1); err == nil {
		t.Errorf("tenant B reached tenant A's Layer3 service: answered by %q", token)
	}
	// Its node port, from outside the cluster, on either node: the
	// endpoint on the other node answers over the overlay too.
	for _, nd := range c.nodes {
		at := netip.AddrPortFrom(nd.ip, 30090)
		seen := map[string]int{}
		for range 16 {
			token, err := echoFrom(c.ext, "outside", at, 1)
			if err != nil {
				t.Fatalf("outside to the node port %s: %v", at, err)
			}
			seen[token]++
		}
		if seen["a1"] == 0 || seen["a2"] == 0 || len(seen) != 2 {
			t.Errorf("connections to the node port %s were answered by %v, want a1 and a2 only", at, seen)
		}
	}

	// Node 2 leaves node 1's state: its subnet is no longer routed there.
	apply(0, State{Networks: netsOf(0)})
	if err := ping(pods["a1"].ns, netip.Addr{}, addr("10.100.1.5"), time.Second, true); err == nil {
		t.Error("a1 still reaches a2 after node 2 left its peers")
	}
	routes := func() (n int) {
		t.Helper()
		c.must(withHandle(nl.NSPath(RouterNSName(c.nodes[0].dp.cfg, 1)), func(h *nl.Handle) error {
			l, err := h.LinkByName(routerOverlayIf)
			if err != nil {
				return err
			}
			rs, err := h.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{LinkIndex: l.Attrs().Index}, netlink.RT_FILTER_OIF)
			for _, r := range rs {
				if r.Gw != nil {
					n++
				}
			}
			return err
		}))
		return n
	}
	if n := routes(); n != 0 {
		t.Errorf("%d routes via the overlay left after the peer went", n)
	}
	apply(0, State{Networks: netsOf(0, 1)})
	if n := routes(); n != 1 {
		t.Errorf("%d routes via the overlay, want 1", n)
	}
	if token, err := echoSession(pods["a1"], addr("10.100.1.5"), 2); err != nil || token != "a2" {
		t.Errorf("after the peer came back: %q, %v", token, err)
	}
}
