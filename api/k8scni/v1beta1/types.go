package v1beta1

import (
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// PolicyForAnnotation names the networks a MultiNetworkPolicy applies to:
// a comma-separated list of NADs, each "namespace/name" or "name" (in the
// policy's namespace).
const PolicyForAnnotation = "k8s.v1.cni.cncf.io/policy-for"

// MultiNetworkPolicy is a NetworkPolicy for the secondary networks its
// k8s.v1.cni.cncf.io/policy-for annotation names. Its spec is
// NetworkPolicy's, field for field (the multi-networkpolicy project's
// v1beta1 spec has the same JSON), and means the same for the selected
// pods' interfaces on those networks.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:path=multi-networkpolicies,scope=Namespaced,singular=multi-networkpolicy,shortName=multi-policy
// +kubebuilder:storageversion
// +kubebuilder:printcolumn:name="Networks",type=string,JSONPath=".metadata.annotations.k8s\\.v1\\.cni\\.cncf\\.io/policy-for"
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=".metadata.creationTimestamp"
type MultiNetworkPolicy struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec networkingv1.NetworkPolicySpec `json:"spec,omitempty"`
}

// MultiNetworkPolicyList is a list of MultiNetworkPolicies.
//
// +kubebuilder:object:root=true
type MultiNetworkPolicyList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []MultiNetworkPolicy `json:"items"`
}
