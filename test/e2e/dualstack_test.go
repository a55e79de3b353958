package e2e

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ipamv1alpha1 "kvnet.io/kvnet/api/k8scni/v1alpha1"
	kubevirtv1 "kvnet.io/kvnet/api/kubevirt/v1"
	udnv1 "kvnet.io/kvnet/api/udn/v1"
	"kvnet.io/kvnet/internal/cli/why"
	"kvnet.io/kvnet/internal/lab/cli/lab"
	"kvnet.io/kvnet/internal/lab/guest"
	"kvnet.io/kvnet/internal/lab/simkubelet"
	"kvnet.io/kvnet/internal/lab/simlauncher"
	"kvnet.io/kvnet/internal/lab/simvirt"
	"kvnet.io/kvnet/internal/testenv"
	"kvnet.io/kvnet/internal/vmclaims"
)

// consoleLeases returns every eth0 lease of both families a VM's guests
// reported on the console, in order: DHCPv4 and DHCPv6 apart.
func consoleLeases(t testing.TB, dir, ns, name string) (v4, v6 []guest.Lease) {
	t.Helper()
	b, err := os.ReadFile(simlauncher.ConsoleLog(lab.VMsDir(dir), ns, name))
	if err != nil {
		return nil, nil
	}
	for _, line := range strings.Split(string(b), "\n") {
		if i := strings.Index(line, guest.Lease6Prefix+" "); i >= 0 {
			if l, err := guest.ParseLease6(line[i:]); err == nil && l.Iface == "eth0" {
				v6 = append(v6, l)
			}
		} else if i := strings.Index(line, guest.LeasePrefix+" "); i >= 0 {
			if l, err := guest.ParseLease(line[i:]); err == nil && l.Iface == "eth0" {
				v4 = append(v4, l)
			}
		}
	}
	return v4, v6
}

// dsVM is one VM of TestLabDualStackVMs: its namespace's UDN subnets,
// and what the test learned of it.
type dsVM struct {
	ns      string
	subnets []string
	peers   map[string]string // node -> the netns of a pod of the network there
	ips     []netip.Addr
	v4, v6  int // console leases seen so far, per family
}

// claimIPs returns the addresses the IPAMClaim of vm's pod network holds.
func claimIPs(ctx context.Context, c client.Client, ns, vm string) ([]netip.Addr, error) {
	var claim ipamv1alpha1.IPAMClaim
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: vmclaims.ClaimName(vm, "podnet")}, &claim); err != nil {
		return nil, err
	}
	var out []netip.Addr
	for _, s := range claim.Status.IPs {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("IPAMClaim %s/%s status.ips %q: %w", ns, claim.Name, s, err)
		}
		out = append(out, p.Addr())
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out, nil
}

