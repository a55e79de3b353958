// Package netconf is the CNI network configuration of kvnet networks: the
// JSON a NetworkAttachmentDefinition carries in spec.config, as rendered by
// the UDN controller and read by the allocator, the node agent and the CNI
// plugin.
//
// The keys are OVN-Kubernetes' (so tooling that reads NADs keeps working),
// except that "type" is "kvnet-cni". List values are comma-joined strings, as
// upstream renders them.
package netconf

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"strings"
)

// PluginType is the CNI "type" of kvnet networks.
const PluginType = "kvnet-cni"

// CNIVersion is the CNI specification version kvnet renders.
const CNIVersion = "1.1.0"

// Topologies as rendered (lowercase).
const (
	TopologyLayer2   = "layer2"
	TopologyLayer3   = "layer3"
	TopologyLocalnet = "localnet"
)

// Roles as rendered (lowercase).
const (
	RolePrimary   = "primary"
	RoleSecondary = "secondary"
)

// ErrInvalid marks a configuration that cannot be used; the message names
// the field and value.
var ErrInvalid = errors.New("invalid network configuration")

// NetConf is a kvnet network's CNI configuration.
type NetConf struct {
	CNIVersion            string `json:"cniVersion,omitempty"`
	Type                  string `json:"type"`
	Name                  string `json:"name"`
	NADName               string `json:"netAttachDefName,omitempty"`
	Topology              string `json:"topology,omitempty"`
	Role                  string `json:"role,omitempty"`
	MTU                   int    `json:"mtu,omitempty"`
	Subnets               string `json:"subnets,omitempty"`
	ExcludeSubnets        string `json:"excludeSubnets,omitempty"`
	ReservedSubnets       string `json:"reservedSubnets,omitempty"`
	InfrastructureSubnets string `json:"infrastructureSubnets,omitempty"`
	DefaultGatewayIPs     string `json:"defaultGatewayIPs,omitempty"`
	JoinSubnet            string `json:"joinSubnet,omitempty"`
	TransitSubnet         string `json:"transitSubnet,omitempty"`
	AllowPersistentIPs    bool   `json:"allowPersistentIPs,omitempty"`
	PhysicalNetworkName   string `json:"physicalNetworkName,omitempty"`
	VLANID                int    `json:"vlanID,omitempty"`
}

// Marshal renders the configuration as the JSON stored in a NAD.
func (c *NetConf) Marshal() (string, error) {
	b, err := json.Marshal(c)
	if err != nil {
		return "", fmt.Errorf("marshal network configuration %q: %w", c.Name, err)
	}
	return string(b), nil
}

// IsPrimary reports whether the network is a primary network.
func (c *NetConf) IsPrimary() bool { return c.Role == RolePrimary }

// Parse reads a NAD's spec.config. It returns (nil, nil) when the
// configuration is valid JSON of another CNI type, so callers can skip
// foreign NADs; a kvnet configuration with a bad field is an error wrapping
// ErrInvalid that names the field and value.
func Parse(config string) (*NetConf, error) {
	var probe struct {
		Type string `json:"type"`
	}
	if err := json.Unmarshal([]byte(config), &probe); err != nil {
		return nil, fmt.Errorf("%w: spec.config is not a JSON object: %v", ErrInvalid, err)
	}
	if probe.Type != PluginType {
		return nil, nil
	}
	var c NetConf
	if err := json.Unmarshal([]byte(config), &c); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if c.Topology == TopologyLocalnet && c.PhysicalNetworkName == "" {
		// As OVN-Kubernetes: a localnet network that names no physical
		// network is attached to the one of its own name.
		c.PhysicalNetworkName = c.Name
	}
	return &c, nil
}

