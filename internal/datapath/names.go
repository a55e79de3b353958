package datapath

import (
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
)

// MaxNetworkID is the largest network ID. IDs come from the UDN ID
// allocator (1..4095) and double as VXLAN VNIs, so the VNI space used by
// kvnet is 1..4095 and leaves the rest of the 24-bit VNI space to others.
const MaxNetworkID = 4095

// Names of the links kvnet creates in the node namespace. Each is a fixed
// prefix plus the decimal network ID, at most 8 characters, well under
// IFNAMSIZ-1 = 15; Apply recognises leftovers by these exact shapes.
const (
	bridgePrefix  = "kvbr" // the network's bridge
	vxlanPrefix   = "kvvx" // its VXLAN device, a port of the bridge
	gwPortPrefix  = "kvgw" // bridge-side end of the veth into the router ns
	svcPortPrefix = "kvsv" // bridge-side end of the router's service veth
	transitPrefix = "kvtr" // node-side end of the transit veth to the router ns
	// A localnet network's patch into the physical bridge: a veth whose
	// kvlp end is a port of the physical bridge and whose kvln end is a
	// port of the network's bridge, or, with a VLAN, carries the VLAN
	// device kvlv that is.
	physPortPrefix  = "kvlp"
	patchPortPrefix = "kvln"
	vlanPortPrefix  = "kvlv"
)

// Names of the router namespace's two links. The namespace holds nothing
// else, so the names need no ID.
const (
	routerGwIf      = "gw"      // peer of kvgw<ID>: holds the gateway IPs and GatewayMAC
	routerTransitIf = "transit" // peer of kvtr<ID>: holds the router-side transit address
	// routerSvcIf, peer of kvsv<ID>, holds this node's service addresses
	// (Network.ServiceAddrs) with its own MAC: service connections leave
	// the router through it, masqueraded to its address, so that the
	// endpoint's replies, wherever it runs, come back to this router.
	routerSvcIf = "svc"
	// routerOverlayIf, on a Layer3 network, is the router's VXLAN device
	// (VNI = network ID; its UDP socket stays in the node namespace, where
	// it was made as kvvx<ID>): the routers of all nodes share this L2
	// segment, each with its own overlay address, and route host subnets
	// to each other over it.
	routerOverlayIf = "ovl"
)

// serviceMark marks a router's service connections (conntrack mark, and
// packet mark of their original direction), and numbers the routing table
// that sends them out routerSvcIf.
const serviceMark = 0x4b56

// svcPortName returns the bridge-side end of network id's service veth.
func svcPortName(id int) string { return svcPortPrefix + strconv.Itoa(id) }

// RouterGatewayInterface is the interface of a router namespace that
// faces the network's bridge and holds the gateway IPs: where the node's
// DHCP server for the network listens.
const RouterGatewayInterface = routerGwIf

// BridgeName returns the name of network id's bridge, e.g. "kvbr7".
func BridgeName(id int) string { return bridgePrefix + strconv.Itoa(id) }

// VXLANName returns the name of network id's VXLAN device, e.g. "kvvx7".
func VXLANName(id int) string { return vxlanPrefix + strconv.Itoa(id) }

// gwPortName returns the bridge-side end of the veth into the router ns.
func gwPortName(id int) string { return gwPortPrefix + strconv.Itoa(id) }

// transitName returns the node-side end of network id's transit veth.
func transitName(id int) string { return transitPrefix + strconv.Itoa(id) }

// parseOwnedLink reports the kind prefix and network ID of a kvnet-owned
// node link name, and whether the name is one (prefix + canonical decimal
// ID in range; "kvbr07" or "kvbr0" are not ours).
func parseOwnedLink(name string) (prefix string, id int, ok bool) {
	for _, p := range []string{bridgePrefix, vxlanPrefix, gwPortPrefix, svcPortPrefix, transitPrefix, physPortPrefix, patchPortPrefix, vlanPortPrefix} {
		if rest, found := strings.CutPrefix(name, p); found {
			id, ok := parseID(rest)
			return p, id, ok
		}
	}
	return "", 0, false
}

// parseID parses a canonical decimal network ID (no sign, no leading zero).
func parseID(s string) (int, bool) {
	if s == "" || s[0] == '0' || len(s) > 4 {
		return 0, false
	}
	id, err := strconv.Atoi(s)
	if err != nil || id < 1 || id > MaxNetworkID || strconv.Itoa(id) != s {
		return 0, false
	}
	return id, true
}

// GatewayMAC returns the MAC of network id's gateway:
// 0a:58:a9:fe:<id high byte>:<id low byte>. Every node uses the same MAC
// (and the same gateway IPs), so a VM keeps its gateway neighbour entry
// across live migration. 0a:58 is the locally administered unicast prefix
// OVN-Kubernetes uses for derived MACs, and a9:fe (169.254) marks it as
// infrastructure; tenants never get MACs from this range.
func GatewayMAC(networkID int) net.HardwareAddr {
	return net.HardwareAddr{0x0a, 0x58, 0xa9, 0xfe, byte(networkID >> 8), byte(networkID)}
}

