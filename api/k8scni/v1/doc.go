// Package v1 holds kvnet's Go types for k8s.cni.cncf.io/v1
// NetworkAttachmentDefinition, JSON-compatible with the Network Plumbing
// Working Group's multi-network specification (v1.3), and the pod
// annotation formats that specification defines.
//
// +kubebuilder:object:generate=true
// +groupName=k8s.cni.cncf.io
package v1
