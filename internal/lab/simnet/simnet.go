package simnet

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"

	"github.com/vishvananda/netlink"

	"kvnet.io/kvnet/internal/nl"
)

// The underlay: every node and the external namespace have UnderlayDev on
// UnderlayBits-long subnet 192.168.100.0/24, MTU UnderlayMTU.
const (
	UnderlayDev  = "eth0"
	UnderlayBits = 24
	UnderlayMTU  = 1500
)

var (
	// ExternalIP is the external namespace's underlay address, the nodes'
	// default gateway.
	ExternalIP = netip.MustParseAddr("192.168.100.254")
	// InternetIP is on the external namespace's loopback: an address "on
	// the internet", reached from nodes through their default route.
	InternetIP = netip.MustParseAddr("198.51.100.1")
)

// The physical network localnet networks attach to: the namespace
// <Prefix>-phys plays a datacenter L2 segment (bridge phys0) with one host
// on it, DatacenterHostIP; every node has the Linux bridge PhysicalBridge
// with an uplink (phys-up) into it, which the node's bridge mapping
// "PhysicalNetwork:PhysicalBridge" names. Nothing routes between it and
// the underlay.
const (
	PhysicalNetwork = "physnet"
	PhysicalBridge  = "br-phys"
)

var (
	// DatacenterSubnet is the physical network's subnet; DatacenterHostIP
	// (its first address) is the host on it, which runs nothing itself:
	// tests serve from its namespace, Cluster.Physical.
	DatacenterSubnet = netip.MustParsePrefix("192.168.50.0/24")
	DatacenterHostIP = netip.MustParseAddr("192.168.50.1")
)

// MaxNodes is the largest number of nodes: 192.168.100.1 to .253.
const MaxNodes = 253

// ErrTooManyNodes is the error of New given more than MaxNodes names.
var ErrTooManyNodes = errors.New("too many nodes")

const (
	switchName   = "sw"      // the switch namespace, <Prefix>-sw
	externalName = "ext"     // the external namespace, <Prefix>-ext
	switchBridge = "sw0"     // the bridge in the switch namespace
	physName     = "phys"    // the physical network namespace, <Prefix>-phys
	physBridge   = "phys0"   // its bridge, holding DatacenterHostIP
	physUplink   = "phys-up" // a node's uplink into it, a port of PhysicalBridge
)

// Cluster is a simulated cluster network; see the package doc.
type Cluster struct {
	Prefix   string // every namespace of the cluster is named <Prefix>-<name>
	Switch   string // switch namespace path
	External string // external namespace path
	Physical string // physical network namespace path (DatacenterHostIP)
	Nodes    []*Node
}

// Node is one simulated node.
type Node struct {
	Name string     // as given to New, e.g. "n1"
	NS   string     // namespace path, /run/netns/<Prefix>-<Name>
	IP   netip.Addr // underlay address on UnderlayDev, 192.168.100.<index+1>
}

// RandomPrefix returns a fresh prefix: "kvt" and 6 random hex digits.
func RandomPrefix() string {
	b := make([]byte, 3)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return "kvt" + hex.EncodeToString(b)
}

// New builds the switch, the external namespace and one node per name,
// node i named names[i] with IP 192.168.100.(i+1). It fails, without
// touching them, if namespaces with this prefix exist already (a live
// cluster, or leftovers for Cleanup). On any later error it removes what
// it made.
func New(prefix string, names ...string) (*Cluster, error) {
	if err := checkPrefix(prefix); err != nil {
		return nil, err
	}
	if len(names) > MaxNodes {
		return nil, fmt.Errorf("simnet: %d nodes, at most %d: %w", len(names), MaxNodes, ErrTooManyNodes)
	}
	seen := map[string]bool{}
	for _, name := range names {
		if err := checkName(name); err != nil {
			return nil, err
		}
		if seen[name] {
			return nil, fmt.Errorf("simnet: node name %q given twice", name)
		}
		seen[name] = true
	}
	if left, err := owned(prefix); err != nil {
		return nil, err
	} else if len(left) > 0 {
		return nil, fmt.Errorf("simnet: namespaces of prefix %q exist already (%s); clean up with Cleanup", prefix, strings.Join(left, ", "))
	}
	c := &Cluster{Prefix: prefix}
	if err := c.build(names); err != nil {
		return nil, errors.Join(err, c.Close())
	}
	return c, nil
}

