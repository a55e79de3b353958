package node_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kubevirtv1 "kvnet.io/kvnet/api/kubevirt/v1"
	"kvnet.io/kvnet/internal/testenv"
	"kvnet.io/kvnet/internal/testenv/nstest"
)

// TestAgentDHCPForKubeVirtBindings: on a primary network (no persistent
// IPs here), a guest with the l2bridge (managedTap) binding gets from
// kvnet-node's DHCPv4 what OVN-Kubernetes's DHCPv4 for VMs sends
// (go-controller/pkg/kubevirt/dhcp.go and the network controllers'
// ensureDHCP: router, DNS server, hostname, MTU, lease time 3500 s), the
// hostname being the guest's as KubeVirt sets it; a guest with the bridge
// binding, whose virt-launcher serves it DHCPv4 (KubeVirt v1.7.0
// pkg/network/dhcp/bridge.go), gets no answer from kvnet-node, so that it
// hears one server. Real busybox udhcpc in the pod's namespace.
func TestAgentDHCPForKubeVirtBindings(t *testing.T) {
	testenv.NeedsFixture(t, env != nil)
	if _, err := os.Stat("/usr/bin/busybox"); err != nil {
		t.Fatalf("busybox (for udhcpc) not found: %v", err)
	}
	ctx := context.Background()
	l := newLab(t, "n1")
	const ns = "agent-kv-dhcp"
	nad := tenant(t, ns, "10.6.0.0/24", false)
	// The launcher pods as KubeVirt v1.7.0 templates them
	// (pkg/virt-controller/services/template.go): the guest's hostname
	// (spec.hostname, else the VMI's name up to its first ".") as the
	// pod's hostname and in vm.kubevirt.io/name, the VMI's name in
	// kubevirt.io/domain.
	vm := func(name, hostname string, iface kubevirtv1.Interface) func(*corev1.Pod) {
		iface.Name = "podnet"
		vmi := &kubevirtv1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: kubevirtv1.VirtualMachineInstanceSpec{
				Domain:   kubevirtv1.DomainSpec{Devices: kubevirtv1.Devices{Interfaces: []kubevirtv1.Interface{iface}}},
				Networks: []kubevirtv1.Network{{Name: "podnet", Pod: &kubevirtv1.PodNetwork{}}},
			}}
		testenv.Create(t, c, vmi)
		vmi.Status.NodeName = l.nodeName("n1")
		if err := c.Status().Update(ctx, vmi); err != nil {
			t.Fatal(err)
		}
		return func(p *corev1.Pod) {
			p.Labels[kubevirtv1.AppLabel] = kubevirtv1.VirtLauncherValue
			p.Labels[kubevirtv1.VMNameLabel] = hostname
			p.Annotations[kubevirtv1.DomainAnnotation] = name
			p.Spec.Hostname = hostname
		}
	}
	l2 := l.runPod(nad, "virt-launcher-web-abcde", "n1", vm("web.prod", "web", kubevirtv1.Interface{Binding: &kubevirtv1.PluginBinding{Name: "l2bridge"}}))
	br := l.runPod(nad, "virt-launcher-br-abcde", "n1", vm("br", "br", kubevirtv1.Interface{Bridge: &kubevirtv1.InterfaceBridge{}}))

	// udhcpc runs script with the lease's options in its environment.
	udhcpc := func(p *pod, tries string) (string, error) {
		// The guest asks DHCP: drop what kvnet-cni configured.
		if err := nstest.Exec(p.netns, "ip", "addr", "flush", "dev", "ovn-udn1"); err != nil {
			t.Fatal(err)
		}
		out := filepath.Join(tmpDir, "udhcpc-"+p.name)
		script := out + ".sh"
		if err := os.WriteFile(script, []byte("#!/bin/sh\n[ \"$1\" = bound ] || exit 0\nprintf 'ip=%s\\nmask=%s\\nrouter=%s\\ndns=%s\\nmtu=%s\\nhostname=%s\\nlease=%s\\n' \"$ip\" \"$mask\" \"$router\" \"$dns\" \"$mtu\" \"$hostname\" \"$lease\" > "+out+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := nstest.Exec(p.netns, "busybox", "udhcpc", "-i", "ovn-udn1", "-n", "-q", "-f", "-t", tries, "-T", "1", "-s", script); err != nil {
			return "", err
		}
		b, err := os.ReadFile(out)
		return string(b), err
	}

	t.Run("l2bridge: kvnet-node's DHCPv4 sends what OVN-Kubernetes sends", func(t *testing.T) {
		var got string
		testenv.Eventually(t, waitTimeout, "DHCP lease of the l2bridge guest", func() (err error) {
			got, err = udhcpc(l2, "3")
			return err
		})
		want := fmt.Sprintf("ip=%s\nmask=24\nrouter=10.6.0.1\ndns=%s\nmtu=%d\nhostname=web\nlease=3500\n", l2.ip(), dnsServer, l.agent("n1").MTU())
		if got != want {
			t.Errorf("lease:\n%s\nwant:\n%s", got, want)
		}
	})

	t.Run("bridge: virt-launcher's DHCPv4 only", func(t *testing.T) {
		// Once the node has planned the bridge guest's port without an
		// IPv4 lease (its VMI seen), its server, which just answered the
		// l2bridge guest, must not answer this one.
		testenv.Eventually(t, waitTimeout, "the bridge guest's port planned without DHCPv4", func() error {
			plan := l.agent("n1").LastPlan()
			for _, p := range plan.State.Ports {
				if p.MAC.String() != br.a.MACAddress {
					continue
				}
				for _, d := range plan.DHCP {
					if lease, ok := d.Leases[br.a.MACAddress]; ok && lease.IP.IsValid() {
						return fmt.Errorf("network %s leases it %s", d.Network, lease.IP)
					}
				}
				return nil
			}
			return fmt.Errorf("no port for %s yet", br.a.MACAddress)
		})
		if got, err := udhcpc(br, "3"); err == nil || !strings.Contains(err.Error(), "exit status") {
			t.Fatalf("the bridge guest got a lease from kvnet-node (err %v):\n%s", err, got)
		}
	})
}
