package datapath

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"kvnet.io/kvnet/internal/nl"
	"kvnet.io/kvnet/internal/testenv"
	"kvnet.io/kvnet/internal/testenv/netiptest"
)

// migrationState is node nd's State while VM x (MAC shared by src on one
// node and dst on another) migrates: both its ports are Migrating, dst's
// on Standby until activated, and nodes holding neither know the MAC at
// src's node, as a dynamic entry.
func (c *cluster) migrationState(nd *node, nets []Network, src, dst *pod, activated bool) State {
	s := c.state(nd, nets)
	mac := src.mac.String()
	var remotes []RemoteMAC
	for _, m := range s.RemoteMACs {
		if m.MAC.String() != mac {
			remotes = append(remotes, m)
		}
	}
	s.RemoteMACs = remotes
	for i := range s.Ports {
		if s.Ports[i].MAC.String() == mac {
			s.Ports[i].Migrating = true
			s.Ports[i].Standby = nd == dst.node && !activated
		}
	}
	if nd != src.node && nd != dst.node {
		s.RemoteMACs = append(s.RemoteMACs, RemoteMAC{Network: src.network, MAC: src.mac, VTEP: src.node.ip, Migrating: true})
	}
	return s
}

// While a VM migrates, the nodes follow its MAC to the target with the
// guest's first frame from there (QEMU's announce), with no Apply: a pod
// on a third node and one on the source node then reach the target.
// Converging to the post-migration State keeps it there, with a
// permanent entry again.
func TestMigratingMACFollowsFirstFrame(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 3)
	rt := gatewayRoutes("10.1.1.1")
	y := c.addPod(c.nodes[0], "y", "tenant-a_udn", nil, netiptest.MustPrefixes("10.1.1.2/24"), rt)
	x := c.addPod(c.nodes[1], "x", "tenant-a_udn", nil, netiptest.MustPrefixes("10.1.1.3/24"), rt)
	z := c.addPod(c.nodes[1], "z", "tenant-a_udn", nil, netiptest.MustPrefixes("10.1.1.4/24"), rt)
	nets := []Network{tenantA}
	c.applyAll(nets)
	startEcho(t, x)
	xIP := addr("10.1.1.3")
	if token, err := echoSession(y, xIP, 1); err != nil || token != "x" {
		t.Fatalf("before the migration: answered by %q (%v), want x", token, err)
	}

	// The migration starts: the target pod x2 (same MAC and IP) on n3;
	// both ports are Migrating, x2's on Standby.
	x2 := c.addPod(c.nodes[2], "x2", "tenant-a_udn", x.mac, x.ips, rt)
	startEcho(t, x2)
	for _, nd := range c.nodes {
		if err := nd.dp.Apply(context.Background(), c.migrationState(nd, nets, x, x2, false)); err != nil {
			t.Fatalf("apply on %s: %v", nd.name, err)
		}
	}
	// What the target pod's own stack sends with the guest's MAC and IP
	// is not taken for the guest: the guest still runs on the source.
	bcast := net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	if err := sendRawFrame(x2, udpFrame(x.mac, bcast, xIP, addr("10.1.1.255"), 9, 9, []byte("not the guest"))); err != nil {
		t.Fatal(err)
	}
	for _, from := range []*pod{y, z} {
		if token, err := echoSession(from, xIP, 1); err != nil || token != "x" {
			t.Fatalf("during the migration, from %s: answered by %q (%v), want x", from.name, token, err)
		}
	}

	// The switch-over: the source pauses (its link goes down), the guest
	// announces itself from the target (RARP, as QEMU does), and only the
	// target node takes its port off Standby, as its kvnet-node does on
	// seeing the announce. No other node applies anything.
	if err := podLink(x, func(h *nl.Handle, l netlink.Link) error { return h.LinkSetDown(l) }); err != nil {
		t.Fatal(err)
	}
	if err := sendRawFrame(x2, rarpFrame(x.mac)); err != nil {
		t.Fatal(err)
	}
	if err := c.nodes[2].dp.Apply(context.Background(), c.migrationState(c.nodes[2], nets, x, x2, true)); err != nil {
		t.Fatal(err)
	}
	for _, from := range []*pod{y, z} {
		token, err := echoSession(from, xIP, 1)
		if err != nil || token != "x2" {
			t.Fatalf("after the target's announce, from %s (%s): answered by %q (%v), want x2", from.name, from.node.name, token, err)
		}
	}

	// Converge: x is gone, x2 is an ordinary port; n1 has a permanent
	// entry to n3 again.
	if err := nl.Do(x.node.ns, func() error { return TeardownPodInterface(x.hostIf) }); err != nil {
		t.Fatal(err)
	}
	x.node = nil
	c.applyAll(nets)
	if token, err := echoSession(y, xIP, 1); err != nil || token != "x2" {
		t.Fatalf("after converging: answered by %q (%v), want x2", token, err)
	}
	if err := withHandle(c.nodes[0].ns, func(h *nl.Handle) error {
		entries, err := vxlanFDB(h, 1)
		if err != nil {
			return err
		}
		for _, e := range entries {
			if isSelf(e) && e.HardwareAddr.String() == x.mac.String() {
				if e.IP.String() != c.nodes[2].ip.String() || e.State&netlink.NUD_PERMANENT == 0 {
					return fmt.Errorf("n1's entry for %s: %s state %#x, want permanent to %s", x.mac, e.IP, e.State, c.nodes[2].ip)
				}
				return nil
			}
		}
		return fmt.Errorf("n1 has no entry for %s", x.mac)
	}); err != nil {
		t.Fatal(err)
	}
}

