// Package v1 holds a subset of kubevirt.io/v1 as kvnet's own Go types:
// VirtualMachine, VirtualMachineInstance, VirtualMachineInstanceMigration and
// KubeVirt, with the networking fields typed and every other field kept by
// the CRD (x-kubernetes-preserve-unknown-fields) and by the Go types
// (UnknownFields), so that a typed update does not drop it.
//
// In a real cluster KubeVirt owns these CRDs and kvnet only reads them (and
// patches VM MACs through its webhook, with JSON patches that leave unknown
// fields alone). The lab installs the CRDs generated from this package.
//
// +kubebuilder:object:generate=true
// +groupName=kubevirt.io
package v1
