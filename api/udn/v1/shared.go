package v1

// NetworkTopology is the shape of a user-defined network.
type NetworkTopology string

const (
	// NetworkTopologyLayer2 is one L2 segment shared by every node.
	NetworkTopologyLayer2 NetworkTopology = "Layer2"
	// NetworkTopologyLayer3 is one L2 segment per node, routed between nodes.
	NetworkTopologyLayer3 NetworkTopology = "Layer3"
	// NetworkTopologyLocalnet bridges pods onto a physical network (CUDN only).
	NetworkTopologyLocalnet NetworkTopology = "Localnet"
)

// NetworkRole says whether a network is a pod's primary network.
type NetworkRole string

const (
	// NetworkRolePrimary networks replace the default network for every pod
	// of a labelled namespace.
	NetworkRolePrimary NetworkRole = "Primary"
	// NetworkRoleSecondary networks are attached on request through the
	// k8s.v1.cni.cncf.io/networks annotation.
	NetworkRoleSecondary NetworkRole = "Secondary"
)

// IPAMMode says whether kvnet assigns IPs on a network.
// +kubebuilder:validation:Enum=Enabled;Disabled
type IPAMMode string

const (
	// IPAMEnabled: kvnet assigns IPs from the network's subnets.
	IPAMEnabled IPAMMode = "Enabled"
	// IPAMDisabled: kvnet assigns MACs only and provides pure L2.
	IPAMDisabled IPAMMode = "Disabled"
)

// NetworkIPAMLifecycle controls how long assigned IPs live.
// +kubebuilder:validation:Enum=Persistent
type NetworkIPAMLifecycle string

// IPAMLifecyclePersistent keeps IPs in IPAMClaims, so VMs keep them across
// restarts and live migrations.
const IPAMLifecyclePersistent NetworkIPAMLifecycle = "Persistent"

// CIDR is an IPv4 or IPv6 prefix in CIDR notation.
// +kubebuilder:validation:XValidation:rule="isCIDR(self)", message="CIDR is invalid"
// +kubebuilder:validation:MaxLength=43
type CIDR string

// DualStackCIDRs is one CIDR, or two of different IP families.
// +kubebuilder:validation:MinItems=1
// +kubebuilder:validation:MaxItems=2
// +kubebuilder:validation:XValidation:rule="size(self) != 2 || !isCIDR(self[0]) || !isCIDR(self[1]) || cidr(self[0]).ip().family() != cidr(self[1]).ip().family()", message="When 2 CIDRs are set, they must be from different IP families"
type DualStackCIDRs []CIDR

// IP is an IPv4 or IPv6 address.
// +kubebuilder:validation:XValidation:rule="isIP(self)", message="IP is invalid"
type IP string

// DualStackIPs is one IP, or two of different IP families.
// +kubebuilder:validation:MinItems=1
// +kubebuilder:validation:MaxItems=2
// +kubebuilder:validation:XValidation:rule="size(self) != 2 || !isIP(self[0]) || !isIP(self[1]) || ip(self[0]).family() != ip(self[1]).family()", message="When 2 IPs are set, they must be from different IP families"
type DualStackIPs []IP

