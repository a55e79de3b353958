package simvirt

import (
	"cmp"
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kubevirtv1 "kvnet.io/kvnet/api/kubevirt/v1"
	"kvnet.io/kvnet/internal/kubevirt/launcher"
	"kvnet.io/kvnet/internal/podnetworks"
)

// primaryPodIfName is the pod interface of a primary user-defined network
// (OVN-Kubernetes' name, which simkubelet uses).
const primaryPodIfName = "ovn-udn1"

// maxLabelValue bounds label values.
const maxLabelValue = 63

// runStrategy returns the VM's run strategy: spec.runStrategy, else the
// deprecated spec.running (true: Always, false: Halted), else Halted.
func runStrategy(vm *kubevirtv1.VirtualMachine) string {
	switch {
	case vm.Spec.RunStrategy != nil:
		return *vm.Spec.RunStrategy
	case vm.Spec.Running != nil && *vm.Spec.Running:
		return RunStrategyAlways
	default:
		return RunStrategyHalted
	}
}

// wantsRunning reports whether a VM with run strategy rs is meant to run
// (Manual and unknown strategies are not).
func wantsRunning(rs string) bool {
	switch rs {
	case RunStrategyAlways, RunStrategyRerunOnFailure, RunStrategyOnce:
		return true
	}
	return false
}

func finalPhase(phase string) bool { return phase == PhaseFailed || phase == PhaseSucceeded }

// restarts reports whether a VM with run strategy rs starts its VMI anew
// when the VMI is in phase.
func restarts(rs, phase string) bool {
	return rs == RunStrategyAlways && finalPhase(phase) || rs == RunStrategyRerunOnFailure && phase == PhaseFailed
}

// controlledBy reports whether o's controller is the object with uid.
func controlledBy(o metav1.Object, uid string) bool {
	ref := metav1.GetControllerOf(o)
	return ref != nil && string(ref.UID) == uid
}

// vmOf returns the name of the VM controlling vmi, "" for a standalone VMI.
func vmOf(vmi *kubevirtv1.VirtualMachineInstance) string {
	if ref := metav1.GetControllerOf(vmi); ref != nil && ref.Kind == "VirtualMachine" {
		return ref.Name
	}
	return ""
}

// newVMI builds the VMI of vm, as virt-controller does (and as virt-api
// defaults it: see defaultNetworks). vm.Spec.Template must be set.
func newVMI(vm *kubevirtv1.VirtualMachine, defaultInterface string) *kubevirtv1.VirtualMachineInstance {
	t := vm.Spec.Template
	lbls := maps.Clone(t.ObjectMeta.Labels)
	if lbls == nil {
		lbls = map[string]string{}
	}
	yes := true
	vmi := &kubevirtv1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{
			Namespace:   vm.Namespace,
			Name:        vm.Name,
			Labels:      lbls,
			Annotations: maps.Clone(t.ObjectMeta.Annotations),
			Finalizers:  []string{VMIFinalizer},
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: kubevirtv1.GroupVersion.String(), Kind: "VirtualMachine", Name: vm.Name, UID: vm.UID,
				Controller: &yes, BlockOwnerDeletion: &yes,
			}},
		},
		Spec: *t.Spec.DeepCopy(),
	}
	defaultNetworks(&vmi.Spec, defaultInterface)
	return vmi
}

// defaultNetworks adds the default pod network and its interface to a spec
// without interfaces and networks, unless autoattachPodInterface is false,
// as virt-api does. defaultInterface is the KubeVirt CR's
// defaultNetworkInterface ("" means bridge).
func defaultNetworks(spec *kubevirtv1.VirtualMachineInstanceSpec, defaultInterface string) {
	d := &spec.Domain.Devices
	if len(d.Interfaces) > 0 || len(spec.Networks) > 0 || (d.AutoattachPodInterface != nil && !*d.AutoattachPodInterface) {
		return
	}
	iface := kubevirtv1.Interface{Name: "default"}
	switch defaultInterface {
	case "masquerade":
		iface.Masquerade = &kubevirtv1.InterfaceMasquerade{}
	default:
		iface.Bridge = &kubevirtv1.InterfaceBridge{}
	}
	d.Interfaces = []kubevirtv1.Interface{iface}
	spec.Networks = []kubevirtv1.Network{{Name: "default", Pod: &kubevirtv1.PodNetwork{}}}
}

