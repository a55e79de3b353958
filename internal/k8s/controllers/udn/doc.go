// Package udn reconciles UserDefinedNetworks and ClusterUserDefinedNetworks
// into NetworkAttachmentDefinitions, following OVN-Kubernetes' cluster
// manager: one NAD per UDN (per selected namespace for a CUDN), network IDs
// persisted on the NADs, namespace-label rules for primary networks,
// finalizers that block deletion while pods use a network, and the
// NetworkCreated status condition.
//
// The rendering, naming and checks are in internal/udn; this package only
// reads objects, calls those functions and writes the results.
package udn
