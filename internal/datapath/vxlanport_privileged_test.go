package datapath

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"kvnet.io/kvnet/internal/nl"
	"kvnet.io/kvnet/internal/testenv/netiptest"
)

// TestVXLANPort: with NodeConfig.VXLANPort set (4790, beside a default
// network whose VXLAN takes 4789), the nodes' VXLAN devices use it, pods
// on two nodes reach each other over it, and the rule keeping tenants off
// VXLAN names it; a port out of range is refused, naming it.
func TestVXLANPort(t *testing.T) {
	t.Parallel()
	c := newClusterWith(t, 2, func(cfg *NodeConfig) { cfg.VXLANPort = 4790 })
	nets := []Network{{Name: "ns1/l2", ID: 11}}
	p1 := c.addPod(c.nodes[0], "v1", "ns1/l2", nil, netiptest.MustPrefixes("192.0.2.11/24"), nil)
	c.addPod(c.nodes[1], "v2", "ns1/l2", nil, netiptest.MustPrefixes("192.0.2.12/24"), nil)
	c.applyAll(nets)
	for _, nd := range c.nodes {
		c.must(withHandle(nd.ns, func(h *nl.Handle) error {
			l, err := h.LinkByName(VXLANName(11))
			if err != nil {
				return err
			}
			if vx, ok := l.(*netlink.Vxlan); !ok {
				t.Errorf("node %s: %s is a %s, not a VXLAN device", nd.name, VXLANName(11), l.Type())
			} else if vx.Port != 4790 {
				t.Errorf("node %s: VXLAN device port %d, want 4790", nd.name, vx.Port)
			}
			return nil
		}))
	}
	if err := ping(p1.ns, netip.Addr{}, addr("192.0.2.12"), 3*time.Second, true); err != nil {
		t.Fatalf("pod on n1 -> pod on n2 over VXLAN port 4790: %v", err)
	}

	rules := renderTables(nodeRulesPort(State{Networks: []Network{{Name: "a", ID: 1, Primary: true,
		Subnets: netiptest.MustPrefixes("10.1.0.0/24"), Gateways: []netip.Addr{addr("10.1.0.1")}}}}, 4790))
	if !strings.Contains(rules, "udp dport 4790") || strings.Contains(rules, "udp dport 4789") {
		t.Errorf("node rules keep tenants off another VXLAN port:\n%s", rules)
	}

	if _, err := New(NodeConfig{Name: "bad", UnderlayIP: addr("192.0.2.1"), UnderlayDev: underlayDev, VXLANPort: 70000}); err == nil ||
		!strings.Contains(err.Error(), "VXLAN port 70000 out of range") {
		t.Errorf("New with VXLAN port 70000: %v, want it refused naming the port", err)
	}
}