// httpGet fetches http://addr/ from netns and returns the body's first
// line.
func httpGet(ctx context.Context, netns string, addr netip.AddrPort) (string, error) {
	dctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	conn, err := guest.DialContext(dctx, netns, "tcp", addr.String())
	if err != nil {
		return "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(3 * time.Second))
	fmt.Fprintf(conn, "GET / HTTP/1.0\r\nHost: vm\r\n\r\n")
	b, err := io.ReadAll(conn)
	if err != nil {
		return "", err
	}
	_, body, ok := strings.Cut(string(b), "\r\n\r\n")
	if !ok {
		return "", fmt.Errorf("no HTTP body in %q", b)
	}
	return strings.TrimSpace(body), nil
}

// A VM on a dual-stack primary Layer2 UDN with persistent IPs (l2bridge)
// and one on an IPv6-only one: each guest's console leases (DHCPv4 from
// kvnet-node, DHCPv6 after its router advertisement) are its IPAMClaim's
// status.ips, and a pod on another node reaches its HTTP server at each
// of them; the VMI reports those addresses as the guest's (the lab's
// guest agent) and kvnet why calls the VM healthy. The same holds after a
// live migration (where the guest's
// DHCPv6 renewal is answered by the target node) and after stop/start. A
// RequireDualStack Service in front of the dual-stack VM, and a
// PreferDualStack one in front of the IPv6-only VM, are each reached at
// their IPv6 cluster IP. A guest that releases its IPv6 address is
// reported by kvnet why (GuestAddressMissing) until it leases it again.
func TestLabDualStackVMs(t *testing.T) {
	dir, c := threeNodeLab(t)
	ctx := context.Background()

	vms := map[string]*dsVM{
		"vm-ds": {ns: "e2e-ds", subnets: []string{"10.80.0.0/16", "fd80:0:0:10::/60"}},
		"vm-v6": {ns: "e2e-v6", subnets: []string{"fd81:0:0:20::/60"}},
	}
	names := []string{"vm-ds", "vm-v6"}
	for _, name := range names {
		v := vms[name]
		primaryNamespace(t, c, v.ns)
		var subnets udnv1.DualStackCIDRs
		for _, s := range v.subnets {
			subnets = append(subnets, udnv1.CIDR(s))
		}
		if err := c.Create(ctx, &udnv1.UserDefinedNetwork{
			ObjectMeta: metav1.ObjectMeta{Namespace: v.ns, Name: "net"},
			Spec: udnv1.UserDefinedNetworkSpec{Topology: udnv1.NetworkTopologyLayer2, Layer2: &udnv1.Layer2Config{
				Role: udnv1.NetworkRolePrimary, Subnets: subnets,
				IPAM: &udnv1.IPAMConfig{Lifecycle: udnv1.IPAMLifecyclePersistent}}},
		}); err != nil {
			t.Fatal(err)
		}
		vm := l2bridgeVM(v.ns, name)
		vm.Spec.Template.ObjectMeta.Labels = map[string]string{"app": name}
		if err := c.Create(ctx, vm); err != nil {
			t.Fatal(err)
		}
	}
	// A dual-stack Service in front of each VM: RequireDualStack for
	// vm-ds, PreferDualStack for vm-v6 (both get both families in a
	// dual-stack cluster; vm-v6 is reached at the IPv6 one only).
	policies := map[string]corev1.IPFamilyPolicy{"vm-ds": corev1.IPFamilyPolicyRequireDualStack, "vm-v6": corev1.IPFamilyPolicyPreferDualStack}
	svcs := map[string]*corev1.Service{}
	for _, name := range names {
		policy := policies[name]
		svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: vms[name].ns, Name: "web"},
			Spec: corev1.ServiceSpec{Selector: map[string]string{"app": name}, IPFamilyPolicy: &policy,
				Ports: []corev1.ServicePort{{Name: "http", Port: 8080, TargetPort: intstr.FromInt32(guest.HTTPPort)}}}}
		if err := c.Create(ctx, svc); err != nil {
			t.Fatal(err)
		}
		svcs[name] = svc
	}

	// Peers: a pod per network on every node; checks use one on a node
	// other than the VM's.
	for _, name := range names {
		v := vms[name]
		v.peers = map[string]string{}
		for i := 1; i <= 3; i++ {
			node := lab.NodeName(i)
			p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: v.ns, Name: fmt.Sprintf("peer-%d", i)},
				Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}
			if err := c.Create(ctx, p); err != nil {
				t.Fatal(err)
			}
			testenv.Eventually(t, time.Minute, v.ns+"/"+p.Name+" Running", func() error {
				if err := c.Get(ctx, client.ObjectKeyFromObject(p), p); err != nil {
					return err
				}
				if p.Status.Phase != corev1.PodRunning {
					return fmt.Errorf("phase %q", p.Status.Phase)
				}
				return nil
			})
			v.peers[node] = simkubelet.PodNetNS(lab.KubeletConfig(dir, node), p)
		}
	}
	// peer returns the netns of a peer of the VM on another node than
	// node, and that node.
	peer := func(v *dsVM, node string) (string, string) {
		for i := 1; i <= 3; i++ {
			if n := lab.NodeName(i); n != node {
				return v.peers[n], n
			}
		}
		panic("one node")
	}

	// check waits until the VM's guest has reported, after the leases
	// seen so far, a lease of each family its claim holds an address of,
	// each the claim's address (addresses compared, not prefix lengths:
	// dhcpcd adds a /128; the last DHCPv4 one may be an earlier one
	// unless renews4); then the peer reaches the guest's HTTP server
	// at each address. The claim's addresses must be the first check's.
	check := func(name, when string, renews4 bool) {
		t.Helper()
		v := vms[name]
		node := runningOn(t, c, v.ns, name)
		var ips []netip.Addr
		testenv.Eventually(t, time.Minute, "IPAMClaim of "+name+" holds its addresses", func() error {
			var err error
			if ips, err = claimIPs(ctx, c, v.ns, name); err != nil {
				return err
			}
			if len(ips) != len(v.subnets) {
				return fmt.Errorf("status.ips %v, want one per subnet of %v", ips, v.subnets)
			}
			return nil
		})
		if v.ips == nil {
			v.ips = ips
		} else if !slices.Equal(ips, v.ips) {
			t.Fatalf("%s %s: IPAMClaim holds %v, before %v", name, when, ips, v.ips)
		}
		var l4, l6 []guest.Lease
		testenv.Eventually(t, 2*time.Minute, fmt.Sprintf("%s %s: the guest's leases on its console", name, when), func() error {
			l4, l6 = consoleLeases(t, dir, v.ns, name)
			var got []netip.Addr
			for _, ip := range ips {
				ls, seen := l4, v.v4
				if !renews4 {
					seen--
				}
				if ip.Is6() {
					ls, seen = l6, v.v6
				}
				if len(ls) <= seen {
					return fmt.Errorf("no new %s lease (%d so far); claim %v", map[bool]string{false: "DHCPv4", true: "DHCPv6"}[ip.Is6()], len(ls), ips)
				}
				got = append(got, ls[len(ls)-1].IP())
			}
			slices.SortFunc(got, netip.Addr.Compare)
			if !slices.Equal(got, ips) {
				return fmt.Errorf("the guest's last leases are %v, IPAMClaim status.ips %v", got, ips)
			}
			return nil
		})
		v.v4, v.v6 = len(l4), len(l6)
		peerNS, peerNode := peer(v, node)
		for _, ip := range ips {
			testenv.Eventually(t, time.Minute, fmt.Sprintf("%s %s: the peer reaches http://%s", name, when, ip), func() error {
				got, err := httpGet(ctx, peerNS, netip.AddrPortFrom(ip, guest.HTTPPort))
				if err != nil {
					return err
				}
				if got != name {
					return fmt.Errorf("answer %q, want %q", got, name)
				}
				return nil
			})
		}
		// The VMI reports the guest's addresses, as KubeVirt does from the
		// guest agent (the lab's: the console leases), and kvnet why finds
		// each claimed address there.
		testenv.Eventually(t, time.Minute, fmt.Sprintf("%s %s: the VMI reports the guest's addresses", name, when), func() error {
			var vmi kubevirtv1.VirtualMachineInstance
			if err := c.Get(ctx, client.ObjectKey{Namespace: v.ns, Name: name}, &vmi); err != nil {
				return err
			}
			for _, i := range vmi.Status.Interfaces {
				if i.Name != "podnet" {
					continue
				}
				var got []netip.Addr
				for _, s := range i.IPs {
					if a, err := netip.ParseAddr(s); err == nil {
						got = append(got, a)
					}
				}
				slices.SortFunc(got, netip.Addr.Compare)
				if i.InfoSource != simvirt.InfoSource || i.InterfaceName != "eth0" || !slices.Equal(got, ips) {
					return fmt.Errorf("status.interfaces[podnet] %+v, want the guest's eth0 with %v from %q", i, ips, simvirt.InfoSource)
				}
				return nil
			}
			return fmt.Errorf("no podnet in status.interfaces %+v", vmi.Status.Interfaces)
		})
		rep, err := why.Diagnose(ctx, c, "vm", v.ns, name, why.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if !rep.Healthy() {
			var b strings.Builder
			rep.Print(&b)
			t.Fatalf("%s %s: kvnet why vm:\n%s", name, when, b.String())
		}
		t.Logf("%s %s on %s: leases %v = IPAMClaim status.ips = the VMI's guest addresses, reached over HTTP at each from a pod on %s", name, when, node, ips, peerNode)
	}
	for _, name := range names {
		check(name, "at boot", true)
	}

	// The Services: an IPv6 cluster IP each, and a real IPv6 connection
	// to the guest through it.
	svc6 := map[string]netip.Addr{}
	for _, name := range names {
		svc := svcs[name]
		if err := c.Get(ctx, client.ObjectKeyFromObject(svc), svc); err != nil {
			t.Fatal(err)
		}
		for _, s := range svc.Spec.ClusterIPs {
			if a, err := netip.ParseAddr(s); err == nil && a.Is6() {
				svc6[name] = a
			}
		}
		if !svc6[name].IsValid() || len(svc.Spec.ClusterIPs) != 2 {
			t.Fatalf("Service %s/%s (%s) has cluster IPs %v, want an IPv4 and an IPv6 one", svc.Namespace, svc.Name, *svc.Spec.IPFamilyPolicy, svc.Spec.ClusterIPs)
		}
	}
	// viaServices fetches each VM's page through its Service's IPv6
	// cluster IP, from a peer on another node than the VM's.
	viaServices := func(when string) {
		t.Helper()
		for _, name := range names {
			v := vms[name]
			testenv.Eventually(t, time.Minute, fmt.Sprintf("%s: a pod reaches %s through its %s Service's IPv6 cluster IP [%s]:8080", when, name, policies[name], svc6[name]), func() error {
				netns, _ := peer(v, runningOn(t, c, v.ns, name))
				got, err := httpGet(ctx, netns, netip.AddrPortFrom(svc6[name], 8080))
				if err != nil {
					return err
				}
				if got != name {
					return fmt.Errorf("answer %q, want %q", got, name)
				}
				return nil
			})
		}
		t.Logf("%s: each VM reached through its Service's IPv6 cluster IP %v", when, svc6)
	}
	viaServices("at boot")

	// An IPv6 single-stack Service in front of the dual-stack VM: one
	// IPv6 cluster IP, reached over IPv6.
	single := corev1.IPFamilyPolicySingleStack
	web6 := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: vms["vm-ds"].ns, Name: "web6"},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "vm-ds"}, IPFamilyPolicy: &single, IPFamilies: []corev1.IPFamily{corev1.IPv6Protocol},
			Ports: []corev1.ServicePort{{Name: "http", Port: 8081, TargetPort: intstr.FromInt32(guest.HTTPPort)}}}}
	if err := c.Create(ctx, web6); err != nil {
		t.Fatal(err)
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(web6), web6); err != nil {
		t.Fatal(err)
	}
	vip6, err := netip.ParseAddr(web6.Spec.ClusterIP)
	if err != nil || !vip6.Is6() || len(web6.Spec.ClusterIPs) != 1 {
		t.Fatalf("IPv6 single-stack Service has cluster IPs %v, want one IPv6 address", web6.Spec.ClusterIPs)
	}
	testenv.Eventually(t, time.Minute, fmt.Sprintf("a pod reaches vm-ds through its IPv6 single-stack Service [%s]:8081", vip6), func() error {
		netns, _ := peer(vms["vm-ds"], runningOn(t, c, vms["vm-ds"].ns, "vm-ds"))
		got, err := httpGet(ctx, netns, netip.AddrPortFrom(vip6, 8081))
		if err == nil && got != "vm-ds" {
			err = fmt.Errorf("answer %q, want %q", got, "vm-ds")
		}
		return err
	})

	// Live migration of both VMs.
	for _, name := range names {
		v := vms[name]
		from := runningOn(t, c, v.ns, name)
		migrate(t, c, v.ns, name, "mig-"+name)
		if to := runningOn(t, c, v.ns, name); to == from {
			t.Fatalf("%s still runs on %s after its migration", name, from)
		}
		// The guest renews its DHCPv6 lease now (dhcpcd -N), rather than
		// at T1: only the target node can answer it, the source has no
		// port for the guest any more.
		ip6 := v.ips[len(v.ips)-1]
		netns, _ := peer(v, from)
		if out, err := guest.Exec(ctx, netns, ip6, "dhcpcd -6 -N eth0"); err != nil {
			t.Fatalf("%s: dhcpcd -N in the guest: %v: %s", name, err, out)
		}
		// The DHCPv4 lease is not renewed: only a new DHCPv6 one is
		// awaited.
		check(name, "after its live migration", false)
	}

	viaServices("after the live migrations")

	// Stop and start both VMs: new guests, the same addresses.
	setRunStrategy := func(ns, name, rs string) {
		t.Helper()
		patch := []byte(fmt.Sprintf(`{"spec":{"runStrategy":%q}}`, rs))
		vm := &kubevirtv1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
		if err := c.Patch(ctx, vm, client.RawPatch(types.MergePatchType, patch)); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range names {
		setRunStrategy(vms[name].ns, name, "Halted")
	}
	for _, name := range names {
		v := vms[name]
		testenv.Eventually(t, 2*time.Minute, name+"'s VMI gone", func() error {
			var vmi kubevirtv1.VirtualMachineInstance
			if err := c.Get(ctx, client.ObjectKey{Namespace: v.ns, Name: name}, &vmi); err == nil {
				return fmt.Errorf("VMI still there, phase %q", vmi.Status.Phase)
			}
			return nil
		})
	}
	for _, name := range names {
		setRunStrategy(vms[name].ns, name, "Always")
	}
	for _, name := range names {
		check(name, "after stop/start", true)
	}
	viaServices("after stop/start")

	// kvnet why sees a guest without its claim's IPv6 address: dhcpcd in
	// the guest releases it (the console says so, and the lab's guest
	// agent, like KubeVirt's, reports the guest without it), and
	// GuestAddressMissing names it; a new lease makes the VM healthy.
	v := vms["vm-ds"]
	netns, _ := peer(v, runningOn(t, c, v.ns, "vm-ds"))
	ip4, ip6 := v.ips[0], v.ips[len(v.ips)-1]
	guestRun := func(cmd string) {
		t.Helper()
		if out, err := guest.Exec(ctx, netns, ip4, cmd); err != nil {
			t.Fatalf("vm-ds: %s: %v: %s", cmd, err, out)
		}
	}
	diagnose := func(want why.Code) error {
		rep, err := why.Diagnose(ctx, c, "vm", v.ns, "vm-ds", why.Options{})
		if err != nil {
			return err
		}
		switch {
		case want == "" && rep.Problem != nil:
			return fmt.Errorf("not healthy: %s: %s", rep.Problem.Code, rep.Problem.Message)
		case want != "" && (rep.Problem == nil || rep.Problem.Code != want || !strings.Contains(rep.Problem.Message, ip6.String())):
			return fmt.Errorf("problem %+v, want %s naming %s", rep.Problem, want, ip6)
		}
		return nil
	}
	guestRun("dhcpcd -k eth0")
	testenv.Eventually(t, time.Minute, "kvnet why vm vm-ds: GuestAddressMissing for its released IPv6 address", func() error {
		return diagnose(why.GuestAddressMissing)
	})
	guestRun("dhcpcd -b -f /etc/dhcpcd.conf eth0 >/run/dhcpcd.eth0.out 2>&1")
	testenv.Eventually(t, time.Minute, "kvnet why vm vm-ds: healthy again with a new DHCPv6 lease", func() error {
		return diagnose("")
	})
	t.Logf("vm-ds without %s in its guest: kvnet why said %s; healthy again after a new lease", ip6, why.GuestAddressMissing)
}
