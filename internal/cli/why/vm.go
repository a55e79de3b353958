package why

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	kubevirtv1 "kvnet.io/kvnet/api/kubevirt/v1"
	"kvnet.io/kvnet/internal/ipam"
	"kvnet.io/kvnet/internal/migration"
	"kvnet.io/kvnet/internal/netconf"
	"kvnet.io/kvnet/internal/vmclaims"
)

// domainAttachmentManagedTap is the binding-plugin type whose tap
// virt-launcher makes itself: l2bridge, the binding of primary UDNs.
const domainAttachmentManagedTap = "managedTap"

// Phases of VirtualMachineInstanceMigrations.
const migrationFailed = "Failed"

// vmFacts are the objects the chain of a VM or VMI reads.
type vmFacts struct {
	netFacts
	VM  *kubevirtv1.VirtualMachine         // nil: a standalone VMI
	VMI *kubevirtv1.VirtualMachineInstance // nil: the VM is not running
	// KubeVirts are the KubeVirt CRs (normally one).
	KubeVirts []kubevirtv1.KubeVirt
	Webhook   webhookFacts
	// Launcher is the chosen launcher pod's chain (nil: none), see
	// chooseLauncher.
	Launcher *podFacts
	// Migrations of the VMI.
	Migrations []kubevirtv1.VirtualMachineInstanceMigration
	// Switchovers are kvnet-node's events on the VMI saying where and how
	// its networks switched in live migrations.
	Switchovers []corev1.Event
}

// lastSwitchovers returns, per network, the note of the VMI's newest
// switch-over event of the VMI with UID uid (any UID if ""), newest
// network first, and whether any of them was switched by the API.
func lastSwitchovers(events []corev1.Event, uid types.UID) (notes []string, byAPI bool) {
	var newest []*corev1.Event
	for i := range events {
		e := &events[i]
		if uid != "" && e.InvolvedObject.UID != "" && e.InvolvedObject.UID != uid {
			continue
		}
		newest = append(newest, e)
	}
	if len(newest) == 0 {
		return nil, false
	}
	slices.SortFunc(newest, func(a, b *corev1.Event) int { return eventTime(b).Compare(eventTime(a)) })
	// The newest migration's events: those within a minute of the newest.
	last := eventTime(newest[0])
	seen := map[string]bool{}
	for _, e := range newest {
		network, _, _ := strings.Cut(strings.TrimPrefix(e.Message, "network "), " ")
		if last.Sub(eventTime(e)) > time.Minute || seen[network] {
			continue
		}
		seen[network] = true
		notes = append(notes, e.Message)
		byAPI = byAPI || e.Reason == migration.EventSwitchedByAPI
	}
	return notes, byAPI
}

// vmSpec is what the VM runs: the VMI's spec, or the VM's template.
func (f *vmFacts) vmSpec() *kubevirtv1.VirtualMachineInstanceSpec {
	if f.VMI != nil {
		return &f.VMI.Spec
	}
	if f.VM != nil && f.VM.Spec.Template != nil {
		return &f.VM.Spec.Template.Spec
	}
	return nil
}

// bindingPlugins merges the binding plugins of the KubeVirt CRs.
func (f *vmFacts) bindingPlugins() map[string]kubevirtv1.InterfaceBindingPlugin {
	out := map[string]kubevirtv1.InterfaceBindingPlugin{}
	for _, kv := range f.KubeVirts {
		if nc := kv.Spec.Configuration.NetworkConfiguration; nc != nil {
			for name, p := range nc.Binding {
				out[name] = p
			}
		}
	}
	return out
}

// nadKeyOf returns the NAD key of a VM network's networkName.
func nadKeyOf(namespace, ref string) string {
	if ns, name, ok := strings.Cut(ref, "/"); ok {
		return ns + "/" + name
	}
	return namespace + "/" + ref
}

