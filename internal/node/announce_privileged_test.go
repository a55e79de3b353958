package node_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nadv1 "kvnet.io/kvnet/api/k8scni/v1"
	ipamclaimv1alpha1 "kvnet.io/kvnet/api/k8scni/v1alpha1"
	kubevirtv1 "kvnet.io/kvnet/api/kubevirt/v1"
	"kvnet.io/kvnet/internal/datapath"
	"kvnet.io/kvnet/internal/migration"
	"kvnet.io/kvnet/internal/nl"
	"kvnet.io/kvnet/internal/node"
	"kvnet.io/kvnet/internal/testenv"
	"kvnet.io/kvnet/internal/testenv/nstest"
)

// TestAgentOpensTargetOnGuestFrame: during a live migration whose VMI the
// API never moves (status.nodeName stays the source node, the migration
// never completes), the guest's first frame on the target node alone
// opens the target's standby port: QEMU's RARP announce (ethertype
// 0x8035 from the guest's MAC) in one case, the guest's first IPv4 packet
// in the other. Each VM's source pod is down (its guest paused), so only
// the target pod can answer the peer's ARP for the VM's address, and its
// answer passes only an open port.
func TestAgentOpensTargetOnGuestFrame(t *testing.T) {
	testenv.NeedsFixture(t, env != nil)
	ctx := context.Background()
	l := newLab(t, "n1", "n2", "n3")
	nad := tenant(t, "agent-frame", "10.6.0.0/24", true)
	peer := l.runPod(nad, "peer", "n3", nil)

	rarpSrc, rarpDst := migratingVM(t, l, nad, "vm-rarp")
	ipSrc, ipDst := migratingVM(t, l, nad, "vm-ip")

	switched := func() float64 {
		var n float64
		for _, m := range metricsOf(t, "kvnet_migration_switchovers_total", l.nodeName("n2")) {
			if labelValue(m, "trigger") == node.TriggerFirstFrame {
				n += m.GetCounter().GetValue()
			}
		}
		return n
	}
	before := switched()
	defer func() {
		if n := switched() - before; n != 2 {
			t.Errorf("n2 counted %v switch-overs at a first frame, want 2", n)
		}
	}()
	for _, tc := range []struct {
		name, vm string
		src, dst *pod
		frame    []byte
	}{
		{"RARP", "vm-rarp", rarpSrc, rarpDst, rarpFrame(mac(t, rarpDst.a.MACAddress))},
		{"first IPv4 packet", "vm-ip", ipSrc, ipDst,
			ipv4UDPFrame(mac(t, ipDst.a.MACAddress), mac(t, peer.a.MACAddress), netip.MustParseAddr(ipDst.ip()), netip.MustParseAddr(peer.ip()))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			guestMAC := tc.dst.a.MACAddress
			testenv.Eventually(t, waitTimeout, "the target's port on n2 on standby", targetPort(l, guestMAC, true))
			if tc.name == "RARP" {
				// The target's port goes down and up again while on
				// standby: its reader is told once (ENETDOWN) and must
				// still see the guest's first frame after.
				flapTargetPort(t, l, guestMAC)
			}
			// The source guest pauses: only the target can answer now.
			if err := nstest.Exec(tc.src.netns, "ip", "link", "set", tc.src.ifName, "down"); err != nil {
				t.Fatal(err)
			}
			if err := arping(peer, tc.dst.ip()); err == nil {
				t.Fatal("the peer's ARP was answered before the guest's first frame: the target's standby port let the target pod's answer through")
			}
			if err := sendFrame(tc.dst, tc.frame); err != nil {
				t.Fatal(err)
			}
			testenv.Eventually(t, waitTimeout, "the target's port opened by the guest's "+tc.name+" (the peer's ARP answered through it)", func() error {
				return arping(peer, tc.dst.ip())
			})
			testenv.Eventually(t, waitTimeout, "n2's plan keeps the target's port open", targetPort(l, guestMAC, false))
			// n2 marks the target pod, and n1 shuts the source's port
			// before anything moved the VMI.
			testenv.Eventually(t, waitTimeout, "n1's plan has the source's port departed", func() error {
				for _, p := range l.agent("n1").LastPlan().State.Ports {
					if p.MAC.String() == guestMAC && p.Departed {
						return nil
					}
				}
				return fmt.Errorf("no departed port of %s in n1's plan", guestMAC)
			})
			var target corev1.Pod
			if err := c.Get(ctx, client.ObjectKey{Namespace: nad.Namespace, Name: tc.dst.name}, &target); err != nil {
				t.Fatal(err)
			}
			if _, ok := target.Annotations[migration.GuestArrivedAnnotation]; !ok {
				t.Errorf("target pod %s lacks %s: %v", tc.dst.name, migration.GuestArrivedAnnotation, target.Annotations)
			}
			// Nothing moved the VMI: the frame alone did it.
			var vmi kubevirtv1.VirtualMachineInstance
			if err := c.Get(ctx, client.ObjectKey{Namespace: nad.Namespace, Name: tc.vm}, &vmi); err != nil {
				t.Fatal(err)
			}
			if ms := vmi.Status.MigrationState; vmi.Status.NodeName != l.nodeName("n1") || ms == nil || ms.Completed || ms.Failed {
				t.Fatalf("VMI %s moved: node %q, migration %+v", tc.vm, vmi.Status.NodeName, ms)
			}
			// The switch-over, told to the VM's owner on the VMI and
			// counted in n2's metrics.
			wantFrame := map[string]string{"RARP": "(RARP)", "first IPv4 packet": "(IPv4 from " + tc.dst.ip() + ")"}[tc.name]
			testenv.Eventually(t, waitTimeout, "the switch-over's Event on VMI "+tc.vm, func() error {
				var evs eventsv1.EventList
				if err := c.List(ctx, &evs, client.InNamespace(nad.Namespace)); err != nil {
					return err
				}
				var seen []string
				for _, e := range evs.Items {
					if e.Regarding.Kind != "VirtualMachineInstance" || e.Regarding.Name != tc.vm {
						continue
					}
					seen = append(seen, e.Reason+": "+e.Note)
					if e.Reason == migration.EventSwitchover && e.Type == corev1.EventTypeNormal &&
						strings.Contains(e.Note, "to node "+l.nodeName("n2")+" at the guest's first frame there "+wantFrame) {
						return nil
					}
				}
				return fmt.Errorf("events of the VMI: %q", seen)
			})
		})
	}
}

