package v1

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// Well-known labels and annotations of KubeVirt that kvnet reads or writes.
const (
	// VirtualMachineLabel labels IPAMClaims (and other objects) with the VM name.
	VirtualMachineLabel = "kubevirt.io/vm"
	// AppLabel is set to "virt-launcher" on launcher pods.
	AppLabel = "kubevirt.io"
	// VirtLauncherValue is AppLabel's value on launcher pods.
	VirtLauncherValue = "virt-launcher"
	// DomainAnnotation names the VMI a launcher pod runs.
	DomainAnnotation = "kubevirt.io/domain"
	// VMNameLabel names the VM of a launcher pod (at most 63 characters).
	VMNameLabel = "vm.kubevirt.io/name"
	// AddressesAnnotation on a VMI requests IPs per interface:
	// {"<iface>": ["10.0.0.5", ...]}.
	AddressesAnnotation = "network.kubevirt.io/addresses"
	// MigrationTargetReadyAnnotation is set on a target pod once its domain runs.
	MigrationTargetReadyAnnotation = "kubevirt.io/migration-target-ready-timestamp"
)

// VirtualMachine is a VM definition that outlives its runs.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:path=virtualmachines,scope=Namespaced,shortName=vm;vms,singular=virtualmachine
// +kubebuilder:subresource:status
type VirtualMachine struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec VirtualMachineSpec `json:"spec"`
	// +optional
	Status VirtualMachineStatus `json:"status,omitempty"`
}

// VirtualMachineSpec is the desired state of a VM.
// +kubebuilder:pruning:PreserveUnknownFields
type VirtualMachineSpec struct {
	// Running is the deprecated on/off switch.
	// +optional
	Running *bool `json:"running,omitempty"`
	// RunStrategy is Always, Halted, Manual, RerunOnFailure, Once.
	// +optional
	RunStrategy *string `json:"runStrategy,omitempty"`
	// Template is the VMI the VM runs.
	// +optional
	Template *VirtualMachineInstanceTemplateSpec `json:"template,omitempty"`
}

// VirtualMachineInstanceTemplateSpec is a VMI template.
type VirtualMachineInstanceTemplateSpec struct {
	// +optional
	ObjectMeta metav1.ObjectMeta `json:"metadata,omitempty"`
	// +optional
	Spec VirtualMachineInstanceSpec `json:"spec,omitempty"`
}

// VirtualMachineStatus is the observed state of a VM.
// +kubebuilder:pruning:PreserveUnknownFields
type VirtualMachineStatus struct {
	// +optional
	PrintableStatus string `json:"printableStatus,omitempty"`
	// +optional
	Ready bool `json:"ready,omitempty"`
	// +optional
	Created bool `json:"created,omitempty"`
}

// VirtualMachineList is a list of VirtualMachines.
// +kubebuilder:object:root=true
type VirtualMachineList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []VirtualMachine `json:"items"`
}

// VirtualMachineInstance is one run of a VM.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:path=virtualmachineinstances,scope=Namespaced,shortName=vmi;vmis,singular=virtualmachineinstance
// +kubebuilder:subresource:status
type VirtualMachineInstance struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec VirtualMachineInstanceSpec `json:"spec"`
	// +optional
	Status VirtualMachineInstanceStatus `json:"status,omitempty"`
}

// VirtualMachineInstanceSpec is the desired state of a VMI.
// +kubebuilder:pruning:PreserveUnknownFields
type VirtualMachineInstanceSpec struct {
	// +optional
	Domain DomainSpec `json:"domain,omitempty"`
	// Networks are the networks the VM's interfaces connect to.
	// +optional
	Networks []Network `json:"networks,omitempty"`
	// +optional
	Hostname string `json:"hostname,omitempty"`
	// +optional
	Subdomain string `json:"subdomain,omitempty"`
}

// DomainSpec is the virtual hardware.
// +kubebuilder:pruning:PreserveUnknownFields
type DomainSpec struct {
	// +optional
	Devices Devices `json:"devices,omitempty"`
}

// Devices are the virtual devices.
// +kubebuilder:pruning:PreserveUnknownFields
type Devices struct {
	// +optional
	Interfaces []Interface `json:"interfaces,omitempty"`
	// AutoattachPodInterface adds a default pod network when no network is
	// given, unless false.
	// +optional
	AutoattachPodInterface *bool `json:"autoattachPodInterface,omitempty"`
}

