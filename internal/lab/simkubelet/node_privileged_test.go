package simkubelet_test

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"kvnet.io/kvnet/internal/lab/simkubelet"
	"kvnet.io/kvnet/internal/testenv"
)

// TestNodeStatus: the kubelet reports its node as a kubelet does — Ready,
// its underlay address as InternalIP, its name as Hostname, NodeInfo —
// and keeps beating: the Ready condition's heartbeat and the node's Lease
// in kube-node-lease are renewed while the transition time stays.
func TestNodeStatus(t *testing.T) {
	testenv.NeedsFixture(t, privileged)
	nodeIP := netip.MustParseAddr("192.168.100.77")
	k := startKubelet(t, func(cfg *simkubelet.Config) {
		cfg.NodeIP = nodeIP
		cfg.HeartbeatInterval = 200 * time.Millisecond
	})
	ctx := context.Background()
	var first corev1.NodeCondition
	testenv.Eventually(t, waitTimeout, "node Ready with addresses and NodeInfo", func() error {
		k.running(t)
		var n corev1.Node
		if err := c.Get(ctx, client.ObjectKey{Name: nodeName}, &n); err != nil {
			return err
		}
		ready := nodeReady(&n)
		if ready == nil || ready.Status != corev1.ConditionTrue || ready.Reason != simkubelet.ReasonKubeletReady {
			return fmt.Errorf("Ready condition %+v", ready)
		}
		want := []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: nodeIP.String()}, {Type: corev1.NodeHostName, Address: nodeName}}
		if fmt.Sprint(n.Status.Addresses) != fmt.Sprint(want) {
			return fmt.Errorf("addresses %v, want %v", n.Status.Addresses, want)
		}
		info := n.Status.NodeInfo
		if info.ContainerRuntimeVersion != simkubelet.ContainerRuntimeVersion || info.KubeletVersion != simkubelet.KubeletVersion ||
			info.OperatingSystem != "linux" || info.Architecture == "" || info.KernelVersion == "" || info.BootID == "" {
			return fmt.Errorf("NodeInfo %+v", info)
		}
		first = *ready
		return nil
	})
	var lease coordinationv1.Lease
	testenv.Eventually(t, waitTimeout, "node lease", func() error {
		if err := c.Get(ctx, client.ObjectKey{Namespace: simkubelet.NodeLeaseNamespace, Name: nodeName}, &lease); err != nil {
			return err
		}
		if lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity != nodeName || lease.Spec.RenewTime == nil {
			return fmt.Errorf("lease spec %+v", lease.Spec)
		}
		if len(lease.OwnerReferences) != 1 || lease.OwnerReferences[0].Kind != "Node" || lease.OwnerReferences[0].Name != nodeName {
			return fmt.Errorf("lease owners %+v, want the Node", lease.OwnerReferences)
		}
		return nil
	})
	firstRenew := lease.Spec.RenewTime.Time
	// Heartbeat times have a resolution of a second on the wire.
	testenv.Eventually(t, waitTimeout, "heartbeat renewed", func() error {
		k.running(t)
		var n corev1.Node
		if err := c.Get(ctx, client.ObjectKey{Name: nodeName}, &n); err != nil {
			return err
		}
		ready := nodeReady(&n)
		if ready == nil || !ready.LastHeartbeatTime.After(first.LastHeartbeatTime.Time) {
			return fmt.Errorf("Ready heartbeat %v, not after %v", ready, first.LastHeartbeatTime)
		}
		if !ready.LastTransitionTime.Equal(&first.LastTransitionTime) {
			return fmt.Errorf("Ready transition time moved from %v to %v while Ready stayed True", first.LastTransitionTime, ready.LastTransitionTime)
		}
		var l coordinationv1.Lease
		if err := c.Get(ctx, client.ObjectKey{Namespace: simkubelet.NodeLeaseNamespace, Name: nodeName}, &l); err != nil {
			return err
		}
		if !l.Spec.RenewTime.After(firstRenew) {
			return fmt.Errorf("lease renew time %v, not after %v", l.Spec.RenewTime, firstRenew)
		}
		return nil
	})
}

func nodeReady(n *corev1.Node) *corev1.NodeCondition {
	for i := range n.Status.Conditions {
		if n.Status.Conditions[i].Type == corev1.NodeReady {
			return &n.Status.Conditions[i]
		}
	}
	return nil
}