func (c *Cluster) build(names []string) error {
	var err error
	if c.Switch, err = c.newNS(switchName); err != nil {
		return err
	}
	if err := c.buildSwitch(); err != nil {
		return err
	}
	if c.External, err = c.newNS(externalName); err != nil {
		return err
	}
	if err := c.plug(c.External, externalName, ExternalIP); err != nil {
		return err
	}
	if err := withHandle(c.External, func(h *nl.Handle) error {
		lo, err := h.LinkByName("lo")
		if err != nil {
			return err
		}
		if err := h.AddrAdd(lo, &netlink.Addr{IPNet: ipNet(netip.PrefixFrom(InternetIP, InternetIP.BitLen()))}); err != nil {
			return fmt.Errorf("add address %s to lo: %w", InternetIP, err)
		}
		return nil
	}); err != nil {
		return fmt.Errorf("simnet: external namespace %s: %w", c.External, err)
	}
	if err := c.buildPhysical(); err != nil {
		return err
	}
	for i, name := range names {
		nd := &Node{Name: name, IP: netip.AddrFrom4([4]byte{192, 168, 100, byte(i + 1)})}
		if nd.NS, err = c.newNS(name); err != nil {
			return err
		}
		c.Nodes = append(c.Nodes, nd)
		if err := c.plug(nd.NS, fmt.Sprintf("n%d", i+1), nd.IP); err != nil {
			return err
		}
		if err := withHandle(nd.NS, func(h *nl.Handle) error {
			dev, err := h.LinkByName(UnderlayDev)
			if err != nil {
				return err
			}
			gw := &netlink.Route{LinkIndex: dev.Attrs().Index, Gw: net.IP(ExternalIP.AsSlice()),
				Dst: &net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}}
			if err := h.RouteAdd(gw); err != nil {
				return fmt.Errorf("add default route via %s: %w", ExternalIP, err)
			}
			return nil
		}); err != nil {
			return fmt.Errorf("simnet: node %s (%s): %w", name, nd.NS, err)
		}
		if err := c.plugPhysical(nd.NS, fmt.Sprintf("n%d", i+1)); err != nil {
			return fmt.Errorf("simnet: node %s (%s): %w", name, nd.NS, err)
		}
	}
	return nil
}

// buildPhysical makes the physical network namespace: bridge phys0, up,
// holding DatacenterHostIP.
func (c *Cluster) buildPhysical() error {
	var err error
	if c.Physical, err = c.newNS(physName); err != nil {
		return err
	}
	return withHandle(c.Physical, func(h *nl.Handle) error {
		if err := h.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: physBridge}}); err != nil {
			return fmt.Errorf("simnet: physical network: create bridge %q: %w", physBridge, err)
		}
		br, err := h.LinkByName(physBridge)
		if err != nil {
			return err
		}
		if err := h.AddrAdd(br, &netlink.Addr{IPNet: ipNet(netip.PrefixFrom(DatacenterHostIP, DatacenterSubnet.Bits()))}); err != nil {
			return fmt.Errorf("simnet: physical network: add %s: %w", DatacenterHostIP, err)
		}
		return h.LinkSetUp(br)
	})
}