// Layer3Config configures a Layer3 network.
// +kubebuilder:validation:XValidation:rule="self.role != 'Secondary' || self.subnets == oldSelf.subnets", message="Subnets is immutable for Secondary role"
// +kubebuilder:validation:XValidation:rule="self.role != 'Secondary' || !has(self.subnets) || self.subnets.size() <= 2", message="Secondary networks may define at most 2 subnets"
// +kubebuilder:validation:XValidation:rule="self.role != 'Secondary' || size(self.subnets) != 2 || !isCIDR(self.subnets[0].cidr) || !isCIDR(self.subnets[1].cidr) || cidr(self.subnets[0].cidr).ip().family() != cidr(self.subnets[1].cidr).ip().family()", message="When 2 CIDRs are set for Secondary networks, they must be from different IP families"
// +kubebuilder:validation:XValidation:rule="!has(self.joinSubnets) || has(self.role) && self.role == 'Primary'", message="JoinSubnets is only supported for Primary network"
// +kubebuilder:validation:XValidation:rule="!has(self.subnets) || !has(self.mtu) || !self.subnets.exists_one(i, isCIDR(i.cidr) && cidr(i.cidr).ip().family() == 6) || self.mtu >= 1280", message="MTU should be greater than or equal to 1280 when IPv6 subnet is used"
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.subnets) || oldSelf.subnets.all(old, self.subnets.exists(new, new.cidr == old.cidr))", message="Removing existing subnets is not allowed"
// +kubebuilder:validation:XValidation:rule="!has(self.subnets) || self.subnets.size() == 1 || !self.subnets.exists(i, self.subnets.exists(j, i != j && cidr(i.cidr).containsCIDR(j.cidr)))", message="Subnets must not overlap or contain each other"
// +kubebuilder:validation:XValidation:rule="!has(self.subnets) || self.subnets.size() == 1 || !self.subnets.exists(i, self.subnets.filter(j, j.cidr == i.cidr).size() > 1)", message="Subnets with same CIDR are not allowed"
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.subnets) || oldSelf.subnets.all(old, self.subnets.exists(new, new.cidr == old.cidr && (!has(old.hostSubnet) && !has(new.hostSubnet) || has(old.hostSubnet) && has(new.hostSubnet) && old.hostSubnet == new.hostSubnet)))", message="hostSubnet is immutable"
// +kubebuilder:validation:XValidation:rule="!has(self.subnets) || self.subnets.size() == 1 || self.subnets.all(i, self.subnets.all(j, cidr(i.cidr).ip().family() != cidr(j.cidr).ip().family() || (has(i.hostSubnet) == has(j.hostSubnet) && (!has(i.hostSubnet) || i.hostSubnet == j.hostSubnet))))", message="Subnets from the same IP family must use the same hostSubnet value"
type Layer3Config struct {
	// Role is Primary (every pod of the namespace) or Secondary (on request).
	// +kubebuilder:validation:Enum=Primary;Secondary
	// +kubebuilder:validation:XValidation:rule="self == oldSelf", message="role is immutable"
	// +required
	Role NetworkRole `json:"role"`

	// MTU of the network; the cluster default when unset.
	// +kubebuilder:validation:Minimum=576
	// +kubebuilder:validation:Maximum=65536
	// +kubebuilder:validation:XValidation:rule="self == oldSelf", message="mtu is immutable"
	// +optional
	MTU int32 `json:"mtu,omitempty"`

	// Subnets are split into one smaller subnet per node.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=400
	// +listType=atomic
	// +required
	Subnets []Layer3Subnet `json:"subnets,omitempty"`

	// JoinSubnets link the network's router to the node (Primary only).
	// +kubebuilder:validation:XValidation:rule="self == oldSelf", message="joinSubnets is immutable"
	// +optional
	JoinSubnets DualStackCIDRs `json:"joinSubnets,omitempty"`
}

// Layer3Subnet is a cluster subnet and the size of each node's share of it.
// +kubebuilder:validation:XValidation:rule="!has(self.hostSubnet) || !isCIDR(self.cidr) || self.hostSubnet > cidr(self.cidr).prefixLength()", message="HostSubnet must be smaller than CIDR subnet"
// +kubebuilder:validation:XValidation:rule="!has(self.hostSubnet) || !isCIDR(self.cidr) || (cidr(self.cidr).ip().family() != 4 || self.hostSubnet < 32)", message="HostSubnet must < 32 for ipv4 CIDR"
type Layer3Subnet struct {
	// CIDR is the cluster-wide subnet.
	// +required
	CIDR CIDR `json:"cidr,omitempty"`

	// HostSubnet is the prefix length of each node's subnet.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=127
	// +optional
	HostSubnet int32 `json:"hostSubnet,omitempty"`
}

