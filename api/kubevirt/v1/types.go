package v1

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

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
	// VMNameLabel, despite its name, holds a launcher pod's guest
	// hostname: the VMI's spec.hostname, else the VMI's name up to its
	// first "." and cut at 63 characters (KubeVirt's template service). It
	// is not the VM's name: that is the controller owner of the pod's VMI
	// (the pod's controller owner, named by DomainAnnotation), and
	// KubeVirt names a VM's VMI after the VM.
	VMNameLabel = "vm.kubevirt.io/name"
	// VMIIDLabel on a launcher pod is its VMI's name, cut and hashed
	// past 63 characters.
	VMIIDLabel = "vmi.kubevirt.io/id"
	// AddressesAnnotation on a VMI requests IPs per interface:
	// {"<iface>": ["10.0.0.5", ...]}.
	AddressesAnnotation = "network.kubevirt.io/addresses"
	// MigrationTargetReadyAnnotation is set on a target pod once its domain runs.
	MigrationTargetReadyAnnotation = "kubevirt.io/migration-target-ready-timestamp"
	// AllowPodBridgeNetworkLiveMigrationAnnotation on a VMI lets a VMI with
	// bridge binding on the pod network migrate.
	AllowPodBridgeNetworkLiveMigrationAnnotation = "kubevirt.io/allow-pod-bridge-network-live-migration"
	// PlacePCIDevicesOnRootComplexAnnotation on a VMI places its PCI
	// devices on the root complex (no hotplug ports are reserved).
	PlacePCIDevicesOnRootComplexAnnotation = "kubevirt.io/placePCIDevicesOnRootComplex"
	// PCIInterfaceSlotCountAnnotation freezes the number of PCI slots kept
	// for interfaces (placeholders plus interfaces at boot).
	PCIInterfaceSlotCountAnnotation = "kubevirt.io/pci-interface-slot-count"
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
	// Unknown keeps the members not declared here.
	Unknown UnknownFields `json:"-"`
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
	// Unknown keeps the members not declared here.
	Unknown UnknownFields `json:"-"`
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
	// Unknown keeps the members not declared here.
	Unknown UnknownFields `json:"-"`
}

