package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ipamv1alpha1 "kvnet.io/kvnet/api/k8scni/v1alpha1"
	kubevirtv1 "kvnet.io/kvnet/api/kubevirt/v1"
	"kvnet.io/kvnet/internal/kubevirt/launcher"
	"kvnet.io/kvnet/internal/lab/cli/lab"
	"kvnet.io/kvnet/internal/lab/guest"
	"kvnet.io/kvnet/internal/lab/simkubelet"
	"kvnet.io/kvnet/internal/lab/simlauncher"
	"kvnet.io/kvnet/internal/lab/simvirt"
	"kvnet.io/kvnet/internal/vmclaims"
)

// demoVM is the VM the demo migrates; demoVMPeer pings it.
const (
	demoVMNamespace = "udn-demo"
	demoVM          = "vm-a"
	demoVMPeer      = "udn-demo/web-1"
)

// vmIface is one network of the demo VM: the IPAMClaim that holds its
// addresses and the launcher pod interface that carries it.
type vmIface struct {
	network  string // the VM network's name
	claim    string // IPAMClaim name
	podIface string // interface in the launcher pod
	specMAC  string // the VMI's MAC: spec macAddress (the MAC pool's), else status.interfaces' (kvnet's allocation)
}

// vmIfaces returns the VMI's networks with their claims and launcher pod
// interfaces, in spec order.
func vmIfaces(vmi *kubevirtv1.VirtualMachineInstance, vmName string) []vmIface {
	macs := map[string]string{}
	for _, i := range vmi.Spec.Domain.Devices.Interfaces {
		macs[i.Name] = i.MacAddress
	}
	var out []vmIface
	for _, n := range vmi.Spec.Networks {
		f := vmIface{network: n.Name, claim: vmclaims.ClaimName(vmName, n.Name), specMAC: macs[n.Name]}
		switch {
		case n.Pod != nil:
			f.podIface = simkubelet.PrimaryIfName
		case n.Multus != nil && !n.Multus.Default:
			f.podIface = launcher.PodInterfaceName(n.Name)
		default:
			continue
		}
		out = append(out, f)
	}
	return out
}

// ifaceState is one interface of the running VM, from two independent
// sources: the IPAMClaim's status.ips (what the IPAM keeps for the VM) and
// what the kernel has on the launcher pod's interface (ip -j addr).
type ifaceState struct {
	vmIface
	claimed []netip.Prefix // IPAMClaim status.ips, IPv4 (DHCPv4)
	// claimed6 are the claim's IPv6 addresses (DHCPv6, after kvnet-node's
	// router advertisement, on the primary network).
	claimed6 []netip.Prefix
	mac      string         // the interface's MAC, from the kernel
	addrs    []netip.Prefix // its global addresses, from the kernel
}

// vmState is the running VM as the demo checks it.
type vmState struct {
	node, pod string
	ifaces    []ifaceState
}

func (s vmState) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "on %s in pod %s", s.node, s.pod)
	for i, f := range s.ifaces {
		fmt.Fprintf(&b, "\n    %-10s IPAMClaim %s: %s; guest eth%d (pod interface %s): %s MAC %s", f.network, f.claim, prefixes(f.claimed), i, f.podIface, prefixes(f.addrs), f.mac)
	}
	return b.String()
}

func prefixes(ps []netip.Prefix) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.String()
	}
	return strings.Join(s, ",")
}

// ipv4 returns the first IPv4 address the claim of network holds, "" when
// none.
func (s vmState) ipv4(network string) string {
	for _, f := range s.ifaces {
		if f.network != network {
			continue
		}
		for _, p := range f.claimed {
			if p.Addr().Is4() {
				return p.Addr().String()
			}
		}
	}
	return ""
}

