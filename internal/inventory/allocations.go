package inventory

import (
	"net"
	"net/netip"
	"slices"
	"strings"

	"kvnet.io/kvnet/internal/ipam"
	"kvnet.io/kvnet/internal/ipam/allocator"
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
// Networks without subnets (MACs only) have no pool.
func (inv *Inventory) Pools() map[string]Pool {
	if inv.pools != nil {
		return inv.pools
	}
	nets := map[string]*allocator.Network{}
	for name, nad := range inv.served {
		cfg, err := ipam.NetworkConfig(nad.Served)
		if err != nil || len(cfg.Subnets) == 0 {
			continue
		}
		n, err := allocator.NewNetwork(cfg)
		if err != nil {
			continue
		}
		nets[name] = n
	}
	for _, c := range inv.Claims {
		if n, ok := nets[c.Network]; ok && len(c.IPs) > 0 {
			_, _ = n.Reserve("claim/"+c.Key(), addrs(c.IPs), nil)
		}
	}
	for _, p := range inv.Pods {
		if !p.Live() {
			continue
		}
		for _, a := range p.Attachments {
			if n, ok := nets[a.Network]; ok && a.Claim == "" && len(a.IPs) > 0 {
				_, _ = n.Reserve("pod/"+p.Key(), addrs(a.IPs), nil)
			}
		}
	}
	inv.pools = map[string]Pool{}
	for name, n := range nets {
		size, used := n.Stats()
		inv.pools[name] = Pool{Used: used, Size: size}
	}
	return inv.pools
}

func addrs(ps []netip.Prefix) []netip.Addr {
	out := make([]netip.Addr, 0, len(ps))
	for _, p := range ps {
		out = append(out, p.Addr())
	}
	return out
}