// VXLAN encapsulation overhead on the underlay: outer Ethernet is not
// counted in the MTU, so it is outer IP + UDP (8) + VXLAN (8) + inner
// Ethernet (14): 50 bytes over IPv4 (20), 70 over IPv6 (40).
const (
	vxlanOverhead4 = 50
	vxlanOverhead6 = 70
)

// PodMTU returns the MTU of pods, bridges, VXLAN devices and router veths
// for an IPv4 underlay of MTU underlayMTU: underlayMTU minus the 50-byte
// VXLAN overhead, so an inner full-size frame fits one underlay packet.
func PodMTU(underlayMTU int) int { return underlayMTU - vxlanOverhead4 }

// podMTUFor is PodMTU for an underlay of either family.
func podMTUFor(underlayMTU int, underlayIP netip.Addr) int {
	if underlayIP.Is6() && !underlayIP.Is4In6() {
		return underlayMTU - vxlanOverhead6
	}
	return PodMTU(underlayMTU)
}

// Transit addressing, after OVN-Kubernetes' masquerade subnets
// (169.254.0.0/17 and fd69::/112): the first 10 addresses are left to the
// cluster default network's masquerade IPs, then each network ID takes a
// pair. The same pair is used on every node: the addresses are link-local
// to the node, and using one scheme everywhere makes them predictable in
// captures and audits.
//
// The prefixes are the cluster's masquerade subnets (reserved.Subnets,
// kvnet-node --masquerade-subnets); SetMasqueradeSubnets changes them.
var (
	transitPrefix4 = netip.MustParsePrefix("169.254.0.0/17")
	transitPrefix6 = netip.MustParsePrefix("fd69::/112")
)

// SetMasqueradeSubnets makes v4 and v6 (validated by reserved.Parse:
// large enough for every network ID) the prefixes of TransitAddrs. It is
// process-wide, as the setting is cluster-wide: kvnet-node calls it once,
// before creating its datapath.
func SetMasqueradeSubnets(v4, v6 netip.Prefix) error {
	for _, p := range []netip.Prefix{v4, v6} {
		if host := p.Addr().BitLen() - p.Bits(); !p.IsValid() || host < 14 {
			return fmt.Errorf("masquerade subnet %s: must hold at least %d addresses", p, transitOffsetBase+2*MaxNetworkID+1)
		}
	}
	if !v4.Addr().Is4() || !v6.Addr().Is6() {
		return fmt.Errorf("masquerade subnets %s, %s: want an IPv4 then an IPv6 subnet", v4, v6)
	}
	transitPrefix4, transitPrefix6 = v4.Masked(), v6.Masked()
	return nil
}

// transitOffsetBase is the first offset handed out; see transitPrefix4.
const transitOffsetBase = 10

// TransitAddrs returns network id's transit addresses for the family of
// v6 (false: IPv4): router = base + 10 + 2*id - 1, node = base + 10 + 2*id,
// counted from the start of 169.254.0.0/17 (or fd69::/112). ID 1 gets
// 169.254.0.11 (router) and 169.254.0.12 (node); ID 200 gets
// 169.254.1.153/169.254.1.154; ID 4095 gets 169.254.32.7/169.254.32.8.
func TransitAddrs(id int, v6 bool) (router, node netip.Addr, err error) {
	if id < 1 || id > MaxNetworkID {
		return netip.Addr{}, netip.Addr{}, fmt.Errorf("transit addresses of network ID %d: out of range 1-%d", id, MaxNetworkID)
	}
	p := transitPrefix4
	if v6 {
		p = transitPrefix6
	}
	off := transitOffsetBase + 2*id // node side; router side is off-1
	return addOffset(p.Addr(), off-1), addOffset(p.Addr(), off), nil
}

// addOffset returns a + off for small non-negative off.
func addOffset(a netip.Addr, off int) netip.Addr {
	b := a.AsSlice()
	carry := off
	for i := len(b) - 1; i >= 0 && carry > 0; i-- {
		sum := int(b[i]) + carry
		b[i] = byte(sum)
		carry = sum >> 8
	}
	out, _ := netip.AddrFromSlice(b)
	return out
}

// defaultRouterNSPrefix names router namespaces on a real node, where the
// datapath runs in the host namespace: kvnet-r<ID>.
const defaultRouterNSPrefix = "kvnet-r"

// routerNSPrefix returns the prefix of cfg's router namespace names. A
// datapath in its own namespace (a simulated node) gets a prefix naming
// that namespace so that several simulated nodes on one machine do not
// share router namespaces.
func routerNSPrefix(cfg NodeConfig) string {
	if cfg.RouterNSPrefix != "" {
		return cfg.RouterNSPrefix
	}
	if cfg.NetNS == "" {
		return defaultRouterNSPrefix
	}
	base := cfg.NetNS[strings.LastIndexByte(cfg.NetNS, '/')+1:]
	return "kvnet-" + base + "-r"
}

// RouterNSName returns the name (under /run/netns) of network id's router
// namespace for the node configured by cfg, e.g. "kvnet-r7".
func RouterNSName(cfg NodeConfig, id int) string {
	return routerNSPrefix(cfg) + strconv.Itoa(id)
}

// portChainName returns the nftables chain holding port hostIf's
// anti-spoofing rules.
func portChainName(hostIf string) string { return "port-" + hostIf }
