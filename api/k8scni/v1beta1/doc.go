// Package v1beta1 holds kvnet's Go types for k8s.cni.cncf.io/v1beta1
// MultiNetworkPolicy, JSON-compatible with k8snetworkplumbingwg's
// multi-networkpolicy project.
//
// A MultiNetworkPolicy is a NetworkPolicy for secondary networks: its
// k8s.v1.cni.cncf.io/policy-for annotation names the networks (NADs) it
// applies to, and its spec has NetworkPolicy's fields and meaning, for the
// pods' interfaces on those networks.
//
// +kubebuilder:object:generate=true
// +groupName=k8s.cni.cncf.io
package v1beta1
