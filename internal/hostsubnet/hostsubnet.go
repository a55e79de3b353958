// Package hostsubnet hands out the per-node subnets of Layer3 networks.
//
// A Layer3 network's cluster subnets (e.g. 10.100.0.0/16 with hostSubnet
// 24) are cut into host subnets, one per node and cluster subnet, as
// OVN-Kubernetes' cluster manager does. Pods get addresses from their
// node's host subnet, with the node's router (the host subnet's first
// address) as gateway, and nodes route between host subnets.
//
// kvnet-controller publishes the assignment in one node annotation,
// Annotation, which every node and the allocator read; it is the only
// record, so assignments survive controller restarts. Assign is the pure
// planning function; Parse and Format read and write the annotation.
package hostsubnet

import (
	"cmp"
	"encoding/json"
	"fmt"
	"math/big"
	"net/netip"
	"slices"
	"strings"

	"kvnet.io/kvnet/internal/netconf"
)

// Annotation holds a node's host subnets: a JSON object from network name
// to the node's host subnets of that network, in the order of the
// network's cluster subnets, e.g.
// {"tenant-a_udn":["10.100.3.0/24","fd00:10:100:3::/64"]}.
const Annotation = "kvnet.io/node-subnets"

// Default host subnet lengths when a Layer3 subnet sets none, as upstream.
const (
	DefaultHostBits4 = 24
	DefaultHostBits6 = 64
)

// Subnets is one node's annotation: network name -> host subnets.
type Subnets map[string][]netip.Prefix

// HostBits returns the prefix length of s's host subnets.
func HostBits(s netconf.Layer3Subnet) int {
	switch {
	case s.HostSubnet > 0:
		return s.HostSubnet
	case s.CIDR.Addr().Is4():
		return DefaultHostBits4
	default:
		return DefaultHostBits6
	}
}

// Network is a Layer3 network to plan for.
type Network struct {
	Name    string
	Subnets []netconf.Layer3Subnet
	// Nodes, when not nil, are the only nodes that get host subnets of
	// the network (dynamic allocation: the nodes that use it); the others
	// drop theirs, which are then free. Nil: every node.
	Nodes map[string]bool
}

// wants reports whether node should hold host subnets of n.
func (n Network) wants(node string) bool { return n.Nodes == nil || n.Nodes[node] }

// Validate reports whether n's subnets can be cut into host subnets; the
// error names the network, subnet and length.
func (n Network) Validate() error {
	if len(n.Subnets) == 0 {
		return fmt.Errorf("network %q: no subnets", n.Name)
	}
	for _, s := range n.Subnets {
		bits := HostBits(s)
		if !s.CIDR.IsValid() || s.CIDR != s.CIDR.Masked() {
			return fmt.Errorf("network %q: subnet %q is not a network prefix", n.Name, s.CIDR)
		}
		if bits <= s.CIDR.Bits() || bits > s.CIDR.Addr().BitLen() || (s.CIDR.Addr().Is4() && bits >= 32) {
			return fmt.Errorf("network %q: subnet %q: host subnet length /%d must be longer than /%d and shorter than a single address",
				n.Name, s.CIDR, bits, s.CIDR.Bits())
		}
	}
	return nil
}

// HostSubnetOf returns the host subnet of n holding addr, if any.
func (n Network) HostSubnetOf(addr netip.Addr) (netip.Prefix, bool) {
	for _, s := range n.Subnets {
		if s.CIDR.Contains(addr) {
			p, err := addr.Prefix(HostBits(s))
			return p, err == nil
		}
	}
	return netip.Prefix{}, false
}

// Parse reads a node's Annotation value. Every prefix must be a valid
// network prefix; the error names the network and value.
func Parse(v string) (Subnets, error) {
	var raw map[string][]string
	if err := json.Unmarshal([]byte(v), &raw); err != nil {
		return nil, fmt.Errorf("annotation %s: %w", Annotation, err)
	}
	out := make(Subnets, len(raw))
	for name, list := range raw {
		if name == "" {
			return nil, fmt.Errorf("annotation %s: empty network name", Annotation)
		}
		ps := make([]netip.Prefix, 0, len(list))
		for _, s := range list {
			p, err := netip.ParsePrefix(s)
			if err != nil || p != p.Masked() {
				return nil, fmt.Errorf("annotation %s: network %q: %q is not a network prefix", Annotation, name, s)
			}
			ps = append(ps, p)
		}
		out[name] = ps
	}
	return out, nil
}

// Format writes s as an Annotation value ("" for no networks); keys are
// sorted, so equal assignments give equal strings.
func Format(s Subnets) string {
	if len(s) == 0 {
		return ""
	}
	raw := make(map[string][]string, len(s))
	for name, ps := range s {
		list := make([]string, len(ps))
		for i, p := range ps {
			list[i] = p.String()
		}
		raw[name] = list
	}
	b, _ := json.Marshal(raw) // map keys are sorted by encoding/json
	return string(b)
}

