package simvirt

import (
	"encoding/json"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kubevirtv1 "kvnet.io/kvnet/api/kubevirt/v1"
)

// domainAttachmentManagedTap is the domainAttachmentType, as KubeVirt
// spells it, of a binding plugin whose tap virt-launcher makes itself: the
// only kind of plugin the lab runs (a "tap" plugin, or one without a type,
// needs its sidecar or CNI plugin).
const domainAttachmentManagedTap = "managedTap"

// labRuns is what the lab runs, for the reasons of bindings it does not.
const labRuns = "it runs bridge, masquerade and managedTap binding plugins"

// The VMI condition simvirt writes on a VMI it fails because of its
// bindings, in status.conditions as KubeVirt's virt-controller writes one
// for a VMI it cannot synchronize (KubeVirt's reason is FailedCreate). The
// message is the failure reason.
const (
	ConditionSynchronized    = "Synchronized"
	ReasonUnsupportedBinding = "UnsupportedBinding"
)

// checkBindings says why the lab cannot run the VMI of spec: one sentence
// per interface that is not absent whose binding the lab cannot run,
// joined by "; ". plugins are the binding plugins of the KubeVirt CR
// (spec.configuration.network.binding). nil means every interface can run.
//
// The lab runs bridge, masquerade (on the pod network only) and binding
// plugins registered with domainAttachmentType managedTap; not sriov,
// passtBinding, the removed slirp, macvtap and passt, plugins with
// domainAttachmentType tap or none (sidecar plugins), plugins that are not
// registered, nor an interface without exactly one binding.
func checkBindings(spec *kubevirtv1.VirtualMachineInstanceSpec, plugins map[string]kubevirtv1.InterfaceBindingPlugin) error {
	networks := map[string]kubevirtv1.Network{}
	for _, n := range spec.Networks {
		if _, dup := networks[n.Name]; !dup {
			networks[n.Name] = n
		}
	}
	var why []string
	for _, iface := range spec.Domain.Devices.Interfaces {
		if iface.State == kubevirtv1.InterfaceStateAbsent {
			continue
		}
		if reason := checkBinding(iface, networks, plugins); reason != "" {
			why = append(why, fmt.Sprintf("interface %q: %s", iface.Name, reason))
		}
	}
	if len(why) == 0 {
		return nil
	}
	return unsupportedBindingError(strings.Join(why, "; "))
}

// unsupportedBindingError is what checkBindings returns.
type unsupportedBindingError string

func (e unsupportedBindingError) Error() string { return string(e) }

// checkBinding says why the lab cannot run iface ("" when it can).
func checkBinding(iface kubevirtv1.Interface, networks map[string]kubevirtv1.Network, plugins map[string]kubevirtv1.InterfaceBindingPlugin) string {
	var methods []string
	for _, m := range []struct {
		set  bool
		name string
	}{
		{iface.Bridge != nil, "bridge"},
		{iface.Masquerade != nil, "masquerade"},
		{iface.SRIOV != nil, "sriov"},
		{iface.PasstBinding != nil, "passtBinding"},
		{iface.DeprecatedSlirp != nil, "slirp"},
		{iface.DeprecatedMacvtap != nil, "macvtap"},
		{iface.DeprecatedPasst != nil, "passt"},
		{iface.Binding != nil, "binding"},
	} {
		if m.set {
			methods = append(methods, m.name)
		}
	}
	switch {
	case len(methods) == 0:
		return "no binding method: the lab cannot run it (" + labRuns + ")"
	case len(methods) > 1:
		return fmt.Sprintf("bindings %s are mutually exclusive: set exactly one", strings.Join(methods, ", "))
	}
	switch m := methods[0]; m {
	case "bridge":
		return ""
	case "masquerade":
		n, ok := networks[iface.Name]
		switch {
		case !ok:
			return fmt.Sprintf("binding \"masquerade\": spec.networks has no network %q (masquerade runs on the pod network only)", iface.Name)
		case n.Pod == nil:
			return fmt.Sprintf("binding \"masquerade\": network %q is not the pod network (masquerade runs on the pod network only)", iface.Name)
		}
		return ""
	case "binding":
		name := iface.Binding.Name
		if name == "" {
			return "binding.name is empty: it must name a binding plugin registered in the KubeVirt CR (spec.configuration.network.binding)"
		}
		p, ok := plugins[name]
		switch {
		case !ok:
			return fmt.Sprintf("binding plugin %q is not registered in the KubeVirt CR (spec.configuration.network.binding)", name)
		case p.DomainAttachmentType == domainAttachmentManagedTap:
			return ""
		case p.DomainAttachmentType == "":
			return fmt.Sprintf("binding plugin %q has no domainAttachmentType (a sidecar plugin): the lab cannot run this binding (%s)", name, labRuns)
		default:
			return fmt.Sprintf("binding plugin %q has domainAttachmentType %q: the lab cannot run this binding (%s)", name, p.DomainAttachmentType, labRuns)
		}
	default:
		return fmt.Sprintf("binding %q: the lab cannot run this binding (%s)", m, labRuns)
	}
}