// Interface is a VM NIC and how it binds to its network.
// +kubebuilder:pruning:PreserveUnknownFields
type Interface struct {
	// Name matches a Network name.
	Name string `json:"name"`
	// +optional
	Model string `json:"model,omitempty"`
	// +optional
	Bridge *InterfaceBridge `json:"bridge,omitempty"`
	// +optional
	Masquerade *InterfaceMasquerade `json:"masquerade,omitempty"`
	// +optional
	SRIOV *InterfaceSRIOV `json:"sriov,omitempty"`
	// +optional
	PasstBinding *InterfacePasstBinding `json:"passtBinding,omitempty"`
	// Binding names a network binding plugin registered in the KubeVirt CR.
	// +optional
	Binding *PluginBinding `json:"binding,omitempty"`
	// +optional
	Ports []Port `json:"ports,omitempty"`
	// MacAddress requests a MAC.
	// +optional
	MacAddress string `json:"macAddress,omitempty"`
	// +optional
	BootOrder *uint `json:"bootOrder,omitempty"`
	// +optional
	PciAddress string `json:"pciAddress,omitempty"`
	// +optional
	Tag string `json:"tag,omitempty"`
	// +optional
	ACPIIndex int `json:"acpiIndex,omitempty"`
	// State is "" (up), up, down or absent (hot unplug).
	// +optional
	State InterfaceState `json:"state,omitempty"`
}

// InterfaceState is the desired link state of an interface.
type InterfaceState string

// Interface states.
const (
	InterfaceStateUp     InterfaceState = "up"
	InterfaceStateDown   InterfaceState = "down"
	InterfaceStateAbsent InterfaceState = "absent"
)

// InterfaceBridge connects the VM to the pod interface through a bridge.
type InterfaceBridge struct{}

// InterfaceMasquerade connects the VM through NAT on the pod interface.
type InterfaceMasquerade struct{}

// InterfaceSRIOV passes an SR-IOV VF through.
type InterfaceSRIOV struct{}

// InterfacePasstBinding connects the VM through passt.
type InterfacePasstBinding struct{}

// PluginBinding names a binding plugin.
type PluginBinding struct {
	Name string `json:"name"`
}

// Port is a port exposed by a masquerade interface.
type Port struct {
	// +optional
	Name string `json:"name,omitempty"`
	// +optional
	Protocol string `json:"protocol,omitempty"`
	Port     int32  `json:"port"`
}

// Network is where an interface connects: the pod network or a Multus one.
type Network struct {
	Name string `json:"name"`
	// +optional
	Pod *PodNetwork `json:"pod,omitempty"`
	// +optional
	Multus *MultusNetwork `json:"multus,omitempty"`
}

// PodNetwork is the pod's primary network.
type PodNetwork struct {
	// +optional
	VMNetworkCIDR string `json:"vmNetworkCIDR,omitempty"`
	// +optional
	VMIPv6NetworkCIDR string `json:"vmIPv6NetworkCIDR,omitempty"`
}

// MultusNetwork is a network attachment definition.
type MultusNetwork struct {
	// NetworkName is "<nad>" or "<namespace>/<nad>".
	NetworkName string `json:"networkName"`
	// Default makes this the pod's default network.
	// +optional
	Default bool `json:"default,omitempty"`
}

// VirtualMachineInstanceStatus is the observed state of a VMI.
// +kubebuilder:pruning:PreserveUnknownFields
type VirtualMachineInstanceStatus struct {
	// +optional
	Phase string `json:"phase,omitempty"`
	// +optional
	NodeName string `json:"nodeName,omitempty"`
	// +optional
	Interfaces []VirtualMachineInstanceNetworkInterface `json:"interfaces,omitempty"`
	// ActivePods maps pod UID to node name.
	// +optional
	ActivePods map[string]string `json:"activePods,omitempty"`
	// +optional
	MigrationState *VirtualMachineInstanceMigrationState `json:"migrationState,omitempty"`
}

// VirtualMachineInstanceNetworkInterface is the observed state of a VM NIC.
type VirtualMachineInstanceNetworkInterface struct {
	// +optional
	IP string `json:"ipAddress,omitempty"`
	// +optional
	MAC string `json:"mac,omitempty"`
	// +optional
	Name string `json:"name,omitempty"`
	// +optional
	IPs []string `json:"ipAddresses,omitempty"`
	// +optional
	PodInterfaceName string `json:"podInterfaceName,omitempty"`
	// +optional
	InterfaceName string `json:"interfaceName,omitempty"`
	// +optional
	InfoSource string `json:"infoSource,omitempty"`
	// +optional
	QueueCount int32 `json:"queueCount,omitempty"`
	// +optional
	LinkState string `json:"linkState,omitempty"`
}

// VirtualMachineInstanceMigrationState is the state of a live migration.
// +kubebuilder:pruning:PreserveUnknownFields
type VirtualMachineInstanceMigrationState struct {
	// +optional
	TargetNodeAddress string `json:"targetNodeAddress,omitempty"`
	// +optional
	TargetDirectMigrationNodePorts map[string]int `json:"targetDirectMigrationNodePorts,omitempty"`
	// +optional
	TargetNode string `json:"targetNode,omitempty"`
	// +optional
	TargetPod string `json:"targetPod,omitempty"`
	// +optional
	SourceNode string `json:"sourceNode,omitempty"`
	// +optional
	SourcePod string `json:"sourcePod,omitempty"`
	// +optional
	Completed bool `json:"completed,omitempty"`
	// +optional
	Failed bool `json:"failed,omitempty"`
	// +optional
	MigrationNetworkType string `json:"migrationNetworkType,omitempty"`
}

