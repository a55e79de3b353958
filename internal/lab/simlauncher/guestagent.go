package simlauncher

import (
	"fmt"
	"maps"

	"k8s.io/apimachinery/pkg/types"

	"kvnet.io/kvnet/internal/lab/guest"
	"kvnet.io/kvnet/internal/lab/simvirt"
)

// GuestInterfaces tells the addresses the guest of VMI namespace/name
// holds, as a guest agent would (it makes the Launcher a
// simvirt.GuestAgent): one entry per guest NIC, eth0 first, with the MAC
// QEMU gave it and the newest DHCPv4 and DHCPv6 lease the guest printed
// on its console for it, but a DHCPv6 address it reported gone (a NIC
// without leases has no addresses). A
// migrated guest keeps the leases it reported on its source: it holds
// them still. ok is false when no guest of the VMI runs here.
func (l *Launcher) GuestInterfaces(namespace, name string) ([]simvirt.GuestInterface, bool) {
	key := types.NamespacedName{Namespace: namespace, Name: name}
	l.mu.Lock()
	var r *running
	for _, g := range l.guests {
		if g.vmi != key || g.moved {
			continue
		}
		select {
		case <-g.vm.Done():
		default:
			r = g
		}
	}
	l.mu.Unlock()
	if r == nil {
		return nil, false
	}
	leases := r.leases()
	out := make([]simvirt.GuestInterface, len(r.plumbed))
	for i, p := range r.plumbed {
		iface := fmt.Sprintf("eth%d", i)
		gi := simvirt.GuestInterface{Name: iface, MAC: p.GuestMAC}
		for _, fam := range leases {
			if lease, ok := fam[iface]; ok {
				gi.IPs = append(gi.IPs, lease.IP())
			}
		}
		out[i] = gi
	}
	return out, true
}

// leases returns the newest lease per guest NIC the guest reported, DHCPv4
// then DHCPv6: since its QEMU started, over what it had reported before
// it was migrated here; a DHCPv6 address the guest reported gone since is
// left out.
func (r *running) leases() [2]map[string]guest.Lease {
	out := [2]map[string]guest.Lease{maps.Clone(r.inherited[0]), maps.Clone(r.inherited[1])}
	for i := range out {
		if out[i] == nil {
			out[i] = map[string]guest.Lease{}
		}
	}
	for iface := range r.vm.Released6() {
		delete(out[1], iface)
	}
	maps.Copy(out[0], r.vm.Leases())
	maps.Copy(out[1], r.vm.Leases6())
	return out
}