// diagnoseVM walks a VM's chain: namespace, networks and NADs, bindings,
// webhooks, then (when it runs) its launcher pod's claims, addresses and
// node, and its last migration.
func diagnoseVM(r *Report, f *vmFacts) {
	spec := f.vmSpec()
	if spec == nil {
		r.Summary = "the VM has no template and no VMI: nothing to check"
		return
	}
	plugins := f.bindingPlugins()
	var evidence []string
	networks := map[string]kubevirtv1.Network{}
	for _, n := range spec.Networks {
		networks[n.Name] = n
	}
	for _, iface := range spec.Domain.Devices.Interfaces {
		if n, ok := networks[iface.Name]; ok && n.Pod != nil && iface.Binding != nil && plugins[iface.Binding.Name].DomainAttachmentType == domainAttachmentManagedTap {
			evidence = append(evidence, fmt.Sprintf("interface %q of the VM uses binding %s, which serves a primary user-defined network", iface.Name, iface.Binding.Name))
		}
	}
	labelled, primaryKey, stop := checkNamespace(r, &f.netFacts, evidence)
	if stop {
		return
	}
	served := map[string]*netconf.Served{}
	selectedBy := map[string]string{} // NAD key -> the VM network selecting it
	for i, n := range spec.Networks {
		if n.Multus == nil {
			continue
		}
		where := fmt.Sprintf("spec.networks[%d] (VM network %q)", i, n.Name)
		key := nadKeyOf(f.Namespace.Name, n.Multus.NetworkName)
		s, stop := checkNAD(r, &f.netFacts, key, where)
		if stop {
			return
		}
		served[n.Name] = s
		if first, dup := selectedBy[key]; dup && s != nil {
			r.fail("network", fmt.Sprintf("VM networks %q and %q both select NAD %s", first, n.Name, key), NADSelectedTwice,
				fmt.Sprintf("give VM network %q a network of its own (another UserDefinedNetwork or NetworkAttachmentDefinition), then restart the VM or let the hot plug's migration retry", n.Name),
				"VM networks %q and %q both select NAD %s (%s): kvnet gives a pod one address per NAD, so it refuses a launcher pod that selects one twice, and the VM cannot start or finish the migration that hot-plugs the second", first, n.Name, key, where)
			return
		}
		selectedBy[key] = n.Name
	}
	if checkClaimNames(r, f, spec, primaryKey) {
		return
	}
	if checkBindings(r, f, spec, networks, served, plugins) {
		return
	}
	if checkWebhook(r, &f.Webhook, []string{webhookVMs, webhookLauncher}) {
		return
	}
	if f.VMI == nil {
		r.Summary = "not running (no VMI): its networks, bindings and webhooks are ready for it to start"
		return
	}
	r.ok("vmi", "%s/%s: phase %s%s", f.VMI.Namespace, f.VMI.Name, orDefault(f.VMI.Status.Phase, "unknown"), onNode(f.VMI.Status.NodeName))
	if f.Launcher == nil {
		failNoLauncher(r, f)
		return
	}
	f.Launcher.VMI = f.VMI
	diagnoseAllocation(r, f.Launcher, labelled, primaryKey)
	if r.Problem != nil {
		return
	}
	if atts, err := ipam.PodAttachments(f.Launcher.Pod, labelled, primaryKey, f.Launcher.lookup); err == nil && checkGuestAddresses(r, f, spec, atts) {
		return
	}
	summary := r.Summary
	if checkMigration(r, f) {
		return
	}
	r.Summary = fmt.Sprintf("%s (launcher pod %s, VMI %s)", summary, f.Launcher.Pod.Name, orDefault(f.VMI.Status.Phase, "phase unknown"))
}

func onNode(n string) string {
	if n == "" {
		return ""
	}
	return " on node " + n
}

func failNoLauncher(r *Report, f *vmFacts) {
	cond := ""
	if c, ok := vmiCondition(f.VMI, "Synchronized"); ok && c.Status == corev1.ConditionFalse {
		cond = fmt.Sprintf("; condition Synchronized=False (%s): %s", c.Reason, c.Message)
	}
	r.fail("launcher", "no virt-launcher pod", LauncherPodMissing,
		fmt.Sprintf("virt-controller creates the pod: see kubectl -n %s describe vmi %s and virt-controller's events (kvnet's webhook denies a launcher pod that already carries %s, or requests IPs outside its network)", f.VMI.Namespace, f.VMI.Name, "v1.multus-cni.io/default-network"),
		"VMI %s/%s (phase %s) has no virt-launcher pod%s", f.VMI.Namespace, f.VMI.Name, orDefault(f.VMI.Status.Phase, "unknown"), cond)
}

// vmiCond is a VMI condition; api/kubevirt/v1 keeps status.conditions in
// the status's unknown fields.
type vmiCond struct {
	Type    string                 `json:"type"`
	Status  corev1.ConditionStatus `json:"status"`
	Reason  string                 `json:"reason"`
	Message string                 `json:"message"`
}

