package v1

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// UserDefinedNetwork is a network requested for one namespace.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:path=userdefinednetworks,scope=Namespaced,shortName=udn,singular=userdefinednetwork
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Topology",type=string,JSONPath=".spec.topology"
// +kubebuilder:printcolumn:name="Created",type=string,JSONPath=".status.conditions[?(@.type=='NetworkCreated')].status"
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=".metadata.creationTimestamp"
type UserDefinedNetwork struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +kubebuilder:validation:XValidation:rule="has(self.topology) && self.topology == 'Layer3' ? has(self.layer3): !has(self.layer3)", message="spec.layer3 is required when topology is Layer3 and forbidden otherwise"
	// +kubebuilder:validation:XValidation:rule="has(self.topology) && self.topology == 'Layer2' ? has(self.layer2): !has(self.layer2)", message="spec.layer2 is required when topology is Layer2 and forbidden otherwise"
	// +required
	Spec UserDefinedNetworkSpec `json:"spec"`
	// +optional
	Status UserDefinedNetworkStatus `json:"status,omitempty"`
}

// UserDefinedNetworkSpec is the desired network of a UserDefinedNetwork.
type UserDefinedNetworkSpec struct {
	// Topology is Layer2 or Layer3.
	// +kubebuilder:validation:Enum=Layer2;Layer3
	// +kubebuilder:validation:XValidation:rule="self == oldSelf", message="Topology is immutable"
	// +required
	Topology NetworkTopology `json:"topology"`

	// Layer3 is the Layer3 topology configuration.
	// +optional
	Layer3 *Layer3Config `json:"layer3,omitempty"`

	// Layer2 is the Layer2 topology configuration.
	// +kubebuilder:validation:XValidation:rule="self == oldSelf", message="Layer2 is immutable"
	// +optional
	Layer2 *Layer2Config `json:"layer2,omitempty"`
}

// UserDefinedNetworkStatus is the observed state of a UserDefinedNetwork.
type UserDefinedNetworkStatus struct {
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// UserDefinedNetworkList is a list of UserDefinedNetworks.
// +kubebuilder:object:root=true
type UserDefinedNetworkList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []UserDefinedNetwork `json:"items"`
}

// ClusterUserDefinedNetwork is a network shared by the namespaces its
// selector matches.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:path=clusteruserdefinednetworks,scope=Cluster,shortName=cudn,singular=clusteruserdefinednetwork
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Topology",type=string,JSONPath=".spec.network.topology"
// +kubebuilder:printcolumn:name="Created",type=string,JSONPath=".status.conditions[?(@.type=='NetworkCreated')].status"
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=".metadata.creationTimestamp"
type ClusterUserDefinedNetwork struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec ClusterUserDefinedNetworkSpec `json:"spec"`
	// +optional
	Status ClusterUserDefinedNetworkStatus `json:"status,omitempty"`
}

// ClusterUserDefinedNetworkSpec is the desired state of a
// ClusterUserDefinedNetwork.
type ClusterUserDefinedNetworkSpec struct {
	// NamespaceSelector selects the namespaces the network is available in.
	// +required
	NamespaceSelector metav1.LabelSelector `json:"namespaceSelector"`

	// Network is the network's configuration.
	// +kubebuilder:validation:XValidation:rule="has(self.topology) && self.topology == 'Layer3' ? has(self.layer3): !has(self.layer3)", message="spec.layer3 is required when topology is Layer3 and forbidden otherwise"
	// +kubebuilder:validation:XValidation:rule="has(self.topology) && self.topology == 'Layer2' ? has(self.layer2): !has(self.layer2)", message="spec.layer2 is required when topology is Layer2 and forbidden otherwise"
	// +kubebuilder:validation:XValidation:rule="has(self.topology) && self.topology == 'Localnet' ? has(self.localnet): !has(self.localnet)", message="spec.localnet is required when topology is Localnet and forbidden otherwise"
	// +required
	Network NetworkSpec `json:"network"`
}

// NetworkSpec is the network of a ClusterUserDefinedNetwork.
type NetworkSpec struct {
	// Topology is Layer2, Layer3 or Localnet.
	// +kubebuilder:validation:Enum=Layer2;Layer3;Localnet
	// +kubebuilder:validation:XValidation:rule="self == oldSelf", message="Topology is immutable"
	// +required
	Topology NetworkTopology `json:"topology"`

	// Layer3 is the Layer3 topology configuration.
	// +optional
	Layer3 *Layer3Config `json:"layer3,omitempty"`

	// Layer2 is the Layer2 topology configuration.
	// +kubebuilder:validation:XValidation:rule="self == oldSelf", message="Layer2 is immutable"
	// +optional
	Layer2 *Layer2Config `json:"layer2,omitempty"`

	// Localnet is the Localnet topology configuration.
	// +kubebuilder:validation:XValidation:rule="self == oldSelf", message="Localnet is immutable"
	// +optional
	Localnet *LocalnetConfig `json:"localnet,omitempty"`
}

// ClusterUserDefinedNetworkStatus is the observed state of a
// ClusterUserDefinedNetwork.
type ClusterUserDefinedNetworkStatus struct {
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// ClusterUserDefinedNetworkList is a list of ClusterUserDefinedNetworks.
// +kubebuilder:object:root=true
type ClusterUserDefinedNetworkList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ClusterUserDefinedNetwork `json:"items"`
}
