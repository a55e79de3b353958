package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/dynamic"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"kvnet.io/kvnet/internal/cli/why"
	"kvnet.io/kvnet/internal/k8s/manager"
	"kvnet.io/kvnet/internal/migration"
)

// The VM scenarios (RunVMScenarios): what a VM owner expects of kvnet on
// a cluster with real KubeVirt, each checked through the Kubernetes API
// alone (objects, exec into pods, the guest's serial console log that
// KubeVirt's guest-console-log container prints).
const (
	// ScenarioVMMasquerade: a VM with KubeVirt's masquerade binding on
	// the pod network of a namespace whose primary Layer2 UDN has
	// persistent IPs runs; its launcher pod's ovn-udn1 address (the VMI's
	// IP) is its IPAMClaim's; the guest holds KubeVirt's DHCP lease; a pod
	// on another node fetches the guest's page at the VMI's IP.
	ScenarioVMMasquerade = "vm-masquerade-primary-udn"
	// ScenarioVMTenant: a pod of another tenant, whose primary UDN has
	// the same subnet, does not reach the VM.
	ScenarioVMTenant = "vm-tenant-isolation"
	// ScenarioVMService: a ClusterIP Service selecting the VM answers at
	// its name (CoreDNS) from a pod of the UDN.
	ScenarioVMService = "vm-service-by-name"
	// ScenarioVMPodNetwork: a masquerade VM in a namespace without a UDN
	// gets a pod IP of the cluster default network and is reached there.
	ScenarioVMPodNetwork = "vm-masquerade-pod-network"
	// ScenarioVMStopStart: stopping and starting the VM keeps its IP
	// (the IPAMClaim) and MAC, and it is reached again.
	ScenarioVMStopStart = "vm-stop-start"
	// ScenarioVMMigration: two live migrations through virt-handler,
	// between the two nodes other than the client's, while a pod on the
	// third node keeps a TCP connection to the guest's echo service open:
	// every line it sent comes back, in order, after each migration.
	ScenarioVMMigration = "vm-live-migration-tcp"
	// ScenarioVMPolicy: a NetworkPolicy selecting the VM by its VMI's
	// labels (on its launcher pod) admits a client pod of the UDN and
	// refuses another (app=intruder), after a control where both reach
	// it; the same after a live migration to the other node.
	ScenarioVMPolicy = "vm-policy-across-migration"
	// ScenarioVMKvnetNodeRoll: kvnet-node rolled to a new image on every
	// node (a DaemonSet rolling update), then killed (SIGKILL, as a
	// crash does) on the VM's node and the pod server's, while the
	// migration scenario's echo client keeps its TCP connection to the VM
	// and another streams to a pod of the UDN: every line of both comes
	// back in order, and the VM keeps its IP, MAC and claim, the pod its
	// address.
	ScenarioVMKvnetNodeRoll = "vm-kvnet-node-roll"
	// ScenarioVMDrain: the node running vm-m and two more VMs of the
	// persistent primary UDN, each with a TCP echo stream from the
	// client's node, is drained (cordon, then the Eviction API on its
	// launcher pods, as kubectl drain); KubeVirt live-migrates every VM
	// off it (evictionStrategy LiveMigrate): each keeps its IP, MAC and
	// claim, every stream goes on in order, and each switch-over is read
	// from the logs (at the guest's first frame on the target, or a
	// finding).
	ScenarioVMDrain = "vm-node-drain"
	// ScenarioVML2Bridge: a VM with the l2bridge binding (KubeVirt's
	// managedTap) on the primary UDN gets its IPAMClaim's address from
	// kvnet-node's DHCP. KubeVirt's managedTap and bridge bindings put a
	// dummy link in the launcher pod; on a kernel without dummy links the
	// result is Blocked, naming KubeVirt's error.
	ScenarioVML2Bridge = "vm-l2bridge-primary-udn"
)

// VMScenarios are the VM scenarios' names in the order RunVMScenarios
// reports them; on a dual-stack cluster ScenarioVMDualStack follows.
var VMScenarios = []string{
	ScenarioVMMasquerade, ScenarioVMTenant, ScenarioVMService, ScenarioVMPodNetwork,
	ScenarioVMStopStart, ScenarioVMMigration, ScenarioVMPolicy, ScenarioVMNodePortLB, ScenarioVMKvnetNodeRoll, ScenarioVMDrain, ScenarioVML2Bridge,
}

// VMScenarioLabel marks the namespaces the VM scenarios create;
// CleanupVMScenarios deletes them.
const VMScenarioLabel = "lab.kvnet.io/vm-scenarios"

const (
	nsVM      = "scn-vm"       // primary Layer2 UDN "net" (persistent): VMs vm-m, vm-d1, vm-d2 and vm-l2, pods vc, echo*
	nsVMB     = "scn-vm-b"     // another tenant's primary Layer2 UDN on the same subnet: pod vb
	nsVMPlain = "scn-vm-plain" // the cluster default network: VM vm-p, pod vp
)

var (
	vmGVR        = schema.GroupVersionResource{Group: "kubevirt.io", Version: "v1", Resource: "virtualmachines"}
	vmiGVR       = schema.GroupVersionResource{Group: "kubevirt.io", Version: "v1", Resource: "virtualmachineinstances"}
	vmimGVR      = schema.GroupVersionResource{Group: "kubevirt.io", Version: "v1", Resource: "virtualmachineinstancemigrations"}
	ipamClaimGVR = schema.GroupVersionResource{Group: "k8s.cni.cncf.io", Version: "v1alpha1", Resource: "ipamclaims"}
)

// guestLease is a KVNET-LEASE line of the guest's console: a DHCPv4
// lease it took.
type guestLease struct {
	Iface, MAC string
	IP         netip.Prefix
}

var leaseLine = regexp.MustCompile(`KVNET-LEASE iface=(\S+) mac=(\S+) ip=(\S+)`)

// parseGuestLeases returns the console's leases, oldest first; lines it
// cannot read are skipped (the console also carries the kernel's).
func parseGuestLeases(console string) []guestLease {
	var out []guestLease
	for _, m := range leaseLine.FindAllStringSubmatch(console, -1) {
		p, err := netip.ParsePrefix(m[3])
		if err != nil {
			continue
		}
		out = append(out, guestLease{Iface: m[1], MAC: m[2], IP: p})
	}
	return out
}

// KubeVirt's masquerade binding: virt-launcher's DHCP server gives the
// guest this address of the binding's default vmNetworkCIDR
// (10.0.2.0/24, gateway .1) and NATs it to the pod's address.
var masqueradeGuest = netip.MustParsePrefix("10.0.2.2/24")

// checkMasqueradeLease checks a masquerade guest's console leases: the
// last one on the NIC with the VMI's MAC is KubeVirt's masquerade
// address (virt-launcher's DHCP, not kvnet's). It returns that lease.
func checkMasqueradeLease(leases []guestLease, mac string) (guestLease, error) {
	if mac == "" {
		return guestLease{}, errors.New("VMI interface without a MAC to find the guest's lease by")
	}
	var last *guestLease
	for i := range leases {
		if strings.EqualFold(leases[i].MAC, mac) {
			last = &leases[i]
		}
	}
	switch {
	case last == nil:
		return guestLease{}, fmt.Errorf("guest printed no lease for its NIC %s (leases %v)", mac, leases)
	case last.IP != masqueradeGuest:
		return *last, fmt.Errorf("guest's NIC %s leased %s, want KubeVirt's masquerade address %s", mac, last.IP, masqueradeGuest)
	}
	return *last, nil
}

// vmSpec is what vmObject builds a VirtualMachine from.
type vmSpec struct {
	ns, name string
	binding  string // "masquerade" or a network binding plugin's name (l2bridge)
	avoid    string // a node the VM must not run on (the clients'), or ""
	on       string // a node the VM must run on, or ""
	image    string
	// subdomain, if set, is the VM's spec.subdomain (a headless
	// Service's name), its spec.hostname its name.
	subdomain string
}

// vmObject is a VirtualMachine as a VM owner writes it: one interface on
// the pod network, the guest's containerDisk, the serial console logged,
// label app=<name> on the VMI (for a Service).
func vmObject(v vmSpec) *unstructured.Unstructured {
	iface := map[string]any{"name": "default"}
	if v.binding == "masquerade" {
		iface["masquerade"] = map[string]any{}
	} else {
		iface["binding"] = map[string]any{"name": v.binding}
	}
	spec := map[string]any{
		"domain": map[string]any{
			"devices": map[string]any{
				"logSerialConsole": true,
				"disks":            []any{map[string]any{"name": "containerdisk", "disk": map[string]any{"bus": "virtio"}}},
				"interfaces":       []any{iface},
			},
			"resources": map[string]any{"requests": map[string]any{"memory": "256Mi"}},
		},
		"networks": []any{map[string]any{"name": "default", "pod": map[string]any{}}},
		"volumes":  []any{map[string]any{"name": "containerdisk", "containerDisk": map[string]any{"image": v.image}}},
	}
	if v.subdomain != "" {
		spec["hostname"], spec["subdomain"] = v.name, v.subdomain
	}
	op, node := "NotIn", v.avoid
	if v.on != "" {
		op, node = "In", v.on
	}
	if node != "" {
		spec["affinity"] = map[string]any{"nodeAffinity": map[string]any{
			"requiredDuringSchedulingIgnoredDuringExecution": map[string]any{"nodeSelectorTerms": []any{
				map[string]any{"matchExpressions": []any{map[string]any{
					"key": corev1.LabelHostname, "operator": op, "values": []any{node},
				}}},
			}},
		}}
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
		"metadata": map[string]any{"name": v.name, "namespace": v.ns},
		"spec": map[string]any{
			"runStrategy": "Always",
			"template": map[string]any{
				"metadata": map[string]any{"labels": map[string]any{"app": v.name}},
				"spec":     spec,
			},
		},
	}}
}

