package e2e

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
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
	"kvnet.io/kvnet/internal/testenv/nstest"
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
// isolated before the switch-over.
//
// A TCP connection the guest opens (its egress is not isolated) to a
// server in the outsider's pod on a third node, neither the VM's nor its
// migration target, stays open across the migration: the target has never
// seen it, and the first segment there is the server's, inbound, which the
// ingress rules alone would drop. Before the migration the server sends a
// line and the guest one back; after it the server sends first (a line
// longer than a segment), and every byte arrives, then every byte the
// guest sends back. The server's own connections to the VM stay refused.
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

	// simvirt migrates to the least loaded other node, the first in node
	// order among equals: with one VM, the first node that is not the
	// VM's. The server is on the remaining one (checked after the
	// migration), in the outsider's pod, which the policy admits to the
	// echo port only; the guest is driven through the client's there.
	from := runningOn(t, c, ns, name)
	var others []string
	for i := 1; i <= 3; i++ {
		if n := lab.NodeName(i); n != from {
			others = append(others, n)
		}
	}
	target, srvNode := others[0], others[1]
	srv := outsiders[srvNode]
	ln := nstest.Listen(t, srv.netns, fmt.Sprintf(":%d", pushPort))
	gexec := func(cmd string) (string, error) {
		ectx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		return guest.Exec(ectx, clients[srvNode].netns, ip, cmd)
	}
	// The guest's side of the connection: busybox nc in its own session,
	// detached from the exec connection, sending what is appended to
	// /tmp/in and writing what it receives to /tmp/out. Once only: a
	// retried exec finds /tmp/in.
	testenv.Eventually(t, 2*time.Minute, "the guest starts its connection to the server", func() error {
		_, err := gexec(fmt.Sprintf(`[ -e /tmp/in ] || { : >/tmp/in; setsid sh -c 'tail -f /tmp/in | nc %s %d >/tmp/out 2>/tmp/err' </dev/null >/dev/null 2>&1 & }`,
			srv.ip, pushPort))
		return err
	})
	// guestState says how the guest's side is, for a failure.
	guestState := func() string {
		out, err := gexec(fmt.Sprintf(`echo "nc's stderr: $(cat /tmp/err)"; ps | grep -e 'nc ' -e 'tail -f' | grep -v grep; netstat -tn | grep :%d; true`, pushPort))
		if err != nil {
			out += " " + err.Error()
		}
		return out
	}
	_ = ln.(*net.TCPListener).SetDeadline(time.Now().Add(2 * time.Minute))
	sconn, err := ln.Accept()
	if err != nil {
		t.Fatalf("the server on %s: no connection from the guest: %v; the guest: %s", srvNode, err, guestState())
	}
	ln.Close()
	t.Cleanup(func() { sconn.Close() })
	if got := sconn.RemoteAddr().(*net.TCPAddr).AddrPort().Addr().Unmap(); got != ip {
		t.Fatalf("the server accepted a connection from %s, want the VM's %s", got, ip)
	}
	sr := bufio.NewReader(sconn)
	serverSends := func(line string) {
		t.Helper()
		_ = sconn.SetWriteDeadline(time.Now().Add(time.Minute))
		if _, err := io.WriteString(sconn, line+"\n"); err != nil {
			t.Fatalf("the server writes %q: %v", abbrev(line), err)
		}
	}
	// guestHas waits until the guest has received exactly want from the
	// server, in all.
	guestHas := func(what, want string) {
		t.Helper()
		var last string
		if !testenv.EventuallyOrError(t, 2*time.Minute, what, func() error {
			out, err := gexec("cat /tmp/out")
			if err != nil {
				return err
			}
			last = out
			if out != want {
				return fmt.Errorf("the guest has received %d bytes %q, want %d bytes %q", len(out), abbrev(out), len(want), abbrev(want))
			}
			return nil
		}) {
			t.Fatalf("%s: the guest has received %q in all; the guest: %s", what, abbrev(last), guestState())
		}
	}
	// guestSends has the guest send line and then the output of the
	// shell commands more ("" or ending in ";"), once: a retried exec
	// finds line in /tmp/in.
	guestSends := func(what, line, more string) {
		t.Helper()
		testenv.Eventually(t, 2*time.Minute, what, func() error {
			_, err := gexec(fmt.Sprintf("grep -qx %[1]s /tmp/in || { echo %[1]s;%[2]s } >>/tmp/in", line, more))
			return err
		})
	}
	serverReceives := func(what string, want ...string) {
		t.Helper()
		_ = sconn.SetReadDeadline(time.Now().Add(2 * time.Minute))
		for _, w := range want {
			got, err := sr.ReadString('\n')
			if err != nil || got != w+"\n" {
				t.Fatalf("%s: the server read %q (%v), want %q; the guest: %s", what, abbrev(got), err, abbrev(w), guestState())
			}
		}
	}
	// The server's own connections to the VM stay refused while it has
	// one open with the VM.
	serverRefused := func(when string) {
		t.Helper()
		testenv.Eventually(t, time.Minute, when+": the outsider on "+srvNode+" reaches the VM's echo port (positive control)", func() error {
			return echo(srv.netns)
		})
		if got := dial(srv.netns, guest.HTTPPort); got != "timed out" {
			t.Errorf("%s: the server (the outsider on %s) to the VM's HTTP port: %s; want timed out (its connection with the VM opens no other)", when, srvNode, got)
		}
	}

	before, after := "server-before-migration", "server-after-migration "+strings.Repeat("0123456789", 300)
	serverSends(before)
	guestHas("before the migration: the guest receives the server's line", before+"\n")
	guestSends("before the migration: the guest sends its line", "guest-before-migration", "")
	serverReceives("before the migration: the guest's line", "guest-before-migration")
	serverRefused("before the migration")

	migrate(t, c, ns, name, "mig")
	to := runningOn(t, c, ns, name)
	if to != target {
		t.Fatalf("the VM migrated from %s to %s, not to %s: the server on %s is not on a third node", from, to, target, srvNode)
	}
	// The server speaks first on the connection, which the target has
	// never seen: its segments come in to the VM, whose ingress is
	// isolated.
	serverSends(after)
	guestHas("after the live migration: the guest receives the server's line, sent first on the connection the guest opened before it",
		before+"\n"+after+"\n")
	// Then the guest: a line of its own and the server's back.
	guestSends("after the live migration: the guest sends its lines", "guest-after-migration", " tail -n 1 /tmp/out;")
	serverReceives("after the live migration: the guest's lines on the connection the server spoke first on", "guest-after-migration", after)
	t.Logf("a connection the guest opened on %s to the server on %s: lines both ways before the migration to %s and, the server first, %d bytes after it",
		from, srvNode, to, len(after)+1)
	serverRefused("after the live migration")
	check("after the live migration")
}

// pushPort is where the server of TestLabVMPolicyAcrossMigration listens
// for the guest's connection.
const pushPort = 9000

// abbrev shortens s for a message: its start and end.
func abbrev(s string) string {
	if len(s) <= 80 {
		return s
	}
	return fmt.Sprintf("%s...(%d bytes)...%s", s[:40], len(s)-80, s[len(s)-40:])
}