// checkPlumbed returns an error unless the interface carries exactly the
// addresses its claim holds, and the MAC the VMI has for it (the spec's
// macAddress, else status.interfaces' mac: what kvnet allocated to the
// claim's owner), read independently of the guest.
func checkPlumbed(f ifaceState) error {
	if len(f.claimed) == 0 {
		return fmt.Errorf("IPAMClaim %s/%s has no status.ips", demoVMNamespace, f.claim)
	}
	if f.specMAC == "" {
		return fmt.Errorf("network %s: VirtualMachineInstance %s/%s names no MAC for it (spec macAddress or status.interfaces mac)", f.network, demoVMNamespace, demoVM)
	}
	if !samePrefixes(f.claimed, f.addrs) {
		return fmt.Errorf("network %s: IPAMClaim %s holds %s, but %s in the launcher pod has %s", f.network, f.claim, prefixes(f.claimed), f.podIface, prefixes(f.addrs))
	}
	if !strings.EqualFold(f.specMAC, f.mac) {
		return fmt.Errorf("network %s: the VMI's interface has MAC %s, but the guest's eth has %s", f.network, f.specMAC, f.mac)
	}
	return nil
}

// checkLease returns an error unless the DHCP lease the guest reported on
// eth<i> is the address its IPAMClaim holds, for the MAC the VMI has for
// the interface (not the guest's own idea of its MAC: the lease is the
// guest's, so comparing with the guest would compare it with itself).
func checkLease(i int, f ifaceState, l guest.Lease) error {
	if !samePrefixes([]netip.Prefix{l.Addr}, f.claimed) || f.specMAC == "" || !strings.EqualFold(l.MAC.String(), f.specMAC) {
		return fmt.Errorf("network %s: the guest's DHCP lease on eth%d is %s for MAC %s, but IPAMClaim %s holds %s and the VMI has MAC %q",
			f.network, i, l.Addr, l.MAC, f.claim, prefixes(f.claimed), f.specMAC)
	}
	return nil
}

func samePrefixes(a, b []netip.Prefix) bool {
	key := func(ps []netip.Prefix) []string {
		s := make([]string, len(ps))
		for i, p := range ps {
			s[i] = p.String()
		}
		slices.Sort(s)
		return s
	}
	return slices.Equal(key(a), key(b))
}