// runningVM is a VMI as the scenarios found it Ready.
type runningVM struct {
	ns, name string
	node     string
	ip       netip.Addr
	mac      string
	uid      string
	// diskCRC is the containerDisk's CRC32 virt-handler reported in the
	// VMI's status.volumeStatus (0 if none).
	diskCRC int64
	err     error
}

func (v *runningVM) String() string { return v.ns + "/" + v.name }

type vmScenarios struct {
	*scenarios
	nodes []string // all Ready nodes: clients on nodes[0], VMs elsewhere
	vms   map[string]*runningVM
}

// RunVMScenarios runs the VM scenarios on a cluster with KubeVirt and
// kvnet installed (at least three Ready nodes): it removes what a previous
// run left (CleanupVMScenarios), creates their namespaces (labelled
// VMScenarioLabel), networks, client pods, VMs and Service, and returns
// one result per VMScenarios entry, in that order. t.GuestImage is the
// guest's containerDisk. The objects stay for the user to explore.
func RunVMScenarios(ctx context.Context, t ScenarioTarget, out io.Writer) ([]ScenarioResult, error) {
	if out == nil {
		out = io.Discard
	}
	if t.Config == nil || t.Client == nil || t.Image == "" || t.GuestImage == "" {
		return nil, errors.New("vm scenarios: target needs API config, client, workload image and GuestImage")
	}
	if t.PodTimeout == 0 {
		t.PodTimeout = 4 * time.Minute
	}
	dyn, err := dynamic.NewForConfig(t.Config)
	if err != nil {
		return nil, err
	}
	nodes, err := readyNodes(ctx, t.Client)
	if err != nil {
		return nil, err
	}
	if len(nodes) < 3 {
		return nil, fmt.Errorf("vm scenarios: %d Ready nodes %v: want three (a client's and two for migrations)", len(nodes), nodes)
	}
	s := &vmScenarios{
		scenarios: &scenarios{t: t, dyn: dyn, out: out, pods: map[string]*scenarioPod{}, nodes: [2]string{nodes[0], nodes[1]}},
		nodes:     nodes,
		vms:       map[string]*runningVM{},
	}
	s.logf("removing a previous run's VM objects")
	if err := CleanupVMScenarios(ctx, t, out); err != nil {
		return nil, err
	}
	if err := s.create(ctx); err != nil {
		return nil, err
	}
	s.waitPods(ctx)
	s.waitVMs(ctx, "vm-m", "vm-p", "vm-6")

	var results []ScenarioResult
	run := func(name string, f func(context.Context) (string, error)) {
		runScenario(ctx, out, &results, name, func(ctx context.Context) (string, error) {
			detail, err := f(ctx)
			if err != nil {
				if p := s.guestPanics(ctx); p != "" {
					err = fmt.Errorf("%w; %s", err, p)
				}
			}
			return detail, err
		})
	}
	run(ScenarioVMMasquerade, s.masquerade)
	run(ScenarioVMTenant, s.tenant)
	run(ScenarioVMService, s.service)
	run(ScenarioVMPodNetwork, s.podNetwork)
	run(ScenarioVMStopStart, s.stopStart)
	run(ScenarioVMMigration, s.migration)
	run(ScenarioVMPolicy, s.vmPolicy)
	run(ScenarioVMNodePortLB, s.vmNodePortLB)
	run(ScenarioVMKvnetNodeRoll, s.kvnetNodeRoll)
	run(ScenarioVMDrain, s.drain)
	run(ScenarioVML2Bridge, s.l2bridge)
	if t.DualStack {
		run(ScenarioVMDualStack, s.vmDualStack)
	}
	return results, nil
}

// CleanupVMScenarios deletes the namespaces the VM scenarios created and
// waits until they are gone.
func CleanupVMScenarios(ctx context.Context, t ScenarioTarget, out io.Writer) error {
	return cleanupLabelled(ctx, t, out, VMScenarioLabel)
}

// blockedError is a scenario that cannot run on this machine for a
// reason no code of the project can change (the kernel's features).
type blockedError struct{ msg string }

func (b *blockedError) Error() string { return b.msg }

func (s *vmScenarios) create(ctx context.Context) error {
	cs := s.t.Client
	s.logf("creating namespaces, networks, pods on %s and VMs elsewhere", s.nodes[0])
	for _, ns := range []struct {
		name    string
		primary bool
	}{{nsVM, true}, {nsVMB, true}, {nsVMPlain, false}} {
		labels := map[string]string{VMScenarioLabel: ""}
		if ns.primary {
			labels[primaryLabel] = ""
		}
		o := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns.name, Labels: labels}}
		if _, err := cs.CoreV1().Namespaces().Create(ctx, o, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("vm scenarios: create namespace %q: %w", ns.name, err)
		}
	}
	for _, u := range []struct {
		ns       string
		reserved []any
	}{{nsVM, nil}, {nsVMB, []any{tenantBReserved.String()}}} {
		o := primaryUDNObject(u.ns, tenantSubnet.String())
		if u.reserved != nil {
			if err := unstructured.SetNestedSlice(o.Object, u.reserved, "spec", "layer2", "reservedSubnets"); err != nil {
				return err
			}
		}
		if _, err := s.dyn.Resource(udnGVR).Namespace(u.ns).Create(ctx, o, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("vm scenarios: create UserDefinedNetwork %s/net: %w", u.ns, err)
		}
	}
	nads := map[string]string{nsVM: "net", nsVMB: "net", nsVMPlain: ""}
	clients := []struct{ ns, name string }{{nsVM, "vc"}, {nsVMB, "vb"}, {nsVMPlain, "vp"}}
	vms := []vmSpec{
		{ns: nsVM, name: "vm-m", binding: "masquerade", avoid: s.nodes[0], subdomain: vmSubdomain},
		{ns: nsVMPlain, name: "vm-p", binding: "masquerade", avoid: s.nodes[0]},
	}
	if s.t.DualStack {
		if err := s.createVMDualStack(ctx); err != nil {
			return err
		}
		nads[nsVM6] = "net"
		// vm-6 runs on the clients' node, which no other scenario
		// drains or migrates from, and c6 on another.
		vms = append(vms, vmSpec{ns: nsVM6, name: "vm-6", binding: "masquerade", on: s.nodes[0]})
	}
	if err := s.waitNamespaces(ctx, nads); err != nil {
		return err
	}
	for _, p := range clients {
		s.createPod(ctx, webPod(p.ns, p.name, s.nodes[0], s.t.Image))
	}
	if s.t.DualStack {
		s.createPod(ctx, webPod(nsVM6, "c6", s.nodes[1], s.t.Image))
	}
	s.createPod(ctx, intruder(s.nodes[0], s.t.Image))
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "vm-m", Namespace: nsVM},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{"app": "vm-m"},
			Ports:    []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(80)}},
		},
	}
	if _, err := cs.CoreV1().Services(nsVM).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("vm scenarios: create Service %s/vm-m: %w", nsVM, err)
	}
	if err := s.createVMServices(ctx); err != nil {
		return err
	}
	hl := svc.DeepCopy()
	hl.Name, hl.Spec.ClusterIP = vmSubdomain, corev1.ClusterIPNone
	if _, err := cs.CoreV1().Services(nsVM).Create(ctx, hl, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("vm scenarios: create Service %s/%s: %w", nsVM, vmSubdomain, err)
	}
	for _, v := range vms {
		v.image = s.t.GuestImage
		if err := s.createVM(ctx, v); err != nil {
			return err
		}
	}
	return nil
}

// createVM creates a VM, retrying while the webhooks' caches lag behind
// the namespace's new NAD.
func (s *vmScenarios) createVM(ctx context.Context, v vmSpec) error {
	s.vms[v.ns+"/"+v.name] = &runningVM{ns: v.ns, name: v.name}
	return poll(ctx, time.Minute, func(ctx context.Context) error {
		_, err := s.dyn.Resource(vmGVR).Namespace(v.ns).Create(ctx, vmObject(v), metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("vm scenarios: create VirtualMachine %s/%s: %w", v.ns, v.name, err)
		}
		return nil
	})
}

// vmiTimeout bounds the wait for a VMI to run with its guest up (QEMU
// under TCG boots the guest in seconds; pulling and starting the launcher
// pod takes longer).
const vmiTimeout = 5 * time.Minute

// waitVMs waits for each named VM (namespace found in s.vms) to run and
// its guest to say it is up on the console.
func (s *vmScenarios) waitVMs(ctx context.Context, names ...string) {
	for _, n := range names {
		for _, v := range s.vms {
			if v.name == n {
				v.err = s.waitVM(ctx, v)
			}
		}
	}
}