// Node is one node's name and its current annotation (nil: none or
// unreadable).
type Node struct {
	Name    string
	Current Subnets
}

// Result is Assign's plan.
type Result struct {
	// Nodes holds every node's new annotation value.
	Nodes map[string]Subnets
	// Problems lists what could not be assigned (an exhausted cluster
	// subnet, an invalid network), each naming network, subnet and node.
	Problems []string
}

// Assign plans every node's host subnets of every network. A node keeps
// the host subnets it holds while they are valid (inside the network's
// cluster subnet, of its host length) and no node before it (by name)
// holds the same; every other node gets the lowest free host subnet of
// each cluster subnet. Networks not listed are dropped from the nodes, and
// so is a network from the nodes its Nodes leaves out.
// A node gets a network only when every cluster subnet of it has a host
// subnet for the node; Problems says which did not.
func Assign(networks []Network, nodes []Node) Result {
	nodes = slices.Clone(nodes)
	slices.SortFunc(nodes, func(a, b Node) int { return cmp.Compare(a.Name, b.Name) })
	res := Result{Nodes: make(map[string]Subnets, len(nodes))}
	for _, n := range nodes {
		res.Nodes[n.Name] = Subnets{}
	}
	for _, nw := range networks {
		if err := nw.Validate(); err != nil {
			res.Problems = append(res.Problems, err.Error())
			continue
		}
		// got[i][node] is the node's host subnet of cluster subnet i.
		got := make([]map[string]netip.Prefix, len(nw.Subnets))
		for i, cs := range nw.Subnets {
			bits := HostBits(cs)
			got[i] = map[string]netip.Prefix{}
			taken := map[netip.Prefix]bool{}
			// Keep what nodes hold.
			for _, n := range nodes {
				cur := n.Current[nw.Name]
				if i >= len(cur) || !nw.wants(n.Name) {
					continue
				}
				p := cur[i]
				if p.Bits() != bits || !cs.CIDR.Contains(p.Addr()) || taken[p] {
					continue
				}
				taken[p] = true
				got[i][n.Name] = p
			}
			// Hand out the lowest free ones to the others.
			next := uint64(0)
			for _, n := range nodes {
				if _, ok := got[i][n.Name]; ok || !nw.wants(n.Name) {
					continue
				}
				for {
					p, ok := nth(cs.CIDR, bits, next)
					if !ok {
						res.Problems = append(res.Problems, fmt.Sprintf(
							"network %q: subnet %q has no free /%d host subnet for node %q", nw.Name, cs.CIDR, bits, n.Name))
						break
					}
					next++
					if !taken[p] {
						taken[p] = true
						got[i][n.Name] = p
						break
					}
				}
			}
		}
		for _, n := range nodes {
			ps := make([]netip.Prefix, 0, len(nw.Subnets))
			for i := range nw.Subnets {
				if p, ok := got[i][n.Name]; ok {
					ps = append(ps, p)
				}
			}
			if len(ps) == len(nw.Subnets) {
				res.Nodes[n.Name][nw.Name] = ps
			}
		}
	}
	slices.Sort(res.Problems)
	return res
}

// nth returns the k-th host subnet of length bits inside cidr, and false
// past the last.
func nth(cidr netip.Prefix, bits int, k uint64) (netip.Prefix, bool) {
	width := bits - cidr.Bits()
	if width < 64 && k >= uint64(1)<<width {
		return netip.Prefix{}, false
	}
	a := cidr.Addr()
	n := new(big.Int).SetBytes(a.AsSlice())
	off := new(big.Int).Lsh(new(big.Int).SetUint64(k), uint(a.BitLen()-bits))
	n.Add(n, off)
	buf := make([]byte, a.BitLen()/8)
	n.FillBytes(buf)
	addr, _ := netip.AddrFromSlice(buf)
	if a.Is4() {
		addr = addr.Unmap()
	}
	return netip.PrefixFrom(addr, bits), true
}

// Equal reports whether two annotations hold the same assignment.
func Equal(a, b Subnets) bool {
	return Format(a) == Format(b)
}

// String is the annotation value, for logs.
func (s Subnets) String() string { return strings.TrimSpace(Format(s)) }

// Gateway is the node router's address in host subnet p: its first
// address after the network address.
func Gateway(p netip.Prefix) netip.Addr { return p.Masked().Addr().Next() }

// FromConf returns the Layer3 network a kvnet-cni configuration describes.
func FromConf(c *netconf.NetConf) (Network, error) {
	if c.Topology != netconf.TopologyLayer3 {
		return Network{}, fmt.Errorf("network %q: topology %q is not layer3", c.Name, c.Topology)
	}
	subs, err := netconf.ParseLayer3Subnets(c.Subnets)
	if err != nil {
		return Network{}, fmt.Errorf("network %q: %w", c.Name, err)
	}
	n := Network{Name: c.Name, Subnets: subs}
	return n, n.Validate()
}
