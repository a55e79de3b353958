// Package migration is a VirtualMachineInstance's live migration as one
// value: which VMI, from which node and launcher pod to which, and how far
// it is, read once from the VMI's status.migrationState (Of). It imports
// no Kubernetes client: kvnet-node (internal/node) and the read-side
// inventory (internal/inventory) both build it from the objects they
// already hold.
//
// # Where the switch-over lives
//
// During a live migration two launcher pods hold the VM's MAC, one per
// node. Which of them the network sends the guest's frames to (the
// switch-over) is decided in three places, each for its own reason:
//
//  1. The API: KubeVirt moves the VMI's status.nodeName to the target and
//     sets status.migrationState.completed when the migration is over.
//     kvnet-node's plan (node.Desired) reads it through a Migration and
//     the VMI's node: the holder on status.nodeName is the live one.
//  2. The node's frame watcher (internal/node, announce.go): on the
//     target node, the first frame the guest sends there (QEMU's RARP
//     announce, or its first IP packet) marks its MAC announced. That
//     happens seconds before the API moves, and the plan then has the
//     target port open (not on Standby) although the VMI still names the
//     source node.
//  3. The datapath (internal/datapath): a target port is on Standby
//     (its frames dropped) until Activate opens it, which the frame
//     watcher calls at once on the guest's first frame, and which the
//     next Apply keeps.
//
// Only the API's is durable: the other two are recomputed by kvnet-node
// after a restart (a guest already running on the target sends frames
// again; until then the API's switch decides).
package migration

import (
	"k8s.io/apimachinery/pkg/types"

	kubevirtv1 "kvnet.io/kvnet/api/kubevirt/v1"
)

// State is how far a migration is, as KubeVirt's status tells.
type State string

// The States of a migration.
const (
	// Pending: a target is being prepared; the migration has not started.
	Pending State = "Pending"
	// Running: the guest's memory is being copied to the target.
	Running State = "Running"
	// Succeeded: the guest runs on the target.
	Succeeded State = "Succeeded"
	// Failed: the guest stays on the source.
	Failed State = "Failed"
)

// Migration is one VMI's live migration: the last one its status reports.
type Migration struct {
	VMI                    types.NamespacedName
	SourceNode, TargetNode string
	// SourcePod and TargetPod are the launcher pods (in the VMI's
	// namespace) on SourceNode and TargetNode.
	SourcePod, TargetPod string
	State                State
	// FailureReason says why a Failed migration failed ("" if unknown).
	FailureReason string
	// UID is the VirtualMachineInstanceMigration's ("" if not reported).
	UID string
}

// Of returns vmi's migration, or nil if its status reports none.
func Of(vmi *kubevirtv1.VirtualMachineInstance) *Migration {
	ms := vmi.Status.MigrationState
	if ms == nil {
		return nil
	}
	m := &Migration{
		VMI:        types.NamespacedName{Namespace: vmi.Namespace, Name: vmi.Name},
		SourceNode: ms.SourceNode, TargetNode: ms.TargetNode,
		SourcePod: ms.SourcePod, TargetPod: ms.TargetPod,
		FailureReason: ms.FailureReason, UID: ms.MigrationUID,
	}
	switch {
	case ms.Failed:
		m.State = Failed
	case ms.Completed:
		m.State = Succeeded
	case ms.StartTimestamp != nil:
		m.State = Running
	default:
		m.State = Pending
	}
	return m
}

// InProgress reports whether m has a target and is neither over nor
// failed: both launcher pods then hold the VM's MAC.
func (m *Migration) InProgress() bool {
	return m != nil && m.TargetNode != "" && (m.State == Pending || m.State == Running)
}

// Role is a launcher pod's part in a migration.
type Role int

// The Roles of a pod.
const (
	NoRole Role = iota // not one of the migration's pods
	Source
	Target
)

// RoleOf returns the part the pod namespace/name plays in m.
func (m *Migration) RoleOf(namespace, name string) Role {
	switch {
	case m == nil || namespace != m.VMI.Namespace || name == "":
		return NoRole
	case name == m.SourcePod:
		return Source
	case name == m.TargetPod:
		return Target
	}
	return NoRole
}

// Reasons of the events kvnet-node records on a VMI when one of its
// networks switched to a live migration's target node: at the guest's
// first frame there (Normal), or by the API before any frame of the
// guest was seen there (Warning). Each note starts "network <name>
// switched from node <source> to node <target> ".
const (
	EventSwitchover    = "MigrationSwitchover"
	EventSwitchedByAPI = "MigrationSwitchedByAPI"
)