// Layer2Config configures a Layer2 network: one segment across all nodes.
// +kubebuilder:validation:XValidation:rule="has(self.ipam) && has(self.ipam.mode) && self.ipam.mode != 'Enabled' || has(self.subnets)", message="Subnets is required with ipam.mode is Enabled or unset"
// +kubebuilder:validation:XValidation:rule="!has(self.ipam) || !has(self.ipam.mode) || self.ipam.mode != 'Disabled' || !has(self.subnets)", message="Subnets must be unset when ipam.mode is Disabled"
// +kubebuilder:validation:XValidation:rule="!has(self.ipam) || !has(self.ipam.mode) || self.ipam.mode != 'Disabled' || self.role == 'Secondary'", message="Disabled ipam.mode is only supported for Secondary network"
// +kubebuilder:validation:XValidation:rule="!has(self.joinSubnets) || has(self.role) && self.role == 'Primary'", message="JoinSubnets is only supported for Primary network"
// +kubebuilder:validation:XValidation:rule="!has(self.subnets) || !has(self.mtu) || !self.subnets.exists_one(i, isCIDR(i) && cidr(i).ip().family() == 6) || self.mtu >= 1280", message="MTU should be greater than or equal to 1280 when IPv6 subnet is used"
// +kubebuilder:validation:XValidation:rule="!has(self.defaultGatewayIPs) || has(self.role) && self.role == 'Primary'", message="defaultGatewayIPs is only supported for Primary network"
// +kubebuilder:validation:XValidation:rule="!has(self.defaultGatewayIPs) || self.defaultGatewayIPs.all(ip, self.subnets.exists(subnet, cidr(subnet).containsIP(ip)))", message="defaultGatewayIPs must belong to one of the subnets specified in the subnets field"
// +kubebuilder:validation:XValidation:rule="!has(self.defaultGatewayIPs) || size(self.defaultGatewayIPs) == size(self.subnets)", message="defaultGatewayIPs must be specified for all IP families"
// +kubebuilder:validation:XValidation:rule="!has(self.reservedSubnets) || has(self.subnets)", message="reservedSubnets must be unset when subnets is unset"
// +kubebuilder:validation:XValidation:rule="!has(self.reservedSubnets) || has(self.role) && self.role == 'Primary'", message="reservedSubnets is only supported for Primary network"
// +kubebuilder:validation:XValidation:rule="!has(self.infrastructureSubnets) || has(self.subnets)", message="infrastructureSubnets must be unset when subnets is unset"
// +kubebuilder:validation:XValidation:rule="!has(self.infrastructureSubnets) || has(self.role) && self.role == 'Primary'", message="infrastructureSubnets is only supported for Primary network"
// +kubebuilder:validation:XValidation:rule="!has(self.infrastructureSubnets) || !has(self.defaultGatewayIPs) || self.defaultGatewayIPs.all(ip, self.infrastructureSubnets.exists(subnet, cidr(subnet).containsIP(ip)))", message="defaultGatewayIPs have to belong to infrastructureSubnets"
// +kubebuilder:validation:XValidation:rule="!has(self.reservedSubnets) || self.reservedSubnets.all(e, self.subnets.exists(s, cidr(s).containsCIDR(cidr(e))))",message="reservedSubnets must be subnetworks of the networks specified in the subnets field",fieldPath=".reservedSubnets"
// +kubebuilder:validation:XValidation:rule="!has(self.infrastructureSubnets) || self.infrastructureSubnets.all(e, self.subnets.exists(s, cidr(s).containsCIDR(cidr(e))))",message="infrastructureSubnets must be subnetworks of the networks specified in the subnets field",fieldPath=".infrastructureSubnets"
// +kubebuilder:validation:XValidation:rule="!has(self.infrastructureSubnets) || !has(self.reservedSubnets) || self.infrastructureSubnets.all(infra, !self.reservedSubnets.exists(reserved, cidr(infra).containsCIDR(reserved) || cidr(reserved).containsCIDR(infra)))", message="infrastructureSubnets and reservedSubnets must not overlap"
// +kubebuilder:validation:XValidation:rule="!has(self.infrastructureSubnets) || self.infrastructureSubnets.all(s, isCIDR(s) && cidr(s) == cidr(s).masked())", message="infrastructureSubnets must be a masked network address (no host bits set)"
// +kubebuilder:validation:XValidation:rule="!has(self.reservedSubnets) || self.reservedSubnets.all(s, isCIDR(s) && cidr(s) == cidr(s).masked())", message="reservedSubnets must be a masked network address (no host bits set)"
type Layer2Config struct {
	// Role is Primary (every pod of the namespace) or Secondary (on request).
	// +kubebuilder:validation:Enum=Primary;Secondary
	// +required
	Role NetworkRole `json:"role"`

	// MTU of the network; the cluster default when unset.
	// +kubebuilder:validation:Minimum=576
	// +kubebuilder:validation:Maximum=65536
	// +optional
	MTU int32 `json:"mtu,omitempty"`

	// Subnets pods get their IPs from; unset only when ipam.mode is Disabled.
	// +optional
	Subnets DualStackCIDRs `json:"subnets,omitempty"`

	// ReservedSubnets are kept out of automatic allocation; static requests
	// may still use them.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=25
	// +optional
	ReservedSubnets []CIDR `json:"reservedSubnets,omitempty"`

	// InfrastructureSubnets hold the gateway and management addresses.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=4
	// +optional
	InfrastructureSubnets []CIDR `json:"infrastructureSubnets,omitempty"`

	// DefaultGatewayIPs override the gateway address (.1 by default).
	// +optional
	DefaultGatewayIPs DualStackIPs `json:"defaultGatewayIPs,omitempty"`

	// JoinSubnets link the network's router to the node (Primary only).
	// +optional
	JoinSubnets DualStackCIDRs `json:"joinSubnets,omitempty"`

	// IPAM configures address management on the network.
	// +optional
	IPAM *IPAMConfig `json:"ipam,omitempty"`
}