// launcherPod builds a launcher pod of vmi on node with the network
// annotations ann; vmim is the migration the pod is the target of (nil
// for a VMI's first pod).
func launcherPod(vmi *kubevirtv1.VirtualMachineInstance, node string, ann map[string]string, vmim *kubevirtv1.VirtualMachineInstanceMigration) *corev1.Pod {
	lbls := maps.Clone(vmi.Labels)
	if lbls == nil {
		lbls = map[string]string{}
	}
	lbls[kubevirtv1.AppLabel] = kubevirtv1.VirtLauncherValue
	lbls[CreatedByLabel] = string(vmi.UID)
	lbls[kubevirtv1.VMNameLabel] = guestHostname(vmi)
	lbls[kubevirtv1.VMIIDLabel] = vmiID(vmi.Name)
	annotations := maps.Clone(ann)
	if annotations == nil {
		annotations = map[string]string{}
	}
	annotations[kubevirtv1.DomainAnnotation] = vmi.Name
	annotations["kubectl.kubernetes.io/default-container"] = ComputeContainer
	if vmim != nil {
		lbls[MigrationJobUIDLabel] = string(vmim.UID)
		annotations[MigrationJobNameAnnotation] = vmim.Name
	}
	yes := true
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace:    vmi.Namespace,
			GenerateName: "virt-launcher-" + vmi.Name + "-",
			Labels:       lbls,
			Annotations:  annotations,
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: kubevirtv1.GroupVersion.String(), Kind: "VirtualMachineInstance", Name: vmi.Name, UID: vmi.UID,
				Controller: &yes, BlockOwnerDeletion: &yes,
			}},
		},
		Spec: corev1.PodSpec{
			NodeName:      node,
			RestartPolicy: corev1.RestartPolicyNever,
			Containers:    []corev1.Container{{Name: ComputeContainer, Image: LauncherImage}},
		},
	}
}

// guestHostname is what KubeVirt writes into a launcher pod's
// vm.kubevirt.io/name, whatever the label's name says: the VMI's
// spec.hostname, else its name up to the first "." cut at 63 characters.
func guestHostname(vmi *kubevirtv1.VirtualMachineInstance) string {
	if vmi.Spec.Hostname != "" {
		return vmi.Spec.Hostname
	}
	name, _, _ := strings.Cut(vmi.Name, ".")
	return truncate(name, maxLabelValue)
}

// vmiID is a launcher pod's vmi.kubevirt.io/id: the VMI's name, or past 63
// characters its first 54 and "-" and 8 hex digits of its SHA-1, as
// KubeVirt keeps the label unique and valid.
func vmiID(name string) string {
	if len(name) <= maxLabelValue {
		return name
	}
	const hashLen = 8
	sum := sha1.Sum([]byte(name))
	return name[:maxLabelValue-hashLen-1] + "-" + hex.EncodeToString(sum[:])[:hashLen]
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}

// podRunning reports whether the pod runs (kubelet reported it Running and
// nobody is deleting it).
func podRunning(p *corev1.Pod) bool {
	return p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning
}

// podGone describes why a pod can no longer run a VM ("" when it can).
func podGone(p *corev1.Pod) string {
	switch {
	case p.DeletionTimestamp != nil:
		return fmt.Sprintf("launcher pod %s on node %s is being deleted", p.Name, p.Spec.NodeName)
	case p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded:
		msg := fmt.Sprintf("launcher pod %s on node %s is %s", p.Name, p.Spec.NodeName, p.Status.Phase)
		if p.Status.Message != "" {
			msg += ": " + p.Status.Message
		}
		return msg
	}
	return ""
}

// pickNode returns the node of nodes with the fewest pods (load), ties
// going to the earlier in nodes, other than exclude; "" when none is left.
func pickNode(nodes []string, load map[string]int, exclude string) string {
	best := ""
	for _, n := range nodes {
		if n == exclude {
			continue
		}
		if best == "" || load[n] < load[best] {
			best = n
		}
	}
	return best
}

// nadKey resolves a Multus networkName ("<nad>" or "<ns>/<nad>") to a NAD
// key in namespace ns.
func nadKey(ns, ref string) string {
	if _, _, ok := strings.Cut(ref, "/"); ok {
		return ref
	}
	return ns + "/" + ref
}

