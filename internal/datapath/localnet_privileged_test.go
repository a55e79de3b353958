package datapath

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"kvnet.io/kvnet/internal/lab/simnet"
	"kvnet.io/kvnet/internal/nl"
	"kvnet.io/kvnet/internal/testenv/netiptest"
)

// serveDatacenter runs an echo server answering "dc" on the simulated
// physical network's host, simnet.DatacenterHostIP.
func serveDatacenter(t *testing.T, c *cluster) {
	t.Helper()
	startEcho(t, &pod{name: "dc", ns: c.sim.Physical})
}

// localnetState is node nd's state for localnet network n and tunnelled
// networks others: its pods' ports, and remote MACs of the tunnelled ones
// only (the physical network learns its own).
func (c *cluster) localnetState(nd *node, n Network, others []Network) State {
	s := c.state(nd, others) // every pod's port, and every remote MAC
	s.Networks = append(s.Networks, n)
	var remotes []RemoteMAC
	for _, m := range s.RemoteMACs {
		if m.Network != n.Name {
			remotes = append(remotes, m)
		}
	}
	s.RemoteMACs = remotes
	return s
}

// TestLocalnet: pods of a localnet network on two nodes reach a host of
// the physical network and each other through it, with their own
// addresses; a tunnelled network with the same subnet reaches neither. A
// VLAN on a kernel without 8021q fails Apply with ErrNoVLAN and leaves the
// patch untagged-attached nowhere.
func TestLocalnet(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 2)
	serveDatacenter(t, c)
	ln := Network{Name: "physnet_ln", ID: 20, Physical: simnet.PhysicalBridge, MTU: 1500}
	tunnelled := []Network{{Name: "ns1/l2", ID: 21}}
	p1 := c.addPod(c.nodes[0], "ln1", ln.Name, nil, netiptest.MustPrefixes("192.168.50.11/24"), nil)
	p2 := c.addPod(c.nodes[1], "ln2", ln.Name, nil, netiptest.MustPrefixes("192.168.50.12/24"), nil)
	other := c.addPod(c.nodes[0], "tun1", "ns1/l2", nil, netiptest.MustPrefixes("192.168.50.13/24"), nil)
	other.l2only = true
	apply := func(n Network) error {
		var errs []error
		for _, nd := range c.nodes {
			errs = append(errs, nd.dp.Apply(context.Background(), c.localnetState(nd, n, tunnelled)))
		}
		return errors.Join(errs...)
	}
	if err := apply(ln); err != nil {
		t.Fatal(err)
	}
	startEcho(t, p2)
	for _, tc := range []struct {
		dst   string
		token string
	}{{"192.168.50.1", "dc"}, {"192.168.50.12", "ln2"}} {
		if err := ping(p1.ns, netip.Addr{}, addr(tc.dst), 3*time.Second, true); err != nil {
			t.Fatalf("localnet pod to %s: %v", tc.dst, err)
		}
		token, err := echoSession(p1, addr(tc.dst), 2)
		if err != nil || token != tc.token {
			t.Fatalf("echo to %s: token %q, %v; want %q", tc.dst, token, err, tc.token)
		}
	}
	if _, err := echoSession(other, addr("192.168.50.1"), 1); err == nil {
		t.Fatal("a pod of a tunnelled network with the same subnet reached the physical network")
	}
	// The localnet network has no tunnel and no router.
	if err := withHandle(c.nodes[0].ns, func(h *nl.Handle) error {
		if _, err := h.LinkByName(VXLANName(ln.ID)); !errors.Is(err, nl.ErrNotFound) {
			return fmt.Errorf("VXLAN device of a localnet network: %v", err)
		}
		// The patch carries the network's MTU, not the tunnels' pod MTU.
		for _, name := range []string{physPortName(ln.ID), patchPortName(ln.ID)} {
			l, err := h.LinkByName(name)
			if err != nil {
				return err
			}
			if l.Attrs().MTU != 1500 {
				return fmt.Errorf("%s MTU %d, want the network's 1500", name, l.Attrs().MTU)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	// A mapping to a bridge the node lacks: an error naming it, and the
	// patch is off the old bridge.
	gone := ln
	gone.Physical = "br-gone"
	if err := apply(gone); err == nil || !strings.Contains(err.Error(), `physical bridge "br-gone"`) {
		t.Fatalf("apply with a missing physical bridge: %v", err)
	}
	if err := withHandle(c.nodes[0].ns, func(h *nl.Handle) error {
		if _, err := h.LinkByName(physPortName(ln.ID)); !errors.Is(err, nl.ErrNotFound) {
			return fmt.Errorf("%s still there after its bridge mapping changed: %v", physPortName(ln.ID), err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := echoSession(p1, addr("192.168.50.1"), 1); err == nil {
		t.Fatal("the pod still reaches the old physical network")
	}
	if err := apply(ln); err != nil {
		t.Fatal(err)
	}

	vlan := ln
	vlan.VLAN = 100
	supported, perr := ProbeVLAN(c.nodes[0].ns)
	if perr != nil {
		t.Fatal(perr)
	}
	err := apply(vlan)
	if supported {
		// A kernel with 8021q: the network's bridge port is the VLAN device.
		if err != nil {
			t.Fatal(err)
		}
		c.must(withHandle(c.nodes[0].ns, func(h *nl.Handle) error {
			l, err := h.LinkByName(vlanPortName(ln.ID))
			if err != nil {
				return err
			}
			if v, ok := l.(*netlink.Vlan); !ok || v.VlanId != 100 {
				return fmt.Errorf("%s is %#v, want VLAN 100", l.Attrs().Name, l)
			}
			return nil
		}))
		return
	}
	t.Log("this kernel has no 8021q: checking the VLAN request fails clearly")
	if !errors.Is(err, ErrNoVLAN) || !strings.Contains(err.Error(), "8021q") || !strings.Contains(err.Error(), "vlan 100") {
		t.Fatalf("apply with VLAN 100 on a kernel without 8021q: %v; want ErrNoVLAN naming 8021q and the VLAN", err)
	}
	c.must(withHandle(c.nodes[0].ns, func(h *nl.Handle) error {
		patch, err := h.LinkByName(patchPortName(ln.ID))
		if err != nil {
			return err
		}
		if patch.Attrs().MasterIndex != 0 {
			return fmt.Errorf("%s still a bridge port after a failed VLAN request: untagged attach", patch.Attrs().Name)
		}
		return nil
	}))
	if _, err := echoSession(p1, addr("192.168.50.1"), 1); err == nil {
		t.Fatal("after a failed VLAN request the pod still reaches the physical network untagged")
	}
}
