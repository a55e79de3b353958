package allocator

import (
	"bytes"
	"cmp"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"slices"
	"sync"
)

// Config describes one network's address space. Field comments give the
// OVN-Kubernetes names used in error messages.
type Config struct {
	// Name is the network name, for errors.
	Name string
	// Subnets (subnets) holds at most one IPv4 and one IPv6 subnet. Without
	// subnets the network only hands out MACs.
	Subnets []netip.Prefix
	// Exclude (excludeSubnets) is never handed out, not even on request.
	Exclude []netip.Prefix
	// Reserved (reservedSubnets) is never handed out automatically, but
	// static requests may take it.
	Reserved []netip.Prefix
	// Infrastructure (infrastructureSubnets, primary only) is excluded as a
	// whole; the gateway and management IPs of its family are its first
	// usable addresses, falling back to .1 and .2 of the subnet.
	Infrastructure []netip.Prefix
	// Gateways (defaultGatewayIPs, primary only) is the gateway per family
	// instead of .1 or the first infrastructure address.
	Gateways []netip.Addr
	// Primary marks a primary Layer2 network: a gateway (first host, ".1")
	// and a management IP (second host, ".2") per subnet are kept from
	// allocation, unless Infrastructure or Gateways say otherwise.
	// Infrastructure and Gateways are ignored on other networks.
	Primary bool
}

// Request asks for one allocation.
type Request struct {
	// Owner holds the allocation, e.g. "pod/<uid>" or "claim/<ns>/<name>";
	// required.
	Owner string
	// IPs are static IPs, at most one per family. Empty means one automatic
	// IP per subnet; a family without a static IP gets an automatic one.
	IPs []netip.Addr
	// MAC is the requested MAC; nil derives it from the first IP (DeriveMAC).
	MAC net.HardwareAddr
}

// Allocation is what an owner holds on a network.
type Allocation struct {
	// IPs are the addresses with their subnet's prefix length, e.g.
	// 10.0.0.5/24; IPv4 first.
	IPs []netip.Prefix
	MAC net.HardwareAddr
	// Gateways holds, on primary networks, the gateway of each IP's family
	// in the order of IPs; nil on secondary networks.
	Gateways []netip.Addr
}

// subnet is one subnet of a network with what is carved out of it. Only
// r changes after NewNetwork.
type subnet struct {
	r        *Range
	exclude  []netip.Prefix // excludeSubnets, and infrastructureSubnets on primary networks
	reserved []netip.Prefix // reservedSubnets
	gateway  netip.Addr     // primary networks only
	mgmt     netip.Addr     // primary networks only
	// blocked counts window bits taken by NewNetwork for the above, so
	// Stats can report the automatic pool alone.
	blocked int
}

// excluded reports whether ip, inside s, may never be handed out.
func (s *subnet) excluded(ip netip.Addr) bool {
	return s.r.isNetworkOrBroadcast(ip) || ip == s.gateway || ip == s.mgmt || inAny(s.exclude, ip)
}

// isBlocked reports whether ip, inside s, is kept from automatic allocation.
// Such IPs are taken in the bitmap from the start (inside the window), so
// owners holding them are recorded in Network.ips alone.
func (s *subnet) isBlocked(ip netip.Addr) bool {
	return s.excluded(ip) || inAny(s.reserved, ip)
}

// holding is what one owner holds.
type holding struct {
	ips []netip.Addr // IPv4 first
	mac net.HardwareAddr
}

// Network allocates IPs and MACs of one network. It is safe for concurrent
// use: one mutex serializes every operation, which are all short.
type Network struct {
	name    string
	primary bool
	subnets []*subnet // IPv4 first

	mu     sync.Mutex // guards following, and the Ranges of subnets
	owners map[string]*holding
	ips    map[netip.Addr]string // IP -> owner
	macs   map[[6]byte]string    // MAC -> owner
}

