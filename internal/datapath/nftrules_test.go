package datapath

import (
	"flag"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
)

var update = flag.Bool("update", false, "rewrite golden files in testdata/")

// goldenState has one primary dual-stack network, one secondary L2
// network, a port with IPv4+IPv6, a port with IPv4 only and an L2 port.
func goldenState() State {
	return State{
		Networks: []Network{
			{Name: "l2net", ID: 300, Remotes: []netip.Addr{netip.MustParseAddr("192.168.100.2")}},
			{Name: "tenant-a_udn", ID: 1, Primary: true,
				Subnets:  []netip.Prefix{netip.MustParsePrefix("10.1.1.0/24"), netip.MustParsePrefix("fd00:1::/64")},
				Gateways: []netip.Addr{netip.MustParseAddr("10.1.1.1"), netip.MustParseAddr("fd00:1::1")}},
		},
		Ports: []Port{
			{Network: "tenant-a_udn", HostIfName: "pa2", MAC: net.HardwareAddr{0x02, 0, 0, 0, 0, 0x02},
				IPs: []netip.Prefix{netip.MustParsePrefix("10.1.1.3/24")}},
			{Network: "tenant-a_udn", HostIfName: "pa1", MAC: net.HardwareAddr{0x02, 0, 0, 0, 0, 0x01},
				IPs: []netip.Prefix{netip.MustParsePrefix("10.1.1.2/24"), netip.MustParsePrefix("fd00:1::2/64")}},
			{Network: "l2net", HostIfName: "l2p", MAC: net.HardwareAddr{0x02, 0, 0, 0, 0, 0x03}},
		},
	}
}

func checkGolden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -run %s -update to create it)", err, t.Name())
	}
	if got != string(want) {
		t.Errorf("%s differs from golden file (go test -update to accept):\n--- got\n%s\n--- want\n%s", path, got, want)
	}
}

func TestNodeRulesGolden(t *testing.T) {
	checkGolden(t, "node.nft", renderTables(nodeRules("eth0", goldenState())))
}

func TestRouterRulesGolden(t *testing.T) {
	checkGolden(t, "router.nft", renderTables(routerRules(goldenState().Networks[1])))
}

func TestNodeRulesEmptyState(t *testing.T) {
	if got := nodeRules("eth0", State{}); got != nil {
		t.Errorf("nodeRules(empty) = %v, want no tables", got)
	}
}

// Counters are keyed by comment, so comments of counted rules must be
// unique on a node, and every port rule must name its port.
func TestRuleComments(t *testing.T) {
	seen := map[string]bool{}
	for _, tb := range nodeRules("eth0", goldenState()) {
		for _, c := range tb.chains {
			for _, r := range c.rules {
				if r.comment == "" {
					t.Errorf("chain %s: rule %q has no comment", c.name, r.text)
				}
				if r.counted() {
					if seen[r.comment] {
						t.Errorf("comment %q used twice", r.comment)
					}
					seen[r.comment] = true
				}
			}
		}
	}
	for _, p := range goldenState().Ports {
		for _, r := range portRules(p) {
			if want := "port " + p.HostIfName + ":"; len(r.comment) < len(want) || r.comment[:len(want)] != want {
				t.Errorf("port %s: rule comment %q does not name the port", p.HostIfName, r.comment)
			}
		}
	}
}

func TestLongCommentTruncated(t *testing.T) {
	long := make([]byte, 300)
	for i := range long {
		long[i] = 'n'
	}
	n := Network{Name: string(long), ID: 5, Primary: true}
	for _, tb := range routerRules(n) {
		for _, c := range tb.chains {
			for _, r := range c.rules {
				if len(r.comment) > maxCommentLen {
					t.Errorf("comment of %d bytes, limit %d", len(r.comment), maxCommentLen)
				}
			}
		}
	}
}
