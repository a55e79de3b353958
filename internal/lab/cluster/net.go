package cluster

import (
	"bytes"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strings"
)

// The cluster's fixed addresses: one cluster per machine.
const (
	// BridgeName is the host bridge every node's eth0 is plugged into.
	BridgeName = "kvcbr0"
	// NetnsPrefix starts the name of every node's network namespace
	// (kvc-node-1, ...) and of its veth's host end.
	NetnsPrefix = "kvc-"
	// RegistryPort is the registry's port on HostIP.
	RegistryPort = 5000
	// cgroupPrefix starts the name of every node's cgroup root
	// (/kvc-node-1 in each hierarchy).
	cgroupPrefix = "kvc-"
)

var (
	// HostIP is the host's address on BridgeName: the registry's, and the
	// nodes' default gateway.
	HostIP = netip.MustParseAddr("10.89.0.1")
	// NodeSubnet is the bridge's subnet.
	NodeSubnet = netip.MustParsePrefix("10.89.0.0/24")
	// KubernetesServiceIP is the kubernetes Service's cluster IP, the
	// first of the lab's Service range (controlplane.ServiceCIDR).
	KubernetesServiceIP = netip.MustParseAddr("10.96.0.1")
	// ClusterCIDR holds every node's pod subnet (10.244.<i>.0/24).
	ClusterCIDR = netip.MustParsePrefix("10.244.0.0/16")
)

// The IPv6 side of a dual-stack cluster (Config.IPFamily IPFamilyDual).
var (
	// HostIP6 is the host's IPv6 address on BridgeName, the nodes'
	// default IPv6 gateway.
	HostIP6 = netip.MustParseAddr("fd89::1")
	// NodeSubnet6 is the bridge's IPv6 subnet.
	NodeSubnet6 = netip.MustParsePrefix("fd89::/64")
	// ClusterCIDR6 holds every node's IPv6 pod subnet
	// (fd00:10:244:<i>::/64).
	ClusterCIDR6 = netip.MustParsePrefix("fd00:10:244::/56")
)

// IP families of a cluster (Config.IPFamily).
const (
	IPFamilyIPv4 = "ipv4"
	IPFamilyDual = "dual"
)

// NodeIP6 is node i's IPv6 address on the bridge.
func NodeIP6(i int) netip.Addr {
	return netip.AddrFrom16([16]byte{0xfd, 0x89, 15: byte(10 + i)})
}

// PodCIDR6 is node i's IPv6 pod subnet.
func PodCIDR6(i int) netip.Prefix {
	return netip.PrefixFrom(netip.AddrFrom16([16]byte{0xfd, 0x00, 0x00, 0x10, 0x02, 0x44, 0x00, byte(i)}), 64)
}

// The datacenter network localnet networks attach to: a host bridge with
// an address on the physical subnet (a host of the datacenter), and in
// every node a Linux bridge holding the node's uplink to it, which the
// nodes map physical network PhysNetwork to (kvnet.io/bridge-mappings).
const (
	// PhysBridgeName is the host's bridge of the datacenter network.
	PhysBridgeName = "kvcphys0"
	// PhysNodeBridge is each node's bridge on the datacenter network.
	PhysNodeBridge = "br-phys"
	// PhysNetwork is the physical network's name (physicalNetworkName).
	PhysNetwork = "physnet"
)

var (
	// PhysSubnet is the datacenter network's subnet.
	PhysSubnet = netip.MustParsePrefix("192.168.60.0/24")
	// PhysHostIP is this host's address on it.
	PhysHostIP = netip.MustParseAddr("192.168.60.1")
)

// NodeName is the Kubernetes name of node i (counted from 1).
func NodeName(i int) string { return fmt.Sprintf("node-%d", i) }

// NodeIP is node i's address on the bridge.
func NodeIP(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 89, 0, byte(10 + i)}) }

// PodCIDR is node i's pod subnet.
func PodCIDR(i int) netip.Prefix {
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 244, byte(i), 0}), 24)
}

// Netns is the name of node i's network namespace (under /run/netns).
func Netns(i int) string { return NetnsPrefix + NodeName(i) }

// run runs a command and returns its error with its output.
func run(name string, args ...string) error {
	cmd := exec.Command(name, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(out.String()))
	}
	return nil
}

// inNetns runs a command in node i's network namespace.
func inNetns(i int, name string, args ...string) error {
	return run("ip", append([]string{"netns", "exec", Netns(i), name}, args...)...)
}

// buildBridge makes the host bridge with HostIP. Bridge netfilter is off
// on it: the host's firewall has no say in what crosses between nodes,
// as a physical switch does not run it.
func buildBridge(dual bool) error {
	steps := [][]string{
		{"link", "add", BridgeName, "type", "bridge"},
		{"link", "set", BridgeName, "type", "bridge", "nf_call_iptables", "0", "nf_call_ip6tables", "0", "nf_call_arptables", "0"},
		{"addr", "add", netip.PrefixFrom(HostIP, NodeSubnet.Bits()).String(), "dev", BridgeName},
		{"link", "set", BridgeName, "up"},
	}
	if dual {
		steps = append(steps, []string{"addr", "add", netip.PrefixFrom(HostIP6, NodeSubnet6.Bits()).String(), "dev", BridgeName, "nodad"})
	}
	for _, s := range steps {
		if err := run("ip", s...); err != nil {
			return fmt.Errorf("host bridge: %w", err)
		}
	}
	phys := [][]string{
		{"link", "add", PhysBridgeName, "type", "bridge"},
		{"link", "set", PhysBridgeName, "type", "bridge", "nf_call_iptables", "0", "nf_call_ip6tables", "0", "nf_call_arptables", "0"},
		{"addr", "add", netip.PrefixFrom(PhysHostIP, PhysSubnet.Bits()).String(), "dev", PhysBridgeName},
		{"link", "set", PhysBridgeName, "up"},
	}
	for _, s := range phys {
		if err := run("ip", s...); err != nil {
			return fmt.Errorf("datacenter bridge: %w", err)
		}
	}
	return nil
}