// NewNetwork validates cfg and returns a Network with nothing allocated.
// Errors wrap ErrInvalid and name the field and value.
func NewNetwork(cfg Config) (*Network, error) {
	n := &Network{
		name:    cfg.Name,
		primary: cfg.Primary,
		owners:  map[string]*holding{},
		ips:     map[netip.Addr]string{},
		macs:    map[[6]byte]string{},
	}
	for _, p := range cfg.Subnets {
		if !p.IsValid() || p.Addr().Is4In6() {
			return nil, fmt.Errorf("subnets %q of network %q is not a valid CIDR: %w", p.String(), n.name, ErrInvalid)
		}
		p = p.Masked()
		if s := n.family(p.Addr()); s != nil {
			return nil, fmt.Errorf("subnets %q: network %q already has subnet %q of that family: %w",
				p.String(), n.name, s.r.prefix.String(), ErrInvalid)
		}
		r, err := NewRange(p)
		if err != nil {
			return nil, fmt.Errorf("subnets %q of network %q: %w", p.String(), n.name, err)
		}
		n.subnets = append(n.subnets, &subnet{r: r})
	}
	slices.SortFunc(n.subnets, func(a, b *subnet) int { return cmp.Compare(a.r.prefix.Addr().BitLen(), b.r.prefix.Addr().BitLen()) })

	// inside returns the subnet holding all of p.
	inside := func(field string, p netip.Prefix) (*subnet, error) {
		if p.IsValid() {
			p = p.Masked()
			for _, s := range n.subnets {
				if s.r.prefix.Bits() <= p.Bits() && s.r.prefix.Contains(p.Addr()) {
					return s, nil
				}
			}
		}
		return nil, fmt.Errorf("%s %q is not inside any subnet of network %q: %w", field, p.String(), n.name, ErrInvalid)
	}
	for _, p := range cfg.Exclude {
		s, err := inside("excludeSubnets", p)
		if err != nil {
			return nil, err
		}
		s.exclude = append(s.exclude, p.Masked())
	}
	for _, p := range cfg.Reserved {
		s, err := inside("reservedSubnets", p)
		if err != nil {
			return nil, err
		}
		s.reserved = append(s.reserved, p.Masked())
	}
	infra := map[*subnet][]netip.Prefix{}
	for _, p := range cfg.Infrastructure {
		s, err := inside("infrastructureSubnets", p)
		if err != nil {
			return nil, err
		}
		infra[s] = append(infra[s], p.Masked())
	}
	gateways := map[*subnet]netip.Addr{}
	for _, g := range cfg.Gateways {
		g = g.Unmap().WithZone("")
		s := n.subnetOf(g)
		switch {
		case s == nil:
			return nil, fmt.Errorf("defaultGatewayIPs %q is not inside any subnet of network %q: %w", g.String(), n.name, ErrInvalid)
		case gateways[s].IsValid():
			return nil, fmt.Errorf("defaultGatewayIPs %q: network %q already has gateway %q in subnet %q: %w",
				g.String(), n.name, gateways[s].String(), s.r.prefix.String(), ErrInvalid)
		case s.r.isNetworkOrBroadcast(g):
			return nil, fmt.Errorf("defaultGatewayIPs %q is the network or broadcast address of subnet %q of network %q: %w",
				g.String(), s.r.prefix.String(), n.name, ErrInvalid)
		case len(infra[s]) > 0 && !inAny(infra[s], g):
			return nil, fmt.Errorf("defaultGatewayIPs %q is not inside the infrastructureSubnets of network %q: %w", g.String(), n.name, ErrInvalid)
		}
		gateways[s] = g
	}

	for _, s := range n.subnets {
		if n.primary {
			s.gateway, s.mgmt = pickGateway(s.r, infra[s], gateways[s])
			s.exclude = append(s.exclude, infra[s]...)
		}
		for _, p := range s.exclude {
			s.r.takePrefix(p)
		}
		for _, p := range s.reserved {
			s.r.takePrefix(p)
		}
		for _, a := range []netip.Addr{s.gateway, s.mgmt} {
			if a.IsValid() {
				s.r.takePrefix(netip.PrefixFrom(a, a.BitLen()))
			}
		}
		s.blocked = s.r.Used()
	}
	return n, nil
}

// pickGateway returns the gateway and management IPs of a primary subnet:
// the given gateway or the first usable infrastructure address, and the
// next usable infrastructure address, each falling back to the first and
// second host of the subnet (the first if the gateway is the second).
func pickGateway(r *Range, infra []netip.Prefix, gw netip.Addr) (gateway, mgmt netip.Addr) {
	infra = slices.Clone(infra)
	slices.SortFunc(infra, func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr()) })
	var cands []netip.Addr
	for _, p := range infra {
		// Skipping the network address, the broadcast address and the
		// given gateway takes at most three steps per prefix.
		a := p.Addr()
		for k := 0; k < 4 && len(cands) < 2 && p.Contains(a); k++ {
			if !r.isNetworkOrBroadcast(a) && a != gw && !slices.Contains(cands, a) {
				cands = append(cands, a)
			}
			a = a.Next()
		}
	}
	gateway = gw
	if !gateway.IsValid() {
		gateway = r.addrAt(0)
		if len(cands) > 0 {
			gateway, cands = cands[0], cands[1:]
		}
	}
	switch {
	case len(cands) > 0:
		mgmt = cands[0]
	case r.addrAt(1) != gateway:
		mgmt = r.addrAt(1)
	default:
		mgmt = r.addrAt(0)
	}
	return gateway, mgmt
}

