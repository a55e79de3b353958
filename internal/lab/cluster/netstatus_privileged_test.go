//go:build cluster

package cluster

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// checkPrimaryDefault checks a primary-UDN pod's network-status as KubeVirt
// reads it: exactly one entry marked default, interface ovn-udn1, and
// eth0 there too; and that only Multus wrote the annotation: every
// managedFields entry owning it is a write of the status subresource (a
// Multus UpdateStatus), none a patch of the pod itself (kvnet-node's old
// rewrite), so no second writer races Multus.
func checkPrimaryDefault(t testing.TB, p *corev1.Pod) {
	t.Helper()
	var statuses []networkStatus
	if err := json.Unmarshal([]byte(p.Annotations["k8s.v1.cni.cncf.io/network-status"]), &statuses); err != nil {
		t.Errorf("pod %s: network-status: %v", p.Name, err)
		return
	}
	var defaults []string
	eth0 := false
	for _, s := range statuses {
		if s.Default {
			defaults = append(defaults, s.Interface)
		}
		eth0 = eth0 || s.Interface == "eth0"
	}
	if len(defaults) != 1 || defaults[0] != "ovn-udn1" || !eth0 {
		t.Errorf("pod %s: network-status marks %v default (want exactly [ovn-udn1]), eth0 listed %v: %s",
			p.Name, defaults, eth0, p.Annotations["k8s.v1.cni.cncf.io/network-status"])
	}
	for _, mf := range p.ManagedFields {
		if mf.FieldsV1 == nil || !strings.Contains(string(mf.FieldsV1.GetRawBytes()), `"f:k8s.v1.cni.cncf.io/network-status"`) {
			continue
		}
		if mf.Subresource != "status" {
			t.Errorf("pod %s: network-status written by %q through %s (subresource %q), not only by Multus's status update",
				p.Name, mf.Manager, mf.Operation, mf.Subresource)
		}
	}
}

// checkLeaseReleased checks that the cluster default network's IPAM on
// node (Flannel delegates to host-local, which keeps one file per
// address under /var/lib/cni/networks/<network>) holds no lease for ip:
// kvnet-cni, the primary-UDN pod's default network for Multus, ran the
// default network's DEL when the pod went.
func checkLeaseReleased(t testing.TB, c *Cluster, node, ip string) {
	t.Helper()
	if leaseHeld(t, c, node, ip) {
		leases, _ := filepath.Glob(filepath.Join(c.Dir, "nodes", node, "root", "var/lib/cni/networks", "*", ip))
		// Whether kvnet-cni's DEL ran: it forgets the configuration its
		// ADD kept for the container.
		kept, _ := filepath.Glob(filepath.Join(c.Dir, "nodes", node, "root", "var/lib/cni/kvnet/default-network", "*"))
		t.Errorf("node %s: default network lease %v still held after its pod was deleted (kvnet-cni's kept configurations: %v)", node, leases, kept)
	}
}

// leaseHeld reports whether the default network's host-local IPAM on
// node holds a lease for ip.
func leaseHeld(t testing.TB, c *Cluster, node, ip string) bool {
	t.Helper()
	leases, err := filepath.Glob(filepath.Join(c.Dir, "nodes", node, "root", "var/lib/cni/networks", "*", ip))
	if err != nil {
		t.Fatal(err)
	}
	return len(leases) > 0
}