// TestAgentProbesStandbyPort: a migration target whose guest sends
// nothing on its own (behind its pod's NAT, KubeVirt's masquerade) is
// opened by its answer to kvnet-node's standby probe. The target pod's
// own stack holds the guest's address and answers the probes itself
// first (its ICMP counters say so): those answers (TTL 64) leave the port
// on standby. With the pod's TTL at 63, its answers look as a guest's
// forwarded through the pod's NAT do: the port opens at the first, and
// the VMI's event names it.
func TestAgentProbesStandbyPort(t *testing.T) {
	testenv.NeedsFixture(t, env != nil)
	ctx := context.Background()
	l := newLab(t, "n1", "n2", "n3")
	nad := tenant(t, "agent-probe", "10.9.0.0/24", true)
	l.runPod(nad, "peer", "n3", nil)
	_, dst := migratingVM(t, l, nad, "vm-probe")
	testenv.Eventually(t, waitTimeout, "the target's port on n2 on standby", targetPort(l, dst.a.MACAddress, true))
	before := echoReplies(t, dst)
	testenv.Eventually(t, waitTimeout, "the target pod answering kvnet-node's probes itself", func() error {
		if n := echoReplies(t, dst) - before; n < 5 {
			return fmt.Errorf("%d echo replies", n)
		}
		return nil
	})
	if err := targetPort(l, dst.a.MACAddress, true)(); err != nil {
		t.Fatalf("the pod's own answers to the probes opened the port: %v", err)
	}
	if err := nstest.Exec(dst.netns, "sysctl", "-q", "-w", "net.ipv4.ip_default_ttl=63"); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, waitTimeout, "the port opened by an answer forwarded from the guest", targetPort(l, dst.a.MACAddress, false))
	testenv.Eventually(t, waitTimeout, "the switch-over's Event on VMI vm-probe", func() error {
		var evs eventsv1.EventList
		if err := c.List(ctx, &evs, client.InNamespace(nad.Namespace)); err != nil {
			return err
		}
		var seen []string
		for _, e := range evs.Items {
			if e.Regarding.Name != "vm-probe" {
				continue
			}
			seen = append(seen, e.Reason+": "+e.Note)
			if e.Reason == migration.EventSwitchover && strings.Contains(e.Note, "first frame there (IPv4 from "+dst.ip()+")") {
				return nil
			}
		}
		return fmt.Errorf("events of the VMI: %q", seen)
	})
}

