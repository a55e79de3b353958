package why

import (
	"context"
	"fmt"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/client"

	kubevirtv1 "kvnet.io/kvnet/api/kubevirt/v1"
)

// reportGuest writes the VMI's status.interfaces as KubeVirt does from
// the guest agent: interface "pod" with ips (none: no guest agent).
func reportGuest(t *testing.T, s *vmSeed, ips ...string) {
	t.Helper()
	reportInterface(t, s, "domain, guest-agent", ips...)
}

// reportInterface is reportGuest with the interface's infoSource.
func reportInterface(t *testing.T, s *vmSeed, infoSource string, ips ...string) {
	t.Helper()
	var vmi kubevirtv1.VirtualMachineInstance
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: s.ns, Name: s.name}, &vmi); err != nil {
		t.Fatal(err)
	}
	vmi.Status.Interfaces = []kubevirtv1.VirtualMachineInstanceNetworkInterface{{
		Name: "pod", MAC: "0a:58:0a:00:00:05", InterfaceName: "eth0", IPs: ips, InfoSource: infoSource,
	}}
	if len(ips) > 0 {
		vmi.Status.Interfaces[0].IP = ips[0]
	}
	if err := c.Status().Update(context.Background(), &vmi); err != nil {
		t.Fatal(err)
	}
}

// TestWhyGuestAddressMissing: a VM whose VMI reports the addresses of its
// interface (from the guest agent) without the address its IPAMClaim
// holds is not healthy: GuestAddressMissing names the address and the
// interface.
func TestWhyGuestAddressMissing(t *testing.T) {
	s := newVMSeed(t)
	s.seed(t)
	reportGuest(t, s, "10.0.0.7", "fe80::858:aff:fe00:5")
	expectWhy(t, GuestAddressMissing, []string{
		fmt.Sprintf(`IPAMClaim %s/vm1.pod holds 10.0.0.5 for interface "pod" of VMI %s/vm1, but the VMI reports that interface (guest interface eth0) with addresses [10.0.0.7, fe80::858:aff:fe00:5] only`, s.ns, s.ns),
		"MAC 0a:58:0a:00:00:05",
	}, "vm", "vm1", "-n", s.ns)
}

// TestWhyGuestAddresses: the claim's address reported on the interface
// is healthy and says so; an interface the VMI reports no address for (no
// guest agent) is unknown, not broken.
func TestWhyGuestAddresses(t *testing.T) {
	s := newVMSeed(t)
	s.seed(t)
	reportGuest(t, s, "10.0.0.5", "fe80::858:aff:fe00:5")
	expectWhy(t, "", []string{`interface "pod" holds 10.0.0.5/24 (reported by the VMI)`}, "vm", "vm1", "-n", s.ns)

	reportGuest(t, s)
	expectWhy(t, "", []string{`interface "pod": addresses unknown: the VMI reports none for it (no guest agent in the guest?)`}, "vmi", "vm1", "-n", s.ns)

	// Addresses KubeVirt read elsewhere than from the guest agent.
	reportInterface(t, s, "domain, multus-status", "10.0.0.7")
	expectWhy(t, "", []string{`interface "pod": guest addresses unknown: the VMI's addresses for it come from "domain, multus-status", not the guest agent`}, "vm", "vm1", "-n", s.ns)
}