// vmiCondition is an entry of a VMI's status.conditions, as KubeVirt's
// VirtualMachineInstanceCondition encodes it. The VMI types of
// api/kubevirt/v1 do not declare status.conditions: simvirt keeps them in
// the status's UnknownFields.
type vmiCondition struct {
	Type               string                 `json:"type"`
	Status             corev1.ConditionStatus `json:"status"`
	LastProbeTime      metav1.Time            `json:"lastProbeTime,omitempty"`
	LastTransitionTime metav1.Time            `json:"lastTransitionTime,omitempty"`
	Reason             string                 `json:"reason,omitempty"`
	Message            string                 `json:"message,omitempty"`
}

// conditions returns the VMI's status.conditions, undecoded; nil when
// there are none or they do not parse.
func conditions(st *kubevirtv1.VirtualMachineInstanceStatus) []json.RawMessage {
	if st.Unknown == "" {
		return nil
	}
	var members map[string]json.RawMessage
	if err := json.Unmarshal([]byte(st.Unknown), &members); err != nil {
		return nil
	}
	var conds []json.RawMessage
	if err := json.Unmarshal(members[conditionsMember], &conds); err != nil {
		return nil
	}
	return conds
}

const conditionsMember = "conditions"

// condition returns the VMI's condition of type typ.
func condition(st *kubevirtv1.VirtualMachineInstanceStatus, typ string) (vmiCondition, bool) {
	for _, raw := range conditions(st) {
		var c vmiCondition
		if json.Unmarshal(raw, &c) == nil && c.Type == typ {
			return c, true
		}
	}
	return vmiCondition{}, false
}

// setCondition sets the VMI's condition of c's type to c, keeping the
// others; the transition time stays when status, reason and message do.
func setCondition(st *kubevirtv1.VirtualMachineInstanceStatus, c vmiCondition) error {
	if old, ok := condition(st, c.Type); ok && old.Status == c.Status && old.Reason == c.Reason && old.Message == c.Message {
		return nil
	}
	var conds []json.RawMessage
	raw, err := json.Marshal(c)
	if err != nil {
		return err
	}
	replaced := false
	for _, r := range conditions(st) {
		var o vmiCondition
		if json.Unmarshal(r, &o) == nil && o.Type == c.Type {
			if !replaced {
				conds = append(conds, raw)
				replaced = true
			}
			continue
		}
		conds = append(conds, r)
	}
	if !replaced {
		conds = append(conds, raw)
	}
	members := map[string]json.RawMessage{}
	if st.Unknown != "" {
		if err := json.Unmarshal([]byte(st.Unknown), &members); err != nil {
			return fmt.Errorf("status of the VMI: %w", err)
		}
	}
	if members[conditionsMember], err = json.Marshal(conds); err != nil {
		return err
	}
	b, err := json.Marshal(members) // sorted members, compact values: canonical
	if err != nil {
		return err
	}
	st.Unknown = kubevirtv1.UnknownFields(b)
	return nil
}

// unsupportedBindingCondition is the condition of a VMI failed with reason.
func unsupportedBindingCondition(reason string) vmiCondition {
	return vmiCondition{
		Type: ConditionSynchronized, Status: corev1.ConditionFalse, Reason: ReasonUnsupportedBinding,
		Message: reason, LastTransitionTime: metav1.Now(),
	}
}

// failedForBindings reports whether simvirt failed the VMI because of its
// bindings.
func failedForBindings(vmi *kubevirtv1.VirtualMachineInstance) bool {
	if vmi == nil || vmi.Status.Phase != PhaseFailed {
		return false
	}
	c, ok := condition(&vmi.Status, ConditionSynchronized)
	return ok && c.Status == corev1.ConditionFalse && c.Reason == ReasonUnsupportedBinding
}
