package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	udnv1 "kvnet.io/kvnet/api/udn/v1"
	"kvnet.io/kvnet/internal/lab/cli/lab"
	"kvnet.io/kvnet/internal/lab/guest"
	"kvnet.io/kvnet/internal/lab/simkubelet"
	"kvnet.io/kvnet/internal/podnetworks"
	"kvnet.io/kvnet/internal/testenv"
	"kvnet.io/kvnet/internal/testenv/nstest"
)

// TestLabVMPolicyAcrossMigration: a NetworkPolicy selecting a VM (through
// its launcher pod's labels, the VMI template's) that admits TCP 80 from
// pods labelled role=client only. A real guest on a primary UDN: from a
// pod on another node, a client reaches its HTTP server but not its echo
// port (7, not in the policy's ports), and a pod without the label reaches
// neither, though it reaches the client (the positive control). The same
// holds after a live migration to another node, whose port the policy
// must have isolated before the switch-over.
func TestLabVMPolicyAcrossMigration(t *testing.T) {
	dir, c := threeNodeLab(t)
	ctx := context.Background()
	const ns, name = "e2e-pol", "vm-p"

	primaryNamespace(t, c, ns)
	if err := c.Create(ctx, &udnv1.UserDefinedNetwork{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "net"},
		Spec: udnv1.UserDefinedNetworkSpec{Topology: udnv1.NetworkTopologyLayer2, Layer2: &udnv1.Layer2Config{
			Role: udnv1.NetworkRolePrimary, Subnets: udnv1.DualStackCIDRs{"10.82.0.0/16"},
			IPAM: &udnv1.IPAMConfig{Lifecycle: udnv1.IPAMLifecyclePersistent}}},
	}); err != nil {
		t.Fatal(err)
	}
	tcp := corev1.ProtocolTCP
	if err := c.Create(ctx, &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web-from-clients"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": name}},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"role": "client"}}}},
				Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: new(intstr.FromInt32(guest.HTTPPort))}},
			}},
		},
	}); err != nil {
		t.Fatal(err)
	}
	vm := l2bridgeVM(ns, name)
	vm.Spec.Template.ObjectMeta.Labels = map[string]string{"app": name}
	if err := c.Create(ctx, vm); err != nil {
		t.Fatal(err)
	}

	// A client and an outsider on every node.
	type peer struct{ netns string }
	clients, outsiders := map[string]peer{}, map[string]peer{}
	for i := 1; i <= 3; i++ {
		node := lab.NodeName(i)
		for _, role := range []string{"client", "outsider"} {
			p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("%s-%d", role, i), Labels: map[string]string{"role": role}},
				Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}
			if err := c.Create(ctx, p); err != nil {
				t.Fatal(err)
			}
			testenv.Eventually(t, time.Minute, ns+"/"+p.Name+" Running", func() error {
				if err := c.Get(ctx, client.ObjectKeyFromObject(p), p); err != nil {
					return err
				}
				if p.Status.Phase != corev1.PodRunning || p.Status.PodIP == "" {
					return fmt.Errorf("phase %q, IP %q", p.Status.Phase, p.Status.PodIP)
				}
				return nil
			})
			pr := peer{netns: simkubelet.PodNetNS(lab.KubeletConfig(dir, node), p)}
			if role == "client" {
				clients[node] = pr
			} else {
				outsiders[node] = pr
			}
		}
	}
	// A client's UDN address, for the positive control.
	var client1 corev1.Pod
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "client-1"}, &client1); err != nil {
		t.Fatal(err)
	}
	nets, err := podnetworks.Parse(client1.Annotations[podnetworks.Annotation])
	if err != nil || len(nets[ns+"/net"].IPAddresses) == 0 {
		t.Fatalf("client-1's %s/net allocation: %v (%v)", ns, nets, err)
	}
	clientIP := strings.Split(nets[ns+"/net"].IPAddresses[0], "/")[0]

	var ip netip.Addr
	testenv.Eventually(t, time.Minute, "IPAMClaim of "+name, func() error {
		ips, err := claimIPs(ctx, c, ns, name)
		if err != nil {
			return err
		}
		if len(ips) != 1 {
			return fmt.Errorf("status.ips %v", ips)
		}
		ip = ips[0]
		return nil
	})
	dial := func(netns string, port uint16) error {
		dctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		conn, err := guest.DialContext(dctx, netns, "tcp", netip.AddrPortFrom(ip, port).String())
		if err == nil {
			conn.Close()
		}
		return err
	}
	check := func(when string) {
		t.Helper()
		node := runningOn(t, c, ns, name)
		other := lab.NodeName(1)
		if other == node {
			other = lab.NodeName(2)
		}
		cl, out := clients[other], outsiders[other]
		// The guest is up: the client gets its page (allowed).
		testenv.Eventually(t, 2*time.Minute, when+": a client reaches the VM's HTTP server", func() error {
			got, err := httpGet(ctx, cl.netns, netip.AddrPortFrom(ip, guest.HTTPPort))
			if err == nil && got != name {
				err = fmt.Errorf("answer %q, want %q", got, name)
			}
			return err
		})
		// The outsider works: it reaches a client (no policy selects
		// the clients) on the VM's network.
		testenv.Eventually(t, time.Minute, when+": the outsider on "+other+" reaches a client (positive control)", func() error {
			return nstest.Ping(out.netns, clientIP)
		})
		if err := dial(out.netns, guest.HTTPPort); err == nil {
			t.Errorf("%s: the outsider on %s connected to the VM's HTTP port; the policy admits clients only", when, other)
		}
		if err := dial(cl.netns, guest.EchoPort); err == nil {
			t.Errorf("%s: a client connected to the VM's echo port %d; the policy admits TCP %d only", when, guest.EchoPort, guest.HTTPPort)
		}
		t.Logf("%s (VM on %s, peers on %s): client -> :%d reached; client -> :%d and outsider -> :%d refused", when, node, other, guest.HTTPPort, guest.EchoPort, guest.HTTPPort)
	}
	check("at boot")

	from := runningOn(t, c, ns, name)
	migrate(t, c, ns, name, "mig")
	if to := runningOn(t, c, ns, name); to == from {
		t.Fatalf("the VM still runs on %s after its migration", from)
	}
	check("after the live migration")
}