// waitVM waits until v's VMI is Ready and its guest printed KVNET-READY
// on the console, and records its node, IP, MAC and UID.
func (s *vmScenarios) waitVM(ctx context.Context, v *runningVM) error {
	s.logf("waiting for VM %s", v)
	var last string
	err := poll(ctx, vmiTimeout, func(ctx context.Context) error {
		vmi, err := s.dyn.Resource(vmiGVR).Namespace(v.ns).Get(ctx, v.name, metav1.GetOptions{})
		if err != nil {
			last = err.Error()
			return err
		}
		phase, _, _ := unstructured.NestedString(vmi.Object, "status", "phase")
		if phase != "Running" || !vmiReady(vmi) {
			last = "VMI phase " + phase
			return errors.New(last)
		}
		node, _, _ := unstructured.NestedString(vmi.Object, "status", "nodeName")
		ifaces, _, _ := unstructured.NestedSlice(vmi.Object, "status", "interfaces")
		if len(ifaces) == 0 {
			last = "VMI without status.interfaces"
			return errors.New(last)
		}
		i0, _ := ifaces[0].(map[string]any)
		ipS, _ := i0["ipAddress"].(string)
		ip, err := netip.ParseAddr(ipS)
		if err != nil {
			last = fmt.Sprintf("VMI interface without IP (%v)", i0)
			return errors.New(last)
		}
		console, err := s.console(ctx, v.ns, string(vmi.GetUID()), node)
		if err != nil {
			last = err.Error()
			return err
		}
		if !strings.Contains(console, "KVNET-READY") {
			last = "guest not up yet (no KVNET-READY on its console)"
			return errors.New(last)
		}
		v.node, v.ip, v.uid = node, ip, string(vmi.GetUID())
		v.mac, _ = i0["mac"].(string)
		v.diskCRC = containerDiskChecksum(vmi)
		return nil
	})
	if err != nil {
		return fmt.Errorf("VM %s not running with its guest up after %s: %s%s", v, vmiTimeout, last, s.vmiWarnings(ctx, v.ns, v.name))
	}
	s.logf("VM %s runs on %s at %s", v, v.node, v.ip)
	return nil
}

// containerDiskChecksum is the CRC32 virt-handler reports for the VMI's
// first containerDisk (status.volumeStatus[].containerDiskVolume.checksum),
// 0 if none.
func containerDiskChecksum(vmi *unstructured.Unstructured) int64 {
	vols, _, _ := unstructured.NestedSlice(vmi.Object, "status", "volumeStatus")
	for _, v := range vols {
		m, _ := v.(map[string]any)
		if sum, found, _ := unstructured.NestedInt64(m, "containerDiskVolume", "checksum"); found {
			return sum
		}
	}
	return 0
}

// vmiClaimIP checks that the VMI runs (phase Running, on a node) with
// claim, its IPAMClaim's address, on its first interface (ipAddress or
// among ipAddresses), and returns that interface's MAC and the node.
func vmiClaimIP(vmi *unstructured.Unstructured, claim netip.Addr) (mac, node string, err error) {
	phase, _, _ := unstructured.NestedString(vmi.Object, "status", "phase")
	node, _, _ = unstructured.NestedString(vmi.Object, "status", "nodeName")
	if phase != "Running" || node == "" {
		return "", "", fmt.Errorf("VMI %s/%s: phase %q on node %q, want Running", vmi.GetNamespace(), vmi.GetName(), phase, node)
	}
	ifaces, _, _ := unstructured.NestedSlice(vmi.Object, "status", "interfaces")
	if len(ifaces) == 0 {
		return "", "", fmt.Errorf("VMI %s/%s: no status.interfaces yet", vmi.GetNamespace(), vmi.GetName())
	}
	i0, _ := ifaces[0].(map[string]any)
	var addrs []string
	if a, ok := i0["ipAddress"].(string); ok {
		addrs = append(addrs, a)
	}
	if l, ok := i0["ipAddresses"].([]any); ok {
		for _, a := range l {
			if a, ok := a.(string); ok {
				addrs = append(addrs, a)
			}
		}
	}
	for _, a := range addrs {
		if ip, err := netip.ParseAddr(a); err == nil && ip == claim {
			mac, _ = i0["mac"].(string)
			return mac, node, nil
		}
	}
	return "", "", fmt.Errorf("VMI %s/%s: addresses %v, want its IPAMClaim's %s", vmi.GetNamespace(), vmi.GetName(), addrs, claim)
}

// vmiReady reports the VMI's Ready condition.
func vmiReady(vmi *unstructured.Unstructured) bool {
	conds, _, _ := unstructured.NestedSlice(vmi.Object, "status", "conditions")
	for _, c := range conds {
		m, _ := c.(map[string]any)
		if m["type"] == "Ready" && m["status"] == "True" {
			return true
		}
	}
	return false
}

// vmiWarnings returns the VMI's Warning events (KubeVirt's SyncFailed
// names a network setup error), as "; events: ..." or "".
func (s *vmScenarios) vmiWarnings(ctx context.Context, ns, name string) string {
	msgs := s.warnings(ctx, ns, name)
	if len(msgs) == 0 {
		return ""
	}
	return "; events: " + strings.Join(msgs, " | ")
}

func (s *vmScenarios) warnings(ctx context.Context, ns, name string) []string {
	l, err := s.t.Client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{
		FieldSelector: "type=Warning,involvedObject.kind=VirtualMachineInstance,involvedObject.name=" + name,
	})
	if err != nil {
		return []string{"list events: " + err.Error()}
	}
	var out []string
	for _, e := range l.Items {
		out = append(out, e.Reason+": "+e.Message)
	}
	return out
}

// launcherPod returns the running launcher pod of the VMI with uid on
// node.
func (s *vmScenarios) launcherPod(ctx context.Context, ns, uid, node string) (*corev1.Pod, error) {
	l, err := s.t.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "kubevirt.io/created-by=" + uid})
	if err != nil {
		return nil, err
	}
	for i := range l.Items {
		p := &l.Items[i]
		if p.Spec.NodeName == node && p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
			return p, nil
		}
	}
	return nil, fmt.Errorf("no running launcher pod of VMI %s on %s", uid, node)
}

// ghostRecordDir is where virt-handler keeps, per VMI whose launcher it
// talks to on its node, the launcher's socket (a "ghost record", named by
// the VMI's UID).
const ghostRecordDir = "/var/run/kubevirt-private/ghost-records"

// cleanupMigrationSource works around a KubeVirt v1.8.4 bug the VM
// scenarios hit: after a live migration the source node's virt-handler
// sometimes skips its cleanup of the source (its domain is gone from the
// handler's cache before the handler looks, and the VMI belongs to
// another node by then), leaving the source launcher pod's containerDisk
// bind-mounted (kubelet's teardown of the pod's emptyDir fails with
// EBUSY) and the VMI's ghost record in place; a restarted handler does
// not repair it. A later migration of the VM back to that node then stays
// in PreparingTarget for good ("can not add ghost record when entry
// already exists with differing socket file location", then "Found
// multiple pods active for vmi ... Waiting on outdated pod directories to
// be removed"). It gives KubeVirt 30 s to clean up after source launcher
// pod sourcePod of v on node, then does what the handler skipped, in the
// handler's pod (which sees kubelet's pod directories at /pods): unmounts
// the pod's containerDisk images and removes the ghost record. It returns
// what it did (empty: KubeVirt had cleaned up).
func (s *vmScenarios) cleanupMigrationSource(ctx context.Context, v *runningVM, node, sourcePod string) (string, error) {
	pod, err := s.t.Client.CoreV1().Pods(v.ns).Get(ctx, sourcePod, metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("source launcher pod: %w", err)
	}
	pods, err := s.t.Client.CoreV1().Pods(KubeVirtNamespace).List(ctx, metav1.ListOptions{
		LabelSelector: "kubevirt.io=virt-handler", FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		return "", err
	}
	if len(pods.Items) == 0 {
		return "", fmt.Errorf("no virt-handler pod on %s", node)
	}
	handler := pods.Items[0].Name
	leftovers := sourceLeftoversScript("/pods", string(pod.UID), ghostRecordDir, v.uid)
	var left string
	err = poll(ctx, 30*time.Second, func(ctx context.Context) error {
		out, errOut, err := PodExec(ctx, s.t.Config, s.t.Client, KubeVirtNamespace, handler, "sh", "-c", leftovers)
		if code, ok := ExitStatus(err); ok && code == 3 {
			left = strings.TrimSpace(out)
			return fmt.Errorf("left: %s", left)
		}
		left = ""
		if err != nil {
			// An exec that failed (API server or kubelet busy) is
			// tried again until the deadline.
			return fmt.Errorf("virt-handler %s: %w: %s", handler, err, strings.TrimSpace(errOut))
		}
		return nil
	})
	if left == "" {
		return "", err
	}
	fix := sourceCleanupScript("/pods", string(pod.UID), ghostRecordDir, v.uid)
	if _, errOut, err := PodExec(ctx, s.t.Config, s.t.Client, KubeVirtNamespace, handler, "sh", "-c", fix); err != nil {
		return "", fmt.Errorf("virt-handler %s: clean up after %s: %w: %s", handler, sourcePod, err, strings.TrimSpace(errOut))
	}
	note := fmt.Sprintf("KubeVirt's virt-handler on %s had not cleaned up after source pod %s of VM %s 30 s after the migration (a KubeVirt v1.8.4 bug that strands a later migration back to %s); the scenario unmounted and removed %s",
		node, sourcePod, v, node, left)
	s.logf("%s", note)
	return note, nil
}

// sourceLeftoversScript is a shell script that prints what virt-handler
// left of launcher pod podUID (its containerDisk mounts under podsDir, as
// /proc/self/mountinfo shows them) and of VMI vmiUID (its ghost record in
// ghostDir) and exits 3, or exits 0 when nothing is left.
func sourceLeftoversScript(podsDir, podUID, ghostDir, vmiUID string) string {
	return fmt.Sprintf(`m=$(grep -o "%s/%s/volumes/kubernetes.io~empty-dir/container-disks/[^ ]*" /proc/self/mountinfo | sort -u)
g=%s/%s
[ -e "$g" ] || g=
[ -z "$m$g" ] && exit 0
echo $m $g
exit 3`, podsDir, podUID, ghostDir, vmiUID)
}

// sourceCleanupScript is a shell script that unmounts what
// sourceLeftoversScript finds mounted and removes the ghost record.
func sourceCleanupScript(podsDir, podUID, ghostDir, vmiUID string) string {
	return fmt.Sprintf(`for m in $(grep -o "%s/%s/volumes/kubernetes.io~empty-dir/container-disks/[^ ]*" /proc/self/mountinfo | sort -u); do umount "$m" || exit 1; done
rm -f %s/%s`, podsDir, podUID, ghostDir, vmiUID)
}

// guestPanics returns, for a failed scenario, which of the scenarios'
// guests' consoles show its kernel crashed (empty: none): a guest that
// crashed answers nothing, whatever kvnet does.
func (s *vmScenarios) guestPanics(ctx context.Context) string {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	var found []string
	for _, ns := range []string{nsVM, nsVMB, nsVMPlain, nsVM6} {
		pods, err := s.t.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "kubevirt.io=virt-launcher"})
		if err != nil {
			continue
		}
		for _, p := range pods.Items {
			console, err := s.podLog(ctx, ns, p.Name, "guest-console-log")
			if err != nil {
				continue
			}
			if crash := guestCrash(console); crash != "" {
				found = append(found, fmt.Sprintf("the guest of %s/%s on %s crashed: %s", ns, p.Name, p.Spec.NodeName, crash))
			}
		}
	}
	return strings.Join(found, "; ")
}

