package v1beta1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

// GroupVersion is the API group and version of MultiNetworkPolicy.
var GroupVersion = schema.GroupVersion{Group: "k8s.cni.cncf.io", Version: "v1beta1"}

var (
	// SchemeBuilder registers the types of this package with a scheme.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}
	// AddToScheme adds the types of this package to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

func init() {
	SchemeBuilder.Register(&MultiNetworkPolicy{}, &MultiNetworkPolicyList{})
}