// plugPhysical gives the node namespace ns the bridge PhysicalBridge with
// an uplink whose other end, port, is on the physical network's bridge.
func (c *Cluster) plugPhysical(ns, port string) error {
	err := withHandle(ns, func(h *nl.Handle) error {
		if err := h.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: PhysicalBridge}}); err != nil {
			return fmt.Errorf("create bridge %q: %w", PhysicalBridge, err)
		}
		br, err := h.LinkByName(PhysicalBridge)
		if err != nil {
			return err
		}
		phys, err := nl.OpenNS(c.Physical)
		if err != nil {
			return err
		}
		defer phys.Close()
		veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: physUplink, MasterIndex: br.Attrs().Index},
			PeerName: port, PeerNamespace: netlink.NsFd(int(phys))}
		if err := h.LinkAdd(veth); err != nil {
			return fmt.Errorf("create uplink %q: %w", physUplink, err)
		}
		for _, name := range []string{PhysicalBridge, physUplink} {
			l, err := h.LinkByName(name)
			if err != nil {
				return err
			}
			if err := h.LinkSetUp(l); err != nil {
				return fmt.Errorf("set link %q up: %w", name, err)
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	return withHandle(c.Physical, func(h *nl.Handle) error {
		l, err := h.LinkByName(port)
		if err != nil {
			return err
		}
		br, err := h.LinkByName(physBridge)
		if err != nil {
			return err
		}
		if err := h.LinkSetMaster(l, br); err != nil {
			return fmt.Errorf("attach %q to bridge %q: %w", port, physBridge, err)
		}
		return h.LinkSetUp(l)
	})
}

// buildSwitch adds the bridge to the switch namespace and turns bridge
// netfilter off there.
func (c *Cluster) buildSwitch() error {
	if err := withHandle(c.Switch, func(h *nl.Handle) error {
		if err := h.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: switchBridge}}); err != nil {
			return fmt.Errorf("create bridge %q: %w", switchBridge, err)
		}
		br, err := h.LinkByName(switchBridge)
		if err != nil {
			return err
		}
		if err := h.LinkSetUp(br); err != nil {
			return fmt.Errorf("set link %q up: %w", switchBridge, err)
		}
		return nil
	}); err != nil {
		return fmt.Errorf("simnet: switch namespace %s: %w", c.Switch, err)
	}
	// A physical switch does not run conntrack on what it forwards. The
	// keys exist only while br_netfilter is loaded.
	for _, key := range []string{"net/bridge/bridge-nf-call-iptables", "net/bridge/bridge-nf-call-ip6tables", "net/bridge/bridge-nf-call-arptables"} {
		if err := nl.SetSysctl(c.Switch, key, "0"); err != nil && !errors.Is(err, nl.ErrNotFound) {
			return fmt.Errorf("simnet: switch namespace %s: %w", c.Switch, err)
		}
	}
	return nil
}