// VirtualMachineInstanceList is a list of VirtualMachineInstances.
// +kubebuilder:object:root=true
type VirtualMachineInstanceList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []VirtualMachineInstance `json:"items"`
}

// VirtualMachineInstanceMigration asks for a VMI to be live-migrated.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:path=virtualmachineinstancemigrations,scope=Namespaced,shortName=vmim;vmims,singular=virtualmachineinstancemigration
// +kubebuilder:subresource:status
type VirtualMachineInstanceMigration struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec VirtualMachineInstanceMigrationSpec `json:"spec"`
	// +optional
	Status VirtualMachineInstanceMigrationStatus `json:"status,omitempty"`
}

// VirtualMachineInstanceMigrationSpec names the VMI to migrate.
// +kubebuilder:pruning:PreserveUnknownFields
type VirtualMachineInstanceMigrationSpec struct {
	VMIName string `json:"vmiName"`
}

// VirtualMachineInstanceMigrationStatus is the observed state of a migration.
// +kubebuilder:pruning:PreserveUnknownFields
type VirtualMachineInstanceMigrationStatus struct {
	// +optional
	Phase string `json:"phase,omitempty"`
}

// VirtualMachineInstanceMigrationList is a list of migrations.
// +kubebuilder:object:root=true
type VirtualMachineInstanceMigrationList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []VirtualMachineInstanceMigration `json:"items"`
}

// KubeVirt is KubeVirt's cluster-wide configuration.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:path=kubevirts,scope=Namespaced,shortName=kv;kvs,singular=kubevirt
// +kubebuilder:subresource:status
type KubeVirt struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec KubeVirtSpec `json:"spec"`
	// +optional
	Status KubeVirtStatus `json:"status,omitempty"`
}

// KubeVirtStatus is the observed state of KubeVirt.
// +kubebuilder:pruning:PreserveUnknownFields
type KubeVirtStatus struct {
	// +optional
	Phase string `json:"phase,omitempty"`
}

// KubeVirtSpec is KubeVirt's configuration.
// +kubebuilder:pruning:PreserveUnknownFields
type KubeVirtSpec struct {
	// +optional
	Configuration KubeVirtConfiguration `json:"configuration,omitempty"`
}

// KubeVirtConfiguration holds the parts of the configuration kvnet reads.
// +kubebuilder:pruning:PreserveUnknownFields
type KubeVirtConfiguration struct {
	// +optional
	NetworkConfiguration *NetworkConfiguration `json:"network,omitempty"`
	// +optional
	MigrationConfiguration *MigrationConfiguration `json:"migrations,omitempty"`
}

// NetworkConfiguration is KubeVirt's network configuration.
// +kubebuilder:pruning:PreserveUnknownFields
type NetworkConfiguration struct {
	// +optional
	NetworkInterface string `json:"defaultNetworkInterface,omitempty"`
	// +optional
	PermitBridgeInterfaceOnPodNetwork *bool `json:"permitBridgeInterfaceOnPodNetwork,omitempty"`
	// Binding maps a binding plugin name to its registration.
	// +optional
	Binding map[string]InterfaceBindingPlugin `json:"binding,omitempty"`
}

// InterfaceBindingPlugin registers a network binding plugin.
// +kubebuilder:pruning:PreserveUnknownFields
type InterfaceBindingPlugin struct {
	// +optional
	SidecarImage string `json:"sidecarImage,omitempty"`
	// NetworkAttachmentDefinition is "<ns>/<name>" of the plugin's NAD.
	// +optional
	NetworkAttachmentDefinition string `json:"networkAttachmentDefinition,omitempty"`
	// DomainAttachmentType is tap or managedTap.
	// +optional
	DomainAttachmentType string `json:"domainAttachmentType,omitempty"`
	// +optional
	Migration *InterfaceBindingMigration `json:"migration,omitempty"`
	// +optional
	DownwardAPI string `json:"downwardAPI,omitempty"`
}

// InterfaceBindingMigration says a binding plugin supports migration.
type InterfaceBindingMigration struct {
	// +optional
	Method string `json:"method,omitempty"`
}

// MigrationConfiguration is KubeVirt's migration configuration.
// +kubebuilder:pruning:PreserveUnknownFields
type MigrationConfiguration struct {
	// Network is the name of the NAD (in KubeVirt's namespace) that carries
	// migration traffic.
	// +optional
	Network *string `json:"network,omitempty"`
}

// KubeVirtList is a list of KubeVirts.
// +kubebuilder:object:root=true
type KubeVirtList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []KubeVirt `json:"items"`
}
