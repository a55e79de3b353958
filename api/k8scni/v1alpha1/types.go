package v1alpha1

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// IPAMClaim holds the IPs of one workload interface beyond any pod's life.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:path=ipamclaims,scope=Namespaced,singular=ipamclaim
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Network",type=string,JSONPath=".spec.network"
// +kubebuilder:printcolumn:name="IPs",type=string,JSONPath=".status.ips"
// +kubebuilder:printcolumn:name="Owner",type=string,JSONPath=".status.ownerPod.name"
type IPAMClaim struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   IPAMClaimSpec   `json:"spec,omitempty"`
	Status IPAMClaimStatus `json:"status,omitempty"`
}

// IPAMClaimSpec names the network and interface the claim is for.
type IPAMClaimSpec struct {
	// Network is the CNI network name (the NAD config's "name"), e.g.
	// "tenant-a_udn".
	Network string `json:"network"`
	// Interface is the pod interface name, when known.
	// +optional
	Interface string `json:"interface,omitempty"`
}

// IPAMClaimStatus is what the IPAM has allocated for the claim.
type IPAMClaimStatus struct {
	// IPs are the allocated addresses in CIDR notation.
	// +optional
	IPs []string `json:"ips,omitempty"`
	// OwnerPod is the pod that last used the claim.
	// +optional
	OwnerPod *OwnerPod `json:"ownerPod,omitempty"`
	// Conditions report allocation success or failure (IPsAllocated).
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// OwnerPod names a pod.
type OwnerPod struct {
	Name string `json:"name"`
}

// IPAMClaimList is a list of IPAMClaims.
// +kubebuilder:object:root=true
type IPAMClaimList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []IPAMClaim `json:"items"`
}