// echoReplies returns how many ICMP echo replies pod p's stack sent.
func echoReplies(t *testing.T, p *pod) int {
	t.Helper()
	b, err := exec.Command("ip", "netns", "exec", filepath.Base(p.netns), "cat", "/proc/net/snmp").Output()
	if err != nil {
		t.Fatal(err)
	}
	out := string(b)
	lines := strings.Split(out, "\n")
	for i := 0; i+1 < len(lines); i++ {
		if !strings.HasPrefix(lines[i], "Icmp: ") || !strings.HasPrefix(lines[i+1], "Icmp: ") {
			continue
		}
		names, values := strings.Fields(lines[i]), strings.Fields(lines[i+1])
		for j, n := range names {
			if n == "OutEchoReps" && j < len(values) {
				v, _ := strconv.Atoi(values[j])
				return v
			}
		}
	}
	t.Fatalf("no Icmp OutEchoReps in pod %s's /proc/net/snmp:\n%s", p.name, out)
	return 0
}

// TestAgentSwitchoverByAPI: a migration target whose guest never sends a
// frame there is switched when the API names the target node; kvnet-node
// says so on the VMI (a Warning: the guest's traffic went to the source
// until then) and counts it as an API switch-over. The source node's
// kvnet-node probes the guest until it pauses and publishes its last
// frame on the source pod once the VMI moved; the target's report says
// how long the network was dark from it.
func TestAgentSwitchoverByAPI(t *testing.T) {
	testenv.NeedsFixture(t, env != nil)
	ctx := context.Background()
	l := newLab(t, "n1", "n2")
	nad := tenant(t, "agent-api-switch", "10.8.0.0/24", true)
	src, dst := migratingVM(t, l, nad, "vm-api")
	testenv.Eventually(t, waitTimeout, "the target's port on n2 on standby", targetPort(l, dst.a.MACAddress, true))
	darkBefore := darkCount(t, l.nodeName("n2"))
	// The source's guest answers n1's probes until it pauses: with the
	// pod's TTL at 63 its answers look as a guest's forwarded through
	// the pod's NAT do (the pod's own, TTL 64, do not count).
	if err := nstest.Exec(src.netns, "sysctl", "-q", "-w", "net.ipv4.ip_default_ttl=63"); err != nil {
		t.Fatal(err)
	}
	since := time.Now()
	replies := echoReplies(t, src)
	testenv.Eventually(t, waitTimeout, "the source pod answering n1's migration probes", func() error {
		if n := echoReplies(t, src) - replies; n < 3 {
			return fmt.Errorf("%d echo replies", n)
		}
		return nil
	})
	if err := nstest.Exec(src.netns, "ip", "link", "set", src.ifName, "down"); err != nil {
		t.Fatal(err)
	}
	paused := time.Now()
	var vmi kubevirtv1.VirtualMachineInstance
	if err := c.Get(ctx, client.ObjectKey{Namespace: nad.Namespace, Name: "vm-api"}, &vmi); err != nil {
		t.Fatal(err)
	}
	end := metav1.Now()
	vmi.Status.NodeName = l.nodeName("n2")
	vmi.Status.MigrationState.Completed, vmi.Status.MigrationState.EndTimestamp = true, &end
	if err := c.Status().Update(ctx, &vmi); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, waitTimeout, "n2's plan opens the port the API moved there", func() error {
		for _, p := range l.agent("n2").LastPlan().State.Ports {
			if p.MAC.String() == dst.a.MACAddress && !p.Standby && !p.Migrating {
				return nil
			}
		}
		return fmt.Errorf("no open port of %s in n2's plan", dst.a.MACAddress)
	})
	testenv.Eventually(t, waitTimeout, "the API switch-over's Warning on the VMI", func() error {
		var evs eventsv1.EventList
		if err := c.List(ctx, &evs, client.InNamespace(nad.Namespace)); err != nil {
			return err
		}
		var seen []string
		for _, e := range evs.Items {
			if e.Regarding.Kind != "VirtualMachineInstance" || e.Regarding.Name != "vm-api" {
				continue
			}
			seen = append(seen, e.Reason+": "+e.Note)
			if e.Reason == migration.EventSwitchedByAPI && e.Type == corev1.EventTypeWarning && strings.Contains(e.Note, "by the API") &&
				strings.Contains(e.Note, "the network was dark") && strings.Contains(e.Note, "last frame on node "+l.nodeName("n1")+" (IPv4 from "+src.ip()+")") {
				return nil
			}
		}
		return fmt.Errorf("events of the VMI: %q", seen)
	})
	var n float64
	for _, m := range metricsOf(t, "kvnet_migration_switchovers_total", l.nodeName("n2")) {
		if labelValue(m, "trigger") == node.TriggerAPI {
			n += m.GetCounter().GetValue()
		}
	}
	if n != 1 {
		t.Errorf("n2 counted %v switch-overs by the API, want 1", n)
	}
	if n := darkCount(t, l.nodeName("n2")) - darkBefore; n != 1 {
		t.Errorf("n2 observed %d dark durations, want 1", n)
	}
	// The source pod holds the guest's last frame on n1: after the probes
	// began, before the guest paused.
	var p corev1.Pod
	if err := c.Get(ctx, client.ObjectKey{Namespace: nad.Namespace, Name: src.name}, &p); err != nil {
		t.Fatal(err)
	}
	frames, err := migration.ParseLastFrames(p.Annotations[migration.LastFramesAnnotation])
	if err != nil || len(frames) != 1 {
		t.Fatalf("source pod's last frames %v (%v), want one network's", frames, err)
	}
	for network, f := range frames {
		if f.Node != l.nodeName("n1") || f.At.Before(since) || f.At.After(paused) {
			t.Errorf("network %s: last frame %+v, want one on %s between %s and %s", network, f, l.nodeName("n1"), since, paused)
		}
	}
}