func vmiCondition(vmi *kubevirtv1.VirtualMachineInstance, typ string) (vmiCond, bool) {
	var st struct {
		Conditions []vmiCond `json:"conditions"`
	}
	if vmi.Status.Unknown == "" || json.Unmarshal([]byte(vmi.Status.Unknown), &st) != nil {
		return vmiCond{}, false
	}
	for _, c := range st.Conditions {
		if c.Type == typ {
			return c, true
		}
	}
	return vmiCond{}, false
}

// bindingOf names an interface's binding method.
func bindingOf(iface kubevirtv1.Interface) string {
	switch {
	case iface.Binding != nil:
		return "binding " + iface.Binding.Name
	case iface.Bridge != nil:
		return "bridge"
	case iface.Masquerade != nil:
		return "masquerade"
	case iface.SRIOV != nil:
		return "sriov"
	case iface.PasstBinding != nil:
		return "passtBinding"
	case iface.DeprecatedSlirp != nil:
		return "slirp"
	case iface.DeprecatedMacvtap != nil:
		return "macvtap"
	case iface.DeprecatedPasst != nil:
		return "passt"
	}
	return "none"
}

// checkBindings checks that every interface's binding plugin is registered
// in the KubeVirt CR and that the binding can work on its network.
func checkBindings(r *Report, f *vmFacts, spec *kubevirtv1.VirtualMachineInstanceSpec, networks map[string]kubevirtv1.Network, served map[string]*netconf.Served, plugins map[string]kubevirtv1.InterfaceBindingPlugin) bool {
	var parts []string
	for _, iface := range spec.Domain.Devices.Interfaces {
		if iface.State == kubevirtv1.InterfaceStateAbsent {
			continue
		}
		n := networks[iface.Name]
		if iface.Binding != nil {
			name := iface.Binding.Name
			if _, ok := plugins[name]; !ok {
				registered := make([]string, 0, len(plugins))
				for p := range plugins {
					registered = append(registered, p)
				}
				sort.Strings(registered)
				where := "there is no KubeVirt CR"
				if len(f.KubeVirts) > 0 {
					kv := f.KubeVirts[0]
					where = fmt.Sprintf("KubeVirt %s/%s registers %s in spec.configuration.network.binding", kv.Namespace, kv.Name, orDefault(strings.Join(registered, ", "), "none"))
				}
				fix := fmt.Sprintf("register it in the KubeVirt CR under spec.configuration.network.binding.%s", name)
				if name == "l2bridge" {
					fix += " (l2bridge: {domainAttachmentType: managedTap})"
				}
				fix += ", or correct the interface's binding name"
				return r.fail("binding", fmt.Sprintf("interface %q: plugin %q not registered", iface.Name, name), BindingNotRegistered, fix,
					"interface %q uses binding plugin %q, which KubeVirt does not know (%s): virt-controller refuses to create the VM's launcher pod", iface.Name, name, where)
			}
		}
		switch {
		case iface.Masquerade != nil && n.Pod == nil:
			return r.fail("binding", fmt.Sprintf("interface %q: masquerade on network %q", iface.Name, iface.Name), BindingUnsupported,
				"use bridge binding for a Multus network (masquerade is for the pod network only)",
				"interface %q uses masquerade, which works on the pod network only, but its network %q is %s", iface.Name, iface.Name, describeVMNetwork(n))
		case iface.SRIOV != nil && served[iface.Name] != nil:
			return r.fail("binding", fmt.Sprintf("interface %q: sriov on a kvnet network", iface.Name), BindingUnsupported,
				"use bridge binding on kvnet networks (SR-IOV needs an SR-IOV NetworkAttachmentDefinition)",
				"interface %q uses sriov, but its network %q is a kvnet network (%s): a veth on a node bridge, not an SR-IOV VF", iface.Name, iface.Name, describeVMNetwork(n))
		}
		parts = append(parts, fmt.Sprintf("%s %s on %s", iface.Name, bindingOf(iface), describeVMNetwork(n)))
	}
	if len(parts) > 0 {
		r.ok("binding", "%s", strings.Join(parts, "; "))
	}
	return false
}

func describeVMNetwork(n kubevirtv1.Network) string {
	switch {
	case n.Pod != nil:
		return "the pod network"
	case n.Multus != nil:
		return "Multus network " + n.Multus.NetworkName
	}
	return "no network"
}