// guestCrash returns the first kernel crash line of a guest's console and
// the two lines after it (empty: none).
func guestCrash(console string) string {
	lines := strings.Split(console, "\n")
	for i, l := range lines {
		if strings.Contains(l, "Kernel panic") || strings.Contains(l, "kernel BUG") || strings.Contains(l, "BUG:") ||
			strings.Contains(l, "list_del corruption") || strings.Contains(l, "general protection fault") || strings.Contains(l, "Oops:") {
			end := min(i+3, len(lines))
			return strings.Join(lines[i:end], " | ")
		}
	}
	return ""
}

// console returns the guest's serial console so far, as KubeVirt's
// guest-console-log container prints it.
func (s *vmScenarios) console(ctx context.Context, ns, uid, node string) (string, error) {
	p, err := s.launcherPod(ctx, ns, uid, node)
	if err != nil {
		return "", err
	}
	return s.podLog(ctx, ns, p.Name, "guest-console-log")
}

func (s *vmScenarios) vm(key string) (*runningVM, error) {
	v := s.vms[key]
	if v == nil {
		return nil, fmt.Errorf("VM %s was not created", key)
	}
	return v, v.err
}

// claimIP returns the IPv4 address of IPAMClaim ns/name's status.ips.
func (s *vmScenarios) claimIP(ctx context.Context, ns, name string) (netip.Addr, error) {
	c, err := s.dyn.Resource(ipamClaimGVR).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return netip.Addr{}, fmt.Errorf("IPAMClaim %s/%s: %w", ns, name, err)
	}
	ips, _, _ := unstructured.NestedStringSlice(c.Object, "status", "ips")
	for _, s := range ips {
		if p, err := netip.ParsePrefix(s); err == nil && p.Addr().Is4() {
			return p.Addr(), nil
		}
	}
	return netip.Addr{}, fmt.Errorf("IPAMClaim %s/%s: no IPv4 address in status.ips %v", ns, name, ips)
}

// masquerade: the VMI's IP is its claim's, in the UDN's subnet; the
// guest holds KubeVirt's lease; a pod on another node reaches it.
func (s *vmScenarios) masquerade(ctx context.Context) (string, error) {
	v, err := s.vm(nsVM + "/vm-m")
	if err != nil {
		return "", err
	}
	claim, err := s.claimIP(ctx, nsVM, "vm-m.default")
	if err != nil {
		return "", err
	}
	if v.ip != claim || !tenantSubnet.Contains(v.ip) {
		return "", fmt.Errorf("VMI %s IP %s, IPAMClaim vm-m.default holds %s (subnet %s)", v, v.ip, claim, tenantSubnet)
	}
	lp, err := s.launcherPod(ctx, v.ns, v.uid, v.node)
	if err != nil {
		return "", err
	}
	lpod := &scenarioPod{ns: v.ns, name: lp.Name, pod: lp}
	if a, err := lpod.addr(primaryInterface, tenantSubnet); err != nil || a != claim {
		return "", fmt.Errorf("launcher pod %s: ovn-udn1 %s (%v), want the claim's %s", lp.Name, a, err, claim)
	}
	console, err := s.console(ctx, v.ns, v.uid, v.node)
	if err != nil {
		return "", err
	}
	lease, err := checkMasqueradeLease(parseGuestLeases(console), v.mac)
	if err != nil {
		return "", fmt.Errorf("VM %s: %w", v, err)
	}
	// The guest's disk is padded to a CRC32 >= 2^31 (hack/guest/build-disk.sh),
	// the value KubeVirt < v1.8.4 cannot store on Kubernetes >= 1.36
	// (kubevirt/kubevirt#17858): a VMI running with it proves the pair.
	if v.diskCRC < 1<<31 {
		return "", fmt.Errorf("VMI %s: containerDisk checksum %d in its status, want the guest disk's CRC32 >= 2^31", v, v.diskCRC)
	}
	ps, err := s.need(ctx, nsVM+"/vc")
	if err != nil {
		return "", err
	}
	if v.node == ps[0].node {
		return "", fmt.Errorf("VM %s runs on the client's node %s", v, v.node)
	}
	body, err := s.reach(ctx, ps[0], "http://"+v.ip.String()+"/", v.name)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("VMI %s on %s (containerDisk CRC32 %d >= 2^31): IP %s = IPAMClaim vm-m.default, launcher ovn-udn1 %s; guest lease %s %s %s = KubeVirt's masquerade address (its DHCP, behind NAT); %s on %s fetched %q",
		v, v.node, v.diskCRC, v.ip, claim, lease.Iface, lease.MAC, lease.IP, ps[0], ps[0].node, body), nil
}

// tenant: another tenant's pod on the same subnet does not reach the VM.
func (s *vmScenarios) tenant(ctx context.Context) (string, error) {
	v, err := s.vm(nsVM + "/vm-m")
	if err != nil {
		return "", err
	}
	ps, err := s.need(ctx, nsVMB+"/vb")
	if err != nil {
		return "", err
	}
	b, err := ps[0].addr(primaryInterface, tenantSubnet)
	if err != nil {
		return "", err
	}
	// The probe works: vb reaches the outside world first.
	if s.t.EgressURL != "" {
		if _, err := s.reach(ctx, ps[0], s.t.EgressURL, ""); err != nil {
			return "", err
		}
	}
	if err := s.unreached(ctx, ps[0], "http://"+v.ip.String()+"/"); err != nil {
		return "", err
	}
	return fmt.Sprintf("%s (ovn-udn1 %s, same subnet %s) does not reach VM %s at %s", ps[0], b, tenantSubnet, v, v.ip), nil
}

// service: the Service in front of the VM answers at its name.
func (s *vmScenarios) service(ctx context.Context) (string, error) {
	v, err := s.vm(nsVM + "/vm-m")
	if err != nil {
		return "", err
	}
	ps, err := s.need(ctx, nsVM+"/vc")
	if err != nil {
		return "", err
	}
	url := "http://vm-m." + nsVM + ".svc.cluster.local/"
	body, err := s.reach(ctx, ps[0], url, v.name)
	if err != nil {
		return "", err
	}
	host, err := s.byHostname(ctx, v, ps[0])
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("%s fetched %s: %q; %s", ps[0], url, body, host), nil
}

// vmSubdomain is vm-m's spec.subdomain, a headless Service over it.
const vmSubdomain = "vm-hl"

// byHostname checks that client resolves VM v's hostname.subdomain name
// (through CoreDNS, which answers the launcher pod's default-network
// address) to the VM's UDN address, and fetches the guest's page there.
func (s *vmScenarios) byHostname(ctx context.Context, v *runningVM, client *scenarioPod) (string, error) {
	name := v.name + "." + vmSubdomain + "." + v.ns + ".svc.cluster.local"
	if err := poll(ctx, reachTimeout, func(ctx context.Context) error { return s.resolves(ctx, client, name, v.ip.String()) }); err != nil {
		return "", fmt.Errorf("hostname.subdomain: %w", err)
	}
	launcher, err := s.launcherPod(ctx, v.ns, v.uid, v.node)
	if err != nil {
		return "", err
	}
	if eth0, err := netip.ParseAddr(launcher.Status.PodIP); err == nil {
		if err := s.resolvesNone(ctx, client, name, eth0); err != nil {
			return "", fmt.Errorf("hostname.subdomain resolved to the launcher pod's default-network address: %w", err)
		}
	}
	if _, err := s.reach(ctx, client, "http://"+name+"/", v.name); err != nil {
		return "", fmt.Errorf("fetch by hostname.subdomain: %w", err)
	}
	return fmt.Sprintf("%s resolved %s to %s (launcher pod %s on %s has %s on eth0) and fetched it", client, name, v.ip, launcher.Name, v.node, launcher.Status.PodIP), nil
}

