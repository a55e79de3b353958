package ipam_test

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nadv1 "kvnet.io/kvnet/api/k8scni/v1"
	udnv1 "kvnet.io/kvnet/api/udn/v1"
	"kvnet.io/kvnet/internal/testenv"
)

// TestLocalnetClaimSurvivesPodRecreation: a VM on a Localnet CUDN with
// persistent IPs keeps its address on the physical subnet across a stop
// and start (a new launcher pod with the same IPAMClaim), outside the
// excluded range, and another pod never gets it meanwhile.
func TestLocalnetClaimSurvivesPodRecreation(t *testing.T) {
	ctx := context.Background()
	const ns, cudn = "localnet-vms", "physnet-vms"
	create(t, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{"physnet": "vms"}}})
	create(t, &udnv1.ClusterUserDefinedNetwork{
		ObjectMeta: metav1.ObjectMeta{Name: cudn},
		Spec: udnv1.ClusterUserDefinedNetworkSpec{
			NamespaceSelector: metav1.LabelSelector{MatchLabels: map[string]string{"physnet": "vms"}},
			Network: udnv1.NetworkSpec{Topology: udnv1.NetworkTopologyLocalnet, Localnet: &udnv1.LocalnetConfig{
				Role: udnv1.NetworkRoleSecondary, PhysicalNetworkName: "datacenter",
				Subnets:        udnv1.DualStackCIDRs{"192.168.77.0/24"},
				ExcludeSubnets: []udnv1.CIDR{"192.168.77.0/25"},
				IPAM:           &udnv1.IPAMConfig{Lifecycle: udnv1.IPAMLifecyclePersistent},
			}},
		},
	})
	testenv.Eventually(t, 30*time.Second, "NAD "+ns+"/"+cudn, func() error {
		return c.Get(ctx, client.ObjectKey{Namespace: ns, Name: cudn}, &nadv1.NetworkAttachmentDefinition{})
	})
	mkClaim(t, ns, "vm1.physnet", "cluster_udn_"+cudn)

	create(t, mkPod(ns, "virt-launcher-vm1-aaaaa", secondary(cudn, "vm1.physnet")))
	first := waitAnnotated(t, ns, "virt-launcher-vm1-aaaaa")[ns+"/"+cudn]
	if len(first.IPAddresses) != 1 {
		t.Fatalf("attachment %+v", first)
	}
	ip := netip.MustParsePrefix(first.IPAddresses[0])
	if !netip.MustParsePrefix("192.168.77.128/25").Contains(ip.Addr()) {
		t.Fatalf("IP %s outside the physical subnet's allocatable half 192.168.77.128/25", ip)
	}
	if st := claimStatus(t, ns, "vm1.physnet"); len(st.IPs) != 1 || st.IPs[0] != first.IPAddresses[0] {
		t.Fatalf("claim IPs %v, pod IPs %v", st.IPs, first.IPAddresses)
	}

	// Stop: the pod goes, the claim keeps the address from other pods.
	if err := c.Delete(ctx, mkPod(ns, "virt-launcher-vm1-aaaaa", nil)); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		name := fmt.Sprintf("other-%d", i)
		create(t, mkPod(ns, name, secondary(cudn, "")))
		if got := waitAnnotated(t, ns, name)[ns+"/"+cudn]; got.IPAddresses[0] == first.IPAddresses[0] {
			t.Fatalf("pod %s got the stopped VM's IP %s", name, got.IPAddresses[0])
		}
	}
	// Start: the new launcher pod gets the same address and MAC.
	create(t, mkPod(ns, "virt-launcher-vm1-bbbbb", secondary(cudn, "vm1.physnet")))
	second := waitAnnotated(t, ns, "virt-launcher-vm1-bbbbb")[ns+"/"+cudn]
	if second.IPAddresses[0] != first.IPAddresses[0] || second.MACAddress != first.MACAddress {
		t.Fatalf("after restart %v/%s, before %v/%s", second.IPAddresses, second.MACAddress, first.IPAddresses, first.MACAddress)
	}
}
