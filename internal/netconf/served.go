package netconf

import (
	"encoding/json"
	"fmt"
)

// IPAMType is the CNI IPAM "type" that hands an attachment's addresses to
// kvnet's central allocator, inside a NAD of another plugin (bridge,
// macvlan...): e.g. a dedicated live-migration network.
const IPAMType = "kvnet-ipam"

// IPAMConf is an "ipam" section of type kvnet-ipam. Lists are
// comma-joined, as in kvnet-cni configurations.
type IPAMConf struct {
	Type string `json:"type"`
	// Subnets to allocate from: one IPv4 and/or one IPv6 CIDR.
	Subnets string `json:"subnets"`
	// ExcludeSubnets are never handed out (routers, static hosts).
	ExcludeSubnets string `json:"excludeSubnets,omitempty"`
	// GatewayIPs are reported to the pod (and excluded); no default route
	// is added through them.
	GatewayIPs string `json:"gatewayIPs,omitempty"`
	// AllowPersistentIPs lets IPAMClaims hold this network's IPs.
	AllowPersistentIPs bool `json:"allowPersistentIPs,omitempty"`
}

// OVNOverlayType is OVN-Kubernetes' CNI type for its networks (the NADs
// it renders for UDNs, and hand-written secondary networks). A NAD written
// for OVN-Kubernetes carries it; kvnet serves the same configuration as
// PluginType, whose fields it shares.
const OVNOverlayType = "ovn-k8s-cni-overlay"

// ForeignOverlay reports whether a NAD's spec.config is an
// OVN-Kubernetes network (type OVNOverlayType, alone or first in a list)
// that kvnet could serve with only its type changed.
func ForeignOverlay(config string) bool {
	var top struct {
		Type    string `json:"type"`
		Plugins []struct {
			Type string `json:"type"`
		} `json:"plugins"`
	}
	if json.Unmarshal([]byte(config), &top) != nil {
		return false
	}
	if len(top.Plugins) > 0 {
		return top.Plugins[0].Type == OVNOverlayType
	}
	return top.Type == OVNOverlayType
}

// Served is a NAD configuration kvnet allocates for: either a kvnet-cni
// network (Conf) or another plugin with kvnet-ipam (IPAM).
type Served struct {
	// Name is the network name (the configuration's "name").
	Name string
	// Conf is set for kvnet-cni networks.
	Conf *NetConf
	// IPAM and Plugin are set for kvnet-ipam attachments.
	IPAM   *IPAMConf
	Plugin string
}

// AllowsPersistentIPs reports whether IPAMClaims may hold the network's IPs.
func (s *Served) AllowsPersistentIPs() bool {
	if s.Conf != nil {
		return s.Conf.AllowPersistentIPs && s.Conf.Subnets != "" &&
			(s.Conf.Topology == TopologyLayer2 || s.Conf.Topology == TopologyLocalnet)
	}
	return s.IPAM != nil && s.IPAM.AllowPersistentIPs
}

// IsPrimary reports whether the network is a primary network.
func (s *Served) IsPrimary() bool { return s.Conf != nil && s.Conf.IsPrimary() }

// ParseServed reads a NAD's spec.config and returns what kvnet must
// allocate for it, or (nil, nil) for a NAD kvnet does not serve. Both
// single configurations and configuration lists ("plugins") are read; for a
// list, the first plugin with an ipam section counts.
func ParseServed(config string) (*Served, error) {
	var top struct {
		Name    string            `json:"name"`
		Type    string            `json:"type"`
		IPAM    json.RawMessage   `json:"ipam"`
		Plugins []json.RawMessage `json:"plugins"`
	}
	if err := json.Unmarshal([]byte(config), &top); err != nil {
		return nil, fmt.Errorf("%w: spec.config is not a JSON object: %v", ErrInvalid, err)
	}
	if top.Type == PluginType {
		c, err := Parse(config)
		if err != nil {
			return nil, err
		}
		return &Served{Name: c.Name, Conf: c}, nil
	}
	plugin, ipam := top.Type, top.IPAM
	for i, raw := range top.Plugins {
		var p struct {
			Type string          `json:"type"`
			IPAM json.RawMessage `json:"ipam"`
		}
		if err := json.Unmarshal(raw, &p); err != nil {
			return nil, fmt.Errorf("%w: plugins[%d] is not a JSON object: %v", ErrInvalid, i, err)
		}
		if len(p.IPAM) > 0 && len(ipam) == 0 {
			plugin, ipam = p.Type, p.IPAM
		}
	}
	if len(ipam) == 0 {
		return nil, nil
	}
	var probe struct {
		Type string `json:"type"`
	}
	if err := json.Unmarshal(ipam, &probe); err != nil || probe.Type != IPAMType {
		return nil, nil //nolint:nilerr // an ipam section of another type is not ours
	}
	var ic IPAMConf
	if err := json.Unmarshal(ipam, &ic); err != nil {
		return nil, fmt.Errorf("%w: ipam: %v", ErrInvalid, err)
	}
	if top.Name == "" {
		return nil, fmt.Errorf("%w: \"name\" must be set for kvnet-ipam", ErrInvalid)
	}
	subnets, err := ParsePrefixes("ipam.subnets", ic.Subnets)
	if err != nil {
		return nil, err
	}
	if len(subnets) == 0 {
		return nil, fmt.Errorf("%w: \"ipam.subnets\" must be set for kvnet-ipam", ErrInvalid)
	}
	if _, err := ParsePrefixes("ipam.excludeSubnets", ic.ExcludeSubnets); err != nil {
		return nil, err
	}
	if _, err := ParseAddrs("ipam.gatewayIPs", ic.GatewayIPs); err != nil {
		return nil, err
	}
	return &Served{Name: top.Name, IPAM: &ic, Plugin: plugin}, nil
}