// interfaces returns the VMI's status.interfaces as the pod's
// kvnet.io/pod-networks annotation (or, for the pod network without a
// primary attachment, its status.podIPs) has them.
func interfaces(vmi *kubevirtv1.VirtualMachineInstance, pod *corev1.Pod) []kubevirtv1.VirtualMachineInstanceNetworkInterface {
	nets, err := podnetworks.Parse(pod.Annotations[podnetworks.Annotation])
	if err != nil {
		nets = nil // not allocated (yet), or not kvnet's: no addresses
	}
	ifaces := map[string]kubevirtv1.Interface{}
	for _, i := range vmi.Spec.Domain.Devices.Interfaces {
		if _, seen := ifaces[i.Name]; !seen {
			ifaces[i.Name] = i
		}
	}
	var out []kubevirtv1.VirtualMachineInstanceNetworkInterface
	for _, n := range vmi.Spec.Networks {
		iface, ok := ifaces[n.Name]
		if !ok || iface.State == kubevirtv1.InterfaceStateAbsent {
			continue
		}
		e := kubevirtv1.VirtualMachineInstanceNetworkInterface{Name: n.Name, InfoSource: "domain"}
		var a *podnetworks.Attachment
		switch {
		case n.Pod != nil:
			e.PodInterfaceName = primaryPodIfName
			a = primaryAttachment(nets)
			if a == nil {
				e.PodInterfaceName = launcher.PrimaryPodInterfaceName
				for _, ip := range pod.Status.PodIPs {
					e.IPs = append(e.IPs, ip.IP)
				}
			}
		case n.Multus != nil:
			if n.Multus.Default {
				e.PodInterfaceName = launcher.PrimaryPodInterfaceName
			} else {
				e.PodInterfaceName = launcher.PodInterfaceName(n.Name)
			}
			if v, ok := nets[nadKey(vmi.Namespace, n.Multus.NetworkName)]; ok {
				a = &v
			}
		}
		if a != nil {
			e.MAC = a.MACAddress
			for _, ip := range a.Addrs() {
				e.IPs = append(e.IPs, ip.String())
			}
		}
		if e.MAC == "" {
			e.MAC = iface.MacAddress
		}
		if len(e.IPs) > 0 {
			e.IP = e.IPs[0]
		}
		if a != nil || len(e.IPs) > 0 {
			e.InfoSource = InfoSource
		}
		out = append(out, e)
	}
	return out
}

// primaryAttachment returns the primary attachment of nets (the first by
// NAD key should there be several), nil when there is none.
func primaryAttachment(nets podnetworks.Networks) *podnetworks.Attachment {
	for _, k := range slices.Sorted(maps.Keys(nets)) {
		if a := nets[k]; a.Role == podnetworks.RolePrimary {
			return &a
		}
	}
	return nil
}

// vmStatus is the VM's status given its run strategy and VMI (nil: none).
func vmStatus(rs string, vmi *kubevirtv1.VirtualMachineInstance) kubevirtv1.VirtualMachineStatus {
	var s kubevirtv1.VirtualMachineStatus
	switch {
	case vmi == nil && wantsRunning(rs):
		s.PrintableStatus = "Starting"
	case vmi == nil:
		s.PrintableStatus = "Stopped"
	case vmi.DeletionTimestamp != nil:
		s.PrintableStatus = "Stopping"
	case restarts(rs, vmi.Status.Phase) && failedForBindings(vmi):
		// Kept failed rather than started anew (see holdFailedVMI):
		// KubeVirt's word for a VM whose start keeps failing.
		s.PrintableStatus = "CrashLoopBackOff"
	case finalPhase(vmi.Status.Phase):
		s.PrintableStatus = "Stopped"
	case vmi.Status.Phase == PhaseRunning:
		s.PrintableStatus = "Running"
		if ms := vmi.Status.MigrationState; ms != nil && !ms.Completed && !ms.Failed {
			s.PrintableStatus = "Migrating"
		}
		s.Ready = true
	default:
		s.PrintableStatus = "Starting"
	}
	s.Created = vmi != nil
	return s
}

// byAge sorts objects oldest first (then by name).
func byAge[T metav1.Object](a, b T) int {
	return cmp.Or(a.GetCreationTimestamp().Compare(b.GetCreationTimestamp().Time), cmp.Compare(a.GetName(), b.GetName()))
}