// Name returns the network name.
func (n *Network) Name() string { return n.name }

// Gateways returns the gateway of each subnet, IPv4 first, on primary
// networks, and nil on others.
func (n *Network) Gateways() []netip.Addr {
	if !n.primary {
		return nil
	}
	var out []netip.Addr
	for _, s := range n.subnets {
		out = append(out, s.gateway)
	}
	return out
}

// Allocate gives req.Owner one IP per subnet and a MAC. If the owner holds
// an allocation already it is returned unchanged, whatever req says, so
// retries after a lost API update are harmless. On error nothing stays
// allocated.
func (n *Network) Allocate(req Request) (Allocation, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if req.Owner == "" {
		return Allocation{}, fmt.Errorf("network %q: owner must be set: %w", n.name, ErrInvalid)
	}
	if h, ok := n.owners[req.Owner]; ok {
		return n.allocation(h), nil
	}
	static, err := n.resolve(req.IPs, false)
	if err != nil {
		return Allocation{}, fmt.Errorf("network %q: owner %q: %w", n.name, req.Owner, err)
	}
	for i, ip := range static {
		if !ip.IsValid() {
			continue
		}
		if n.subnets[i].excluded(ip) {
			return Allocation{}, fmt.Errorf("network %q: ip %s requested by %q: %w", n.name, ip, req.Owner, ErrExcluded)
		}
		if o, ok := n.ips[ip]; ok {
			return Allocation{}, fmt.Errorf("network %q: ip %s requested by %q is held by %q: %w", n.name, ip, req.Owner, o, ErrAllocated)
		}
	}
	if req.MAC != nil {
		if err := checkMAC(req.MAC); err != nil {
			return Allocation{}, fmt.Errorf("network %q: owner %q: %w", n.name, req.Owner, err)
		}
		// Checked here too so that a known conflict costs no allocation.
		if o, ok := n.macs[macKey(req.MAC)]; ok {
			return Allocation{}, fmt.Errorf("network %q: mac %s requested by %q is held by %q: %w", n.name, req.MAC, req.Owner, o, ErrMACConflict)
		}
	}

	// A failed request must not move the round robin cursors either, so
	// that a retry gets the addresses it would have got.
	var cursors [2]int
	for i, s := range n.subnets {
		cursors[i] = s.r.next
	}
	undo := func(got []netip.Addr) {
		n.drop(got)
		for i, s := range n.subnets {
			s.r.next = cursors[i]
		}
	}
	got := make([]netip.Addr, 0, len(n.subnets))
	for i, s := range n.subnets {
		ip := static[i]
		if ip.IsValid() {
			err = n.take(s, ip, req.Owner)
		} else if ip, err = s.r.AllocateNext(); err == nil {
			n.ips[ip] = req.Owner
		}
		if err != nil {
			undo(got)
			return Allocation{}, fmt.Errorf("network %q: owner %q: %w", n.name, req.Owner, err)
		}
		got = append(got, ip)
	}
	mac, err := n.pickMAC(req.Owner, req.MAC, got)
	if err != nil {
		undo(got)
		return Allocation{}, err
	}
	h := &holding{ips: got, mac: mac}
	n.owners[req.Owner] = h
	n.macs[macKey(mac)] = req.Owner
	return n.allocation(h), nil
}