// rarpFrame is QEMU's self-announce for mac: a broadcast RARP request
// (reverse request, sender and target hardware address mac).
func rarpFrame(mac net.HardwareAddr) []byte {
	f := append(append(append([]byte{}, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff), mac...), 0x80, 0x35)
	f = append(f, 0, 1, 0x08, 0, 6, 4, 0, 3)
	f = append(append(f, mac...), 0, 0, 0, 0)
	f = append(append(f, mac...), 0, 0, 0, 0)
	return append(f, make([]byte, 18)...) // pad to the Ethernet minimum
}

// Activate opens a migration target's Standby port by itself, with no
// Apply: the guest's announce is all a node needs to deliver to the target.
// An Apply of a state planned before the announce (the port still on
// Standby) keeps it open; once a plan has caught up, a later migration to
// a port of the same name starts on Standby again.
func TestActivateOpensStandbyPort(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 3)
	rt := gatewayRoutes("10.1.1.1")
	y := c.addPod(c.nodes[0], "y", "tenant-a_udn", nil, netiptest.MustPrefixes("10.1.1.2/24"), rt)
	x := c.addPod(c.nodes[1], "x", "tenant-a_udn", nil, netiptest.MustPrefixes("10.1.1.3/24"), rt)
	nets := []Network{tenantA}
	c.applyAll(nets)
	xIP := addr("10.1.1.3")
	x2 := c.addPod(c.nodes[2], "x2", "tenant-a_udn", x.mac, x.ips, rt)
	startEcho(t, x2)
	standby := func() State { return c.migrationState(c.nodes[2], nets, x, x2, false) }
	for _, nd := range c.nodes {
		if err := nd.dp.Apply(context.Background(), c.migrationState(nd, nets, x, x2, false)); err != nil {
			t.Fatalf("apply on %s: %v", nd.name, err)
		}
	}
	const standbyRule = "standby until the guest announces itself"
	if dump := nodeRuleDump(t, c.nodes[2].dp); !strings.Contains(dump, standbyRule) {
		t.Fatalf("the target port is not on Standby:\n%s", dump)
	}
	var port Port
	for _, p := range standby().Ports {
		if p.HostIfName == x2.hostIf {
			port = p
		}
	}

	if err := podLink(x, func(h *nl.Handle, l netlink.Link) error { return h.LinkSetDown(l) }); err != nil {
		t.Fatal(err)
	}
	if err := sendRawFrame(x2, rarpFrame(x.mac)); err != nil {
		t.Fatal(err)
	}
	if err := c.nodes[2].dp.Activate(port); err != nil {
		t.Fatal(err)
	}
	if token, err := echoSession(y, xIP, 1); err != nil || token != "x2" {
		t.Fatalf("after Activate: answered by %q (%v), want x2", token, err)
	}
	// A plan made before the announce does not close it again.
	if err := c.nodes[2].dp.Apply(context.Background(), standby()); err != nil {
		t.Fatal(err)
	}
	if dump := nodeRuleDump(t, c.nodes[2].dp); strings.Contains(dump, standbyRule) {
		t.Fatalf("an Apply of the old plan closed the activated port:\n%s", dump)
	}
	if token, err := echoSession(y, xIP, 1); err != nil || token != "x2" {
		t.Fatalf("after re-applying the old plan: answered by %q (%v), want x2", token, err)
	}
	// The plan catches up; the next migration's Standby is honoured.
	if err := c.nodes[2].dp.Apply(context.Background(), c.migrationState(c.nodes[2], nets, x, x2, true)); err != nil {
		t.Fatal(err)
	}
	if err := c.nodes[2].dp.Apply(context.Background(), standby()); err != nil {
		t.Fatal(err)
	}
	if dump := nodeRuleDump(t, c.nodes[2].dp); !strings.Contains(dump, standbyRule) {
		t.Fatalf("a later Standby of the same port was ignored:\n%s", dump)
	}

	// Bad input changes nothing; a port without a chain is an error.
	if err := c.nodes[2].dp.Activate(Port{HostIfName: x2.hostIf}); !errors.Is(err, ErrInvalidState) {
		t.Errorf("Activate without a MAC: %v, want ErrInvalidState", err)
	}
	if err := c.nodes[2].dp.Activate(Port{HostIfName: "nosuchport", MAC: x.mac}); err == nil || !strings.Contains(err.Error(), "nosuchport") {
		t.Errorf("Activate of an unknown port: %v, want an error naming it", err)
	}
	if dump := nodeRuleDump(t, c.nodes[2].dp); !strings.Contains(dump, standbyRule) {
		t.Fatalf("a failed Activate changed the rules:\n%s", dump)
	}
}