// darkCount is how many dark durations node has observed.
func darkCount(t *testing.T, node string) uint64 {
	t.Helper()
	var n uint64
	for _, m := range metricsOf(t, "kvnet_migration_dark_seconds", node) {
		n += m.GetHistogram().GetSampleCount()
	}
	return n
}

// migratingVM starts VM vm's source pod on n1 and target pod on n2 of
// lab l, with its VMI on n1 and a migration to n2 running, never
// completed.
func migratingVM(t *testing.T, l *lab, nad *nadv1.NetworkAttachmentDefinition, vm string) (src, dst *pod) {
	t.Helper()
	ctx := context.Background()
	testenv.Create(t, c, &ipamclaimv1alpha1.IPAMClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: nad.Namespace, Name: vm + ".udn"},
		Spec:       ipamclaimv1alpha1.IPAMClaimSpec{Network: nad.Namespace + "_udn", Interface: "ovn-udn1"},
	})
	launcher := func(p *corev1.Pod) {
		p.Labels["kubevirt.io"] = "virt-launcher"
		p.Labels["vm.kubevirt.io/name"] = vm
		p.Annotations[kubevirtv1.DomainAnnotation] = vm
		p.Annotations["k8s.ovn.org/primary-udn-ipamclaim"] = vm + ".udn"
	}
	src = l.runPod(nad, "virt-launcher-"+vm+"-a", "n1", launcher)
	dst = l.runPod(nad, "virt-launcher-"+vm+"-b", "n2", launcher)
	if dst.a.MACAddress != src.a.MACAddress || dst.ip() != src.ip() {
		t.Fatalf("%s: target got %s/%s, source %s/%s: the claim must give both the same", vm, dst.a.MACAddress, dst.ip(), src.a.MACAddress, src.ip())
	}
	vmi := &kubevirtv1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: nad.Namespace, Name: vm}}
	testenv.Create(t, c, vmi)
	start := metav1.Now()
	vmi.Status.NodeName = l.nodeName("n1")
	vmi.Status.MigrationState = &kubevirtv1.VirtualMachineInstanceMigrationState{
		SourceNode: l.nodeName("n1"), SourcePod: src.name, TargetNode: l.nodeName("n2"), TargetPod: dst.name, StartTimestamp: &start,
	}
	if err := c.Status().Update(ctx, vmi); err != nil {
		t.Fatal(err)
	}
	return src, dst
}