// Reserve records that owner holds exactly ips (and mac, if not nil), as
// read back from the API after a restart. Excluded and reserved IPs are
// accepted: what the API says was handed out wins. IPs or a MAC the owner
// holds already are fine; IPs it held but are not in ips are freed. On
// error nothing changes.
func (n *Network) Reserve(owner string, ips []netip.Addr, mac net.HardwareAddr) (Allocation, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if owner == "" {
		return Allocation{}, fmt.Errorf("network %q: owner must be set: %w", n.name, ErrInvalid)
	}
	slots, err := n.resolve(ips, true)
	if err != nil {
		return Allocation{}, fmt.Errorf("network %q: owner %q: %w", n.name, owner, err)
	}
	var want []netip.Addr
	for _, ip := range slots {
		if ip.IsValid() {
			want = append(want, ip)
		}
	}
	if len(want) == 0 && mac == nil {
		return Allocation{}, fmt.Errorf("network %q: owner %q: nothing to reserve: %w", n.name, owner, ErrInvalid)
	}
	for _, ip := range want {
		if o, ok := n.ips[ip]; ok && o != owner {
			return Allocation{}, fmt.Errorf("network %q: ip %s reserved for %q is held by %q: %w", n.name, ip, owner, o, ErrAllocated)
		}
	}
	if mac != nil {
		if err := checkMAC(mac); err != nil {
			return Allocation{}, fmt.Errorf("network %q: owner %q: %w", n.name, owner, err)
		}
		if o, ok := n.macs[macKey(mac)]; ok && o != owner {
			return Allocation{}, fmt.Errorf("network %q: mac %s reserved for %q is held by %q: %w", n.name, mac, owner, o, ErrMACConflict)
		}
	}

	var taken []netip.Addr
	for _, ip := range want {
		if n.ips[ip] == owner {
			continue
		}
		if err := n.take(n.subnetOf(ip), ip, owner); err != nil {
			n.drop(taken)
			return Allocation{}, fmt.Errorf("network %q: owner %q: %w", n.name, owner, err)
		}
		taken = append(taken, ip)
	}
	h, ok := n.owners[owner]
	if !ok {
		h = &holding{}
		n.owners[owner] = h
	}
	for _, ip := range h.ips {
		if !slices.Contains(want, ip) {
			n.drop([]netip.Addr{ip})
		}
	}
	h.ips = want
	if mac != nil && !bytes.Equal(mac, h.mac) {
		if h.mac != nil {
			delete(n.macs, macKey(h.mac))
		}
		h.mac = slices.Clone(mac)
		n.macs[macKey(mac)] = owner
	}
	return n.allocation(h), nil
}

// Release frees everything owner holds; it is a no-op if owner holds
// nothing.
func (n *Network) Release(owner string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	h, ok := n.owners[owner]
	if !ok {
		return
	}
	n.drop(h.ips)
	if h.mac != nil && n.macs[macKey(h.mac)] == owner {
		delete(n.macs, macKey(h.mac))
	}
	delete(n.owners, owner)
}

// Transfer hands everything from holds to to, which must hold nothing:
// the same IPs and MAC, at once, so that no other owner can take them in
// between. It returns what to holds now.
func (n *Network) Transfer(from, to string) (Allocation, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	h, ok := n.owners[from]
	if !ok {
		return Allocation{}, fmt.Errorf("network %q: transfer from %q, which holds nothing: %w", n.name, from, ErrInvalid)
	}
	if to == "" || to == from {
		return Allocation{}, fmt.Errorf("network %q: transfer from %q to %q: %w", n.name, from, to, ErrInvalid)
	}
	if _, held := n.owners[to]; held {
		return Allocation{}, fmt.Errorf("network %q: transfer from %q to %q, which holds an allocation already: %w", n.name, from, to, ErrAllocated)
	}
	delete(n.owners, from)
	n.owners[to] = h
	for _, ip := range h.ips {
		n.ips[ip] = to
	}
	if h.mac != nil && n.macs[macKey(h.mac)] == from {
		n.macs[macKey(h.mac)] = to
	}
	return n.allocation(h), nil
}

