package v1

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// NetworkAttachmentDefinition names a CNI configuration pods can attach to.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:path=network-attachment-definitions,scope=Namespaced,shortName=net-attach-def,singular=network-attachment-definition
type NetworkAttachmentDefinition struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +optional
	Spec NetworkAttachmentDefinitionSpec `json:"spec,omitempty"`
}

// NetworkAttachmentDefinitionSpec holds the CNI configuration.
type NetworkAttachmentDefinitionSpec struct {
	// Config is a CNI configuration (or configuration list) as JSON.
	// +optional
	Config string `json:"config,omitempty"`
}

// NetworkAttachmentDefinitionList is a list of NetworkAttachmentDefinitions.
// +kubebuilder:object:root=true
type NetworkAttachmentDefinitionList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []NetworkAttachmentDefinition `json:"items"`
}