// TestAgentAnswersStandbyPortARP: a migration target whose pod's own
// stack sends the guest's traffic (KubeVirt's masquerade binding: the
// guest is behind NAT in the pod, and the pod's neighbour cache starts
// empty) must resolve its peer before the first packet that opens its
// port can leave, while the standby port drops the ARP request itself.
// kvnet-node answers it with the peer's (or the gateway's) MAC; the
// answer alone does not open the port; the pod's first packet then does,
// with the VMI never moved by the API.
func TestAgentAnswersStandbyPortARP(t *testing.T) {
	testenv.NeedsFixture(t, env != nil)
	ctx := context.Background()
	l := newLab(t, "n1", "n2", "n3")
	nad := tenant(t, "agent-masq", "10.7.0.0/24", true)
	peer := l.runPod(nad, "peer", "n3", nil)
	src, dst := migratingVM(t, l, nad, "vm-masq")
	guestMAC := dst.a.MACAddress
	testenv.Eventually(t, waitTimeout, "the target's port on n2 on standby", targetPort(l, guestMAC, true))
	if err := nstest.Exec(src.netns, "ip", "link", "set", src.ifName, "down"); err != nil {
		t.Fatal(err)
	}

	// The target pod's ARP for the peer and for the gateway: answered by
	// kvnet-node, with their MACs, and the port stays on standby.
	for _, tc := range []struct{ what, ip, mac string }{
		{"the peer", peer.ip(), peer.a.MACAddress},
		{"the gateway", "10.7.0.1", datapath.GatewayMAC(l.agent("n2").LastPlan().State.Networks[0].ID).String()},
	} {
		out, err := exec.Command("ip", "netns", "exec", filepath.Base(dst.netns), "busybox", "arping", "-c", "1", "-w", "2", "-I", dst.ifName, tc.ip).CombinedOutput()
		if err != nil {
			t.Fatalf("the target pod's ARP for %s (%s) was not answered: %v\n%s", tc.what, tc.ip, err, out)
		}
		if !strings.Contains(strings.ToLower(string(out)), tc.mac) {
			t.Fatalf("the target pod's ARP for %s (%s) was answered, not with %s:\n%s", tc.what, tc.ip, tc.mac, out)
		}
	}
	if err := targetPort(l, guestMAC, true)(); err != nil {
		t.Fatalf("after the ARP answers: %v: an ARP request opened the port", err)
	}

	// The pod's own first packet (as masquerade sends the guest's) opens
	// the port, and the peer's answer comes back through it.
	testenv.Eventually(t, waitTimeout, "the target pod pings the peer through its opened port", func() error {
		return nstest.Ping(dst.netns, peer.ip())
	})
	testenv.Eventually(t, waitTimeout, "n2's plan keeps the target's port open", targetPort(l, guestMAC, false))
	var vmi kubevirtv1.VirtualMachineInstance
	if err := c.Get(ctx, client.ObjectKey{Namespace: nad.Namespace, Name: "vm-masq"}, &vmi); err != nil {
		t.Fatal(err)
	}
	if ms := vmi.Status.MigrationState; vmi.Status.NodeName != l.nodeName("n1") || ms == nil || ms.Completed || ms.Failed {
		t.Fatalf("VMI moved: node %q, migration %+v", vmi.Status.NodeName, ms)
	}
}