// compareMigration returns an error unless the VM moved to another node
// and pod and kept, on every interface, its claimed addresses and the MAC
// its old launcher pod had.
func compareMigration(before, after vmState) error {
	var problems []string
	if after.node == before.node || after.pod == before.pod {
		problems = append(problems, fmt.Sprintf("it still runs on %s in pod %s", after.node, after.pod))
	}
	for _, b := range before.ifaces {
		i := slices.IndexFunc(after.ifaces, func(a ifaceState) bool { return a.network == b.network })
		if i < 0 {
			problems = append(problems, fmt.Sprintf("network %s is gone", b.network))
			continue
		}
		a := after.ifaces[i]
		if !samePrefixes(a.claimed, b.claimed) || !samePrefixes(a.addrs, b.addrs) {
			problems = append(problems, fmt.Sprintf("network %s: addresses %s (claim %s), before %s (claim %s)", b.network, prefixes(a.addrs), prefixes(a.claimed), prefixes(b.addrs), prefixes(b.claimed)))
		}
		if !samePrefixes(a.claimed6, b.claimed6) {
			problems = append(problems, fmt.Sprintf("network %s: IPv6 claim %s, before %s", b.network, prefixes(a.claimed6), prefixes(b.claimed6)))
		}
		if !strings.EqualFold(a.mac, b.mac) {
			problems = append(problems, fmt.Sprintf("network %s: MAC %s, before %s", b.network, a.mac, b.mac))
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("live migration of VM %s/%s: %s: the node must change, the IPs and MACs must not", demoVMNamespace, demoVM, strings.Join(problems, "; "))
	}
	return nil
}

// guestIfaceCmd prints a guest NIC's MAC, then its IPv4 addresses (one
// "ip -o -4 addr" line each), with the guest's busybox.
func guestIfaceCmd(iface string) string {
	return fmt.Sprintf("cat /sys/class/net/%s/address && ip -o -4 addr show dev %s", iface, iface)
}

// parseGuestIface reads what guestIfaceCmd printed for iface: its MAC and
// global IPv4 addresses.
func parseGuestIface(out, iface string) (string, []netip.Prefix, error) {
	lines := strings.Split(strings.TrimSpace(out), "\n")
	mac := strings.TrimSpace(lines[0])
	if _, err := net.ParseMAC(mac); err != nil {
		return "", nil, fmt.Errorf("guest interface %s: MAC %q: %w", iface, mac, err)
	}
	var addrs []netip.Prefix
	for _, l := range lines[1:] {
		f := strings.Fields(l)
		i := slices.Index(f, "inet")
		if i < 0 || i+1 >= len(f) || !slices.Contains(f, "global") {
			continue
		}
		p, err := netip.ParsePrefix(f[i+1])
		if err != nil {
			return "", nil, fmt.Errorf("guest interface %s: address %q: %w", iface, f[i+1], err)
		}
		addrs = append(addrs, p)
	}
	return mac, addrs, nil
}

// readGuest reads the guest's NICs from its own kernel, through its
// lab-only exec service at addr, connecting from netns (a pod on the same
// network): it waits until the guest answers (it may still be booting).
func readGuest(ctx context.Context, netns string, addr netip.Addr, n int, timeout time.Duration) ([]string, [][]netip.Prefix, error) {
	var cmds []string
	for i := range n {
		cmds = append(cmds, guestIfaceCmd(fmt.Sprintf("eth%d", i)))
	}
	deadline := time.Now().Add(timeout)
	for {
		var macs []string
		var addrs [][]netip.Prefix
		var err error
		for i, cmd := range cmds {
			var out string
			ectx, cancel := context.WithTimeout(ctx, 3*time.Second)
			out, err = guest.Exec(ectx, netns, addr, cmd)
			cancel()
			if err != nil {
				break
			}
			mac, a, perr := parseGuestIface(out, fmt.Sprintf("eth%d", i))
			if perr != nil {
				return nil, nil, perr
			}
			macs, addrs = append(macs, mac), append(addrs, a)
		}
		if err == nil {
			return macs, addrs, nil
		}
		if time.Now().After(deadline) {
			return nil, nil, fmt.Errorf("the guest at %s does not answer after %s: %w", addr, timeout, err)
		}
		select {
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// vmSnapshot waits until the VMI runs (no migration under way) in a
// running launcher pod, then reads each network's IPAMClaim and what the
// guest's own kernel has on the matching NIC (through its exec service,
// from peer), and checks they agree.
func vmSnapshot(ctx context.Context, c client.Client, peer labPod, timeout time.Duration) (vmState, error) {
	vmi, pod, err := runningVMI(ctx, c, demoVM, timeout)
	if err != nil {
		return vmState{}, err
	}
	st := vmState{node: pod.Spec.NodeName, pod: pod.Name}
	ifaces := vmIfaces(vmi, demoVM)
	if len(ifaces) == 0 {
		return vmState{}, fmt.Errorf("VirtualMachineInstance %s/%s has no pod or multus network", demoVMNamespace, demoVM)
	}
	for _, f := range ifaces {
		claim, err := claimWithIPs(ctx, c, f, timeout)
		if err != nil {
			return vmState{}, err
		}
		is := ifaceState{vmIface: f}
		for _, s := range claim.Status.IPs {
			p, err := netip.ParsePrefix(s)
			if err != nil {
				return vmState{}, fmt.Errorf("IPAMClaim %s/%s status.ips %q: %w", demoVMNamespace, f.claim, s, err)
			}
			if p.Addr().Is4() { // the guest's IPv4 NIC addresses, checked below
				is.claimed = append(is.claimed, p)
			} else { // checked on the console (guestIPv6)
				is.claimed6 = append(is.claimed6, p)
			}
		}
		for _, si := range vmi.Status.Interfaces {
			if si.Name == f.network && f.specMAC == "" {
				is.specMAC = si.MAC
			}
		}
		st.ifaces = append(st.ifaces, is)
	}
	ip := st.ipv4(st.primaryNetwork())
	if ip == "" {
		return vmState{}, errors.New("the VM has no IPv4 address on its pod network")
	}
	macs, addrs, err := readGuest(ctx, peer.netns, netip.MustParseAddr(ip), len(st.ifaces), timeout)
	if err != nil {
		return vmState{}, fmt.Errorf("VM %s/%s on %s: %w", demoVMNamespace, demoVM, st.node, err)
	}
	for i := range st.ifaces {
		st.ifaces[i].mac, st.ifaces[i].addrs = macs[i], addrs[i]
		if err := checkPlumbed(st.ifaces[i]); err != nil {
			return vmState{}, fmt.Errorf("VM %s/%s on %s: %w", demoVMNamespace, demoVM, st.node, err)
		}
	}
	return st, nil
}

// claimWithIPs reads the IPAMClaim of f, waiting up to timeout for its
// status.ips: kvnet-controller records them on the claim as it allocates
// the launcher pod, in a write of its own that may land after the pod
// runs. A claim still without them is returned as it is (checkPlumbed
// reports it).
func claimWithIPs(ctx context.Context, c client.Client, f vmIface, timeout time.Duration) (ipamv1alpha1.IPAMClaim, error) {
	deadline := time.Now().Add(timeout)
	for {
		var claim ipamv1alpha1.IPAMClaim
		if err := c.Get(ctx, client.ObjectKey{Namespace: demoVMNamespace, Name: f.claim}, &claim); err != nil {
			return claim, fmt.Errorf("IPAMClaim %s/%s of network %s (the demo's networks are persistent): %w", demoVMNamespace, f.claim, f.network, err)
		}
		if len(claim.Status.IPs) > 0 || time.Now().After(deadline) {
			return claim, nil
		}
		select {
		case <-ctx.Done():
			return claim, ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// primaryNetwork is the VM network on the launcher pod's primary
// interface.
func (s vmState) primaryNetwork() string {
	for _, f := range s.ifaces {
		if f.podIface == simkubelet.PrimaryIfName {
			return f.network
		}
	}
	return ""
}

// runningVMI waits until the VMI runs with no migration under way, and
// returns it with its launcher pod: the running pod of status.activePods
// on status.nodeName.
func runningVMI(ctx context.Context, c client.Client, name string, timeout time.Duration) (*kubevirtv1.VirtualMachineInstance, *corev1.Pod, error) {
	deadline := time.Now().Add(timeout)
	for {
		var vmi kubevirtv1.VirtualMachineInstance
		err := c.Get(ctx, client.ObjectKey{Namespace: demoVMNamespace, Name: name}, &vmi)
		why := ""
		switch {
		case err != nil:
			why = err.Error()
		case vmi.Status.Phase != simvirt.PhaseRunning:
			why = fmt.Sprintf("phase %q", vmi.Status.Phase)
		case vmi.Status.MigrationState != nil && !vmi.Status.MigrationState.Completed && !vmi.Status.MigrationState.Failed:
			why = "a migration is under way"
		default:
			pod, perr := launcherPod(ctx, c, &vmi)
			if perr == nil {
				return &vmi, pod, nil
			}
			why = perr.Error()
		}
		if time.Now().After(deadline) {
			return nil, nil, fmt.Errorf("VirtualMachineInstance %s/%s not running after %s: %s", demoVMNamespace, name, timeout, why)
		}
		select {
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// launcherPod returns the running launcher pod of the VMI on its node.
func launcherPod(ctx context.Context, c client.Client, vmi *kubevirtv1.VirtualMachineInstance) (*corev1.Pod, error) {
	var pods corev1.PodList
	if err := c.List(ctx, &pods, client.InNamespace(vmi.Namespace), client.MatchingLabels{simvirt.CreatedByLabel: string(vmi.UID)}); err != nil {
		return nil, err
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		if vmi.Status.ActivePods[string(p.UID)] == vmi.Status.NodeName && p.Spec.NodeName == vmi.Status.NodeName &&
			p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning {
			return p, nil
		}
	}
	return nil, fmt.Errorf("no running launcher pod on %q among %d pod(s) of the VMI", vmi.Status.NodeName, len(pods.Items))
}

// Pods the demo's VM checks use besides the peer.
const (
	demoVMOther  = "udn-demo/web-2" // the guest reaches it
	demoVMTenant = "tenant-b/db-1"  // another tenant: must not reach the guest
	demoEgress   = "198.51.100.1"   // the lab's "internet"
)

// printVMMigration shows the lab's VM, a QEMU guest, running on a
// simulated node: the DHCP lease the guest got equals its IPAMClaim (and
// so does its DHCPv6 lease where the claim holds an IPv6 address), a pod
// on the network reaches the guest's TCP service (over IPv6 too), the guest reaches
// another pod and the egress address, another tenant does not reach it.
// Then it live-migrates the guest with an open TCP connection to it and
// shows that the guest kept its IPs, MACs and that connection. It fails if
// any of that does not hold.
func printVMMigration(ctx context.Context, out io.Writer, c client.Client, labDir string, pods map[string]labPod, timeout time.Duration) error {
	if err := c.Get(ctx, client.ObjectKey{Namespace: demoVMNamespace, Name: demoVM}, &kubevirtv1.VirtualMachine{}); err != nil {
		if apierrors.IsNotFound(err) {
			return fmt.Errorf("VirtualMachine %s/%s, which the demo migrates, does not exist (examples/ creates it)", demoVMNamespace, demoVM)
		}
		return err
	}
	peer, ok := pods[demoVMPeer]
	if !ok {
		return fmt.Errorf("pod %s, which talks to the VM, is not running on a simulated node", demoVMPeer)
	}
	fmt.Fprintf(out, "\n== VirtualMachine %s/%s: a QEMU guest in its launcher pod (console: kvnet-lab console -n %s %s)\n", demoVMNamespace, demoVM, demoVMNamespace, demoVM)
	fmt.Fprintf(out, "  (IPs from its IPAMClaims; the guest's NICs read from the guest's own kernel)\n")
	before, err := vmSnapshot(ctx, c, peer, timeout)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "  running %s\n", before)
	leases, err := consoleLeases(simlauncher.ConsoleLog(lab.VMsDir(labDir), demoVMNamespace, demoVM))
	if err != nil {
		return err
	}
	for i, f := range before.ifaces {
		l, ok := leases[fmt.Sprintf("eth%d", i)]
		if !ok {
			return fmt.Errorf("the guest's console shows no DHCP lease on eth%d (network %s)", i, f.network)
		}
		if err := checkLease(i, f, l); err != nil {
			return err
		}
		router := "none"
		if l.Router.IsValid() {
			router = l.Router.String()
		}
		fmt.Fprintf(out, "  guest DHCP lease eth%d %s router %s mtu %d (MAC %s) = IPAMClaim %s\n", i, l.Addr, router, l.MTU, l.MAC, f.claim)
	}
	ip6, err := guestIPv6(ctx, out, labDir, before, timeout)
	if err != nil {
		return err
	}
	ip := netip.MustParseAddr(before.ipv4(before.primaryNetwork()))
	if err := vmTraffic(ctx, out, pods, peer, ip, before.node); err != nil {
		return err
	}
	if ip6.IsValid() {
		if err := reachIPv6(ctx, out, peer, ip6, before.node, timeout); err != nil {
			return err
		}
	}

	// An open connection to the guest, used during the migration.
	conn, err := openEcho(ctx, peer.netns, ip)
	if err != nil {
		return err
	}
	defer conn.Close()
	pinger := startEchoPinger(conn)
	mig := &kubevirtv1.VirtualMachineInstanceMigration{
		ObjectMeta: metav1.ObjectMeta{Namespace: demoVMNamespace, GenerateName: demoVM + "-migration-"},
		Spec:       kubevirtv1.VirtualMachineInstanceMigrationSpec{VMIName: demoVM},
	}
	start := time.Now()
	if err := c.Create(ctx, mig); err != nil {
		return fmt.Errorf("create migration: %w", err)
	}
	for mig.Status.Phase != simvirt.PhaseSucceeded {
		if mig.Status.Phase == simvirt.PhaseFailed {
			return fmt.Errorf("migration %s failed: %s", mig.Name, mig.Annotations[simvirt.FailureReasonAnnotation])
		}
		if time.Since(start) > timeout {
			return fmt.Errorf("migration %s not done after %s (phase %q)", mig.Name, timeout, mig.Status.Phase)
		}
		time.Sleep(200 * time.Millisecond)
		if err := c.Get(ctx, client.ObjectKeyFromObject(mig), mig); err != nil {
			return err
		}
	}
	after, err := vmSnapshot(ctx, c, peer, timeout)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "  live migration %s: %s -> %s in %s\n", mig.Name, before.node, after.node, time.Since(start).Round(10*time.Millisecond))
	fmt.Fprintf(out, "  running %s\n", after)
	if err := compareMigration(before, after); err != nil {
		return err
	}
	fmt.Fprintf(out, "  kept its IPs and MACs on every network, on another node\n")
	// The connection opened before the migration still echoes.
	time.Sleep(time.Second)
	pause, echoes, err := pinger.stop()
	if err != nil {
		return fmt.Errorf("the TCP connection %s -> %s:%d opened before the migration broke: %w", peer, ip, guest.EchoPort, err)
	}
	fmt.Fprintf(out, "  kept its open TCP connection from %s (%d echoes; blackout, the longest wait for one: %s)\n", peer, echoes, pause.Round(time.Millisecond))
	if ip6.IsValid() {
		if err := reachIPv6(ctx, out, peer, ip6, after.node, timeout); err != nil {
			return err
		}
	}
	return vmTraffic(ctx, out, pods, peer, ip, after.node)
}

// vmTraffic checks the guest at ip on node: peer reaches its TCP echo
// service, the guest reaches another pod and the egress address, and
// another tenant's pod does not reach it (after the peer did, the positive
// control).
func vmTraffic(ctx context.Context, out io.Writer, pods map[string]labPod, peer labPod, ip netip.Addr, node string) error {
	if err := echo(ctx, peer.netns, ip); err != nil {
		fmt.Fprintf(out, "  blocked %s (%s) -> %s %s:%d (%s)   <-- WRONG\n", peer, peer.pod.Spec.NodeName, demoVM, ip, guest.EchoPort, node)
		return fmt.Errorf("%s cannot reach the guest of VM %s at %s:%d: %w", peer, demoVM, ip, guest.EchoPort, err)
	}
	fmt.Fprintf(out, "  reached %s (%s) -> %s %s:%d (%s; TCP echo in the guest)\n", peer, peer.pod.Spec.NodeName, demoVM, ip, guest.EchoPort, node)
	other, ok := pods[demoVMOther]
	if !ok {
		return fmt.Errorf("pod %s, which the guest pings, is not running", demoVMOther)
	}
	targets := []string{other.a.IPAddresses[0], demoEgress}
	for _, t := range targets {
		dst, _, _ := strings.Cut(t, "/")
		ectx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := guest.Exec(ectx, peer.netns, ip, "ping -c 1 -W 2 "+dst)
		cancel()
		if err != nil {
			fmt.Fprintf(out, "  blocked %s (guest) -> %s   <-- WRONG\n", demoVM, dst)
			return fmt.Errorf("the guest of VM %s cannot reach %s: %w", demoVM, dst, err)
		}
		fmt.Fprintf(out, "  reached %s (guest) -> %s\n", demoVM, dst)
	}
	tenant, ok := pods[demoVMTenant]
	if !ok {
		return fmt.Errorf("pod %s, another tenant, is not running", demoVMTenant)
	}
	if err := echo(ctx, tenant.netns, ip); err == nil {
		fmt.Fprintf(out, "  reached %s (%s) -> %s %s:%d   <-- WRONG: another tenant\n", tenant, tenant.pod.Spec.NodeName, demoVM, ip, guest.EchoPort)
		return fmt.Errorf("%s, another tenant, reaches the guest of VM %s", tenant, demoVM)
	}
	fmt.Fprintf(out, "  blocked %s (%s) -> %s %s:%d (another tenant; control: %s reached it)\n", tenant, tenant.pod.Spec.NodeName, demoVM, ip, guest.EchoPort, peer)
	return nil
}

// consoleLeases returns the last DHCP lease the guest reported per NIC on
// its console (KVNET-LEASE lines).
func consoleLeases(path string) (map[string]guest.Lease, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("the guest's console log: %w", err)
	}
	leases := map[string]guest.Lease{}
	for _, line := range strings.Split(string(b), "\n") {
		i := strings.Index(line, guest.LeasePrefix)
		if i < 0 {
			continue
		}
		if l, err := guest.ParseLease(line[i:]); err == nil {
			leases[l.Iface] = l
		}
	}
	return leases, nil
}
