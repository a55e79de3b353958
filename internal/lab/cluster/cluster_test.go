package cluster

import (
	"context"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

func TestUpRejectsBadNodeCount(t *testing.T) {
	for _, n := range []int{0, -1, 10} {
		_, err := Up(context.Background(), Config{Dir: t.TempDir(), Nodes: n})
		if err == nil || !strings.Contains(err.Error(), "nodes") {
			t.Errorf("Up with %d nodes: got %v, want an error naming nodes", n, err)
		}
	}
}

// TestKubeletConfig checks the settings this host needs survive rendering
// (docs/cluster.md says why each is there).
func TestKubeletConfig(t *testing.T) {
	n := node{i: 2, dir: "/x/nodes/node-2"}
	var kc map[string]any
	s := render(kubeletConfig, map[string]any{"CgroupRoot": n.cgroupRoot(), "NodeIP": NodeIP(2).String(), "ResolvConf": n.path("resolv.conf")})
	if err := yaml.Unmarshal([]byte(s), &kc); err != nil {
		t.Fatalf("kubelet.yaml: %v\n%s", err, s)
	}
	want := map[string]any{
		"kind": "KubeletConfiguration", "cgroupDriver": "cgroupfs", "cgroupRoot": "/kvc-node-2",
		"failCgroupV1": false, "address": "10.89.0.12", "oomScoreAdj": float64(0),
	}
	for k, v := range want {
		if kc[k] != v {
			t.Errorf("kubelet.yaml %s: got %v, want %v", k, kc[k], v)
		}
	}
}

func TestNodeAddresses(t *testing.T) {
	if got := PodCIDR(3).String(); got != "10.244.3.0/24" {
		t.Errorf("PodCIDR(3) = %s", got)
	}
	if !ClusterCIDR.Contains(PodCIDR(9).Addr()) || !NodeSubnet.Contains(NodeIP(9)) {
		t.Errorf("node 9's addresses out of range: %s, %s", PodCIDR(9), NodeIP(9))
	}
}