// IPAMConfig configures address management.
// +kubebuilder:validation:XValidation:rule="!has(self.lifecycle) || self.lifecycle != 'Persistent' || !has(self.mode) || self.mode == 'Enabled'", message="lifecycle Persistent is only supported when ipam.mode is Enabled"
// +kubebuilder:validation:MinProperties=1
type IPAMConfig struct {
	// Mode is Enabled (default) or Disabled (MACs only, pure L2).
	// +optional
	Mode IPAMMode `json:"mode,omitempty"`

	// Lifecycle Persistent keeps IPs in IPAMClaims across VM restarts and
	// live migrations.
	// +optional
	Lifecycle NetworkIPAMLifecycle `json:"lifecycle,omitempty"`
}

// LocalnetConfig configures a network bridged onto a physical network.
// +kubebuilder:validation:XValidation:rule="!has(self.ipam) || !has(self.ipam.mode) || self.ipam.mode == 'Enabled' ? has(self.subnets) : !has(self.subnets)", message="Subnets is required with ipam.mode is Enabled or unset, and forbidden otherwise"
// +kubebuilder:validation:XValidation:rule="!has(self.excludeSubnets) || has(self.subnets)", message="excludeSubnets must be unset when subnets is unset"
// +kubebuilder:validation:XValidation:rule="!has(self.subnets) || !has(self.mtu) || !self.subnets.exists_one(i, isCIDR(i) && cidr(i).ip().family() == 6) || self.mtu >= 1280", message="MTU should be greater than or equal to 1280 when an IPv6 subnet is used"
type LocalnetConfig struct {
	// Role must be Secondary.
	// +kubebuilder:validation:Enum=Secondary
	// +required
	Role NetworkRole `json:"role"`

	// PhysicalNetworkName names the node's bridge mapping for this network.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="self.matches('^[^,:]+$')", message="physicalNetworkName cannot contain `,` or `:` characters"
	// +required
	PhysicalNetworkName string `json:"physicalNetworkName"`

	// Subnets pods get their IPs from.
	// +optional
	Subnets DualStackCIDRs `json:"subnets,omitempty"`

	// ExcludeSubnets are never assigned (e.g. addresses used by routers on the
	// physical network).
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=25
	// +optional
	ExcludeSubnets []CIDR `json:"excludeSubnets,omitempty"`

	// IPAM configures address management on the network.
	// +optional
	IPAM *IPAMConfig `json:"ipam,omitempty"`

	// MTU of the network; 1500 when unset.
	// +kubebuilder:validation:Minimum=576
	// +kubebuilder:validation:Maximum=65536
	// +optional
	MTU int32 `json:"mtu,omitempty"`

	// VLAN configures the network's VLAN on the physical network.
	// +optional
	VLAN *VLANConfig `json:"vlan,omitempty"`
}

// VLANMode is how pods attach to the VLAN.
// +kubebuilder:validation:Enum=Access
type VLANMode string

// VLANModeAccess puts pod ports in access mode on one VLAN.
const VLANModeAccess VLANMode = "Access"

// VLANConfig is a network's VLAN configuration.
// +kubebuilder:validation:XValidation:rule="has(self.mode) && self.mode == 'Access' ? has(self.access): !has(self.access)", message="vlan access config is required when vlan mode is 'Access', and forbidden otherwise"
type VLANConfig struct {
	// Mode is the VLAN mode; only Access.
	// +required
	Mode VLANMode `json:"mode"`

	// Access is the access VLAN configuration.
	// +optional
	Access *AccessVLANConfig `json:"access,omitempty"`
}

// AccessVLANConfig is an access VLAN.
type AccessVLANConfig struct {
	// ID is the VLAN ID.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=4094
	// +required
	ID int32 `json:"id"`
}