// physUplink is the host end of node i's uplink to the datacenter
// network (removeNet deletes it with the node's other veth).
func physUplink(i int) string { return Netns(i) + "p" }

// buildNodeNet makes node i's network namespace, plugged into the bridge
// with NodeIP(i) on its eth0, forwarding on, default route to the host.
func buildNodeNet(i int, dual bool) error {
	ns, hostEnd := Netns(i), Netns(i)
	if err := run("ip", "netns", "add", ns); err != nil {
		return err
	}
	steps := [][]string{
		{"link", "add", hostEnd, "type", "veth", "peer", "name", "eth0", "netns", ns},
		{"link", "set", hostEnd, "master", BridgeName},
		{"link", "set", hostEnd, "up"},
		{"link", "add", physUplink(i), "type", "veth", "peer", "name", "phys0", "netns", ns},
		{"link", "set", physUplink(i), "master", PhysBridgeName},
		{"link", "set", physUplink(i), "up"},
	}
	for _, s := range steps {
		if err := run("ip", s...); err != nil {
			return fmt.Errorf("node %s: %w", NodeName(i), err)
		}
	}
	in := [][]string{
		{"ip", "link", "set", "lo", "up"},
		{"ip", "addr", "add", netip.PrefixFrom(NodeIP(i), NodeSubnet.Bits()).String(), "dev", "eth0"},
		{"ip", "link", "set", "eth0", "up"},
		{"ip", "route", "add", "default", "via", HostIP.String()},
		// A node routes its pods' traffic.
		{"sysctl", "-qw", "net.ipv4.ip_forward=1"},
		// Its uplink to the datacenter network, in the bridge localnet
		// networks are patched into.
		{"ip", "link", "add", PhysNodeBridge, "type", "bridge"},
		{"ip", "link", "set", "phys0", "master", PhysNodeBridge},
		{"ip", "link", "set", "phys0", "up"},
		{"ip", "link", "set", PhysNodeBridge, "up"},
	}
	if dual {
		in = append(in,
			[]string{"ip", "addr", "add", netip.PrefixFrom(NodeIP6(i), NodeSubnet6.Bits()).String(), "dev", "eth0", "nodad"},
			[]string{"ip", "-6", "route", "add", "default", "via", HostIP6.String()},
			[]string{"sysctl", "-qw", "net.ipv6.conf.all.forwarding=1"})
	}
	for _, s := range in {
		if err := inNetns(i, s[0], s[1:]...); err != nil {
			return fmt.Errorf("node %s: %w", NodeName(i), err)
		}
	}
	return nil
}

// routePodSubnets routes every node's pod subnet to that node: on the
// host and, with betweenNodes, on every other node (the stand-in for
// Flannel's routes). The host's routes let the API server reach pods: a
// webhook's or an aggregated API's endpoint (--enable-aggregator-routing).
func routePodSubnets(nodes int, betweenNodes bool) error {
	for j := 1; j <= nodes; j++ {
		via := NodeIP(j).String()
		if err := run("ip", "route", "replace", PodCIDR(j).String(), "via", via, "dev", BridgeName); err != nil {
			return err
		}
		for i := 1; i <= nodes && betweenNodes; i++ {
			if i == j {
				continue
			}
			if err := inNetns(i, "ip", "route", "replace", PodCIDR(j).String(), "via", via); err != nil {
				return fmt.Errorf("node %s: %w", NodeName(i), err)
			}
		}
	}
	return nil
}

// removeNet deletes every node namespace and the bridge (with the host
// routes through it); what is not there is skipped.
func removeNet() error {
	var errs []string
	// The nodes' veths first: deleting a namespace leaves its veth pair to
	// the kernel's asynchronous teardown of the namespace, so the host end
	// could outlive this call and the next Up's "ip link add" fail with
	// "File exists" (seen under load). Deleting the host end is
	// synchronous and takes the node's end with it.
	links, _ := os.ReadDir("/sys/class/net")
	for _, l := range links {
		if strings.HasPrefix(l.Name(), NetnsPrefix+"node-") {
			if err := run("ip", "link", "del", l.Name()); err != nil {
				if _, statErr := os.Stat("/sys/class/net/" + l.Name()); statErr == nil {
					errs = append(errs, err.Error())
				}
			}
		}
	}
	entries, _ := os.ReadDir("/run/netns")
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), NetnsPrefix+"node-") {
			if err := run("ip", "netns", "del", e.Name()); err != nil {
				errs = append(errs, err.Error())
			}
		}
	}
	for _, b := range []string{BridgeName, PhysBridgeName} {
		if _, err := os.Stat("/sys/class/net/" + b); err == nil {
			if err := run("ip", "link", "del", b); err != nil {
				errs = append(errs, err.Error())
			}
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("remove network: %s", strings.Join(errs, "; "))
	}
	return nil
}
