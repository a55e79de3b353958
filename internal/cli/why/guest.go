package why

import (
	"fmt"
	"net/netip"
	"strings"

	kubevirtv1 "kvnet.io/kvnet/api/kubevirt/v1"
	"kvnet.io/kvnet/internal/ipam"
	"kvnet.io/kvnet/internal/podnetworks"
)

// checkGuestAddresses compares, for a running VMI, each address an
// IPAMClaim of its launcher pod holds with the addresses KubeVirt reports
// on the VMI's interface of that network (status.interfaces[].ipAddresses,
// from the guest agent: an interface whose infoSource names another source
// only is not the guest's word). An address the guest does not have is a broken
// link (GuestAddressMissing); an interface the VMI reports no address for
// at all (no guest agent) is unknown, said so, and not a failure.
func checkGuestAddresses(r *Report, f *vmFacts, spec *kubevirtv1.VirtualMachineInstanceSpec, atts []ipam.Attachment) bool {
	vmi := f.VMI
	if vmi == nil || vmi.Status.Phase != "Running" || f.Launcher == nil {
		return false
	}
	reported := map[string]kubevirtv1.VirtualMachineInstanceNetworkInterface{}
	for _, iface := range vmi.Status.Interfaces {
		reported[iface.Name] = iface
	}
	for _, a := range atts {
		if a.ClaimRef == "" {
			continue
		}
		claim := f.Launcher.Claims[a.ClaimRef]
		if claim == nil || len(claim.Status.IPs) == 0 {
			continue
		}
		network := vmNetworkOf(spec, f.Namespace.Name, a)
		if network == "" {
			continue
		}
		iface, ok := reported[network]
		var have []netip.Addr
		for _, s := range iface.IPs {
			if addr, err := netip.ParseAddr(strings.TrimSpace(s)); err == nil {
				have = append(have, addr.Unmap())
			}
		}
		if !ok || len(have) == 0 {
			r.ok("guest", "interface %q: addresses unknown: the VMI reports none for it (no guest agent in the guest?), so IPAMClaim %s's %s cannot be checked there",
				network, claim.Name, strings.Join(claim.Status.IPs, ", "))
			continue
		}
		if iface.InfoSource != "" && !strings.Contains(iface.InfoSource, "guest-agent") {
			r.ok("guest", "interface %q: guest addresses unknown: the VMI's addresses for it come from %q, not the guest agent, so IPAMClaim %s's %s cannot be checked there",
				network, iface.InfoSource, claim.Name, strings.Join(claim.Status.IPs, ", "))
			continue
		}
		for _, s := range claim.Status.IPs {
			want, err := parseClaimAddr(s)
			if err != nil || containsAddr(have, want) {
				continue
			}
			guestIf := iface.InterfaceName
			if guestIf == "" {
				guestIf = "unknown"
			}
			return r.fail("guest", fmt.Sprintf("interface %q: %s missing", network, want), GuestAddressMissing,
				fmt.Sprintf("look at the guest from its console: its interface with MAC %s (guest name %s) must hold %s; kvnet hands it out by DHCP on primary networks, other networks need the guest configured for it", orDefault(iface.MAC, "unknown"), guestIf, want),
				"IPAMClaim %s/%s holds %s for interface %q of VMI %s/%s, but the VMI reports that interface (guest interface %s) with addresses [%s] only: the guest does not have the address its claim holds",
				claim.Namespace, claim.Name, want, network, vmi.Namespace, vmi.Name, guestIf, strings.Join(iface.IPs, ", "))
		}
		r.ok("guest", "interface %q holds %s (reported by the VMI)", network, strings.Join(claim.Status.IPs, ", "))
	}
	return false
}

// vmNetworkOf returns the name of the VM network (which names the VMI's
// interface) that attachment a serves: the pod network for the primary
// network, else the Multus network selecting a's NAD.
func vmNetworkOf(spec *kubevirtv1.VirtualMachineInstanceSpec, namespace string, a ipam.Attachment) string {
	for _, n := range spec.Networks {
		switch {
		case a.Role == podnetworks.RolePrimary && n.Pod != nil:
			return n.Name
		case a.Role != podnetworks.RolePrimary && n.Multus != nil && nadKeyOf(namespace, n.Multus.NetworkName) == a.NADKey:
			return n.Name
		}
	}
	return ""
}

// parseClaimAddr parses a claim's address, in CIDR notation or bare.
func parseClaimAddr(s string) (netip.Addr, error) {
	if p, err := netip.ParsePrefix(s); err == nil {
		return p.Addr().Unmap(), nil
	}
	a, err := netip.ParseAddr(s)
	return a.Unmap(), err
}

func containsAddr(l []netip.Addr, a netip.Addr) bool {
	for _, x := range l {
		if x == a {
			return true
		}
	}
	return false
}
