package udn

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	udnv1 "kvnet.io/kvnet/api/udn/v1"
	"kvnet.io/kvnet/internal/netconf"
	"kvnet.io/kvnet/internal/reserved"
)

// Well-known names shared with OVN-Kubernetes.
const (
	// Finalizer protects UDNs, CUDNs and their NADs while pods use them.
	Finalizer = "k8s.ovn.org/user-defined-network-protection"
	// NADLabel marks NADs rendered from a UDN or CUDN.
	NADLabel = "k8s.ovn.org/user-defined-network"
	// PrimaryNamespaceLabel must be on a namespace, from its creation, for a
	// primary network to serve it.
	PrimaryNamespaceLabel = "k8s.ovn.org/primary-user-defined-network"
	// NetworkIDAnnotation holds a network's ID (1..MaxNetworkID) on its NADs.
	NetworkIDAnnotation = "k8s.ovn.org/network-id"
	// NetworkNameAnnotation holds the network name on its NADs.
	NetworkNameAnnotation = "k8s.ovn.org/network-name"
	// PoolExhaustedAnnotation is set to "true" on a network's NADs by
	// kvnet-controller while pods wait for a free address of it; kvnet-node
	// reports the network to kvnet-cni's STATUS verb. Kept on update.
	PoolExhaustedAnnotation = "kvnet.io/pool-exhausted"
	// NotServedAnnotation on a hand-written NAD says why kvnet does not
	// serve it and what to change (an OVN-Kubernetes NAD, type
	// ovn-k8s-cni-overlay); it goes when the NAD changes.
	NotServedAnnotation = "kvnet.io/not-served"
	// NetworkConflictAnnotation on a hand-written NAD says that it names a
	// network an earlier NAD defines differently, and how: kvnet serves
	// the network as the earlier NAD has it and no pod gets an interface
	// from this one (as OVN-Kubernetes, which requires NADs naming one
	// network to agree). It goes when the NAD agrees again.
	NetworkConflictAnnotation = "kvnet.io/network-conflict"
	// reservedAnnotationPrefix: CR annotations with this prefix are not
	// copied to NADs, and NAD annotations with it are kept on update.
	reservedAnnotationPrefix = "k8s.ovn.org/"
)

// LocalnetDefaultMTU is the MTU of a localnet network that sets none: the
// physical network's usual 1500.
const LocalnetDefaultMTU = netconf.LocalnetDefaultMTU

// NetworkName is the network name of UserDefinedNetwork ns/name.
func NetworkName(namespace, name string) string { return namespace + "_" + name }

// ClusterNetworkName is the network name of ClusterUserDefinedNetwork name.
func ClusterNetworkName(name string) string { return "cluster_udn_" + name }

// Spec is the network part shared by UDNs and CUDNs.
type Spec struct {
	Topology udnv1.NetworkTopology
	Layer2   *udnv1.Layer2Config
	Layer3   *udnv1.Layer3Config
	Localnet *udnv1.LocalnetConfig
}

// SpecOfUDN returns the network spec of a UDN.
func SpecOfUDN(u *udnv1.UserDefinedNetwork) Spec {
	return Spec{Topology: u.Spec.Topology, Layer2: u.Spec.Layer2, Layer3: u.Spec.Layer3}
}

// SpecOfCUDN returns the network spec of a CUDN.
func SpecOfCUDN(c *udnv1.ClusterUserDefinedNetwork) Spec {
	n := c.Spec.Network
	return Spec{Topology: n.Topology, Layer2: n.Layer2, Layer3: n.Layer3, Localnet: n.Localnet}
}

// IsPrimary reports whether the spec is a primary network.
func (s Spec) IsPrimary() bool {
	switch {
	case s.Layer2 != nil:
		return s.Layer2.Role == udnv1.NetworkRolePrimary
	case s.Layer3 != nil:
		return s.Layer3.Role == udnv1.NetworkRolePrimary
	}
	return false
}

// Render returns the CNI configuration of a network. netName is the network
// name, nadKey the NAD's "<namespace>/<name>". Errors name the field and
// value. The API server's validation of UDNs and CUDNs already rejects
// most bad specs; Render checks again what it relies on, so that a spec
// that slipped through is refused rather than rendered into a different
// network.
//
// Render uses the default reserved subnets; RenderReserved the cluster's.
func Render(s Spec, netName, nadKey string) (*netconf.NetConf, error) {
	return RenderReserved(s, netName, nadKey, reserved.Default())
}

// RenderReserved is Render with the cluster's reserved subnets r: a
// primary network's default join subnets and its transit subnets come
// from r, and subnets that overlap r are refused (as OVN-Kubernetes
// refuses them, naming both subnets).
func RenderReserved(s Spec, netName, nadKey string, r reserved.Subnets) (*netconf.NetConf, error) {
	c, err := render(s, netName, nadKey, r)
	if err == nil {
		err = checkReserved(c, r)
	}
	if err != nil {
		return nil, fmt.Errorf("render %q: %w", netName, err)
	}
	return c, nil
}