// targetPort checks that n2's last plan has the migrating port of MAC
// guestMAC, on standby or not.
func targetPort(l *lab, guestMAC string, standby bool) func() error {
	return func() error {
		for _, p := range l.agent("n2").LastPlan().State.Ports {
			if p.MAC.String() != guestMAC {
				continue
			}
			if !p.Migrating || p.Standby != standby {
				return fmt.Errorf("port %s: migrating %v, standby %v; want migrating, standby %v", p.HostIfName, p.Migrating, p.Standby, standby)
			}
			return nil
		}
		return fmt.Errorf("no port of %s in n2's plan", guestMAC)
	}
}

// flapTargetPort sets the host end of n2's port of guestMAC down, then
// up.
func flapTargetPort(t *testing.T, l *lab, guestMAC string) {
	t.Helper()
	for _, p := range l.agent("n2").LastPlan().State.Ports {
		if p.MAC.String() != guestMAC {
			continue
		}
		for _, state := range []string{"down", "up"} {
			if err := nstest.Exec(l.node("n2").NS, "ip", "link", "set", p.HostIfName, state); err != nil {
				t.Fatal(err)
			}
		}
		return
	}
	t.Fatalf("no port of %s in n2's plan", guestMAC)
}

// arping asks, from p, for ip's MAC once and fails unless answered.
func arping(from *pod, ip string) error {
	return nstest.Exec(from.netns, "busybox", "arping", "-c", "1", "-w", "1", "-I", from.ifName, ip)
}

func mac(t *testing.T, s string) net.HardwareAddr {
	t.Helper()
	m, err := net.ParseMAC(s)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// sendFrame sends the Ethernet frame b out of p's interface, as its guest
// would.
func sendFrame(p *pod, b []byte) error {
	return nl.Do(p.netns, func() error {
		ifc, err := net.InterfaceByName(p.ifName)
		if err != nil {
			return err
		}
		proto := binary.BigEndian.Uint16(b[12:14])
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		to := &unix.SockaddrLinklayer{Ifindex: ifc.Index, Protocol: proto<<8 | proto>>8, Halen: 6}
		copy(to.Addr[:], b[0:6])
		return unix.Sendto(fd, b, 0, to)
	})
}

// rarpFrame is QEMU's announce of a guest with MAC m: a broadcast RARP
// request (ethertype 0x8035, reverse request) from and about m.
func rarpFrame(m net.HardwareAddr) []byte {
	b := make([]byte, 60)
	copy(b[0:6], []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	copy(b[6:12], m)
	binary.BigEndian.PutUint16(b[12:], 0x8035)
	binary.BigEndian.PutUint16(b[14:], 1)      // hardware: Ethernet
	binary.BigEndian.PutUint16(b[16:], 0x0800) // protocol: IPv4
	b[18], b[19] = 6, 4
	binary.BigEndian.PutUint16(b[20:], 3) // reverse request
	copy(b[22:28], m)                     // sender MAC; sender IP 0
	copy(b[32:38], m)                     // target MAC; target IP 0
	return b
}

// ipv4UDPFrame is a guest's IPv4 UDP packet from MAC from and address src
// to MAC to and address dst.
func ipv4UDPFrame(from, to net.HardwareAddr, src, dst netip.Addr) []byte {
	b := make([]byte, 60)
	copy(b[0:6], to)
	copy(b[6:12], from)
	binary.BigEndian.PutUint16(b[12:], 0x0800)
	ip := b[14:34]
	ip[0], ip[8], ip[9] = 0x45, 64, unix.IPPROTO_UDP
	binary.BigEndian.PutUint16(ip[2:], 20+8+4)
	s, d := src.As4(), dst.As4()
	copy(ip[12:16], s[:])
	copy(ip[16:20], d[:])
	var sum uint32
	for i := 0; i < 20; i += 2 {
		sum += uint32(binary.BigEndian.Uint16(ip[i:]))
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	binary.BigEndian.PutUint16(ip[10:], ^uint16(sum))
	udp := b[34:42]
	binary.BigEndian.PutUint16(udp[0:], 40000)
	binary.BigEndian.PutUint16(udp[2:], 9) // discard
	binary.BigEndian.PutUint16(udp[4:], 8+4)
	copy(b[42:46], "ping")
	return b
}
