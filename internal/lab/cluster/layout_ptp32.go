package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"

	"kvnet.io/kvnet/internal/repo"
)

// NetworkPTP32 is the /32 default-network layout, as Calico lays pods
// out: each pod's eth0 holds its address as a /32 with "default via
// LinkLocalGateway dev eth0 onlink"; the node's end of the veth has no
// address and answers ARP for the gateway by proxy ARP; the node routes
// each pod's /32 to its veth and blackholes the rest of its pod subnet;
// the nodes and the host route each node's pod subnet to it (as with the
// bridge layout). The reference ptp plugin with host-local makes the veth,
// the address and the node's route; the lab's chained ptp32 plugin
// (internal/lab/cluster/ptp32) does what ptp cannot (its package doc says
// why).
const NetworkPTP32 = "ptp32"

// LinkLocalGateway is every pod's gateway with the ptp32 layout (Calico's).
var LinkLocalGateway = netip.MustParseAddr("169.254.1.1")

// ptp32Plugin is the chained plugin's binary name (and CNI type).
const ptp32Plugin = "ptp32"

// buildPTP32Plugin compiles internal/lab/cluster/ptp32 into work/bin and
// returns its contents.
func buildPTP32Plugin(ctx context.Context, repoRoot, work string) ([]byte, error) {
	out := filepath.Join(work, "bin")
	cmd := repo.GoBuild(ctx, "go", repoRoot, "-ldflags=-s -w", "-o", out+"/", "./internal/lab/cluster/ptp32")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("go build ptp32: %w\n%s", err, stderr.String())
	}
	return os.ReadFile(filepath.Join(out, ptp32Plugin))
}

// ptp32Conflist is node n's default network with the ptp32 layout: ptp
// with host-local on the node's pod subnet and the link-local gateway
// (off the subnet: host-local hands out the subnet's .1 too), then ptp32.
func (n node) ptp32Conflist() ([]byte, error) {
	conf := map[string]any{
		"cniVersion": "1.0.0",
		"name":       "kvnet-lab",
		"plugins": []any{
			map[string]any{
				"type":   "ptp",
				"ipMasq": false, // pods see each other's addresses: no NAT
				"ipam": map[string]any{
					"type":   "host-local",
					"ranges": [][]map[string]string{{{"subnet": PodCIDR(n.i).String(), "gateway": LinkLocalGateway.String()}}},
				},
			},
			map[string]any{"type": ptp32Plugin},
		},
	}
	return json.MarshalIndent(conf, "", "  ")
}

// writePTP32CNI installs the ptp32 plugin in node n's /opt/cni/bin (ptp
// and host-local are there with the others), blackholes the node's pod
// subnet in its namespace (a packet for an address no pod holds is
// dropped, not sent back to the host that routed it here) and writes its
// CNI configuration; containerd picks it up and the node turns Ready.
func (n node) writePTP32CNI(plugin []byte) error {
	if err := os.WriteFile(n.root("/opt/cni/bin/"+ptp32Plugin), plugin, 0o755); err != nil { //nolint:gosec // an executable
		return err
	}
	if err := inNetns(n.i, "ip", "route", "replace", "blackhole", PodCIDR(n.i).String()); err != nil {
		return fmt.Errorf("node %s: %w", n.name(), err)
	}
	b, err := n.ptp32Conflist()
	if err != nil {
		return err
	}
	return n.writeConflist(b)
}

// writeConflist writes the node's default network configuration as
// /etc/cni/net.d/10-kvnet-lab.conflist, atomically.
func (n node) writeConflist(b []byte) error {
	dir := n.root("/etc/cni/net.d")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	tmp := filepath.Join(dir, ".10-kvnet-lab.conflist")
	if err := os.WriteFile(tmp, b, 0o644); err != nil { //nolint:gosec // a config file
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, "10-kvnet-lab.conflist"))
}
