package e2e

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kubevirtv1 "kvnet.io/kvnet/api/kubevirt/v1"
	udnv1 "kvnet.io/kvnet/api/udn/v1"
	"kvnet.io/kvnet/internal/hostsubnet"
	"kvnet.io/kvnet/internal/lab/cli/lab"
	"kvnet.io/kvnet/internal/lab/guest"
	"kvnet.io/kvnet/internal/lab/simkubelet"
	"kvnet.io/kvnet/internal/lab/simvirt"
	"kvnet.io/kvnet/internal/podnetworks"
	"kvnet.io/kvnet/internal/testenv"
)

// layer3UDN makes namespace ns with a primary Layer3 UDN on cidr, /24 per
// node.
func layer3UDN(t testing.TB, c client.Client, ns, cidr string) {
	t.Helper()
	primaryNamespace(t, c, ns)
	if err := c.Create(context.Background(), &udnv1.UserDefinedNetwork{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "net"},
		Spec: udnv1.UserDefinedNetworkSpec{Topology: udnv1.NetworkTopologyLayer3, Layer3: &udnv1.Layer3Config{
			Role: udnv1.NetworkRolePrimary, Subnets: []udnv1.Layer3Subnet{{CIDR: udnv1.CIDR(cidr), HostSubnet: 24}}}},
	}); err != nil {
		t.Fatal(err)
	}
}