// podNetwork: a masquerade VM without a UDN is on the default network.
func (s *vmScenarios) podNetwork(ctx context.Context) (string, error) {
	v, err := s.vm(nsVMPlain + "/vm-p")
	if err != nil {
		return "", err
	}
	n, err := s.t.Client.CoreV1().Nodes().Get(ctx, v.node, metav1.GetOptions{})
	if err != nil {
		return "", err
	}
	if !inPodCIDRs(n, v.ip) {
		return "", fmt.Errorf("VMI %s IP %s not in node %s's pod CIDRs %v", v, v.ip, v.node, n.Spec.PodCIDRs)
	}
	console, err := s.console(ctx, v.ns, v.uid, v.node)
	if err != nil {
		return "", err
	}
	lease, err := checkMasqueradeLease(parseGuestLeases(console), v.mac)
	if err != nil {
		return "", fmt.Errorf("VM %s: %w", v, err)
	}
	ps, err := s.need(ctx, nsVMPlain+"/vp")
	if err != nil {
		return "", err
	}
	body, err := s.reach(ctx, ps[0], "http://"+v.ip.String()+"/", v.name)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("VMI %s on %s: IP %s of the default network; guest lease %s %s = KubeVirt's masquerade address; %s on %s fetched %q", v, v.node, v.ip, lease.MAC, lease.IP, ps[0], ps[0].node, body), nil
}

// setRunStrategy sets the VM's spec.runStrategy.
func (s *vmScenarios) setRunStrategy(ctx context.Context, ns, name, strategy string) error {
	patch := fmt.Sprintf(`{"spec":{"runStrategy":%q}}`, strategy)
	_, err := s.dyn.Resource(vmGVR).Namespace(ns).Patch(ctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	return err
}

// stopStart: the VM comes back with the same IP and MAC.
func (s *vmScenarios) stopStart(ctx context.Context) (string, error) {
	v, err := s.vm(nsVM + "/vm-m")
	if err != nil {
		return "", err
	}
	ip, mac, node := v.ip, v.mac, v.node
	if err := s.setRunStrategy(ctx, v.ns, v.name, "Halted"); err != nil {
		return "", fmt.Errorf("stop VM %s: %w", v, err)
	}
	err = poll(ctx, 3*time.Minute, func(ctx context.Context) error {
		_, err := s.dyn.Resource(vmiGVR).Namespace(v.ns).Get(ctx, v.name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("VMI %s still there after stop (%v)", v, err)
	})
	if err != nil {
		return "", err
	}
	stopped, err := s.claimIP(ctx, nsVM, "vm-m.default")
	if err != nil {
		return "", fmt.Errorf("VM %s stopped: %w", v, err)
	}
	if err := s.setRunStrategy(ctx, v.ns, v.name, "Always"); err != nil {
		return "", fmt.Errorf("start VM %s: %w", v, err)
	}
	if v.err = s.waitVM(ctx, v); v.err != nil {
		return "", v.err
	}
	if v.ip != ip || v.mac != mac {
		return "", fmt.Errorf("VM %s was %s %s on %s, is %s %s on %s after stop/start", v, ip, mac, node, v.ip, v.mac, v.node)
	}
	ps, err := s.need(ctx, nsVM+"/vc")
	if err != nil {
		return "", err
	}
	if _, err := s.reach(ctx, ps[0], "http://"+v.ip.String()+"/", v.name); err != nil {
		return "", err
	}
	return fmt.Sprintf("VM %s: %s %s on %s; stopped, its IPAMClaim kept %s; started: %s %s on %s, reached by %s", v, ip, mac, node, stopped, v.ip, v.mac, v.node, ps[0]), nil
}

// echoPod is a pod on node that opens one TCP connection to the guest's
// echo service (port 7) at ip and sends a numbered line every 20 ms
// (httpget -echo), writing what comes back to /tmp/echo.out and every
// pause of more than 100 ms between two answers to /tmp/echo.gaps; when
// the connection ends it appends "closed" to /tmp/echo.out. Beside it,
// busybox ping sends a request to ip every pingInterval and writes the
// replies to /tmp/ping.out.
func echoPod(ns, name, node, image string, ip netip.Addr) *corev1.Pod {
	script := fmt.Sprintf(`ping -i %g %s > /tmp/ping.out 2>&1 &
httpget -echo -interval 20ms %s > /tmp/echo.out 2> /tmp/echo.gaps; echo closed >> /tmp/echo.out; exec sleep 100000`,
		pingInterval.Seconds(), ip, net.JoinHostPort(ip.String(), "7"))
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{
			NodeSelector:                  map[string]string{corev1.LabelHostname: node},
			TerminationGracePeriodSeconds: ptr.To[int64](0),
			Containers:                    []corev1.Container{{Name: "echo", Image: image, Command: []string{"sh", "-c", script}}},
		},
	}
}

// echoLines reads the echo pod's output: the number of lines echoed
// back, checked to be 1, 2, ... in order, or an error naming the first
// gap or the connection's end.
func (s *vmScenarios) echoLines(ctx context.Context, ns, name string) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, execTimeout)
	defer cancel()
	out, errOut, err := PodExec(ctx, s.t.Config, s.t.Client, ns, name, "cat", "/tmp/echo.out")
	if err != nil {
		return 0, fmt.Errorf("read %s/%s's /tmp/echo.out: %v: %s", ns, name, err, strings.TrimSpace(errOut))
	}
	return checkEchoLines(out)
}

// checkEchoLines checks echo output: lines 1..n in order, the last one
// possibly cut short; "closed" means the connection ended.
func checkEchoLines(out string) (int, error) {
	lines := strings.Split(out, "\n")
	n := 0
	for i, l := range lines {
		if l == "" && i == len(lines)-1 {
			break
		}
		if l == "closed" {
			return n, fmt.Errorf("the TCP connection closed after %d lines", n)
		}
		v, err := strconv.Atoi(l)
		if err != nil || v != n+1 {
			if i == len(lines)-1 {
				break // the line being written
			}
			return n, fmt.Errorf("echo line %d is %q, want %d", i+1, l, n+1)
		}
		n++
	}
	return n, nil
}

// echoGap returns the longest pause the echo pod saw between two answers
// before a line numbered above after (0 if none exceeded 100 ms).
func (s *vmScenarios) echoGap(ctx context.Context, ns, name string, after int) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, execTimeout)
	defer cancel()
	out, errOut, err := PodExec(ctx, s.t.Config, s.t.Client, ns, name, "cat", "/tmp/echo.gaps")
	if err != nil {
		return 0, fmt.Errorf("read %s/%s's /tmp/echo.gaps: %v: %s", ns, name, err, strings.TrimSpace(errOut))
	}
	return maxEchoGap(out, after), nil
}

// maxEchoGap reads httpget -echo's gap lines ("gap <ms> before <line>")
// and returns the longest before a line numbered above after.
func maxEchoGap(gaps string, after int) time.Duration {
	var max time.Duration
	for _, l := range strings.Split(gaps, "\n") {
		var ms, line int
		if _, err := fmt.Sscanf(l, "gap %d before %d", &ms, &line); err != nil || line <= after {
			continue
		}
		if d := time.Duration(ms) * time.Millisecond; d > max {
			max = d
		}
	}
	return max
}

// waitEchoGrows waits until the echo pod has more than past lines back,
// in order.
func (s *vmScenarios) waitEchoGrows(ctx context.Context, ns, name string, past int) (int, error) {
	var n int
	err := poll(ctx, time.Minute, func(ctx context.Context) error {
		var err error
		n, err = s.echoLines(ctx, ns, name)
		if err != nil {
			return &stopPolling{err}
		}
		if n <= past+25 {
			return fmt.Errorf("echo: %d lines back, want more than %d", n, past+25)
		}
		return nil
	})
	var sp *stopPolling
	if errors.As(err, &sp) {
		return n, sp.err
	}
	return n, err
}

// stopPolling is an error poll's caller treats as final.
type stopPolling struct{ err error }

func (e *stopPolling) Error() string { return e.err.Error() }

// migrate live-migrates v to node through a VirtualMachineInstanceMigration
// and waits until it succeeded; it returns the migration's status.
func (s *vmScenarios) migrate(ctx context.Context, v *runningVM, name, node string) (map[string]any, error) {
	m := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstanceMigration",
		"metadata": map[string]any{"name": name, "namespace": v.ns},
		"spec": map[string]any{
			"vmiName":           v.name,
			"addedNodeSelector": map[string]any{corev1.LabelHostname: node},
		},
	}}
	if _, err := s.dyn.Resource(vmimGVR).Namespace(v.ns).Create(ctx, m, metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("create migration %s: %w", name, err)
	}
	var status map[string]any
	err := poll(ctx, 5*time.Minute, func(ctx context.Context) error {
		got, err := s.dyn.Resource(vmimGVR).Namespace(v.ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		phase, _, _ := unstructured.NestedString(got.Object, "status", "phase")
		status, _, _ = unstructured.NestedMap(got.Object, "status")
		switch phase {
		case "Succeeded":
			return nil
		case "Failed":
			reason, _, _ := unstructured.NestedString(got.Object, "status", "migrationState", "failureReason")
			return &stopPolling{fmt.Errorf("migration %s of %s to %s failed: %s", name, v, node, reason)}
		}
		return fmt.Errorf("migration %s: phase %q", name, phase)
	})
	var sp *stopPolling
	if errors.As(err, &sp) {
		return status, sp.err
	}
	if err != nil {
		return status, fmt.Errorf("%w; %s", err, s.migrationDiag(ctx, v, name))
	}
	// v.node is still the source's node.
	ms, _ := status["migrationState"].(map[string]any)
	source, _ := ms["sourcePod"].(string)
	if source == "" {
		// The migration's own status may lack it a moment after it
		// succeeded; the VMI's is the last migration's.
		vmi, err := s.dyn.Resource(vmiGVR).Namespace(v.ns).Get(ctx, v.name, metav1.GetOptions{})
		if err != nil {
			return status, err
		}
		source, _, _ = unstructured.NestedString(vmi.Object, "status", "migrationState", "sourcePod")
	}
	if source == "" {
		return status, fmt.Errorf("migration %s succeeded without a status.migrationState.sourcePod", name)
	}
	if _, err := s.cleanupMigrationSource(ctx, v, v.node, source); err != nil {
		return status, fmt.Errorf("migration %s: after it, on the source node %s: %w", name, v.node, err)
	}
	return status, nil
}