func render(s Spec, netName, nadKey string, r reserved.Subnets) (*netconf.NetConf, error) {
	c := &netconf.NetConf{
		CNIVersion: netconf.CNIVersion,
		Type:       netconf.PluginType,
		Name:       netName,
		NADName:    nadKey,
	}
	switch s.Topology {
	case udnv1.NetworkTopologyLayer2:
		l2 := s.Layer2
		if l2 == nil {
			return nil, errors.New("spec.layer2 is required when topology is Layer2")
		}
		c.Topology = netconf.TopologyLayer2
		role, err := renderRole(l2.Role, udnv1.NetworkRolePrimary, udnv1.NetworkRoleSecondary)
		if err != nil {
			return nil, err
		}
		c.Role = role
		c.MTU = int(l2.MTU)
		var join string
		for _, f := range []struct {
			key  string
			list []udnv1.CIDR
			dst  *string
		}{
			{"subnets", l2.Subnets, &c.Subnets},
			{"reservedSubnets", l2.ReservedSubnets, &c.ReservedSubnets},
			{"infrastructureSubnets", l2.InfrastructureSubnets, &c.InfrastructureSubnets},
			{"joinSubnets", l2.JoinSubnets, &join},
		} {
			if *f.dst, err = joinCIDRs(f.key, f.list); err != nil {
				return nil, err
			}
		}
		if c.DefaultGatewayIPs, err = joinIPs("defaultGatewayIPs", l2.DefaultGatewayIPs); err != nil {
			return nil, err
		}
		if l2.IPAM != nil && l2.IPAM.Lifecycle == udnv1.IPAMLifecyclePersistent {
			c.AllowPersistentIPs = true
		}
		if l2.Role == udnv1.NetworkRolePrimary {
			if len(l2.Subnets) == 0 {
				return nil, errors.New("the subnet attribute must be defined for layer2 primary user defined networks")
			}
			c.JoinSubnet = joinOr(join, r.Join)
			transit, err := transitSubnets(l2.Subnets, l2.JoinSubnets, r)
			if err != nil {
				return nil, err
			}
			c.TransitSubnet = transit
		}
	case udnv1.NetworkTopologyLayer3:
		l3 := s.Layer3
		if l3 == nil {
			return nil, errors.New("spec.layer3 is required when topology is Layer3")
		}
		c.Topology = netconf.TopologyLayer3
		role, err := renderRole(l3.Role, udnv1.NetworkRolePrimary, udnv1.NetworkRoleSecondary)
		if err != nil {
			return nil, err
		}
		c.Role = role
		c.MTU = int(l3.MTU)
		subnets := make([]string, 0, len(l3.Subnets))
		for _, sn := range l3.Subnets {
			if _, err := parseCIDR("subnets", sn.CIDR); err != nil {
				return nil, err
			}
			switch {
			case sn.HostSubnet < 0:
				return nil, fmt.Errorf("\"subnets\" value %q: hostSubnet %d: must be positive", sn.CIDR, sn.HostSubnet)
			case sn.HostSubnet > 0:
				subnets = append(subnets, string(sn.CIDR)+"/"+strconv.Itoa(int(sn.HostSubnet)))
			default:
				subnets = append(subnets, string(sn.CIDR))
			}
		}
		c.Subnets = strings.Join(subnets, ",")
		join, err := joinCIDRs("joinSubnets", l3.JoinSubnets)
		if err != nil {
			return nil, err
		}
		if l3.Role == udnv1.NetworkRolePrimary {
			c.JoinSubnet = joinOr(join, r.Join)
		}
	case udnv1.NetworkTopologyLocalnet:
		ln := s.Localnet
		if ln == nil {
			return nil, errors.New("spec.localnet is required when topology is Localnet")
		}
		c.Topology = netconf.TopologyLocalnet
		role, err := renderRole(ln.Role, udnv1.NetworkRoleSecondary)
		if err != nil {
			return nil, err
		}
		c.Role = role
		c.MTU = int(ln.MTU)
		if c.MTU == 0 {
			c.MTU = LocalnetDefaultMTU
		}
		if c.Subnets, err = joinCIDRs("subnets", ln.Subnets); err != nil {
			return nil, err
		}
		if c.ExcludeSubnets, err = joinCIDRs("excludeSubnets", ln.ExcludeSubnets); err != nil {
			return nil, err
		}
		c.PhysicalNetworkName = ln.PhysicalNetworkName
		if ln.IPAM != nil && ln.IPAM.Lifecycle == udnv1.IPAMLifecyclePersistent {
			c.AllowPersistentIPs = true
		}
		if ln.VLAN != nil && ln.VLAN.Access != nil {
			if id := ln.VLAN.Access.ID; id < 1 || id > 4094 {
				return nil, fmt.Errorf("\"vlan.access.id\" %d: must be between 1 and 4094", id)
			}
			c.VLANID = int(ln.VLAN.Access.ID)
		}
	default:
		return nil, fmt.Errorf("topology %q: must be Layer2, Layer3 or Localnet", s.Topology)
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return c, nil
}

// renderRole returns the rendered (lowercase) role, which must be one of
// allowed.
func renderRole(role udnv1.NetworkRole, allowed ...udnv1.NetworkRole) (string, error) {
	if !slices.Contains(allowed, role) {
		return "", fmt.Errorf("\"role\" %q: must be %s", role, joinRoles(allowed))
	}
	return strings.ToLower(string(role)), nil
}

func joinRoles(l []udnv1.NetworkRole) string {
	s := make([]string, len(l))
	for i, r := range l {
		s[i] = string(r)
	}
	return strings.Join(s, " or ")
}

// transitSubnets returns the default transit subnets, each moved to the next
// free range of its size when it overlaps a subnet or join subnet of the
// network (as OVN-Kubernetes does).
func transitSubnets(subnets, join udnv1.DualStackCIDRs, r reserved.Subnets) (string, error) {
	var taken []netip.Prefix
	for _, f := range []struct {
		key  string
		list udnv1.DualStackCIDRs
	}{{"subnets", subnets}, {"joinSubnets", join}} {
		for _, s := range f.list {
			p, err := parseCIDR(f.key, s)
			if err != nil {
				return "", err
			}
			taken = append(taken, p.Masked())
		}
	}
	if len(join) == 0 {
		taken = append(taken, r.Join...)
	}
	taken = append(taken, r.Masquerade...)
	out := make([]string, 0, len(r.Transit))
	for _, def := range r.Transit {
		p := def
		for tries := 0; ; tries++ {
			q, overlaps := firstOverlap(p, taken)
			if !overlaps {
				break
			}
			// Jump past whichever of the two is larger.
			if q.Bits() > p.Bits() {
				q = p
			}
			next, ok := nextPrefix(q)
			if !ok || tries > 64 {
				return "", fmt.Errorf("no free transit subnet near %s: \"subnets\" and \"joinSubnets\" overlap every candidate", def)
			}
			p = netip.PrefixFrom(next.Addr(), p.Bits())
		}
		out = append(out, p.String())
	}
	return strings.Join(out, ","), nil
}

func firstOverlap(p netip.Prefix, list []netip.Prefix) (netip.Prefix, bool) {
	for _, q := range list {
		if p.Overlaps(q) {
			return q, true
		}
	}
	return netip.Prefix{}, false
}

// nextPrefix returns the prefix of the same length right after p.
func nextPrefix(p netip.Prefix) (netip.Prefix, bool) {
	b := p.Addr().AsSlice()
	bits := p.Bits()
	// Add 1 at bit position bits-1 (counted from the most significant bit).
	idx, bit := (bits-1)/8, 7-uint((bits-1)%8)
	carry := uint16(1) << bit
	for i := idx; i >= 0 && carry > 0; i-- {
		sum := uint16(b[i]) + carry
		b[i] = byte(sum)
		carry = sum >> 8
	}
	if carry > 0 {
		return netip.Prefix{}, false
	}
	a, _ := netip.AddrFromSlice(b)
	return netip.PrefixFrom(a, bits), true
}

// parseCIDR parses one CIDR of spec field key, exactly: the rendered
// configuration joins lists with commas, so an element that is not one
// CIDR by itself (a comma, a space) would render as a different list.
func parseCIDR(key string, c udnv1.CIDR) (netip.Prefix, error) {
	p, err := netip.ParsePrefix(string(c))
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("%q value %q: %w", key, c, err)
	}
	return p, nil
}

// joinCIDRs renders the CIDR list of spec field key.
func joinCIDRs(key string, l []udnv1.CIDR) (string, error) {
	s := make([]string, len(l))
	for i, c := range l {
		if _, err := parseCIDR(key, c); err != nil {
			return "", err
		}
		s[i] = string(c)
	}
	return strings.Join(s, ","), nil
}

// joinIPs renders the IP list of spec field key.
func joinIPs(key string, l []udnv1.IP) (string, error) {
	s := make([]string, len(l))
	for i, ip := range l {
		if _, err := netip.ParseAddr(string(ip)); err != nil {
			return "", fmt.Errorf("%q value %q: %w", key, ip, err)
		}
		s[i] = string(ip)
	}
	return strings.Join(s, ","), nil
}

func joinOr(v string, def []netip.Prefix) string {
	if v != "" {
		return v
	}
	return reserved.Join(def)
}