// TestLabLayer3: two tenants' primary Layer3 UDNs with the same subnet on
// two nodes. Each node gets its own host subnet per network, and pods and
// the VM's guest (DHCP from its node's router) get addresses from their
// node's; a tenant's pods and guest reach each other across the nodes;
// the other tenant's pod, on the same node, never reaches the guest; host
// subnets survive a restart of the whole lab (kvnet-controller included).
func TestLabLayer3(t *testing.T) {
	testenv.NeedsRoot(t)
	_, run := buildKvnet(t)
	dir := t.TempDir()
	showLabLogOnFailure(t, dir)
	run("up", "--dir", dir, "--nodes", "2")
	t.Cleanup(func() { run("down", "--dir", dir) })
	c := labClient(t, dir)
	ctx := context.Background()
	layer3UDN(t, c, "l3-red", "10.60.0.0/16")
	layer3UDN(t, c, "l3-blue", "10.60.0.0/16")

	mkPod := func(ns, name, node string) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}
		if err := c.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	pods := []*corev1.Pod{
		mkPod("l3-red", "p1", lab.NodeName(1)), mkPod("l3-red", "p2", lab.NodeName(2)),
		mkPod("l3-blue", "p1", lab.NodeName(1)), mkPod("l3-blue", "p2", lab.NodeName(2)),
	}
	vm := l2bridgeVM("l3-red", "vm-1")
	if err := c.Create(ctx, vm); err != nil {
		t.Fatal(err)
	}

	// Host subnets: one per node and network, distinct per network.
	nodeSubnets := func() map[string]hostsubnet.Subnets {
		out := map[string]hostsubnet.Subnets{}
		testenv.Eventually(t, time.Minute, "host subnets of both networks on both nodes", func() error {
			for i := 1; i <= 2; i++ {
				var n corev1.Node
				if err := c.Get(ctx, client.ObjectKey{Name: lab.NodeName(i)}, &n); err != nil {
					return err
				}
				s, err := hostsubnet.Parse(n.Annotations[hostsubnet.Annotation])
				if err != nil {
					return err
				}
				if len(s["l3-red_net"]) != 1 || len(s["l3-blue_net"]) != 1 {
					return fmt.Errorf("node %s: %v", n.Name, s)
				}
				out[n.Name] = s
			}
			return nil
		})
		return out
	}
	subnets := nodeSubnets()
	if subnets[lab.NodeName(1)]["l3-red_net"][0] == subnets[lab.NodeName(2)]["l3-red_net"][0] {
		t.Fatalf("both nodes hold the same host subnet: %v", subnets)
	}

	ips := map[string]netip.Addr{} // "ns/name" -> address
	for _, p := range pods {
		testenv.Eventually(t, time.Minute, "pod "+p.Namespace+"/"+p.Name+" running", func() error {
			if err := c.Get(ctx, client.ObjectKeyFromObject(p), p); err != nil {
				return err
			}
			if p.Status.Phase != corev1.PodRunning {
				return fmt.Errorf("phase %q", p.Status.Phase)
			}
			return nil
		})
		nets, err := podnetworks.Parse(p.Annotations[podnetworks.Annotation])
		if err != nil {
			t.Fatal(err)
		}
		a := nets[p.Namespace+"/net"]
		ip := netip.MustParsePrefix(a.IPAddresses[0])
		hs := subnets[p.Spec.NodeName][p.Namespace+"_net"][0]
		if !hs.Contains(ip.Addr()) || a.GatewayIPs[0] != hostsubnet.Gateway(hs).String() {
			t.Errorf("pod %s/%s on %s: %s via %v, want an address of its node's host subnet %s via its router", p.Namespace, p.Name, p.Spec.NodeName, ip, a.GatewayIPs, hs)
		}
		ips[p.Namespace+"/"+p.Name] = ip.Addr()
	}

	lease := waitBoot(t, dir, "l3-red", "vm-1", 1)
	var vmi kubevirtv1.VirtualMachineInstance
	testenv.Eventually(t, time.Minute, "VMI running", func() error {
		if err := c.Get(ctx, client.ObjectKey{Namespace: "l3-red", Name: "vm-1"}, &vmi); err != nil {
			return err
		}
		if vmi.Status.Phase != simvirt.PhaseRunning {
			return fmt.Errorf("phase %q", vmi.Status.Phase)
		}
		return nil
	})
	hs := subnets[vmi.Status.NodeName]["l3-red_net"][0]
	if !hs.Contains(lease.IP()) || lease.Router != hostsubnet.Gateway(hs) {
		t.Fatalf("guest lease %+v on %s, want an address of the node's host subnet %s via %s", lease, vmi.Status.NodeName, hs, hostsubnet.Gateway(hs))
	}

	netnsOf := func(p *corev1.Pod) string { return simkubelet.PodNetNS(lab.KubeletConfig(dir, p.Spec.NodeName), p) }
	ping := func(p *corev1.Pod, dst netip.Addr) error {
		out, err := exec.Command("nsenter", "--net="+netnsOf(p), "busybox", "ping", "-c", "2", "-W", "2", dst.String()).CombinedOutput()
		if err != nil {
			return fmt.Errorf("ping %s from %s/%s: %v: %s", dst, p.Namespace, p.Name, err, out)
		}
		return nil
	}
	// Pods of one tenant, across the nodes, both ways.
	for _, tc := range [][2]int{{0, 1}, {1, 0}, {2, 3}, {3, 2}} {
		from, to := pods[tc[0]], pods[tc[1]]
		if err := ping(from, ips[to.Namespace+"/"+to.Name]); err != nil {
			t.Error(err)
		}
	}
	// The guest answers with its name, from pods of its tenant on both
	// nodes (one of them across nodes).
	httpGet := func(p *corev1.Pod) (string, error) {
		dctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		conn, err := guest.DialContext(dctx, netnsOf(p), "tcp", netip.AddrPortFrom(lease.IP(), guest.HTTPPort).String())
		if err != nil {
			return "", err
		}
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(3 * time.Second))
		fmt.Fprintf(conn, "GET / HTTP/1.0\r\n\r\n")
		b, err := io.ReadAll(conn)
		return string(b), err
	}
	for _, p := range pods[:2] {
		testenv.Eventually(t, 30*time.Second, "l3-red/"+p.Name+" reaches the guest", func() error {
			body, err := httpGet(p)
			if err != nil {
				return err
			}
			if !strings.Contains(body, "vm-1") {
				return fmt.Errorf("answer %q does not name vm-1", body)
			}
			return nil
		})
	}
	// The guest reaches the pods of its tenant on both nodes.
	for _, p := range pods[:2] {
		if out, err := guest.Exec(ctx, netnsOf(pods[0]), lease.IP(), "ping -c 2 -W 2 "+ips["l3-red/"+p.Name].String()+" >/dev/null && echo ok"); err != nil || !strings.Contains(out, "ok") {
			t.Errorf("guest to l3-red/%s: %q, %v", p.Name, out, err)
		}
	}
	// Another tenant with the same subnet: its pods reach their own
	// (above) and never the guest.
	for _, p := range pods[2:] {
		if body, err := httpGet(p); err == nil && strings.Contains(body, "vm-1") {
			t.Errorf("l3-blue/%s reached l3-red's guest: %q", p.Name, body)
		}
	}

	// Host subnets survive restarting the lab, kvnet-controller included.
	run("down", "--dir", dir)
	run("up", "--dir", dir, "--nodes", "2")
	c = labClient(t, dir) // the restarted API server listens elsewhere
	after := nodeSubnets()
	for node, s := range subnets {
		if !hostsubnet.Equal(after[node], s) {
			t.Errorf("node %s: host subnets %v after the restart, were %v", node, after[node], s)
		}
	}
	second := waitBoot(t, dir, "l3-red", "vm-1", 2)
	if !after[vmi.Status.NodeName]["l3-red_net"][0].Contains(second.IP()) && !after[lab.NodeName(1)]["l3-red_net"][0].Contains(second.IP()) && !after[lab.NodeName(2)]["l3-red_net"][0].Contains(second.IP()) {
		t.Errorf("after the restart the guest got %s, outside every host subnet", second.IP())
	}
}
