package node_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nadv1 "kvnet.io/kvnet/api/k8scni/v1"
	udnv1 "kvnet.io/kvnet/api/udn/v1"
	"kvnet.io/kvnet/internal/datapath"
	"kvnet.io/kvnet/internal/lab/simnet"
	"kvnet.io/kvnet/internal/nl"
	"kvnet.io/kvnet/internal/physnet"
	"kvnet.io/kvnet/internal/testenv"
	"kvnet.io/kvnet/internal/testenv/nstest"
)

// localnetCUDN makes namespace ns and a localnet CUDN name on the lab's
// physical network with subnet (host, the datacenter host's address there,
// excluded), with access VLAN vlan unless 0, and returns the CUDN and its
// NAD in ns.
func localnetCUDN(t *testing.T, ns, name string, vlan int32, subnet netip.Prefix, host netip.Addr) (*udnv1.ClusterUserDefinedNetwork, *nadv1.NetworkAttachmentDefinition) {
	t.Helper()
	testenv.Create(t, c, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{"localnet-test": ns}}})
	ln := &udnv1.LocalnetConfig{
		Role: udnv1.NetworkRoleSecondary, PhysicalNetworkName: simnet.PhysicalNetwork,
		Subnets:        udnv1.DualStackCIDRs{udnv1.CIDR(subnet.String())},
		ExcludeSubnets: []udnv1.CIDR{udnv1.CIDR(host.String() + "/32")},
	}
	if vlan != 0 {
		ln.VLAN = &udnv1.VLANConfig{Mode: udnv1.VLANModeAccess, Access: &udnv1.AccessVLANConfig{ID: vlan}}
	}
	cudn := &udnv1.ClusterUserDefinedNetwork{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: udnv1.ClusterUserDefinedNetworkSpec{
			NamespaceSelector: metav1.LabelSelector{MatchLabels: map[string]string{"localnet-test": ns}},
			Network:           udnv1.NetworkSpec{Topology: udnv1.NetworkTopologyLocalnet, Localnet: ln},
		},
	}
	testenv.Create(t, c, cudn)
	var nad nadv1.NetworkAttachmentDefinition
	testenv.Eventually(t, waitTimeout, "NAD of "+name, func() error {
		return c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &nad)
	})
	return cudn, &nad
}

// selecting makes a pod select network name as a secondary network.
func selecting(name string) func(*corev1.Pod) {
	return func(p *corev1.Pod) { p.Annotations["k8s.v1.cni.cncf.io/networks"] = name }
}

// serveRemoteAddr answers each TCP connection to port in the namespace at
// nsPath with the connection's source address.
func serveRemoteAddr(t *testing.T, nsPath string, port int) {
	t.Helper()
	nstest.ServeLine(t, nsPath, fmt.Sprintf(":%d", port), func(conn net.Conn) string {
		host, _, _ := net.SplitHostPort(conn.RemoteAddr().String())
		return host
	})
}

