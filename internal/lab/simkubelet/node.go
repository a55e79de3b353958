package simkubelet

import (
	"context"
	"fmt"
	goruntime "runtime"
	"time"

	"golang.org/x/sys/unix"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
)

// What the simulated kubelet says of itself in the Node's status.
const (
	// KubeletVersion is NodeInfo.KubeletVersion of a simulated node.
	KubeletVersion = "v0.0.0-kvnet-lab"
	// ContainerRuntimeVersion is NodeInfo.ContainerRuntimeVersion.
	ContainerRuntimeVersion = "kvnet-lab://simkubelet"
	// ReasonKubeletReady is the Ready condition's reason, as kubelet's.
	ReasonKubeletReady = "KubeletReady"
	// NodeLeaseNamespace holds the nodes' heartbeat Leases.
	NodeLeaseNamespace = "kube-node-lease"

	defaultHeartbeat = 10 * time.Second
	leaseDuration    = 40 // seconds, kubelet's default
)

// heartbeat reports the node Ready with its addresses and NodeInfo, and
// renews its Lease, now and every Config.HeartbeatInterval until ctx ends,
// as kubelet's node status updates and lease controller do. A failure is
// logged and retried at the next beat.
func (k *kubelet) heartbeat(ctx context.Context) {
	interval := k.cfg.HeartbeatInterval
	if interval <= 0 {
		interval = defaultHeartbeat
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if err := k.beat(ctx); err != nil && ctx.Err() == nil {
			k.log.Error(err, "node heartbeat")
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (k *kubelet) beat(ctx context.Context) error {
	node, err := k.updateNodeStatus(ctx)
	if err != nil {
		return err
	}
	return k.renewLease(ctx, node)
}

// updateNodeStatus creates the Node when it is missing and writes its
// status: Ready, addresses, NodeInfo and the heartbeat time.
func (k *kubelet) updateNodeStatus(ctx context.Context) (*corev1.Node, error) {
	nodes := k.cs.CoreV1().Nodes()
	var out *corev1.Node
	err := retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		cur, err := nodes.Get(ctx, k.cfg.NodeName, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			cur, err = nodes.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: k.cfg.NodeName}}, metav1.CreateOptions{})
		}
		if err != nil {
			return err
		}
		k.nodeStatus(&cur.Status, metav1.Now())
		out, err = nodes.UpdateStatus(ctx, cur, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("update status of node %s: %w", k.cfg.NodeName, err)
	}
	return out, nil
}

// nodeStatus sets what the kubelet reports of its node into st at now.
func (k *kubelet) nodeStatus(st *corev1.NodeStatus, now metav1.Time) {
	ready := corev1.NodeCondition{
		Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: ReasonKubeletReady,
		Message: "simulated kubelet is posting ready status", LastHeartbeatTime: now, LastTransitionTime: now,
	}
	found := false
	for i := range st.Conditions {
		c := &st.Conditions[i]
		if c.Type != corev1.NodeReady {
			continue
		}
		found = true
		if c.Status == corev1.ConditionTrue {
			ready.LastTransitionTime = c.LastTransitionTime
		}
		*c = ready
	}
	if !found {
		st.Conditions = append(st.Conditions, ready)
	}
	st.Addresses = nil
	if k.cfg.NodeIP.IsValid() {
		st.Addresses = append(st.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: k.cfg.NodeIP.String()})
	}
	st.Addresses = append(st.Addresses, corev1.NodeAddress{Type: corev1.NodeHostName, Address: k.cfg.NodeName})
	st.NodeInfo = corev1.NodeSystemInfo{
		MachineID:               k.cfg.NodeName,
		SystemUUID:              k.cfg.NodeName,
		BootID:                  k.bootID,
		KernelVersion:           kernelVersion(),
		OSImage:                 "kvnet lab simulated node",
		ContainerRuntimeVersion: ContainerRuntimeVersion,
		KubeletVersion:          KubeletVersion,
		OperatingSystem:         goruntime.GOOS,
		Architecture:            goruntime.GOARCH,
	}
}

// renewLease creates or renews the node's Lease in kube-node-lease, owned
// by the Node as kubelet's is.
func (k *kubelet) renewLease(ctx context.Context, node *corev1.Node) error {
	leases := k.cs.CoordinationV1().Leases(NodeLeaseNamespace)
	now := metav1.NewMicroTime(time.Now())
	spec := coordinationv1.LeaseSpec{
		HolderIdentity: ptr.To(k.cfg.NodeName), LeaseDurationSeconds: ptr.To(int32(leaseDuration)), RenewTime: &now,
	}
	err := retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		cur, err := leases.Get(ctx, k.cfg.NodeName, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			_, err = leases.Create(ctx, &coordinationv1.Lease{
				ObjectMeta: metav1.ObjectMeta{Name: k.cfg.NodeName, Namespace: NodeLeaseNamespace,
					OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: node.Name, UID: node.UID}}},
				Spec: spec,
			}, metav1.CreateOptions{})
			return err
		}
		if err != nil {
			return err
		}
		cur.Spec = spec
		_, err = leases.Update(ctx, cur, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("renew lease %s/%s: %w", NodeLeaseNamespace, k.cfg.NodeName, err)
	}
	return nil
}

// kernelVersion is the running kernel's release (the simulated nodes share
// it).
func kernelVersion() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return ""
	}
	return unix.ByteSliceToString(u.Release[:])
}