// migrationDiag says why a migration of v is stuck: its status, the
// state and latest warnings of each launcher pod of the VMI, and what
// virt-controller last logged about it.
func (s *vmScenarios) migrationDiag(ctx context.Context, v *runningVM, name string) string {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	var parts []string
	if got, err := s.dyn.Resource(vmimGVR).Namespace(v.ns).Get(ctx, name, metav1.GetOptions{}); err == nil {
		st, _, _ := unstructured.NestedMap(got.Object, "status")
		b, _ := json.Marshal(st)
		parts = append(parts, "migration status "+string(b))
	}
	pods, err := s.t.Client.CoreV1().Pods(v.ns).List(ctx, metav1.ListOptions{LabelSelector: "kubevirt.io=virt-launcher,vm.kubevirt.io/name=" + v.name})
	if err == nil {
		for i := range pods.Items {
			p := &pods.Items[i]
			parts = append(parts, fmt.Sprintf("launcher %s on %q (migration job %q): %s", p.Name, p.Spec.NodeName,
				p.Labels["kubevirt.io/migrationJobUID"], podNotReady(ctx, s.t.Client, p)))
		}
	}
	ctrls, err := s.t.Client.CoreV1().Pods(KubeVirtNamespace).List(ctx, metav1.ListOptions{LabelSelector: "kubevirt.io=virt-controller"})
	if err == nil {
		tail := int64(400)
		for _, p := range ctrls.Items {
			b, err := s.t.Client.CoreV1().Pods(KubeVirtNamespace).GetLogs(p.Name, &corev1.PodLogOptions{TailLines: &tail}).DoRaw(ctx)
			if err != nil {
				continue
			}
			var lines []string
			for _, l := range strings.Split(string(b), "\n") {
				if strings.Contains(l, name) || strings.Contains(l, v.name) {
					lines = append(lines, l)
				}
			}
			if len(lines) > 8 {
				lines = lines[len(lines)-8:]
			}
			if len(lines) > 0 {
				parts = append(parts, p.Name+" logged: "+strings.Join(lines, " | "))
			}
		}
	}
	return strings.Join(parts, "; ")
}

// startEcho starts the echo pod on node against the guest at ip and
// waits until its first lines and ping replies came back; it returns how
// many lines did and the last reply's seq.
func (s *vmScenarios) startEcho(ctx context.Context, ns, node string, ip netip.Addr) (lines, pingSeq int, err error) {
	if _, err := s.t.Client.CoreV1().Pods(ns).Create(ctx, echoPod(ns, "echo", node, s.t.Image, ip), metav1.CreateOptions{}); err != nil {
		return 0, 0, fmt.Errorf("create echo pod: %w", err)
	}
	if lines, err = s.waitEchoGrows(ctx, ns, "echo", 0); err != nil {
		return 0, 0, err
	}
	seqs, err := s.pingReplies(ctx, ns, "echo")
	if err != nil {
		return 0, 0, err
	}
	return lines, seqs[len(seqs)-1], nil
}

// migrationStep is one live migration as the echo client saw it.
type migrationStep struct {
	target   string        // status.migrationState.targetNodeAddress
	took     time.Duration // KubeVirt's start to end timestamps (0: not known)
	lines    int           // echo lines back in order after it
	gap      time.Duration // the client's longest pause during it
	pingSeq  int           // the last ping reply's seq after it
	blackout blackout
	// blackoutErr says why the logs' part of blackout is missing.
	blackoutErr error
	// switchEvent is kvnet-node's event on the VMI for the switch-over
	// ("<reason>: <note>"); switched the target kvnet-node's
	// kvnet_migration_switchovers_total before and after it.
	switchEvent    string
	switchedBefore switchoverMetrics
	switchedAfter  switchoverMetrics
	// why is kvnet why vm's line on the switch-over after it.
	why string
}

// switchoverMetrics are a kvnet-node's migration metrics: switch-overs
// counted (kvnet_migration_switchovers_total, every network and trigger),
// observed by the histograms of the target port's wait (either trigger)
// and of first frame to open port (first-frame only).
type switchoverMetrics struct {
	total, waits, frames, darks float64
}

func (m switchoverMetrics) String() string {
	return fmt.Sprintf("%v (wait histogram %v, first-frame histogram %v, dark histogram %v)", m.total, m.waits, m.frames, m.darks)
}

// migrateWithEcho live-migrates v to node (migrate), checks that its VMI
// is there, waits until the echo pod's lines, lines back before, go on
// in order, and returns what the migration, the client and the logs saw;
// pingSeq is the last ping reply's seq before the migration.
func (s *vmScenarios) migrateWithEcho(ctx context.Context, v *runningVM, name, node string, lines, pingSeq int) (migrationStep, error) {
	since := time.Now()
	switchedBefore, err := s.switchoverCount(ctx, node)
	if err != nil {
		return migrationStep{}, err
	}
	st, err := s.migrate(ctx, v, name, node)
	if err != nil {
		return migrationStep{}, err
	}
	vmi, err := s.dyn.Resource(vmiGVR).Namespace(v.ns).Get(ctx, v.name, metav1.GetOptions{})
	if err != nil {
		return migrationStep{}, err
	}
	if at, _, _ := unstructured.NestedString(vmi.Object, "status", "nodeName"); at != node {
		return migrationStep{}, fmt.Errorf("succeeded but VMI %s is on %s, want %s", v, at, node)
	}
	v.node = node
	// The migration's own status may lack the state a moment after it
	// succeeded; the VMI's is the last migration's.
	ms, _ := st["migrationState"].(map[string]any)
	if ms["targetNodeAddress"] == nil || ms["endTimestamp"] == nil || ms["sourcePod"] == nil {
		ms, _, _ = unstructured.NestedMap(vmi.Object, "status", "migrationState")
	}
	var step migrationStep
	step.target, _ = ms["targetNodeAddress"].(string)
	if a, b := parseTime(ms["startTimestamp"]), parseTime(ms["endTimestamp"]); !a.IsZero() && !b.IsZero() {
		step.took = b.Sub(a)
	}
	if step.lines, err = s.waitEchoGrows(ctx, v.ns, "echo", lines); err != nil {
		return step, fmt.Errorf("%w (%s)", err, s.streamDiag(ctx, v, "echo", ms, node, since))
	}
	if step.gap, err = s.echoGap(ctx, v.ns, "echo", lines); err != nil {
		return step, err
	}
	seqs, err := s.pingReplies(ctx, v.ns, "echo")
	if err != nil {
		return step, err
	}
	pingGap, last := longestPingGap(seqs, pingSeq)
	step.pingSeq = last
	// What the logs tell is a measurement: a log that cannot be read
	// is reported (the benchmark requires it), not the migration's
	// failure.
	step.blackout, step.blackoutErr = s.logBlackout(ctx, v, ms, node, since)
	step.blackout.pingGap = pingGap
	// kvnet-node on the target reports the switch-over: an event on the
	// VMI, its counter and histograms up by one (the first-frame one only
	// for a switch at the guest's first frame), and kvnet why vm says it.
	// The event says how long the network was dark, from the guest's last
	// frame that the source's kvnet-node published on the source pod.
	step.switchedBefore = switchedBefore
	err = poll(ctx, time.Minute, func(ctx context.Context) error {
		if step.switchEvent, err = s.switchoverEvent(ctx, v, node, since); err != nil {
			return err
		}
		if !strings.Contains(step.switchEvent, "the network was dark ") {
			return fmt.Errorf("the switch-over event does not say how long the network was dark: %s", step.switchEvent)
		}
		if step.switchedAfter, err = s.switchoverCount(ctx, node); err != nil {
			return err
		}
		want := switchedBefore
		want.total++
		want.waits++
		want.darks++
		if strings.HasPrefix(step.switchEvent, migration.EventSwitchover+":") {
			want.frames++
		}
		if step.switchedAfter != want {
			return fmt.Errorf("kvnet-node on %s: switch-overs %v, %v before the migration (event %s): want %v", node, step.switchedAfter, switchedBefore, step.switchEvent, want)
		}
		step.why, err = s.whySwitchover(ctx, v, node)
		return err
	})
	return step, err
}

// whySwitchover returns the line of kvnet why vm on v that tells its
// network switched to node.
func (s *vmScenarios) whySwitchover(ctx context.Context, v *runningVM, node string) (string, error) {
	scheme, err := manager.NewScheme()
	if err != nil {
		return "", err
	}
	c, err := client.New(s.t.Config, client.Options{Scheme: scheme})
	if err != nil {
		return "", err
	}
	rep, err := why.Diagnose(ctx, c, "vm", v.ns, v.name, why.Options{})
	if err != nil {
		return "", err
	}
	var b bytes.Buffer
	rep.Print(&b)
	for _, l := range strings.Split(b.String(), "\n") {
		if strings.Contains(l, "switched from node ") && strings.Contains(l, " to node "+node+" ") {
			return strings.TrimSpace(l), nil
		}
	}
	return "", fmt.Errorf("kvnet why vm %s does not say its network switched to node %s:\n%s", v, node, b.String())
}

