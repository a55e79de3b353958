package e2e

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"syscall"
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
)

// TestLabVMPolicyAcrossMigration: a NetworkPolicy selecting a VM (through
// its launcher pod's labels, the VMI template's) isolates its ingress:
// pods labelled role=client may reach TCP 80 (HTTP), the lab's exec port
// and port 81 (closed in the guest), pods labelled role=outsider TCP 7
// (echo) only. A real guest on a primary UDN, from pods on another node:
// each refused connection (the outsider to HTTP, the client to echo) is
// preceded by a positive control on the same port (the client's page, the
// outsider's echo) and must time out (dropped by the policy), where the
// client's connection to the closed port 81 must be reset, so a dial can
// tell a refusal from a guest that is not listening. The same holds
// after a live migration to another node, whose port the policy must have
// isolated before the switch-over. (A connection kept open across the
// migration, the server speaking first, is datapath's
// TestPolicyConnectionAcrossMigration.)
func TestLabVMPolicyAcrossMigration(t *testing.T) {
	dir, c := threeNodeLab(t)
	ctx := context.Background()
	const ns, name = "e2e-pol", "vm-p"
	const closedPort = 81

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
	port := func(p int32) networkingv1.NetworkPolicyPort {
		return networkingv1.NetworkPolicyPort{Protocol: &tcp, Port: new(intstr.FromInt32(p))}
	}
	fromRole := func(r string) []networkingv1.NetworkPolicyPeer {
		return []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"role": r}}}}
	}
	if err := c.Create(ctx, &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web-from-clients"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": name}},
			Ingress: []networkingv1.NetworkPolicyIngressRule{
				{From: fromRole("client"), Ports: []networkingv1.NetworkPolicyPort{port(guest.HTTPPort), port(guest.ExecPort), port(closedPort)}},
				{From: fromRole("outsider"), Ports: []networkingv1.NetworkPolicyPort{port(guest.EchoPort)}},
			},
		},
	}); err != nil {
		t.Fatal(err)
	}
	vm := l2bridgeVM(ns, name)
	vm.Spec.Template.ObjectMeta.Labels = map[string]string{"app": name}
	if err := c.Create(ctx, vm); err != nil {
		t.Fatal(err)
	}

	// A client and an outsider on every node, with their UDN addresses.
	type peer struct {
		netns string
		ip    netip.Addr
	}
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
			nets, err := podnetworks.Parse(p.Annotations[podnetworks.Annotation])
			if err != nil || len(nets[ns+"/net"].IPAddresses) == 0 {
				t.Fatalf("%s's %s/net allocation: %v (%v)", p.Name, ns, nets, err)
			}
			pr := peer{netns: simkubelet.PodNetNS(lab.KubeletConfig(dir, node), p),
				ip: netip.MustParsePrefix(nets[ns+"/net"].IPAddresses[0]).Addr()}
			if role == "client" {
				clients[node] = pr
			} else {
				outsiders[node] = pr
			}
		}
	}

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
	// dial connects from netns to the VM's port and says how it ended: a
	// policy drop times out, a closed port resets.
	dial := func(netns string, port uint16) string {
		dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		conn, err := guest.DialContext(dctx, netns, "tcp", netip.AddrPortFrom(ip, port).String())
		var ne net.Error
		switch {
		case err == nil:
			conn.Close()
			return "connected"
		case errors.Is(err, syscall.ECONNREFUSED):
			return "reset"
		case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
			return "timed out"
		}
		return err.Error()
	}
	// echo makes one round trip with the VM's echo server from netns.
	echo := func(netns string) error {
		dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		conn, err := guest.DialContext(dctx, netns, "tcp", netip.AddrPortFrom(ip, guest.EchoPort).String())
		if err != nil {
			return err
		}
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.WriteString(conn, "ping\n"); err != nil {
			return err
		}
		line, err := bufio.NewReader(conn).ReadString('\n')
		if err == nil && line != "ping\n" {
			err = fmt.Errorf("echo %q, want %q", line, "ping\n")
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
		// HTTP: the client gets its page (the guest is up), the outsider
		// is dropped.
		testenv.Eventually(t, 2*time.Minute, when+": a client reaches the VM's HTTP server", func() error {
			got, err := httpGet(ctx, cl.netns, netip.AddrPortFrom(ip, guest.HTTPPort))
			if err == nil && got != name {
				err = fmt.Errorf("answer %q, want %q", got, name)
			}
			return err
		})
		if got := dial(out.netns, guest.HTTPPort); got != "timed out" {
			t.Errorf("%s: the outsider on %s to the VM's HTTP port: %s; want timed out (the policy admits clients only)", when, other, got)
		}
		// A port the policy admits but the guest does not serve: reset.
		if got := dial(cl.netns, closedPort); got != "reset" {
			t.Errorf("%s: a client to the VM's closed port %d: %s; want reset", when, closedPort, got)
		}
		// Echo: the outsider gets its echo, the client is dropped.
		testenv.Eventually(t, time.Minute, when+": the outsider on "+other+" reaches the VM's echo port (positive control)", func() error {
			return echo(out.netns)
		})
		if got := dial(cl.netns, guest.EchoPort); got != "timed out" {
			t.Errorf("%s: a client to the VM's echo port %d: %s; want timed out (the policy admits outsiders only there)", when, guest.EchoPort, got)
		}
		t.Logf("%s (VM on %s, peers on %s): client -> :%d reached, -> :%d reset, -> :%d dropped; outsider -> :%d reached, -> :%d dropped",
			when, node, other, guest.HTTPPort, closedPort, guest.EchoPort, guest.EchoPort, guest.HTTPPort)
	}
	check("at boot")

	from := runningOn(t, c, ns, name)
	migrate(t, c, ns, name, "mig")
	to := runningOn(t, c, ns, name)
	if to == from {
		t.Fatalf("the VM still runs on %s after its migration", from)
	}
	check("after the live migration")
}