// TestAgentLocalnet: pods of a localnet CUDN on two nodes get addresses of
// the physical network from kvnet's IPAM, reach the datacenter host with
// them (it sees the allocated address, no NAT) and each other through the
// physical network; a pod of a tunnelled network does not reach it. On
// a kernel with 8021q (datapath.ProbeVLAN, as the agent probes), pods of
// a localnet network with access VLAN 100 reach the datacenter host's
// VLAN 100 sub-interface and each other, tagged; on a kernel without it
// (this machine's) such a network is refused: kvnet-node publishes the
// missing feature, the CUDN's condition names it, and kvnet-cni refuses
// the pod with the reason.
func TestAgentLocalnet(t *testing.T) {
	l := newLab(t, "n1", "n2")
	_, nad := localnetCUDN(t, "ln-plain", "agent-ln", 0, simnet.DatacenterSubnet, simnet.DatacenterHostIP)
	p1 := l.runPodOn(nad, "ln1", "n1", "net1", selecting("agent-ln"))
	p2 := l.runPodOn(nad, "ln2", "n2", "net1", selecting("agent-ln"))
	if !simnet.DatacenterSubnet.Contains(netipOf(t, p1.ip())) || p1.ip() == simnet.DatacenterHostIP.String() {
		t.Fatalf("pod address %s: want one of %s other than the host's", p1.ip(), simnet.DatacenterSubnet)
	}
	const port = 7001
	serveRemoteAddr(t, l.Sim.Physical, port)
	host := simnet.DatacenterHostIP.String()
	mustReach(t, p1, host)
	testenv.Eventually(t, waitTimeout, "the datacenter host sees "+p1.name+"'s address", func() error {
		var conn net.Conn
		if err := nl.Do(p1.netns, func() (err error) {
			conn, err = net.DialTimeout("tcp4", net.JoinHostPort(host, fmt.Sprint(port)), 2*time.Second)
			return err
		}); err != nil {
			return err
		}
		defer conn.Close()
		got, err := bufio.NewReader(conn).ReadString('\n')
		if err != nil {
			return err
		}
		if got = strings.TrimSpace(got); got != p1.ip() {
			return fmt.Errorf("host saw %s, want %s", got, p1.ip())
		}
		return nil
	})
	serveToken(t, p2)
	testenv.Eventually(t, waitTimeout, "ln1 reaches ln2 over the physical network", func() error { return answeredBy(p1, p2.ip(), "ln2") })
	// No tunnel: the bridge's only way off the node is the physical patch.
	id := networkID(t, nad)
	if linkExists(l.node("n1").NS, datapath.VXLANName(id)) {
		t.Errorf("a VXLAN device for localnet network %d", id)
	}

	// Control: a tunnelled network's pod with an address of the same
	// subnet does not reach the physical network. Its own gateway has the
	// datacenter host's address (.1) and answers pings (the positive
	// control: the pod is attached), but the host's server never does.
	other := tenant(t, "ln-other", simnet.DatacenterSubnet.String(), false)
	o := l.runPod(other, "lnother", "n1", nil)
	mustReach(t, o, host)
	for range 3 {
		if got, err := tokenAt(o, net.JoinHostPort(host, fmt.Sprint(port))); err == nil {
			t.Fatalf("%s reached the datacenter host's server, which saw %s", o.name, got)
		}
	}

	// VLAN 100: carried tagged on a kernel with 8021q, refused without.
	// The branch is the agent's own probe, run where the agent runs.
	vlanOK, err := datapath.ProbeVLAN(l.node("n1").NS)
	if err != nil {
		t.Fatal(err)
	}
	if vlanOK {
		t.Log("this kernel has 8021q: testing tagged traffic on VLAN 100")
		testLocalnetVLANAccess(t, l, port)
	} else {
		t.Log("this kernel lacks 8021q: testing the refusal of a VLAN network")
		testLocalnetVLANRefused(t, l)
	}
}

// VLAN 100's subnet on the physical network and the datacenter host's
// address there, on a VLAN sub-interface of its side of the segment.
var (
	vlanSubnet = netip.MustParsePrefix("192.168.51.0/24")
	vlanHostIP = netip.MustParseAddr("192.168.51.1")
)

// testLocalnetVLANAccess (a kernel with 8021q): the datacenter side gets a
// VLAN 100 sub-interface holding vlanHostIP and answers ARP only on the
// interface that holds the address (arp_ignore 1), so only frames tagged
// 100 reach it. Pods of a localnet CUDN with access VLAN 100 on two nodes
// reach that address (the host sees their allocated addresses: the
// server of port, serving on every address of the physical namespace)
// and each other.
func testLocalnetVLANAccess(t *testing.T, l *lab, port int) {
	t.Helper()
	if err := nl.Do(l.Sim.Physical, func() error {
		return os.WriteFile("/proc/sys/net/ipv4/conf/all/arp_ignore", []byte("1"), 0o644)
	}); err != nil {
		t.Fatal(err)
	}
	h, err := nl.NewHandle(l.Sim.Physical)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	segment := datacenterLink(t, h)
	vlanLink := &netlink.Vlan{LinkAttrs: netlink.LinkAttrs{Name: "dc.100", ParentIndex: segment.Attrs().Index}, VlanId: 100}
	if err := h.LinkAdd(vlanLink); err != nil {
		t.Fatalf("VLAN 100 on the datacenter side: %v", err)
	}
	if err := h.AddrAdd(vlanLink, &netlink.Addr{IPNet: &net.IPNet{IP: vlanHostIP.AsSlice(), Mask: net.CIDRMask(vlanSubnet.Bits(), 32)}}); err != nil {
		t.Fatal(err)
	}
	if err := h.LinkSetUp(vlanLink); err != nil {
		t.Fatal(err)
	}

	cudn, nad := localnetCUDN(t, "ln-vlan", "agent-ln-vlan", 100, vlanSubnet, vlanHostIP)
	testenv.Eventually(t, waitTimeout, "the VLAN CUDN is created", func() error {
		if err := c.Get(context.Background(), client.ObjectKeyFromObject(cudn), cudn); err != nil {
			return err
		}
		if cond := meta.FindStatusCondition(cudn.Status.Conditions, "NetworkCreated"); cond == nil || cond.Status != metav1.ConditionTrue {
			return fmt.Errorf("condition %+v", cond)
		}
		return nil
	})
	v1 := l.runPodOn(nad, "lnv1", "n1", "net1", selecting("agent-ln-vlan"))
	v2 := l.runPodOn(nad, "lnv2", "n2", "net1", selecting("agent-ln-vlan"))
	if !vlanSubnet.Contains(netipOf(t, v1.ip())) {
		t.Fatalf("VLAN pod address %s: want one of %s", v1.ip(), vlanSubnet)
	}
	addr := net.JoinHostPort(vlanHostIP.String(), fmt.Sprint(port))
	testenv.Eventually(t, waitTimeout, "the datacenter host sees "+v1.name+"'s address on VLAN 100", func() error {
		got, err := tokenAt(v1, addr)
		if err != nil {
			return err
		}
		if got != v1.ip() {
			return fmt.Errorf("host saw %s, want %s", got, v1.ip())
		}
		return nil
	})
	serveToken(t, v2)
	testenv.Eventually(t, waitTimeout, "lnv1 reaches lnv2 on VLAN 100", func() error { return answeredBy(v1, v2.ip(), "lnv2") })
}