// DomainSpec is the virtual hardware.
// +kubebuilder:pruning:PreserveUnknownFields
type DomainSpec struct {
	// +optional
	Devices Devices `json:"devices,omitempty"`
	// Unknown keeps the members not declared here.
	Unknown UnknownFields `json:"-"`
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
	// Unknown keeps the members not declared here.
	Unknown UnknownFields `json:"-"`
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
	// DeprecatedSlirp is the slirp binding, removed in KubeVirt v1.3.
	// +optional
	DeprecatedSlirp *DeprecatedInterfaceSlirp `json:"slirp,omitempty"`
	// DeprecatedMacvtap is the macvtap binding, removed in KubeVirt v1.3.
	// +optional
	DeprecatedMacvtap *DeprecatedInterfaceMacvtap `json:"macvtap,omitempty"`
	// DeprecatedPasst is the passt binding that preceded PasstBinding,
	// removed in KubeVirt v1.3.
	// +optional
	DeprecatedPasst *DeprecatedInterfacePasst `json:"passt,omitempty"`
	// Binding names a network binding plugin registered in the KubeVirt CR.
	// +optional
	Binding *PluginBinding `json:"binding,omitempty"`
	// +optional
	Ports []Port `json:"ports,omitempty"`
	// PortRanges are port ranges forwarded to the VM (masquerade only, at
	// most 10, not with Ports; feature gate PortRangesSpec).
	// +optional
	PortRanges []PortRange `json:"portRanges,omitempty"`
	// MacAddress requests a MAC.
	// +optional
	MacAddress string `json:"macAddress,omitempty"`
	// +optional
	BootOrder *uint `json:"bootOrder,omitempty"`
	// +optional
	PciAddress string `json:"pciAddress,omitempty"`
	// DHCPOptions are extra options KubeVirt's DHCP server hands out.
	// +optional
	DHCPOptions *DHCPOptions `json:"dhcpOptions,omitempty"`
	// +optional
	Tag string `json:"tag,omitempty"`
	// +optional
	ACPIIndex int `json:"acpiIndex,omitempty"`
	// State is "" (up), up, down or absent (hot unplug).
	// +optional
	State InterfaceState `json:"state,omitempty"`
	// Unknown keeps the members not declared here.
	Unknown UnknownFields `json:"-"`
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

// DeprecatedInterfaceSlirp is the removed slirp (QEMU user networking) binding.
type DeprecatedInterfaceSlirp struct{}

// DeprecatedInterfaceMacvtap is the removed macvtap binding.
type DeprecatedInterfaceMacvtap struct{}

// DeprecatedInterfacePasst is the removed passt binding.
type DeprecatedInterfacePasst struct{}

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

// PortRange is a range of ports exposed by a masquerade interface.
type PortRange struct {
	// Protocol is TCP (default) or UDP.
	// +optional
	Protocol string `json:"protocol,omitempty"`
	// Start is the first port of the range.
	Start int32 `json:"start"`
	// End is the last port of the range.
	End int32 `json:"end"`
}

// DHCPOptions are extra DHCP options of an interface.
type DHCPOptions struct {
	// BootFileName is option 67.
	// +optional
	BootFileName string `json:"bootFileName,omitempty"`
	// TFTPServerName is option 66.
	// +optional
	TFTPServerName string `json:"tftpServerName,omitempty"`
	// NTPServers is option 42 (IPv4 addresses).
	// +optional
	NTPServers []string `json:"ntpServers,omitempty"`
	// PrivateOptions are private-use options (224-254).
	// +optional
	PrivateOptions []DHCPPrivateOptions `json:"privateOptions,omitempty"`
}

// DHCPPrivateOptions is one private-use DHCP option.
type DHCPPrivateOptions struct {
	// Option is the option code, 224-254.
	Option int `json:"option"`
	// Value is the option's value.
	Value string `json:"value"`
}

// Network is where an interface connects: the pod network or a Multus one.
type Network struct {
	Name string `json:"name"`
	// +optional
	Pod *PodNetwork `json:"pod,omitempty"`
	// +optional
	Multus *MultusNetwork `json:"multus,omitempty"`
	// ResourceClaim is a DRA network device (feature gate
	// NetworkDevicesWithDRA).
	// +optional
	ResourceClaim *ClaimRequest `json:"resourceClaim,omitempty"`
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

// ClaimRequest names a device request of a DRA ResourceClaim.
type ClaimRequest struct {
	// ClaimName is a name from the VMI's spec.resourceClaims[].
	// +optional
	ClaimName *string `json:"claimName,omitempty"`
	// RequestName is a name from the claim's spec.devices.requests[].
	// +optional
	RequestName *string `json:"requestName,omitempty"`
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
	// Unknown keeps the members not declared here.
	Unknown UnknownFields `json:"-"`
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
	// MigrationUID is the UID of the VirtualMachineInstanceMigration.
	// +optional
	MigrationUID string `json:"migrationUid,omitempty"`
	// +optional
	StartTimestamp *metav1.Time `json:"startTimestamp,omitempty"`
	// +optional
	EndTimestamp *metav1.Time `json:"endTimestamp,omitempty"`
	// FailureReason says why the migration failed.
	// +optional
	FailureReason string `json:"failureReason,omitempty"`
	// TargetState is managed by the target virt-handler (decentralized live
	// migration).
	// +optional
	TargetState *VirtualMachineInstanceMigrationTargetState `json:"targetState,omitempty"`
	// Unknown keeps the members not declared here.
	Unknown UnknownFields `json:"-"`
}

// VirtualMachineInstanceMigrationTargetState is the target side's part of
// a migration's state.
// +kubebuilder:pruning:PreserveUnknownFields
type VirtualMachineInstanceMigrationTargetState struct {
	// NodeAddress is the address of the target node to migrate to.
	// +optional
	NodeAddress *string `json:"nodeAddress,omitempty"`
	// Unknown keeps the members not declared here.
	Unknown UnknownFields `json:"-"`
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
	// Unknown keeps the members not declared here.
	Unknown UnknownFields `json:"-"`
}

// VirtualMachineInstanceMigrationStatus is the observed state of a migration.
// +kubebuilder:pruning:PreserveUnknownFields
type VirtualMachineInstanceMigrationStatus struct {
	// +optional
	Phase string `json:"phase,omitempty"`
	// Unknown keeps the members not declared here.
	Unknown UnknownFields `json:"-"`
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
	// Unknown keeps the members not declared here.
	Unknown UnknownFields `json:"-"`
}

// KubeVirtSpec is KubeVirt's configuration.
// +kubebuilder:pruning:PreserveUnknownFields
type KubeVirtSpec struct {
	// +optional
	Configuration KubeVirtConfiguration `json:"configuration,omitempty"`
	// Unknown keeps the members not declared here.
	Unknown UnknownFields `json:"-"`
}

// KubeVirtConfiguration holds the parts of the configuration kvnet reads.
// +kubebuilder:pruning:PreserveUnknownFields
type KubeVirtConfiguration struct {
	// +optional
	NetworkConfiguration *NetworkConfiguration `json:"network,omitempty"`
	// +optional
	MigrationConfiguration *MigrationConfiguration `json:"migrations,omitempty"`
	// Unknown keeps the members not declared here.
	Unknown UnknownFields `json:"-"`
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
	// Unknown keeps the members not declared here.
	Unknown UnknownFields `json:"-"`
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
	// ComputeResourceOverhead is added to the compute container of a VM
	// using the plugin.
	// +optional
	ComputeResourceOverhead *ResourceRequirementsWithoutClaims `json:"computeResourceOverhead,omitempty"`
	// Unknown keeps the members not declared here.
	Unknown UnknownFields `json:"-"`
}

// ResourceRequirementsWithoutClaims are compute resources (no DRA claims).
type ResourceRequirementsWithoutClaims struct {
	// +optional
	Limits corev1.ResourceList `json:"limits,omitempty"`
	// +optional
	Requests corev1.ResourceList `json:"requests,omitempty"`
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
	// BandwidthPerMigration limits each migration's stream (e.g. "64Mi",
	// bytes per second); unset is unlimited.
	// +optional
	BandwidthPerMigration *resource.Quantity `json:"bandwidthPerMigration,omitempty"`
	// Unknown keeps the members not declared here.
	Unknown UnknownFields `json:"-"`
}

// KubeVirtList is a list of KubeVirts.
// +kubebuilder:object:root=true
type KubeVirtList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []KubeVirt `json:"items"`
}
