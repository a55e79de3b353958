package node

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	nadv1 "kvnet.io/kvnet/api/k8scni/v1"
	kubevirtv1 "kvnet.io/kvnet/api/kubevirt/v1"
)

// launcherOf makes p the launcher pod of VMI vmi as KubeVirt v1.7.0's
// template service does (pkg/virt-controller/services/template.go): the
// kubevirt.io/domain annotation, the guest's hostname as the pod's
// hostname and in vm.kubevirt.io/name.
func launcherOf(p corev1.Pod, vmi, hostname string) corev1.Pod {
	p.Annotations[kubevirtv1.DomainAnnotation] = vmi
	p.Labels = map[string]string{kubevirtv1.AppLabel: kubevirtv1.VirtLauncherValue, kubevirtv1.VMNameLabel: hostname}
	p.Spec.Hostname = hostname
	return p
}

func vmiWith(name string, iface kubevirtv1.Interface) *kubevirtv1.VirtualMachineInstance {
	vmi := &kubevirtv1.VirtualMachineInstance{}
	vmi.Name = name
	iface.Name = "podnet"
	vmi.Spec.Domain.Devices.Interfaces = []kubevirtv1.Interface{iface}
	vmi.Spec.Networks = []kubevirtv1.Network{{Name: "podnet", Pod: &kubevirtv1.PodNetwork{}}}
	return vmi
}

// A guest on a primary network gets DHCPv4 from kvnet-node unless its
// virt-launcher serves it (the bridge binding): one DHCPv4 server either
// way. The hostname is the guest's (the launcher pod's), the lease time
// OVN-Kubernetes's.
func TestLeasesForKubeVirtBindings(t *testing.T) {
	for _, tc := range []struct {
		name  string
		iface kubevirtv1.Interface
		v4    bool
	}{
		{"l2bridge", kubevirtv1.Interface{Binding: &kubevirtv1.PluginBinding{Name: "l2bridge"}}, true},
		{"bridge", kubevirtv1.Interface{Bridge: &kubevirtv1.InterfaceBridge{}}, false},
		{"masquerade", kubevirtv1.Interface{Masquerade: &kubevirtv1.InterfaceMasquerade{}}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vmi := vmiWith("db.prod", tc.iface)
			if got := launcherServesDHCPv4(vmi); got == tc.v4 {
				t.Fatalf("launcherServesDHCPv4 = %v", got)
			}
			lp := launcherOf(pod("a", "virt-launcher-db-x", "n1", "10.1.1.2", "0a:58:0a:01:01:02", time.Hour), "db.prod", "db")
			in := Input{
				Node: "n1", NADs: []nadv1.NetworkAttachmentDefinition{primaryNAD("a", "7")}, Pods: []corev1.Pod{lp},
				Nodes: []corev1.Node{kvnode("n1", "192.168.100.1")}, Links: links(lp), MTU: 1450,
				LauncherDHCPv4: map[types.NamespacedName]bool{{Namespace: "a", Name: "db.prod"}: launcherServesDHCPv4(vmi)},
			}
			plan := Desired(in)
			if len(plan.DHCP) != 1 {
				t.Fatalf("DHCP %+v", plan.DHCP)
			}
			l, ok := plan.DHCP[0].Leases["0a:58:0a:01:01:02"]
			if ok != tc.v4 || l.IP.IsValid() != tc.v4 {
				t.Fatalf("lease %+v (present %v), want an IPv4 lease: %v", l, ok, tc.v4)
			}
			if tc.v4 && (l.Hostname != "db" || l.LeaseTime != 3500*time.Second || l.IP.String() != "10.1.1.2/24") {
				t.Errorf("lease %+v, want hostname db (the guest's, not the VMI's name) and 3500 s", l)
			}
		})
	}
}

func TestGuestHostname(t *testing.T) {
	p := pod("a", "virt-launcher-x", "n1", "10.1.1.2", "0a:58:0a:01:01:02", time.Hour)
	if got := guestHostname(&p); got != "virt-launcher-x" {
		t.Errorf("plain pod: %q", got)
	}
	p.Annotations[kubevirtv1.DomainAnnotation] = "vm1.prod"
	if got := guestHostname(&p); got != "vm1.prod" {
		t.Errorf("domain only: %q", got)
	}
	p.Labels = map[string]string{kubevirtv1.VMNameLabel: "vm1"}
	if got := guestHostname(&p); got != "vm1" {
		t.Errorf("with the label: %q", got)
	}
	p.Spec.Hostname = "web"
	if got := guestHostname(&p); got != "web" {
		t.Errorf("with the pod's hostname: %q", got)
	}
}
