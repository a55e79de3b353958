package simvirt

import (
	"net/netip"
	"slices"
	"strings"
	"time"

	kubevirtv1 "kvnet.io/kvnet/api/kubevirt/v1"
)

// GuestAgent tells what the guest of a VMI holds, as KubeVirt's guest
// agent (qemu-guest-agent, read by virt-handler) does. In the lab, the
// virt-launcher stand-in (package simlauncher) is one: it reads the
// leases its guests print on their consoles.
type GuestAgent interface {
	// GuestInterfaces returns the NICs of the guest running VMI
	// namespace/name with the addresses it holds; ok is false when no
	// guest runs for it (nothing is known of its addresses).
	GuestInterfaces(namespace, name string) (ifaces []GuestInterface, ok bool)
}

// GuestInterface is one NIC of a guest, as its guest agent reports it.
type GuestInterface struct {
	Name string       // in the guest, e.g. eth0
	MAC  string       // its MAC address
	IPs  []netip.Addr // the addresses it holds, IPv4 first
}

// GuestPoll is how often simvirt asks the guest agent about a running VMI
// with a guest (virt-handler polls the guest agent in the same way).
const GuestPoll = 2 * time.Second

// InfoSourceDomain is the infoSource of a VMI interface the guest agent
// does not report.
const InfoSourceDomain = "domain"

// withGuest returns status.interfaces st as the guest agent's report
// guest amends them, as virt-handler does: an interface whose MAC a
// guest NIC has gets that NIC's name (interfaceName) and, unless it is
// masquerade (whose guest address is private to the launcher pod; KubeVirt
// reports the pod's addresses), the guest's addresses, with infoSource
// "domain, guest-agent"; an interface the guest does not report keeps its
// addresses with infoSource "domain" (they are not the guest's word).
func withGuest(vmi *kubevirtv1.VirtualMachineInstance, st []kubevirtv1.VirtualMachineInstanceNetworkInterface, guest []GuestInterface) []kubevirtv1.VirtualMachineInstanceNetworkInterface {
	masquerade := map[string]bool{}
	for _, i := range vmi.Spec.Domain.Devices.Interfaces {
		if i.Masquerade != nil {
			masquerade[i.Name] = true
		}
	}
	out := slices.Clone(st)
	for i := range out {
		e := &out[i]
		g := slices.IndexFunc(guest, func(g GuestInterface) bool { return e.MAC != "" && strings.EqualFold(g.MAC, e.MAC) })
		if g < 0 {
			e.InfoSource = InfoSourceDomain
			continue
		}
		e.InterfaceName = guest[g].Name
		e.InfoSource = InfoSource
		if masquerade[e.Name] {
			continue
		}
		e.IPs, e.IP = nil, ""
		for _, a := range guest[g].IPs {
			e.IPs = append(e.IPs, a.String())
		}
		if len(e.IPs) > 0 {
			e.IP = e.IPs[0]
		}
	}
	return out
}
