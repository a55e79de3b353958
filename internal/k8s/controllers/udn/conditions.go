package udn

import (
	"context"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nadv1 "kvnet.io/kvnet/api/k8scni/v1"
	udnv1 "kvnet.io/kvnet/api/udn/v1"
	"kvnet.io/kvnet/internal/physnet"
	"kvnet.io/kvnet/internal/udn"
)

// Condition type, reasons and messages shared with OVN-Kubernetes.
const (
	ConditionNetworkCreated = "NetworkCreated"

	ReasonNADCreated    = "NetworkAttachmentDefinitionCreated"
	ReasonNADDeleted    = "NetworkAttachmentDefinitionDeleted"
	ReasonSyncError     = "SyncError"
	ReasonCUDNSyncError = "NetworkAttachmentDefinitionSyncError"

	messageNADCreated    = "NetworkAttachmentDefinition has been created"
	messageNADIsDeleting = "NetworkAttachmentDefinition is being deleted"
)

// networkCreated is a UDN's NetworkCreated condition after a sync that
// returned nad and syncErr, as OVN-Kubernetes computes it: a sync error
// wins over a NAD being deleted, which wins over created.
func networkCreated(nad *nadv1.NetworkAttachmentDefinition, syncErr error) metav1.Condition {
	switch {
	case syncErr != nil:
		return falseCondition(ReasonSyncError, syncErr.Error())
	case nad != nil && nad.DeletionTimestamp != nil:
		return falseCondition(ReasonNADDeleted, messageNADIsDeleting)
	}
	return metav1.Condition{Type: ConditionNetworkCreated, Status: metav1.ConditionTrue, Reason: ReasonNADCreated, Message: messageNADCreated}
}

// clusterNetworkCreated is a CUDN's NetworkCreated condition after a sync
// that returned the NADs of the selected namespaces (in namespace order) and
// syncErr, with the same precedence as networkCreated.
func clusterNetworkCreated(nads []*nadv1.NetworkAttachmentDefinition, syncErr error) metav1.Condition {
	var namespaces, deleting []string
	for _, nad := range nads {
		namespaces = append(namespaces, nad.Namespace)
		if nad.DeletionTimestamp != nil {
			deleting = append(deleting, nad.Namespace+"/"+nad.Name)
		}
	}
	switch {
	case syncErr != nil:
		return falseCondition(ReasonCUDNSyncError, syncErr.Error())
	case len(deleting) > 0:
		return falseCondition(ReasonNADDeleted, fmt.Sprintf("NetworkAttachmentDefinition are being deleted: %v", deleting))
	}
	return metav1.Condition{
		Type: ConditionNetworkCreated, Status: metav1.ConditionTrue, Reason: ReasonNADCreated,
		Message: fmt.Sprintf("%s in following namespaces: [%s]", messageNADCreated, strings.Join(namespaces, ", ")),
	}
}

// Reasons of a localnet network that no node can attach (kvnet's own).
const (
	// ReasonNoBridgeMapping: no node maps the physical network to a bridge.
	ReasonNoBridgeMapping = "NoBridgeMapping"
	// ReasonKernelFeatureMissing: nodes that map the physical network lack
	// a kernel feature the network needs (802.1Q for vlan.access).
	ReasonKernelFeatureMissing = "KernelFeatureMissing"
)

// attachableLocalnet turns a True condition False when the nodes cannot
// attach localnet network spec: no node maps its physical network to a
// bridge, or it asks for a VLAN and a node that maps it lacks 802.1Q. A
// network that would be attached untagged, or nowhere, must not read as
// created.
func attachableLocalnet(cond metav1.Condition, spec udn.Spec, nodes []corev1.Node) metav1.Condition {
	ln := spec.Localnet
	if cond.Status != metav1.ConditionTrue || spec.Topology != udnv1.NetworkTopologyLocalnet || ln == nil {
		return cond
	}
	var mapped, noVLAN []string
	for i := range nodes {
		m, err := physnet.ParseBridgeMappings(nodes[i].Annotations[physnet.BridgeMappingsAnnotation])
		if err != nil || m[ln.PhysicalNetworkName] == "" {
			continue
		}
		mapped = append(mapped, nodes[i].Name)
		if physnet.LacksVLAN(&nodes[i]) {
			noVLAN = append(noVLAN, nodes[i].Name)
		}
	}
	slices.Sort(mapped)
	slices.Sort(noVLAN)
	switch {
	case len(mapped) == 0:
		return falseCondition(ReasonNoBridgeMapping, fmt.Sprintf(
			"%s, but no node maps physical network %q to a bridge: annotate the nodes on that network with %s=%s:<bridge>",
			cond.Message, ln.PhysicalNetworkName, physnet.BridgeMappingsAnnotation, ln.PhysicalNetworkName))
	case ln.VLAN != nil && ln.VLAN.Access != nil && len(noVLAN) > 0:
		return falseCondition(ReasonKernelFeatureMissing, fmt.Sprintf(
			"%s, but vlan.access.id %d needs 802.1Q VLAN links (the Linux kernel module %s), which nodes %s lack: kvnet does not attach the network untagged, so pods and VMs on those nodes fail to start",
			cond.Message, ln.VLAN.Access.ID, physnet.KernelFeatureVLAN, strings.Join(noVLAN, ", ")))
	}
	return cond
}

func falseCondition(reason, message string) metav1.Condition {
	return metav1.Condition{Type: ConditionNetworkCreated, Status: metav1.ConditionFalse, Reason: reason, Message: message}
}

// conditionHolds reports whether conds already has cond's status, reason and
// message, so that a reconcile without change writes nothing.
func conditionHolds(conds []metav1.Condition, cond metav1.Condition) bool {
	c := meta.FindStatusCondition(conds, cond.Type)
	return c != nil && c.Status == cond.Status && c.Reason == cond.Reason && c.Message == cond.Message
}

// setCondition patches cond into the status of obj, whose conditions conds
// points to, unless it already holds there, and reports whether it wrote.
// An object already gone is not an error.
func (n *networks) setCondition(ctx context.Context, obj client.Object, conds *[]metav1.Condition, cond metav1.Condition) (bool, error) {
	if conditionHolds(*conds, cond) {
		return false, nil
	}
	patch := client.MergeFrom(obj.DeepCopyObject().(client.Object))
	meta.SetStatusCondition(conds, cond)
	if err := n.client.Status().Patch(ctx, obj, patch); err != nil {
		return false, client.IgnoreNotFound(err)
	}
	return true, nil
}

// reportSync sets the condition a sync ended with and records a change of
// it as an event on obj: Normal when the network is created, Warning
// otherwise, with the condition's reason and message.
func (n *networks) reportSync(ctx context.Context, obj client.Object, conds *[]metav1.Condition, cond metav1.Condition) error {
	changed, err := n.setCondition(ctx, obj, conds, cond)
	if changed {
		eventType := corev1.EventTypeWarning
		if cond.Status == metav1.ConditionTrue {
			eventType = corev1.EventTypeNormal
		}
		n.recorder.Eventf(obj, nil, eventType, cond.Reason, "Sync", "%s", cond.Message)
	}
	return err
}
