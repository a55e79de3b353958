package webhooks

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	kubevirtv1 "kvnet.io/kvnet/api/kubevirt/v1"
	macpoolctl "kvnet.io/kvnet/internal/k8s/controllers/macpool"
	"kvnet.io/kvnet/internal/macpool"
)

// VirtualMachinePath is where the VM MAC mutator is served.
const VirtualMachinePath = "/mutate-virtualmachines"

// VMMutator gives the interfaces of VirtualMachines unique MACs.
type VMMutator struct {
	Pool    *macpoolctl.Manager
	Decoder admission.Decoder
}

// Handle implements admission.Handler.
func (m *VMMutator) Handle(ctx context.Context, req admission.Request) admission.Response {
	start := time.Now()
	defer func() { admissionSeconds.WithLabelValues("virtualmachine").Observe(time.Since(start).Seconds()) }()
	if !m.Pool.Ready() {
		// A replica still indexing the VMs and reservations: it would pick
		// candidates blind (the reservations would still keep MACs unique,
		// but explicit MACs of VMs without one would not be seen).
		return admission.Errored(http.StatusServiceUnavailable, errors.New("kvnet MAC pool is not ready on this replica (still indexing VMs and reservations); retry"))
	}
	var vm kubevirtv1.VirtualMachine
	if err := m.Decoder.Decode(req, &vm); err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	if vm.Namespace == "" {
		vm.Namespace = req.Namespace
	}
	if vm.Spec.Template == nil {
		return admission.Allowed("no template: nothing to assign")
	}
	owner := macpoolctl.Owner(vm.Namespace, vm.Name)
	if vm.Name == "" {
		// generateName: the API server names the VM after admission.
		owner = macpoolctl.ProvisionalOwner(vm.Namespace, string(req.UID))
	}
	dryRun := req.DryRun != nil && *req.DryRun
	spec := vm.Spec.Template.Spec

	assigned := map[int]string{} // interface index -> MAC to write
	var taken []net.HardwareAddr // newly reserved, released on failure
	fail := func(resp admission.Response) admission.Response {
		for _, mac := range taken {
			m.Pool.Unclaim(ctx, owner, mac)
		}
		return resp
	}
	seen := map[string]string{} // MAC -> interface, for duplicates inside the VM
	for i, iface := range spec.Domain.Devices.Interfaces {
		if !macpool.Considered(iface, spec.Networks) || iface.MacAddress == "" {
			continue
		}
		mac, err := net.ParseMAC(iface.MacAddress)
		if err != nil || len(mac) != 6 {
			return fail(admission.Denied(fmt.Sprintf("spec.template.spec.domain.devices.interfaces[%d].macAddress %q of interface %q is not a MAC-48 address", i, iface.MacAddress, iface.Name)))
		}
		if other, dup := seen[mac.String()]; dup {
			return fail(admission.Denied(fmt.Sprintf("MAC %s is used by both interfaces %q and %q of VM %s", mac, other, iface.Name, owner)))
		}
		seen[mac.String()] = iface.Name
		if err := macpool.CheckExplicit(mac); err != nil {
			return fail(admission.Denied(fmt.Sprintf("interface %q: %v", iface.Name, err)))
		}
		if dryRun {
			holder, err := m.Pool.HeldBy(ctx, owner, mac)
			if err != nil {
				return admission.Errored(http.StatusServiceUnavailable, fmt.Errorf("interface %q: %w", iface.Name, err))
			}
			if holder != "" {
				return admission.Denied(fmt.Sprintf("MAC %s of interface %q is already used by VM %s", mac, iface.Name, holder))
			}
			continue
		}
		created, err := m.Pool.Claim(ctx, owner, mac)
		if err != nil {
			var ce *macpool.ConflictError
			if errors.As(err, &ce) {
				return fail(admission.Denied(fmt.Sprintf("MAC %s of interface %q is already used by VM %s", mac, iface.Name, ce.Holder)))
			}
			return fail(admission.Errored(http.StatusServiceUnavailable, fmt.Errorf("interface %q: %w", iface.Name, err)))
		}
		if created {
			taken = append(taken, mac)
		}
	}
	// On UPDATE an interface that lost its MAC (an apply that does not
	// mention it) keeps the one it had: a VM keeps its MACs.
	previous := map[string]string{}
	if req.Operation == admissionv1.Update && len(req.OldObject.Raw) > 0 {
		var old kubevirtv1.VirtualMachine
		if err := m.Decoder.DecodeRaw(req.OldObject, &old); err == nil {
			previous = macpoolctl.VMMACs(&old)
		}
	}
	for i, iface := range spec.Domain.Devices.Interfaces {
		if !macpool.Considered(iface, spec.Networks) || iface.MacAddress != "" {
			continue
		}
		if prev, ok := previous[iface.Name]; ok && !dryRun {
			if hw, err := net.ParseMAC(prev); err == nil && len(hw) == 6 {
				if created, err := m.Pool.Claim(ctx, owner, hw); err == nil {
					if created {
						taken = append(taken, hw)
					}
					assigned[i] = hw.String()
					continue
				}
			}
		}
		mac, err := m.Pool.Allocate(ctx, owner, dryRun)
		if err != nil {
			return fail(admission.Errored(http.StatusInternalServerError, fmt.Errorf("allocate a MAC for interface %q of VM %s: %w", iface.Name, owner, err)))
		}
		if !dryRun {
			taken = append(taken, mac)
		}
		assigned[i] = mac.String()
	}
	if len(assigned) == 0 {
		return admission.Allowed("MACs already set")
	}
	return patchMACs(req.Object.Raw, assigned)
}

// patchMACs writes MACs into the raw VM, keeping every field it does not
// know, and stamps the transaction annotation.
func patchMACs(raw []byte, assigned map[int]string) admission.Response {
	obj, md, err := decodeObject(raw)
	if err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	ifaces, ok := dig(obj, "spec", "template", "spec", "domain", "devices", "interfaces").([]any)
	if !ok {
		return admission.Errored(http.StatusBadRequest, errors.New("spec.template.spec.domain.devices.interfaces is not a list"))
	}
	for i, mac := range assigned {
		if i >= len(ifaces) {
			continue
		}
		if iface, ok := ifaces[i].(map[string]any); ok {
			iface["macAddress"] = mac
		}
	}
	ann, ok := md["annotations"].(map[string]any)
	if !ok {
		if md["annotations"] != nil {
			return admission.Errored(http.StatusBadRequest, fmt.Errorf("metadata.annotations is a %T, not an object", md["annotations"]))
		}
		ann = map[string]any{}
		md["annotations"] = ann
	}
	ann[macpoolctl.TransactionAnnotation] = time.Now().UTC().Format(time.RFC3339Nano)
	out, err := json.Marshal(obj)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	return admission.PatchResponseFromRaw(raw, out)
}

func dig(obj map[string]any, path ...string) any {
	var cur any = obj
	for _, p := range path {
		m, ok := cur.(map[string]any)
		if !ok {
			return nil
		}
		cur = m[p]
	}
	return cur
}
