package simvirt

import (
	"fmt"
	"net/netip"
	"testing"

	kubevirtv1 "kvnet.io/kvnet/api/kubevirt/v1"
)

// TestWithGuest: with a guest agent's report, an interface whose MAC a
// guest NIC has reports the guest's addresses (not kvnet's allocation, so
// an address the guest lacks shows: here its IPv6 one) and the guest's
// name for the NIC; a masquerade interface keeps the pod's addresses; an
// interface the guest does not report is the domain's word only.
func TestWithGuest(t *testing.T) {
	vmi := &kubevirtv1.VirtualMachineInstance{Spec: kubevirtv1.VirtualMachineInstanceSpec{
		Domain: kubevirtv1.DomainSpec{Devices: kubevirtv1.Devices{Interfaces: []kubevirtv1.Interface{
			{Name: "podnet", Binding: &kubevirtv1.PluginBinding{Name: "l2bridge"}},
			{Name: "masq", Masquerade: &kubevirtv1.InterfaceMasquerade{}},
			{Name: "blue", Bridge: &kubevirtv1.InterfaceBridge{}},
			{Name: "nomac", Bridge: &kubevirtv1.InterfaceBridge{}},
		}}},
	}}
	st := []kubevirtv1.VirtualMachineInstanceNetworkInterface{
		{Name: "podnet", IP: "10.0.0.5", IPs: []string{"10.0.0.5", "fd00::5"}, MAC: "0a:58:0a:00:00:05", PodInterfaceName: "ovn-udn1", InfoSource: InfoSource},
		{Name: "masq", IP: "10.244.0.9", IPs: []string{"10.244.0.9"}, MAC: "02:00:00:00:00:09", PodInterfaceName: "eth0", InfoSource: InfoSource},
		{Name: "blue", IP: "192.168.1.7", IPs: []string{"192.168.1.7"}, MAC: "02:00:00:00:00:07", PodInterfaceName: "pod1", InfoSource: InfoSource},
		{Name: "nomac", PodInterfaceName: "pod2", InfoSource: "domain"},
	}
	guest := []GuestInterface{
		{Name: "eth0", MAC: "0A:58:0A:00:00:05", IPs: []netip.Addr{netip.MustParseAddr("10.0.0.5")}},
		{Name: "eth1", MAC: "02:00:00:00:00:09", IPs: []netip.Addr{netip.MustParseAddr("10.0.2.2")}},
		{Name: "eth3", MAC: "02:00:00:00:00:ff"},
	}
	got := withGuest(vmi, st, guest)
	want := []kubevirtv1.VirtualMachineInstanceNetworkInterface{
		{Name: "podnet", IP: "10.0.0.5", IPs: []string{"10.0.0.5"}, MAC: "0a:58:0a:00:00:05", InterfaceName: "eth0", PodInterfaceName: "ovn-udn1", InfoSource: InfoSource},
		{Name: "masq", IP: "10.244.0.9", IPs: []string{"10.244.0.9"}, MAC: "02:00:00:00:00:09", InterfaceName: "eth1", PodInterfaceName: "eth0", InfoSource: InfoSource},
		{Name: "blue", IP: "192.168.1.7", IPs: []string{"192.168.1.7"}, MAC: "02:00:00:00:00:07", PodInterfaceName: "pod1", InfoSource: InfoSourceDomain},
		{Name: "nomac", PodInterfaceName: "pod2", InfoSource: InfoSourceDomain},
	}
	if fmt.Sprintf("%+v", got) != fmt.Sprintf("%+v", want) {
		t.Fatalf("withGuest:\n%+v\nwant\n%+v", got, want)
	}
	if st[0].IPs[1] != "fd00::5" {
		t.Fatalf("withGuest changed its input: %+v", st[0])
	}

	// A guest NIC without leases: the guest's word is "no address".
	got = withGuest(vmi, st[:1], []GuestInterface{{Name: "eth0", MAC: "0a:58:0a:00:00:05"}})
	if g := got[0]; g.IP != "" || len(g.IPs) != 0 || g.InfoSource != InfoSource || g.InterfaceName != "eth0" {
		t.Fatalf("guest NIC without addresses: %+v", g)
	}
}
