package demo

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ipamv1alpha1 "kvnet.io/kvnet/api/k8scni/v1alpha1"
	kubevirtv1 "kvnet.io/kvnet/api/kubevirt/v1"
	"kvnet.io/kvnet/internal/cli/lab"
	"kvnet.io/kvnet/internal/kubevirt/launcher"
	"kvnet.io/kvnet/internal/sim/simkubelet"
	"kvnet.io/kvnet/internal/sim/simvirt"
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
	specMAC  string // the VMI spec's macAddress (the MAC pool's), "" when the pod's own
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
	claimed []netip.Prefix // IPAMClaim status.ips
	mac     string         // the interface's MAC, from the kernel
	addrs   []netip.Prefix // its global addresses, from the kernel
}

// vmState is the running VM as the demo checks it.
type vmState struct {
	node, pod string
	ifaces    []ifaceState
}

func (s vmState) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "on %s in pod %s", s.node, s.pod)
	for _, f := range s.ifaces {
		fmt.Fprintf(&b, "\n    %-10s IPAMClaim %s: %s; %s in the pod: %s MAC %s", f.network, f.claim, prefixes(f.claimed), f.podIface, prefixes(f.addrs), f.mac)
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
// addresses its claim holds, and the MAC the VM spec names, if it names one.
func checkPlumbed(f ifaceState) error {
	if len(f.claimed) == 0 {
		return fmt.Errorf("IPAMClaim %s/%s has no status.ips", demoVMNamespace, f.claim)
	}
	if !samePrefixes(f.claimed, f.addrs) {
		return fmt.Errorf("network %s: IPAMClaim %s holds %s, but %s in the launcher pod has %s", f.network, f.claim, prefixes(f.claimed), f.podIface, prefixes(f.addrs))
	}
	if f.specMAC != "" && !strings.EqualFold(f.specMAC, f.mac) {
		return fmt.Errorf("network %s: the VM's interface has MAC %s, but %s in the launcher pod has %s", f.network, f.specMAC, f.podIface, f.mac)
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
		if !strings.EqualFold(a.mac, b.mac) {
			problems = append(problems, fmt.Sprintf("network %s: MAC %s, before %s", b.network, a.mac, b.mac))
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("live migration of VM %s/%s: %s: the node must change, the IPs and MACs must not", demoVMNamespace, demoVM, strings.Join(problems, "; "))
	}
	return nil
}

// ipLink is the part of `ip -j addr show` the demo reads.
type ipLink struct {
	IfName   string `json:"ifname"`
	Address  string `json:"address"`
	AddrInfo []struct {
		Local     string `json:"local"`
		PrefixLen int    `json:"prefixlen"`
		Scope     string `json:"scope"`
	} `json:"addr_info"`
}

// parseIPAddr reads iface's MAC and global addresses from the output of
// `ip -j addr show dev <iface>`.
func parseIPAddr(out []byte, iface string) (string, []netip.Prefix, error) {
	var links []ipLink
	if err := json.Unmarshal(out, &links); err != nil {
		return "", nil, fmt.Errorf("parse ip -j addr output: %w", err)
	}
	for _, l := range links {
		if l.IfName != iface {
			continue
		}
		if _, err := net.ParseMAC(l.Address); err != nil {
			return "", nil, fmt.Errorf("interface %s: MAC %q: %w", iface, l.Address, err)
		}
		var addrs []netip.Prefix
		for _, a := range l.AddrInfo {
			if a.Scope != "global" {
				continue
			}
			ip, err := netip.ParseAddr(a.Local)
			if err != nil {
				return "", nil, fmt.Errorf("interface %s: address %q: %w", iface, a.Local, err)
			}
			addrs = append(addrs, netip.PrefixFrom(ip, a.PrefixLen))
		}
		return l.Address, addrs, nil
	}
	return "", nil, fmt.Errorf("no interface %s in the ip -j addr output", iface)
}

// readIface reads iface's MAC and global addresses in the network
// namespace from the kernel.
func readIface(ctx context.Context, tl tools, netns, iface string) (string, []netip.Prefix, error) {
	cmd := exec.CommandContext(ctx, tl.ip, "-j", "-n", filepath.Base(netns), "addr", "show", "dev", iface)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", nil, fmt.Errorf("read interface %s in %s: %w: %s", iface, filepath.Base(netns), err, strings.TrimSpace(stderr.String()))
	}
	return parseIPAddr(out, iface)
}

// vmSnapshot waits until the VMI runs (no migration under way) in a
// running launcher pod, then reads each network's IPAMClaim and the
// launcher pod's interface from the kernel, and checks they agree.
func vmSnapshot(ctx context.Context, c client.Client, labDir string, tl tools, timeout time.Duration) (vmState, error) {
	vmi, pod, err := runningVMI(ctx, c, timeout)
	if err != nil {
		return vmState{}, err
	}
	netns := simkubelet.PodNetNS(lab.KubeletConfig(labDir, pod.Spec.NodeName), pod)
	st := vmState{node: pod.Spec.NodeName, pod: pod.Name}
	ifaces := vmIfaces(vmi, demoVM)
	if len(ifaces) == 0 {
		return vmState{}, fmt.Errorf("VirtualMachineInstance %s/%s has no pod or multus network", demoVMNamespace, demoVM)
	}
	for _, f := range ifaces {
		var claim ipamv1alpha1.IPAMClaim
		if err := c.Get(ctx, client.ObjectKey{Namespace: demoVMNamespace, Name: f.claim}, &claim); err != nil {
			return vmState{}, fmt.Errorf("IPAMClaim %s/%s of network %s (the demo's networks are persistent): %w", demoVMNamespace, f.claim, f.network, err)
		}
		is := ifaceState{vmIface: f}
		for _, s := range claim.Status.IPs {
			p, err := netip.ParsePrefix(s)
			if err != nil {
				return vmState{}, fmt.Errorf("IPAMClaim %s/%s status.ips %q: %w", demoVMNamespace, f.claim, s, err)
			}
			is.claimed = append(is.claimed, p)
		}
		if is.mac, is.addrs, err = readIface(ctx, tl, netns, f.podIface); err != nil {
			return vmState{}, fmt.Errorf("launcher pod %s/%s: %w", pod.Namespace, pod.Name, err)
		}
		if err := checkPlumbed(is); err != nil {
			return vmState{}, fmt.Errorf("VM %s/%s on %s: %w", demoVMNamespace, demoVM, st.node, err)
		}
		st.ifaces = append(st.ifaces, is)
	}
	return st, nil
}

// runningVMI waits until the VMI runs with no migration under way, and
// returns it with its launcher pod: the running pod of status.activePods
// on status.nodeName.
func runningVMI(ctx context.Context, c client.Client, timeout time.Duration) (*kubevirtv1.VirtualMachineInstance, *corev1.Pod, error) {
	deadline := time.Now().Add(timeout)
	for {
		var vmi kubevirtv1.VirtualMachineInstance
		err := c.Get(ctx, client.ObjectKey{Namespace: demoVMNamespace, Name: demoVM}, &vmi)
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
			return nil, nil, fmt.Errorf("VirtualMachineInstance %s/%s not running after %s: %s", demoVMNamespace, demoVM, timeout, why)
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

// printVMMigration shows the lab's VM running on a simulated node, reached
// from a pod, then live-migrates it and shows that it kept its IPs and
// MACs and is still reached. It fails if any of that does not hold, and
// if the VM is missing.
func printVMMigration(ctx context.Context, out io.Writer, c client.Client, labDir string, peer labPod, timeout time.Duration, pr prober, tl tools) error {
	if err := c.Get(ctx, client.ObjectKey{Namespace: demoVMNamespace, Name: demoVM}, &kubevirtv1.VirtualMachine{}); err != nil {
		if apierrors.IsNotFound(err) {
			return fmt.Errorf("VirtualMachine %s/%s, which the demo migrates, does not exist (examples/ creates it)", demoVMNamespace, demoVM)
		}
		return err
	}
	fmt.Fprintf(out, "\n== VirtualMachine %s/%s (run by the lab's virt-controller stand-in)\n", demoVMNamespace, demoVM)
	fmt.Fprintf(out, "  (IPs from its IPAMClaims; what the launcher pod has, from the kernel: ip -j addr in its namespace)\n")
	before, err := vmSnapshot(ctx, c, labDir, tl, timeout)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "  running %s\n", before)
	if err := pingVM(ctx, out, pr, peer, before); err != nil {
		return err
	}
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
	after, err := vmSnapshot(ctx, c, labDir, tl, timeout)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "  live migration %s: %s -> %s in %s\n", mig.Name, before.node, after.node, time.Since(start).Round(10*time.Millisecond))
	fmt.Fprintf(out, "  running %s\n", after)
	if err := compareMigration(before, after); err != nil {
		return err
	}
	fmt.Fprintf(out, "  kept its IPs and MACs on every network, on another node\n")
	return pingVM(ctx, out, pr, peer, after)
}

// pingVM pings the VM's pod-network IPv4 address, as its claim holds it,
// from peer.
func pingVM(ctx context.Context, out io.Writer, pr prober, peer labPod, vm vmState) error {
	var network string
	for _, f := range vm.ifaces {
		if f.podIface == simkubelet.PrimaryIfName {
			network = f.network
		}
	}
	ip := vm.ipv4(network)
	if ip == "" {
		return errors.New("the VM has no IPv4 address on its pod network to ping")
	}
	r := expectAnswer(ctx, pr, probe{netns: peer.netns, addr: ip})
	switch r.outcome {
	case answered:
		fmt.Fprintf(out, "  reached %s (%s) -> %s %s (%s)\n", peer, peer.pod.Spec.NodeName, demoVM, ip, vm.node)
		return nil
	case noAnswer:
		fmt.Fprintf(out, "  blocked %s (%s) -> %s %s (%s)   <-- WRONG\n", peer, peer.pod.Spec.NodeName, demoVM, ip, vm.node)
		return fmt.Errorf("%s cannot reach VM %s at %s on %s", peer, demoVM, ip, vm.node)
	default:
		fmt.Fprintf(out, "  ERROR %s (%s) -> %s %s (%s)   <-- %v\n", peer, peer.pod.Spec.NodeName, demoVM, ip, vm.node, r.err)
		return fmt.Errorf("%s -> VM %s at %s: %w", peer, demoVM, ip, r.err)
	}
}