// plug connects the namespace at ns to the switch with a veth: UnderlayDev
// (addr/UnderlayBits, MTU UnderlayMTU, up) in ns, port on the switch bridge.
func (c *Cluster) plug(ns, port string, addr netip.Addr) error {
	err := withHandle(c.Switch, func(sw *nl.Handle) error {
		peer, err := nl.OpenNS(ns)
		if err != nil {
			return err
		}
		defer peer.Close()
		veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: port, MTU: UnderlayMTU}, PeerName: UnderlayDev,
			PeerNamespace: netlink.NsFd(int(peer)), PeerMTU: UnderlayMTU}
		if err := sw.LinkAdd(veth); err != nil {
			return fmt.Errorf("create veth %q (peer %q in %s): %w", port, UnderlayDev, ns, err)
		}
		l, err := sw.LinkByName(port)
		if err != nil {
			return err
		}
		br, err := sw.LinkByName(switchBridge)
		if err != nil {
			return err
		}
		if err := sw.LinkSetMaster(l, br); err != nil {
			return fmt.Errorf("attach %q to bridge %q: %w", port, switchBridge, err)
		}
		if err := sw.LinkSetUp(l); err != nil {
			return fmt.Errorf("set link %q up: %w", port, err)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("simnet: switch port %s: %w", port, err)
	}
	err = withHandle(ns, func(h *nl.Handle) error {
		dev, err := h.LinkByName(UnderlayDev)
		if err != nil {
			return err
		}
		if err := h.AddrAdd(dev, &netlink.Addr{IPNet: ipNet(netip.PrefixFrom(addr, UnderlayBits))}); err != nil {
			return fmt.Errorf("add address %s/%d to %q: %w", addr, UnderlayBits, UnderlayDev, err)
		}
		if err := h.LinkSetUp(dev); err != nil {
			return fmt.Errorf("set link %q up: %w", UnderlayDev, err)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("simnet: namespace %s: %w", ns, err)
	}
	return nil
}

// NewNS creates the namespace <Prefix>-<name> (a pod, a test fixture) and
// returns its path. It belongs to the cluster: Close removes it. An
// existing namespace of that name is an error, not shared.
func (c *Cluster) NewNS(name string) (string, error) {
	if err := checkName(name); err != nil {
		return "", err
	}
	return c.newNS(name)
}

// newNS creates the namespace <Prefix>-<name>, which must not exist.
func (c *Cluster) newNS(name string) (string, error) {
	full := c.Prefix + "-" + name
	if nl.NamedNSExists(full) {
		return "", fmt.Errorf("simnet: create netns %q: exists already", full)
	}
	path, err := nl.CreateNamedNS(full)
	if err != nil {
		return "", fmt.Errorf("simnet: %w", err)
	}
	return path, nil
}

// Close deletes every namespace of the cluster (see the package doc),
// including those made by NewNS and the datapath's router namespaces,
// which takes every link in them along. It returns the errors joined and
// may be called again.
func (c *Cluster) Close() error { return Cleanup(c.Prefix) }

// Cleanup deletes every namespace of the cluster with this prefix, as
// Close does, for a cluster not in memory (leftovers of a crashed lab).
func Cleanup(prefix string) error {
	if err := checkPrefix(prefix); err != nil {
		return err
	}
	names, err := owned(prefix)
	errs := []error{err}
	for _, name := range names {
		errs = append(errs, nl.DeleteNamedNS(name))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("simnet: clean up %q: %w", prefix, err)
	}
	return nil
}

// owned lists the namespaces of the cluster with this prefix.
func owned(prefix string) ([]string, error) {
	var all []string
	for _, p := range []string{prefix + "-", "kvnet-" + prefix + "-"} {
		names, err := nl.ListNamedNS(p)
		if err != nil {
			return nil, fmt.Errorf("simnet: %w", err)
		}
		all = append(all, names...)
	}
	return all, nil
}

// checkPrefix accepts 1 to 32 lowercase letters and digits (no '-', so no
// prefix's "P-" starts another's), except "kvnet", whose "kvnet-" would
// take the host's router namespaces.
func checkPrefix(prefix string) error {
	ok := prefix != "" && len(prefix) <= 32 && prefix != "kvnet"
	for _, r := range prefix {
		ok = ok && (r >= 'a' && r <= 'z' || r >= '0' && r <= '9')
	}
	if !ok {
		return fmt.Errorf("simnet: invalid prefix %q: want 1-32 lowercase letters and digits, not \"kvnet\"", prefix)
	}
	return nil
}

// checkName accepts a namespace name suffix: 1 to 64 letters, digits, '-',
// '_' and '.', not one of the cluster's own.
func checkName(name string) error {
	ok := name != "" && len(name) <= 64 && name != switchName && name != externalName &&
		name != "." && name != ".."
	for _, r := range name {
		ok = ok && (r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.')
	}
	if !ok {
		return fmt.Errorf("simnet: invalid name %q: want 1-64 letters, digits, '-', '_' or '.', not %q or %q", name, switchName, externalName)
	}
	return nil
}

// withHandle runs f with a netlink handle in the namespace at path.
func withHandle(path string, f func(h *nl.Handle) error) error {
	h, err := nl.NewHandle(path)
	if err != nil {
		return err
	}
	defer h.Close()
	return f(h)
}

// ipNet converts a prefix, keeping its host bits.
func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: net.IP(p.Addr().AsSlice()), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}
