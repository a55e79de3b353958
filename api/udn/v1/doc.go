// Package v1 holds kvnet's own Go types for the k8s.ovn.org/v1 API:
// UserDefinedNetwork and ClusterUserDefinedNetwork.
//
// The JSON shape and every CEL validation rule (with its message) match
// OVN-Kubernetes, so manifests written for OpenShift Virtualization apply
// unchanged. The upstream Go module is not reachable from kvnet's build, and
// kvnet does not want its dependency tree anyway; only the wire format is
// shared. EVPN and no-overlay transports are not part of kvnet.
//
// +kubebuilder:object:generate=true
// +groupName=k8s.ovn.org
package v1