// A migration target's Standby port passes the guest's first unicast IP
// frame there at once, before any announce or activation: the frame
// reaches its peer on another node and teaches that node's VXLAN device
// the guest's new place, so the guest's first answer after the pause is
// not lost and the answers to it go to the target.
func TestStandbyPassesGuestFirstFrame(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 3)
	rt := gatewayRoutes("10.1.1.1")
	y := c.addPod(c.nodes[0], "y", "tenant-a_udn", nil, netiptest.MustPrefixes("10.1.1.2/24"), rt)
	x := c.addPod(c.nodes[1], "x", "tenant-a_udn", nil, netiptest.MustPrefixes("10.1.1.3/24"), rt)
	nets := []Network{tenantA}
	c.applyAll(nets)
	startEcho(t, x)
	xIP := addr("10.1.1.3")
	if token, err := echoSession(y, xIP, 1); err != nil || token != "x" {
		t.Fatalf("before the migration: answered by %q (%v), want x", token, err)
	}
	x2 := c.addPod(c.nodes[2], "x2", "tenant-a_udn", x.mac, x.ips, rt)
	startEcho(t, x2)
	for _, nd := range c.nodes {
		if err := nd.dp.Apply(context.Background(), c.migrationState(nd, nets, x, x2, false)); err != nil {
			t.Fatalf("apply on %s: %v", nd.name, err)
		}
	}
	vtepOnN1 := func() string {
		t.Helper()
		var vtep string
		if err := withHandle(c.nodes[0].ns, func(h *nl.Handle) error {
			entries, err := vxlanFDB(h, 1)
			if err != nil {
				return err
			}
			for _, e := range entries {
				if isSelf(e) && e.HardwareAddr.String() == x.mac.String() {
					vtep = e.IP.String()
				}
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return vtep
	}
	if got, want := vtepOnN1(), c.nodes[1].ip.String(); got != want {
		t.Fatalf("during the migration n1 sends %s to %q, want the source %s", x.mac, got, want)
	}
	// The source pauses; the guest resumes on the target and its first
	// frame there is a datagram queued for y.
	if err := podLink(x, func(h *nl.Handle, l netlink.Link) error { return h.LinkSetDown(l) }); err != nil {
		t.Fatal(err)
	}
	if err := sendRawFrame(x2, udpFrame(x.mac, y.mac, xIP, addr("10.1.1.2"), 9, 9, []byte("queued before the pause"))); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, "n1 learns the guest on the target from its first frame", func() error {
		if got, want := vtepOnN1(), c.nodes[2].ip.String(); got != want {
			return fmt.Errorf("n1 sends %s to %q, want the target %s", x.mac, got, want)
		}
		return nil
	})
	if dump := nodeRuleDump(t, c.nodes[2].dp); !strings.Contains(dump, "standby until the guest announces itself") {
		t.Fatalf("the target port left Standby by itself:\n%s", dump)
	}
	// kvnet-node activates the port on that frame; y reaches the guest there.
	for _, p := range c.migrationState(c.nodes[2], nets, x, x2, false).Ports {
		if p.HostIfName == x2.hostIf {
			if err := c.nodes[2].dp.Activate(p); err != nil {
				t.Fatal(err)
			}
		}
	}
	if token, err := echoSession(y, xIP, 1); err != nil || token != "x2" {
		t.Fatalf("after the activation: answered by %q (%v), want x2", token, err)
	}
}

// TestDepartedPortPassesNothing: once the API names the target node, the
// source pod's port is Departed until the migration ends: what the
// source pod's own stack sends from the guest's address (a reset to the
// guest's peers, say) reaches no one, and the bridges keep the guest on
// the target; the guest there is reached.
func TestDepartedPortPassesNothing(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 3)
	rt := gatewayRoutes("10.1.1.1")
	y := c.addPod(c.nodes[0], "y", "tenant-a_udn", nil, netiptest.MustPrefixes("10.1.1.2/24"), rt)
	x := c.addPod(c.nodes[1], "x", "tenant-a_udn", nil, netiptest.MustPrefixes("10.1.1.3/24"), rt)
	nets := []Network{tenantA}
	c.applyAll(nets)
	startEcho(t, y)
	yIP := addr("10.1.1.2")
	// Positive control: the source pod reaches y before it departs.
	if token, err := echoSession(x, yIP, 1); err != nil || token != "y" {
		t.Fatalf("before the migration: x reached %q (%v), want y", token, err)
	}
	x2 := c.addPod(c.nodes[2], "x2", "tenant-a_udn", x.mac, x.ips, rt)
	for _, nd := range c.nodes {
		s := c.migrationState(nd, nets, x, x2, true)
		for i := range s.Ports {
			if nd == x.node && s.Ports[i].MAC.String() == x.mac.String() {
				s.Ports[i].Departed = true
			}
		}
		if err := nd.dp.Apply(context.Background(), s); err != nil {
			t.Fatalf("apply on %s: %v", nd.name, err)
		}
	}
	if token, err := echoSession(x2, yIP, 1); err != nil || token != "y" {
		t.Fatalf("the guest on the target: reached %q (%v), want y", token, err)
	}
	if token, err := echoSession(x, yIP, 1); err == nil {
		t.Fatalf("the departed source pod reached %q", token)
	}
	if dump := nodeRuleDump(t, c.nodes[1].dp); !strings.Contains(dump, "departed: the guest left") {
		t.Fatalf("no departed rule on the source node:\n%s", dump)
	}
}
