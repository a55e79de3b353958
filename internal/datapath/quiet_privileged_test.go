package datapath

import (
	"context"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"kvnet.io/kvnet/internal/nl"
	"kvnet.io/kvnet/internal/testenv/netiptest"
)

// Applying the state a node already has changes no link: kvnet-node
// watches its links and reconciles on their changes, so a write of an
// unchanged setting (a bridge port's learning flag, say) would make it
// reconcile forever. The check is exact: after the second Apply, a marker
// change is made, and every link notification before the marker's is a
// write the Apply should not have made.
func TestApplyUnchangedStateIsQuiet(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 2)
	rt := gatewayRoutes("10.1.1.1")
	c.addPod(c.nodes[0], "a", "tenant-a_udn", nil, netiptest.MustPrefixes("10.1.1.2/24"), rt)
	c.addPod(c.nodes[1], "b", "tenant-a_udn", nil, netiptest.MustPrefixes("10.1.1.3/24"), rt)
	x := c.addPod(c.nodes[0], "x", "tenant-a_udn", nil, netiptest.MustPrefixes("10.1.1.4/24"), rt)
	nets := []Network{tenantA}
	nd := c.nodes[0]
	// x migrates away: a Migrating port (learning on) next to ordinary
	// ones (learning off), so both values of the flag are re-applied.
	x2 := c.addPod(c.nodes[1], "x2", "tenant-a_udn", x.mac, x.ips, rt)
	state := c.migrationState(nd, nets, x, x2, false)
	if err := nd.dp.Apply(context.Background(), state); err != nil {
		t.Fatal(err)
	}

	nsh, err := netns.GetFromPath(nd.ns)
	if err != nil {
		t.Fatal(err)
	}
	defer nsh.Close()
	updates := make(chan netlink.LinkUpdate, 1024)
	done := make(chan struct{})
	defer close(done)
	if err := netlink.LinkSubscribeWithOptions(updates, done, netlink.LinkSubscribeOptions{Namespace: &nsh}); err != nil {
		t.Fatal(err)
	}
	// The first Apply's links change operstate asynchronously (the
	// kernel's link watch defers "running" by up to a second): let those
	// notifications pass before the Apply under test.
	quiet := time.NewTimer(2 * time.Second)
	deadline := time.After(20 * time.Second)
drain:
	for {
		select {
		case <-updates:
			quiet.Reset(2 * time.Second)
		case <-quiet.C:
			break drain
		case <-deadline:
			t.Fatal("links of the first Apply still changing after 20 s")
		}
	}
	if err := nd.dp.Apply(context.Background(), state); err != nil {
		t.Fatal(err)
	}
	const marker = "kvnet-test-marker"
	if err := withHandle(nd.ns, func(h *nl.Handle) error {
		l, err := h.LinkByName(underlayDev)
		if err != nil {
			return err
		}
		return h.LinkSetAlias(l, marker)
	}); err != nil {
		t.Fatal(err)
	}
	for u := range updates {
		if u.Attrs().Alias == marker {
			return
		}
		t.Errorf("re-applying an unchanged state changed link %q (index %d, flags %v)", u.Attrs().Name, u.Attrs().Index, u.Attrs().Flags)
	}
}