// streamDiag says what is known of a broken echo stream (echo pod echo)
// to v after its migration to node (state ms, started at since): how the
// client saw the connection end (the tail of /tmp/echo.gaps), kvnet-node's
// switch-over events on the VMI and the blackout from the logs.
func (s *vmScenarios) streamDiag(ctx context.Context, v *runningVM, echo string, ms map[string]any, node string, since time.Time) string {
	var parts []string
	ectx, cancel := context.WithTimeout(ctx, execTimeout)
	out, _, err := PodExec(ectx, s.t.Config, s.t.Client, v.ns, echo, "tail", "-n", "3", "/tmp/echo.gaps")
	cancel()
	if err != nil {
		parts = append(parts, fmt.Sprintf("client's end not read: %v", err))
	} else {
		parts = append(parts, "client's last words: "+strings.Join(strings.Fields(strings.ReplaceAll(out, "\n", " | ")), " "))
	}
	if ev, err := s.switchoverEvent(ctx, v, node, since); err != nil {
		parts = append(parts, err.Error())
	} else {
		parts = append(parts, "kvnet-node: "+ev)
	}
	if b, err := s.logBlackout(ctx, v, ms, node, since); err != nil {
		parts = append(parts, "blackout not read: "+err.Error())
	} else {
		parts = append(parts, b.String())
	}
	return strings.Join(parts, "; ")
}

// switchoverEvent returns kvnet-node's switch-over event on v's VMI, for
// a switch-over to node since then, as "<reason>: <note>".
func (s *vmScenarios) switchoverEvent(ctx context.Context, v *runningVM, node string, since time.Time) (string, error) {
	evs, err := s.t.Client.EventsV1().Events(v.ns).List(ctx, metav1.ListOptions{FieldSelector: "regarding.name=" + v.name})
	if err != nil {
		return "", err
	}
	var seen []string
	for _, e := range evs.Items {
		if e.Regarding.Kind != "VirtualMachineInstance" || (e.Reason != migration.EventSwitchover && e.Reason != migration.EventSwitchedByAPI) {
			continue
		}
		seen = append(seen, e.Reason+": "+e.Note)
		if e.EventTime.Time.After(since.Add(-time.Second)) && strings.Contains(e.Note, " to node "+node+" ") {
			return e.Reason + ": " + e.Note, nil
		}
	}
	return "", fmt.Errorf("no switch-over event of kvnet-node on VMI %s for node %s (its switch-over events: %q)", v, node, seen)
}

// switchoverCount returns the migration metrics of the kvnet-node on node,
// read from its metrics through the API server's pod proxy.
func (s *vmScenarios) switchoverCount(ctx context.Context, node string) (switchoverMetrics, error) {
	l, err := s.t.Client.CoreV1().Pods("kvnet-system").List(ctx, metav1.ListOptions{
		LabelSelector: "app.kubernetes.io/name=kvnet-node", FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		return switchoverMetrics{}, err
	}
	if len(l.Items) != 1 {
		return switchoverMetrics{}, fmt.Errorf("%d kvnet-node pods on %s", len(l.Items), node)
	}
	b, err := s.t.Client.CoreV1().Pods("kvnet-system").ProxyGet("http", l.Items[0].Name, "9464", "/metrics", nil).DoRaw(ctx)
	if err != nil {
		return switchoverMetrics{}, fmt.Errorf("kvnet-node on %s: /metrics: %w", node, err)
	}
	return switchoverMetrics{
		total:  sumMetric(string(b), "kvnet_migration_switchovers_total"),
		waits:  sumMetric(string(b), "kvnet_migration_target_wait_seconds_count"),
		frames: sumMetric(string(b), "kvnet_migration_switchover_seconds_count"),
		darks:  sumMetric(string(b), "kvnet_migration_dark_seconds_count"),
	}, nil
}

// sumMetric sums the samples of metric name in a Prometheus text
// exposition.
func sumMetric(text, name string) float64 {
	var sum float64
	for _, line := range strings.Split(text, "\n") {
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		f := strings.Fields(line)
		if v, err := strconv.ParseFloat(f[len(f)-1], 64); err == nil {
			sum += v
		}
	}
	return sum
}

// logBlackout reads the blackout of v's migration, whose state is ms,
// to node from the logs (migrationBlackout).
func (s *vmScenarios) logBlackout(ctx context.Context, v *runningVM, ms map[string]any, node string, since time.Time) (blackout, error) {
	sourcePod, _ := ms["sourcePod"].(string)
	targetPod, _ := ms["targetPod"].(string)
	if sourcePod == "" || targetPod == "" {
		return blackout{}, fmt.Errorf("VMI %s: migration state names no source or target pod: %v", v, ms)
	}
	mac, err := s.podMAC(ctx, v.ns, targetPod, primaryInterface)
	if err != nil {
		return blackout{}, err
	}
	return s.migrationBlackout(ctx, v.ns, sourcePod, targetPod, node, mac, since)
}

// blackoutString is the step's blackout, or why the logs did not tell.
func (st migrationStep) blackoutString() string {
	if st.blackoutErr != nil {
		return fmt.Sprintf("longest ping gap %s; the logs not read: %v", millis(st.blackout.pingGap), st.blackoutErr)
	}
	return st.blackout.String()
}

// pingReplies returns the seqs of the replies the echo pod's ping got so
// far.
func (s *vmScenarios) pingReplies(ctx context.Context, ns, name string) ([]int, error) {
	ctx, cancel := context.WithTimeout(ctx, execTimeout)
	defer cancel()
	out, errOut, err := PodExec(ctx, s.t.Config, s.t.Client, ns, name, "cat", "/tmp/ping.out")
	if err != nil {
		return nil, fmt.Errorf("read %s/%s's /tmp/ping.out: %v: %s", ns, name, err, strings.TrimSpace(errOut))
	}
	seqs := pingSeqs(out)
	if len(seqs) == 0 {
		return nil, fmt.Errorf("%s/%s's ping got no reply: %s", ns, name, lastLines(out, 3))
	}
	return seqs, nil
}

// podMAC returns the MAC of pod ns/name's iface from its network-status.
func (s *vmScenarios) podMAC(ctx context.Context, ns, name, iface string) (string, error) {
	pod, err := s.t.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return "", err
	}
	p := &scenarioPod{ns: ns, name: name, pod: pod}
	st, err := p.networkStatus()
	if err != nil {
		return "", err
	}
	for _, e := range st {
		if e.Interface == iface && e.MAC != "" {
			return e.MAC, nil
		}
	}
	return "", fmt.Errorf("pod %s: no MAC of %s in its network-status", p, iface)
}

// migration: two live migrations between the VM's node and the other
// node that is not the client's, with the echo connection open.
func (s *vmScenarios) migration(ctx context.Context) (string, error) {
	v, err := s.vm(nsVM + "/vm-m")
	if err != nil {
		return "", err
	}
	var other string
	for _, n := range s.nodes[1:3] {
		if n != v.node {
			other = n
		}
	}
	if v.node == s.nodes[0] || other == "" {
		return "", fmt.Errorf("VM %s on %s: want it on %s or %s, away from the client's %s", v, v.node, s.nodes[1], s.nodes[2], s.nodes[0])
	}
	n, seq, err := s.startEcho(ctx, nsVM, s.nodes[0], v.ip)
	if err != nil {
		return "", err
	}
	var steps []string
	from := v.node
	for i, to := range []string{other, v.node} {
		name := fmt.Sprintf("mig-%d", i+1)
		overNet := i == 1
		if overNet {
			// The second migration goes over the dedicated migration
			// network.
			if err := s.useMigrationNetwork(ctx); err != nil {
				return strings.Join(steps, "; "), err
			}
			restarted, err := s.afterHandlerRollout(ctx, v)
			if err != nil {
				return strings.Join(steps, "; "), err
			}
			if restarted != "" {
				steps = append(steps, restarted)
				if to = s.nodes[1]; v.node == to {
					to = s.nodes[2]
				}
				if n, seq, err = s.startEcho(ctx, nsVM, s.nodes[0], v.ip); err != nil {
					return strings.Join(steps, "; "), err
				}
				from = v.node
			}
		}
		st, err := s.migrateWithEcho(ctx, v, name, to, n, seq)
		if err != nil {
			return strings.Join(steps, "; "), fmt.Errorf("migration %s (%s -> %s): %w", name, from, to, err)
		}
		n, seq = st.lines, st.pingSeq
		target, err := netip.ParseAddr(st.target)
		if overNet && (err != nil || !MigrationSubnet.Contains(target)) {
			return strings.Join(steps, "; "), fmt.Errorf("migration %s: targetNodeAddress %q, want one in the migration network %s", name, st.target, MigrationSubnet)
		}
		over := "the pod network"
		if err == nil && MigrationSubnet.Contains(target) {
			over = "migration network " + MigrationNetworkNAD
		}
		steps = append(steps, fmt.Sprintf("%s %s -> %s over %s (targetNodeAddress %s, %s): %d lines back in order, longest pause %s; %s; kvnet-node's switch-overs %v -> %v, event %s; kvnet why vm: %s",
			name, from, to, over, st.target, st.took, n, st.gap, st.blackoutString(), st.switchedBefore, st.switchedAfter, st.switchEvent, st.why))
		from = to
		v.node = to
	}
	// Its name follows it: CoreDNS now answers the new launcher pod's
	// default-network address.
	ps, err := s.need(ctx, nsVM+"/vc")
	if err != nil {
		return strings.Join(steps, "; "), err
	}
	host, err := s.byHostname(ctx, v, ps[0])
	if err != nil {
		return strings.Join(steps, "; "), fmt.Errorf("after the migrations: %w", err)
	}
	return fmt.Sprintf("echo from %s on %s to %s:7; %s; after the migrations %s", "echo", s.nodes[0], v.ip, strings.Join(steps, "; "), host), nil
}

