package inventory

import (
	"net"
	"net/netip"
	"slices"
	"strings"

	"kvnet.io/kvnet/internal/ipam"
	"kvnet.io/kvnet/internal/ipam/allocator"
	"kvnet.io/kvnet/internal/netconf"
)

// Allocation is one holding of addresses on a network: an attachment of a
// pod that has not completed (from its kvnet.io/pod-networks), or an
// IPAMClaim's IPs that no such pod uses (a stopped VM's).
type Allocation struct {
	Network   string
	NAD       string // "<ns>/<name>"; "" for a claim no pod uses
	Namespace string
	Pod       string // "" for a claim no pod uses
	Node      string
	// VM names the VM (or VMI) of a launcher pod, or of the claim.
	VM    string
	Claim string
	Role  string
	IPs   []netip.Prefix
	MAC   net.HardwareAddr
}

// Allocations returns every allocation, sorted by network, namespace, pod
// and claim.
func (inv *Inventory) Allocations() []Allocation {
	var out []Allocation
	for _, p := range inv.Pods {
		if !p.Live() {
			continue
		}
		for _, a := range p.Attachments {
			vm := p.VM
			if vm == "" && a.Claim != "" {
				if c, ok := inv.claims[p.Namespace+"/"+a.Claim]; ok {
					vm = c.VM
				}
			}
			out = append(out, Allocation{Network: a.Network, NAD: a.NAD, Namespace: p.Namespace, Pod: p.Name, Node: p.Node,
				VM: vm, Claim: a.Claim, Role: a.Role, IPs: a.IPs, MAC: a.MAC})
		}
	}
	for _, c := range inv.Claims {
		if len(c.IPs) == 0 || len(inv.claimPods[c.Key()]) > 0 {
			continue
		}
		out = append(out, Allocation{Network: c.Network, Namespace: c.Namespace, VM: c.VM, Claim: c.Name, IPs: c.IPs})
	}
	slices.SortStableFunc(out, func(a, b Allocation) int {
		for _, d := range [][2]string{{a.Network, b.Network}, {a.Namespace, b.Namespace}, {a.Pod, b.Pod}, {a.Claim, b.Claim}, {a.NAD, b.NAD}} {
			if c := strings.Compare(d[0], d[1]); c != 0 {
				return c
			}
		}
		return 0
	})
	return out
}

// Pool is the use of a network's automatic address pool, as
// kvnet-controller counts it (kvnet_ipam_pool_used, kvnet_ipam_pool_size).
type Pool struct {
	Used, Size int
}

// Pools returns the pool of every network kvnet allocates addresses for,
// by network name. They are computed as kvnet-controller's start-up
// rebuild does: an allocator per network from its NAD, then the IPs of
// every claim, then those of every pod attachment not backed by a claim.
// Networks without subnets (MACs only) have no pool. A Layer3 network's
// pool is the sum of its nodes' host subnets (one allocator each, as
// kvnet-controller has), so it grows with the nodes.
func (inv *Inventory) Pools() map[string]Pool {
	if inv.pools != nil {
		return inv.pools
	}
	nets := map[string][]*allocator.Network{}
	for name, nad := range inv.served {
		if c := nad.Served.Conf; c != nil && c.Topology == netconf.TopologyLayer3 {
			nets[name] = inv.hostSubnetAllocators(nad.Served)
			continue
		}
		cfg, err := ipam.NetworkConfig(nad.Served)
		if err != nil || len(cfg.Subnets) == 0 {
			continue
		}
		n, err := allocator.NewNetwork(cfg)
		if err != nil {
			continue
		}
		nets[name] = []*allocator.Network{n}
	}
	// reserve takes ips in the allocator of network holding them.
	reserve := func(network, owner string, ips []netip.Prefix) {
		for _, n := range nets[network] {
			if _, err := n.Reserve(owner, addrs(ips), nil); err == nil || len(nets[network]) == 1 {
				return
			}
		}
	}
	for _, c := range inv.Claims {
		if len(c.IPs) > 0 {
			reserve(c.Network, "claim/"+c.Key(), c.IPs)
		}
	}
	for _, p := range inv.Pods {
		if !p.Live() {
			continue
		}
		for _, a := range p.Attachments {
			if a.Claim == "" && len(a.IPs) > 0 {
				reserve(a.Network, "pod/"+p.Key(), a.IPs)
			}
		}
	}
	inv.pools = map[string]Pool{}
	for name, ns := range nets {
		var pool Pool
		for _, n := range ns {
			size, used := n.Stats()
			pool.Size += size
			pool.Used += used
		}
		inv.pools[name] = pool
	}
	return inv.pools
}

// hostSubnetAllocators returns an allocator per host subnet of Layer3
// network s that a node holds.
func (inv *Inventory) hostSubnetAllocators(s *netconf.Served) []*allocator.Network {
	var out []*allocator.Network
	hs := slices.Clone(inv.hostNets[s.Name])
	slices.SortFunc(hs, func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr()) })
	for _, p := range slices.Compact(hs) {
		cfg, err := ipam.HostSubnetConfig(s, []netip.Prefix{p})
		if err != nil {
			continue
		}
		if n, err := allocator.NewNetwork(cfg); err == nil {
			out = append(out, n)
		}
	}
	return out
}

func addrs(ps []netip.Prefix) []netip.Addr {
	out := make([]netip.Addr, 0, len(ps))
	for _, p := range ps {
		out = append(out, p.Addr())
	}
	return out
}