// OwnerOfMAC returns the owner holding mac.
func (n *Network) OwnerOfMAC(mac net.HardwareAddr) (string, bool) {
	if len(mac) != 6 {
		return "", false
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	o, ok := n.macs[macKey(mac)]
	return o, ok
}

// Get returns what owner holds.
func (n *Network) Get(owner string) (Allocation, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	h, ok := n.owners[owner]
	if !ok {
		return Allocation{}, false
	}
	return n.allocation(h), true
}

// OwnerOf returns the owner holding ip.
func (n *Network) OwnerOf(ip netip.Addr) (string, bool) {
	ip = ip.Unmap().WithZone("")
	n.mu.Lock()
	defer n.mu.Unlock()
	o, ok := n.ips[ip]
	return o, ok
}

// Stats returns the size of the automatic pool (host addresses tracked,
// less excluded, reserved, infrastructure, gateway and management ones) and
// how many of those are in use, summed over subnets.
func (n *Network) Stats() (size, used int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, s := range n.subnets {
		size += s.r.Size() - s.blocked
		used += s.r.Used() - s.blocked
	}
	return size, used
}

// resolve maps requested IPs to the slots of n.subnets (the zero Addr where
// none was asked for). A family the network lacks is ErrInvalid for
// Allocate; Reserve, reading state back, reports it as ErrNotInSubnet.
func (n *Network) resolve(ips []netip.Addr, reserve bool) ([]netip.Addr, error) {
	out := make([]netip.Addr, len(n.subnets))
	for _, ip := range ips {
		if !ip.IsValid() {
			return nil, fmt.Errorf("ip %q is not an address: %w", ip.String(), ErrInvalid)
		}
		ip = ip.Unmap().WithZone("")
		i := slices.IndexFunc(n.subnets, func(s *subnet) bool { return s.r.is4 == ip.Is4() })
		switch {
		case i < 0 && reserve:
			return nil, fmt.Errorf("ip %s: %w", ip, ErrNotInSubnet)
		case i < 0:
			return nil, fmt.Errorf("ip %s: the network has no subnet of its family: %w", ip, ErrInvalid)
		case !n.subnets[i].r.Contains(ip):
			return nil, fmt.Errorf("ip %s is outside subnet %s: %w", ip, n.subnets[i].r.prefix, ErrNotInSubnet)
		case out[i].IsValid():
			return nil, fmt.Errorf("ips %s and %s are of one family: %w", out[i], ip, ErrInvalid)
		}
		out[i] = ip
	}
	return out, nil
}

// take records that owner holds ip of s; the caller has checked that
// nobody does.
func (n *Network) take(s *subnet, ip netip.Addr, owner string) error {
	if !s.isBlocked(ip) {
		if err := s.r.Allocate(ip); err != nil {
			// Not wrapped: the bitmap disagreeing with n.ips is a bug, not
			// a conflict to report to the user.
			return fmt.Errorf("ip %s: allocator state out of sync: %v", ip, err)
		}
	}
	n.ips[ip] = owner
	return nil
}

// drop frees ips, undoing take or AllocateNext.
func (n *Network) drop(ips []netip.Addr) {
	for _, ip := range ips {
		delete(n.ips, ip)
		if s := n.subnetOf(ip); s != nil && !s.isBlocked(ip) {
			s.r.Release(ip)
		}
	}
}

// pickMAC returns the MAC for a new allocation of owner holding ips.
func (n *Network) pickMAC(owner string, req net.HardwareAddr, ips []netip.Addr) (net.HardwareAddr, error) {
	var mac net.HardwareAddr
	switch {
	case req != nil:
		mac = slices.Clone(req)
	case len(ips) > 0:
		mac = DeriveMAC(ips[0])
	default:
		// Nothing to derive from: a random locally administered unicast
		// MAC with OVN-Kubernetes' 0a:58 prefix. Collisions in 2^32 are
		// rare, so a few tries suffice.
		for range 8 {
			v := rand.Uint32()
			mac = net.HardwareAddr{0x0a, 0x58, byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}
			if _, ok := n.macs[macKey(mac)]; !ok {
				break
			}
		}
	}
	if o, ok := n.macs[macKey(mac)]; ok {
		return nil, fmt.Errorf("network %q: mac %s for %q is held by %q: %w", n.name, mac, owner, o, ErrMACConflict)
	}
	return mac, nil
}

// allocation returns a copy of h that callers may keep and change.
func (n *Network) allocation(h *holding) Allocation {
	a := Allocation{MAC: slices.Clone(h.mac)}
	for _, ip := range h.ips {
		s := n.subnetOf(ip)
		a.IPs = append(a.IPs, netip.PrefixFrom(ip, s.r.prefix.Bits()))
		if n.primary {
			a.Gateways = append(a.Gateways, s.gateway)
		}
	}
	return a
}

// subnetOf returns the subnet holding ip, or nil.
func (n *Network) subnetOf(ip netip.Addr) *subnet {
	for _, s := range n.subnets {
		if s.r.Contains(ip) {
			return s
		}
	}
	return nil
}

// family returns the subnet of ip's family, or nil.
func (n *Network) family(ip netip.Addr) *subnet {
	for _, s := range n.subnets {
		if s.r.is4 == ip.Is4() {
			return s
		}
	}
	return nil
}

// inAny reports whether ip is inside one of ps.
func inAny(ps []netip.Prefix, ip netip.Addr) bool {
	for _, p := range ps {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}