// chooseLauncher picks the live launcher pod of a VMI: on the VMI's node
// and not being deleted, else the newest.
func chooseLauncher(vmi *kubevirtv1.VirtualMachineInstance, pods []corev1.Pod) *corev1.Pod {
	var live []*corev1.Pod
	for i := range pods {
		if p := &pods[i]; p.DeletionTimestamp == nil && p.Annotations[kubevirtv1.DomainAnnotation] == vmi.Name {
			live = append(live, p)
		}
	}
	if len(live) == 0 {
		return nil
	}
	slices.SortFunc(live, func(a, b *corev1.Pod) int { return b.CreationTimestamp.Compare(a.CreationTimestamp.Time) })
	for _, p := range live {
		if vmi.Status.NodeName != "" && p.Spec.NodeName == vmi.Status.NodeName {
			return p
		}
	}
	return live[0]
}

// checkMigration fails a VMI whose last live migration failed. It reads
// the VMI's migration as kvnet-node does (migration.Of).
func checkMigration(r *Report, f *vmFacts) bool {
	vmi := f.VMI
	m := migration.Of(vmi)
	fix := fmt.Sprintf("see kubectl -n %s get vmim and describe the failed one, and the target pod's events; kvnet why pod <target pod> checks the target's network; then start a new VirtualMachineInstanceMigration", vmi.Namespace)
	if m != nil && m.State == migration.Failed {
		reason := orDefault(m.FailureReason, "no failure reason recorded")
		return r.fail("migration", "failed", MigrationFailed, fix,
			"the last live migration of VMI %s (from node %s to node %s, target pod %s) failed: %s. The VM keeps running on node %s",
			vmi.Name, orDefault(m.SourceNode, "?"), orDefault(m.TargetNode, "?"), orDefault(m.TargetPod, "?"), reason, orDefault(vmi.Status.NodeName, "?"))
	}
	var newest *kubevirtv1.VirtualMachineInstanceMigration
	for i := range f.Migrations {
		vmim := &f.Migrations[i]
		if vmim.Spec.VMIName != vmi.Name {
			continue
		}
		if newest == nil || vmim.CreationTimestamp.After(newest.CreationTimestamp.Time) {
			newest = vmim
		}
	}
	if newest != nil && newest.Status.Phase == migrationFailed {
		reason := ""
		if m != nil && m.UID == string(newest.UID) && m.FailureReason != "" {
			reason = ": " + m.FailureReason
		}
		return r.fail("migration", "VirtualMachineInstanceMigration "+newest.Name+": Failed", MigrationFailed, fix,
			"VirtualMachineInstanceMigration %s/%s of VMI %s is Failed%s. The VM keeps running on node %s", newest.Namespace, newest.Name, vmi.Name, reason, orDefault(vmi.Status.NodeName, "?"))
	}
	switchover := ""
	if notes, byAPI := lastSwitchovers(f.Switchovers, vmi.UID); len(notes) > 0 {
		switchover = "; " + strings.Join(notes, "; ")
		if byAPI {
			switchover += " (a switch-over by the API: the guest's first frame on the target never opened its port, so its traffic went to the old node until KubeVirt finished the migration; see kvnet-node's log on the target node)"
		}
	}
	switch {
	case m != nil && m.State == migration.Succeeded:
		r.ok("migration", "last one completed (node %s to %s)%s", orDefault(m.SourceNode, "?"), orDefault(m.TargetNode, "?"), switchover)
	case m != nil && m.TargetPod != "":
		r.ok("migration", "in progress to node %s (target pod %s)", orDefault(m.TargetNode, "?"), m.TargetPod)
	}
	return false
}

// checkClaimNames fails a VM whose networks compose IPAMClaim names that
// cannot be used (vmclaims.ErrClaimName): kvnet-controller creates no
// claims for it and the launcher-pod webhook denies its pods.
func checkClaimNames(r *Report, f *vmFacts, spec *kubevirtv1.VirtualMachineInstanceSpec, primaryKey string) bool {
	var name string
	switch {
	case f.VM != nil:
		name = f.VM.Name
	case f.VMI != nil:
		name = f.VMI.Name
	}
	vmi := &kubevirtv1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: f.Namespace.Name, Name: name}, Spec: *spec}
	_, err := vmclaims.Claims(vmi, name, primaryKey, f.lookup)
	if !errors.Is(err, vmclaims.ErrClaimName) {
		return false
	}
	return r.fail("network", "unusable IPAMClaim names", ClaimNameUnusable,
		"rename the VM network so that each network with persistent IPs composes its own valid claim name (<vm>.<network>, lowercased, characters outside DNS labels separating labels; see docs/kubevirt.md), then restart the VM",
		"%v: kvnet-controller creates no IPAMClaims for the VM (event InvalidIPAMClaimName) and kvnet's webhook denies its launcher pods",
		strings.TrimPrefix(err.Error(), vmclaims.ErrDeny.Error()+": "))
}