// Validate checks every field that kvnet interprets.
func (c *NetConf) Validate() error {
	if c.Name == "" {
		return fmt.Errorf("%w: \"name\" must be set", ErrInvalid)
	}
	switch c.Topology {
	case TopologyLayer2, TopologyLayer3, TopologyLocalnet:
	default:
		return fmt.Errorf("%w: \"topology\" %q: must be layer2, layer3 or localnet", ErrInvalid, c.Topology)
	}
	switch c.Role {
	case "", RolePrimary, RoleSecondary:
	default:
		return fmt.Errorf("%w: \"role\" %q: must be primary or secondary", ErrInvalid, c.Role)
	}
	if c.MTU < 0 || c.MTU > 65536 {
		return fmt.Errorf("%w: \"mtu\" %d: must be between 0 and 65536", ErrInvalid, c.MTU)
	}
	if c.VLANID < 0 || c.VLANID > 4094 {
		return fmt.Errorf("%w: \"vlanID\" %d: must be between 1 and 4094", ErrInvalid, c.VLANID)
	}
	for _, f := range []struct{ key, val string }{
		{"subnets", c.Subnets}, {"excludeSubnets", c.ExcludeSubnets},
		{"reservedSubnets", c.ReservedSubnets}, {"infrastructureSubnets", c.InfrastructureSubnets},
		{"joinSubnet", c.JoinSubnet}, {"transitSubnet", c.TransitSubnet},
	} {
		if c.Topology == TopologyLayer3 && f.key == "subnets" {
			if _, err := ParseLayer3Subnets(f.val); err != nil {
				return err
			}
			continue
		}
		if _, err := ParsePrefixes(f.key, f.val); err != nil {
			return err
		}
	}
	if _, err := ParseAddrs("defaultGatewayIPs", c.DefaultGatewayIPs); err != nil {
		return err
	}
	if c.AllowPersistentIPs && c.Subnets == "" {
		return fmt.Errorf("%w: \"allowPersistentIPs\" needs \"subnets\"", ErrInvalid)
	}
	return nil
}

// ParsePrefixes parses a comma-joined list of CIDRs. key names the field in
// errors. An empty string is an empty list.
func ParsePrefixes(key, list string) ([]netip.Prefix, error) {
	if list == "" {
		return nil, nil
	}
	var out []netip.Prefix
	for s := range strings.SplitSeq(list, ",") {
		p, err := netip.ParsePrefix(strings.TrimSpace(s))
		if err != nil {
			return nil, fmt.Errorf("%w: %q value %q: %v", ErrInvalid, key, s, err)
		}
		out = append(out, p)
	}
	return out, nil
}

// ParseAddrs parses a comma-joined list of IPs.
func ParseAddrs(key, list string) ([]netip.Addr, error) {
	if list == "" {
		return nil, nil
	}
	var out []netip.Addr
	for s := range strings.SplitSeq(list, ",") {
		a, err := netip.ParseAddr(strings.TrimSpace(s))
		if err != nil {
			return nil, fmt.Errorf("%w: %q value %q: %v", ErrInvalid, key, s, err)
		}
		out = append(out, a)
	}
	return out, nil
}

// Layer3Subnet is a cluster subnet and its per-node prefix length (0: unset).
type Layer3Subnet struct {
	CIDR       netip.Prefix
	HostSubnet int
}

// ParseLayer3Subnets parses Layer3 "cidr[/hostSubnet]" lists such as
// "10.100.0.0/16/24,fd00::/48".
func ParseLayer3Subnets(list string) ([]Layer3Subnet, error) {
	if list == "" {
		return nil, nil
	}
	var out []Layer3Subnet
	for s := range strings.SplitSeq(list, ",") {
		s = strings.TrimSpace(s)
		cidr, host := s, 0
		if i := strings.LastIndex(s, "/"); i > 0 && strings.Count(s, "/") == 2 {
			cidr = s[:i]
			if _, err := fmt.Sscanf(s[i+1:], "%d", &host); err != nil || host < 1 || host > 127 {
				return nil, fmt.Errorf("%w: \"subnets\" value %q: bad host subnet length", ErrInvalid, s)
			}
		}
		p, err := netip.ParsePrefix(cidr)
		if err != nil {
			return nil, fmt.Errorf("%w: \"subnets\" value %q: %v", ErrInvalid, s, err)
		}
		out = append(out, Layer3Subnet{CIDR: p, HostSubnet: host})
	}
	return out, nil
}

// LocalnetDefaultMTU is the MTU of a localnet network that sets none: the
// physical network's usual 1500, not the tunnel MTU of overlay networks.
const LocalnetDefaultMTU = 1500