// datacenterLink is the link of the physical namespace holding
// simnet.DatacenterHostIP: the datacenter side of the segment.
func datacenterLink(t *testing.T, h *nl.Handle) netlink.Link {
	t.Helper()
	links, err := h.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	for _, link := range links {
		addrs, err := h.AddrList(link, netlink.FAMILY_V4)
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range addrs {
			if a.IP.Equal(simnet.DatacenterHostIP.AsSlice()) {
				return link
			}
		}
	}
	t.Fatalf("no link holds %s in the physical namespace", simnet.DatacenterHostIP)
	return nil
}

// testLocalnetVLANRefused (a kernel without 8021q): kvnet-node publishes
// the missing feature, the CUDN's condition names it, kvnet-cni refuses
// the pod with the reason, and no VLAN device is made.
func testLocalnetVLANRefused(t *testing.T, l *lab) {
	t.Helper()
	testenv.Eventually(t, waitTimeout, "kvnet-node publishes the missing 8021q", func() error {
		var nd corev1.Node
		if err := c.Get(context.Background(), client.ObjectKey{Name: l.nodeName("n1")}, &nd); err != nil {
			return err
		}
		if !physnet.LacksVLAN(&nd) {
			return fmt.Errorf("node annotations %v", nd.Annotations)
		}
		return nil
	})
	cudn, vnad := localnetCUDN(t, "ln-vlan", "agent-ln-vlan", 100, vlanSubnet, vlanHostIP)
	testenv.Eventually(t, waitTimeout, "the VLAN CUDN's condition names 8021q", func() error {
		if err := c.Get(context.Background(), client.ObjectKeyFromObject(cudn), cudn); err != nil {
			return err
		}
		cond := meta.FindStatusCondition(cudn.Status.Conditions, "NetworkCreated")
		if cond == nil || cond.Status != metav1.ConditionFalse || cond.Reason != "KernelFeatureMissing" ||
			!strings.Contains(cond.Message, "8021q") || !strings.Contains(cond.Message, l.nodeName("n1")) {
			return fmt.Errorf("condition %+v", cond)
		}
		return nil
	})
	v := l.allocatedPod(vnad, "lnvlan", "n1", "net1", selecting("agent-ln-vlan"))
	testenv.Eventually(t, waitTimeout, "kvnet-cni refuses the VLAN network with the reason", func() error {
		err := l.tryCNI("ADD", vnad, v)
		if err == nil {
			l.cni("DEL", vnad, v)
			return fmt.Errorf("ADD of a VLAN network on a kernel without 8021q succeeded")
		}
		if !strings.Contains(err.Error(), "needs 802.1Q VLAN links (the Linux kernel module 8021q)") {
			return err
		}
		return nil
	})
	if linkExists(l.node("n1").NS, "kvlv"+fmt.Sprint(networkID(t, vnad))) {
		t.Error("a VLAN device exists on a kernel that cannot make one")
	}
}

func netipOf(t *testing.T, s string) netip.Addr {
	t.Helper()
	a, err := netip.ParseAddr(s)
	if err != nil {
		t.Fatal(err)
	}
	return a
}
