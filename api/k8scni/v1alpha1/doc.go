// Package v1alpha1 holds kvnet's Go types for k8s.cni.cncf.io/v1alpha1
// IPAMClaim, JSON-compatible with k8snetworkplumbingwg/ipamclaims.
//
// An IPAMClaim holds the IPs of one interface of one VM for as long as the
// claim exists, so the VM keeps them across restarts and live migrations.
//
// +kubebuilder:object:generate=true
// +groupName=k8s.cni.cncf.io
package v1alpha1