// afterHandlerRollout checks v's VMI after virt-operator rolled
// virt-handler out (useMigrationNetwork). Seen on a loaded node: the new
// virt-handler's first sync found the VMI that had just migrated in
// without its domain ("VMI is in phase: Running | Domain does not
// exist"), failed it, and the VM started a new VMI. That is KubeVirt's
// doing, not kvnet's; it is noted in a FINDING line, and the scenario
// goes on with the new VMI: it must run with the address it had (its
// IPAMClaim's), and the echo client starts again. It returns "" when
// the VMI is the one that was there, else what happened.
func (s *vmScenarios) afterHandlerRollout(ctx context.Context, v *runningVM) (string, error) {
	vmi, err := s.dyn.Resource(vmiGVR).Namespace(v.ns).Get(ctx, v.name, metav1.GetOptions{})
	switch {
	case err == nil && string(vmi.GetUID()) == v.uid:
		if phase, _, _ := unstructured.NestedString(vmi.Object, "status", "phase"); phase == "Running" {
			return "", nil
		}
	case err != nil && !apierrors.IsNotFound(err):
		return "", err
	}
	oldUID, oldIP, oldNode := v.uid, v.ip, v.node
	s.logf("FINDING virt-handler-rollout-vmi-failed: VMI %s (uid %s, on %s) did not survive virt-handler's rollout for the migration network; waiting for the VM to run again", v, oldUID, oldNode)
	if err := s.waitVM(ctx, v); err != nil {
		return "", err
	}
	if v.uid == oldUID {
		return "", fmt.Errorf("VMI %s: not Running after virt-handler's rollout, then Running again as the same VMI %s", v, v.uid)
	}
	if v.ip != oldIP {
		return "", fmt.Errorf("VM %s started again after virt-handler's rollout with %s, want its IPAMClaim's %s", v, v.ip, oldIP)
	}
	if err := s.t.Client.CoreV1().Pods(nsVM).Delete(ctx, "echo", metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil && !apierrors.IsNotFound(err) {
		return "", fmt.Errorf("delete the echo pod: %w", err)
	}
	if err := poll(ctx, 2*time.Minute, func(ctx context.Context) error {
		_, err := s.t.Client.CoreV1().Pods(nsVM).Get(ctx, "echo", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("echo pod still there: %v", err)
	}); err != nil {
		return "", err
	}
	return fmt.Sprintf("KubeVirt failed VMI %s on %s when virt-handler restarted with the migration network (FINDING above); the VM ran again on %s with %s, its address before", oldUID, oldNode, v.node, v.ip), nil
}

func parseTime(v any) time.Time {
	s, _ := v.(string)
	t, _ := time.Parse(time.RFC3339, s)
	return t
}

// l2bridge: a VM with the l2bridge binding on the primary UDN gets its
// claim's address from kvnet-node's DHCP.
func (s *vmScenarios) l2bridge(ctx context.Context) (string, error) {
	v := vmSpec{ns: nsVM, name: "vm-l2", binding: "l2bridge", avoid: s.nodes[0], image: s.t.GuestImage}
	if err := s.createVM(ctx, v); err != nil {
		return "", err
	}
	rv := s.vms[nsVM+"/vm-l2"]
	// KubeVirt reports a failed network setup as a SyncFailed event and
	// restarts the VMI: look for it while waiting.
	var blocked string
	err := poll(ctx, vmiTimeout, func(ctx context.Context) error {
		for _, w := range s.warnings(ctx, nsVM, "vm-l2") {
			if strings.Contains(w, "LinkAdd: operation not supported") {
				blocked = w
				return nil
			}
		}
		vmi, err := s.dyn.Resource(vmiGVR).Namespace(nsVM).Get(ctx, "vm-l2", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if !vmiReady(vmi) {
			return errors.New("VMI vm-l2 not Ready")
		}
		return nil
	})
	if blocked != "" {
		return "", &blockedError{fmt.Sprintf("KubeVirt could not set up the launcher pod's network: %q: its managedTap (l2bridge) and bridge bindings add a dummy link, which this node's kernel does not have (CONFIG_DUMMY)", blocked)}
	}
	if err != nil {
		return "", fmt.Errorf("VM %s: %w%s", rv, err, s.vmiWarnings(ctx, nsVM, "vm-l2"))
	}
	if rv.err = s.waitVM(ctx, rv); rv.err != nil {
		return "", rv.err
	}
	claim, err := s.claimIP(ctx, nsVM, "vm-l2.default")
	if err != nil {
		return "", err
	}
	console, err := s.console(ctx, rv.ns, rv.uid, rv.node)
	if err != nil {
		return "", err
	}
	leases := parseGuestLeases(console)
	if len(leases) == 0 || leases[0].IP.Addr() != claim {
		return "", fmt.Errorf("guest of %s leased %v, want the IPAMClaim's %s", rv, leases, claim)
	}
	ps, err := s.need(ctx, nsVM+"/vc")
	if err != nil {
		return "", err
	}
	body, err := s.reach(ctx, ps[0], "http://"+claim.String()+"/", "vm-l2")
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("guest of %s on %s leased %s from kvnet-node = IPAMClaim vm-l2.default; %s fetched %q", rv, rv.node, leases[0].IP, ps[0], body), nil
}

// The dedicated migration network the VM scenarios switch KubeVirt to
// (spec.configuration.migrations.network): a macvlan NAD on the nodes'
// uplink whose addresses come from kvnet-ipam.
const MigrationNetworkNAD = "kvnet-migration"

// MigrationSubnet is the migration network's subnet.
var MigrationSubnet = netip.MustParsePrefix("10.200.5.0/24")

// migrationNAD is the migration network's NAD on uplink master.
func migrationNAD(master string) *unstructured.Unstructured {
	config := fmt.Sprintf(`{"cniVersion": "1.0.0", "type": "macvlan", "name": %q, "master": %q, "mode": "bridge", "ipam": {"type": "kvnet-ipam", "subnets": %q}}`,
		MigrationNetworkNAD, master, MigrationSubnet.String())
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
		"metadata": map[string]any{"name": MigrationNetworkNAD, "namespace": KubeVirtNamespace},
		"spec":     map[string]any{"config": config},
	}}
}

// useMigrationNetwork makes KubeVirt migrate over the migration network,
// as an admin does: the NAD in KubeVirt's namespace, the KubeVirt CR
// naming it; then it waits until virt-operator rolled virt-handler out
// with the network and every handler holds an address there
// (migration0).
func (s *vmScenarios) useMigrationNetwork(ctx context.Context) (err error) {
	master := s.t.MigrationMaster
	if master == "" {
		master = "eth0"
	}
	s.logf("KubeVirt: migrations over NAD %s/%s (macvlan on %s, kvnet-ipam %s)", KubeVirtNamespace, MigrationNetworkNAD, master, MigrationSubnet)
	_, err = s.dyn.Resource(nadGVR).Namespace(KubeVirtNamespace).Create(ctx, migrationNAD(master), metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create NAD %s/%s: %w", KubeVirtNamespace, MigrationNetworkNAD, err)
	}
	patch := fmt.Sprintf(`{"spec":{"configuration":{"migrations":{"network":%q}}}}`, MigrationNetworkNAD)
	if _, err := s.dyn.Resource(kubeVirtGVR).Namespace(KubeVirtNamespace).Patch(ctx, "kubevirt", types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("KubeVirt %s/kubevirt: set migrations.network: %w", KubeVirtNamespace, err)
	}
	start := time.Now()
	defer func() {
		if err == nil {
			s.logf("KubeVirt: virt-handler rolled out with the migration network in %s", time.Since(start).Round(100*time.Millisecond))
		}
	}()
	return poll(ctx, 10*time.Minute, func(ctx context.Context) error {
		pods, err := s.t.Client.CoreV1().Pods(KubeVirtNamespace).List(ctx, metav1.ListOptions{LabelSelector: "kubevirt.io=virt-handler"})
		if err != nil {
			return err
		}
		ready := 0
		for i := range pods.Items {
			p := &scenarioPod{ns: KubeVirtNamespace, name: pods.Items[i].Name, pod: &pods.Items[i]}
			if !PodReady(p.pod) || p.pod.DeletionTimestamp != nil {
				continue
			}
			if _, err := p.addr("migration0", MigrationSubnet); err != nil {
				return fmt.Errorf("virt-handler not rolled out with the migration network yet: %w", err)
			}
			ready++
		}
		if ready < len(s.nodes) {
			return fmt.Errorf("%d of %d virt-handlers Ready with migration0", ready, len(s.nodes))
		}
		return nil
	})
}

// primaryUDNObject is UDN ns/net: a primary Layer2 network on subnet
// with persistent IPs (IPAMClaims), as the OpenShift docs write it for
// VMs.
func primaryUDNObject(ns, subnet string) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "k8s.ovn.org/v1", "kind": "UserDefinedNetwork",
		"metadata": map[string]any{"name": "net", "namespace": ns},
		"spec": map[string]any{"topology": "Layer2", "layer2": map[string]any{
			"role": "Primary", "subnets": []any{subnet}, "ipam": map[string]any{"lifecycle": "Persistent"},
		}},
	}}
}
