package demo

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"kvnet.io/kvnet/internal/k8s/controllers/epmirror"
	"kvnet.io/kvnet/internal/lab/cli/lab"
	"kvnet.io/kvnet/internal/lab/guest"
	"kvnet.io/kvnet/internal/node"
	"kvnet.io/kvnet/internal/podnetworks"
)

// demoService is the Service of examples/ in front of the VM vm-a;
// demoServiceOutsider is a pod of another tenant, which must not reach it.
const (
	demoService         = "vm-a-web"
	demoServiceOutsider = "tenant-b/db-1"
)

// printVMService shows the VM's Service: a pod of the VM's UDN fetches the
// guest's page through the cluster IP (the guest names its VM), and a pod
// of another tenant, which reaches its own gateway (control), gets nothing
// there; then the same through the node port (printNodePort).
func printVMService(ctx context.Context, out io.Writer, c client.Client, labDir string, pods map[string]labPod, pr prober, timeout time.Duration) error {
	var svc corev1.Service
	if err := c.Get(ctx, client.ObjectKey{Namespace: demoVMNamespace, Name: demoService}, &svc); err != nil {
		return fmt.Errorf("service %s/%s (examples/ creates it): %w", demoVMNamespace, demoService, err)
	}
	vip, err := netip.ParseAddr(svc.Spec.ClusterIP)
	if err != nil {
		return fmt.Errorf("service %s/%s has no cluster IP (%q)", demoVMNamespace, demoService, svc.Spec.ClusterIP)
	}
	addr := netip.AddrPortFrom(vip, guest.HTTPPort)
	peer, ok := pods[demoVMPeer]
	if !ok {
		return fmt.Errorf("pod %s is not running on a simulated node", demoVMPeer)
	}
	outsider, ok := pods[demoServiceOutsider]
	if !ok {
		return fmt.Errorf("pod %s is not running on a simulated node", demoServiceOutsider)
	}
	fmt.Fprintf(out, "\n== Service %s/%s (cluster IP %s) in front of VM %s, load-balanced by the UDN's routers\n", demoVMNamespace, demoService, vip, demoVM)
	var page string
	deadline := time.Now().Add(timeout)
	for {
		page, err = httpGet(ctx, peer.netns, addr)
		if err == nil && strings.Contains(page, demoVM) || time.Now().After(deadline) {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	if err != nil || !strings.Contains(page, demoVM) {
		fmt.Fprintf(out, "  blocked %s -> http://%s/   <-- WRONG\n", peer, addr)
		return fmt.Errorf("%s cannot fetch http://%s/ (Service %s): %q, %v", peer, addr, demoService, page, err)
	}
	fmt.Fprintf(out, "  reached %s (%s) -> http://%s/: the guest answered %q\n", peer, peer.pod.Spec.NodeName, addr, strings.TrimSpace(page))
	if err := printMirror(ctx, out, c, &svc, timeout); err != nil {
		return err
	}
	if err := printGuestDNS(ctx, out, c, &svc, peer, timeout); err != nil {
		return err
	}
	gw := gatewayFor(outsider.a, outsider.ip())
	if gw == "" {
		return fmt.Errorf("pod %s has no gateway to prove it can send (control)", outsider)
	}
	if r := expectAnswer(ctx, pr, probe{netns: outsider.netns, addr: gw}); r.outcome != answered {
		return fmt.Errorf("control: %s does not reach its own gateway %s: %s", outsider, gw, r)
	}
	if page, err := httpGet(ctx, outsider.netns, addr); err == nil {
		fmt.Fprintf(out, "  reached %s -> http://%s/   <-- WRONG: another tenant\n", outsider, addr)
		return fmt.Errorf("%s, of another tenant, fetched http://%s/: %q", outsider, addr, page)
	}
	fmt.Fprintf(out, "  blocked %s -> http://%s/ (another tenant; control: its gateway %s answered)\n", outsider, addr, gw)
	return printNodePort(ctx, out, c, labDir, &svc, outsider)
}

// printNodePort shows the Service's node port: the first simulated node
// fetches the guest's page at every node's address and that port, and the
// other tenant's pod, which reached its gateway just before, gets nothing
// there.
func printNodePort(ctx context.Context, out io.Writer, c client.Client, labDir string, svc *corev1.Service, outsider labPod) error {
	var port int32
	for _, p := range svc.Spec.Ports {
		if p.Port == guest.HTTPPort {
			port = p.NodePort
		}
	}
	if port == 0 {
		return fmt.Errorf("service %s/%s has no node port for port %d (examples/ makes it type NodePort)", svc.Namespace, svc.Name, guest.HTTPPort)
	}
	var nodes corev1.NodeList
	if err := c.List(ctx, &nodes); err != nil {
		return err
	}
	var names []string
	addrs := map[string]netip.Addr{}
	for _, nd := range nodes.Items {
		if a, err := netip.ParseAddr(nd.Annotations[node.VTEPAnnotation]); err == nil {
			names = append(names, nd.Name)
			addrs[nd.Name] = a
		}
	}
	if len(names) == 0 {
		return fmt.Errorf("no simulated node has an address (annotation %s)", node.VTEPAnnotation)
	}
	slices.Sort(names)
	from := names[0]
	netns := lab.NodeNetNS(labDir, from)
	for _, to := range names {
		at := netip.AddrPortFrom(addrs[to], uint16(port))
		page, err := httpGet(ctx, netns, at)
		if err != nil || !strings.Contains(page, demoVM) {
			fmt.Fprintf(out, "  blocked node %s -> http://%s/ (node port of %s)   <-- WRONG\n", from, at, to)
			return fmt.Errorf("node %s cannot fetch http://%s/ (node port %d of Service %s): %q, %v", from, at, port, svc.Name, page, err)
		}
		fmt.Fprintf(out, "  reached node %s -> http://%s/ (node port of %s): the guest answered %q\n", from, at, to, strings.TrimSpace(page))
	}
	at := netip.AddrPortFrom(addrs[from], uint16(port))
	if page, err := httpGet(ctx, outsider.netns, at); err == nil {
		fmt.Fprintf(out, "  reached %s -> http://%s/   <-- WRONG: another tenant\n", outsider, at)
		return fmt.Errorf("%s, of another tenant, fetched http://%s/: %q", outsider, at, page)
	}
	fmt.Fprintf(out, "  blocked %s -> http://%s/ (another tenant, through the node port)\n", outsider, at)
	return nil
}

// printMirror shows the Service's EndpointSlice mirror: it lists the VM's
// UDN address (its launcher pod's primary attachment), where the default
// controller's slice has the pod's cluster default network address.
func printMirror(ctx context.Context, out io.Writer, c client.Client, svc *corev1.Service, timeout time.Duration) error {
	_, launcher, err := runningVMI(ctx, c, demoVM, timeout)
	if err != nil {
		return err
	}
	var vmAddrs []string
	for _, ip := range primaryOf(launcher).IPAddresses {
		vmAddrs = append(vmAddrs, strings.Split(ip, "/")[0])
	}
	deadline := time.Now().Add(timeout)
	for {
		var list discoveryv1.EndpointSliceList
		if err := c.List(ctx, &list, client.InNamespace(svc.Namespace),
			client.MatchingLabels{discoveryv1.LabelManagedBy: epmirror.MirrorController, epmirror.ServiceNameLabel: svc.Name}); err != nil {
			return err
		}
		for _, m := range list.Items {
			for _, e := range m.Endpoints {
				if slices.ContainsFunc(e.Addresses, func(a string) bool { return slices.Contains(vmAddrs, a) }) {
					fmt.Fprintf(out, "  EndpointSlice %s (network %s) lists %s, VM %s's UDN address\n",
						m.Name, m.Annotations[epmirror.NetworkAnnotation], strings.Join(e.Addresses, ","), demoVM)
					return nil
				}
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no EndpointSlice mirror of Service %s lists VM %s's UDN address %v (%d mirrors)", svc.Name, demoVM, vmAddrs, len(list.Items))
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// printGuestDNS shows the guest resolving its Service's name: DHCP gave it
// the cluster DNS Service's address and the namespace's search list, and
// the answer (the Service's cluster IP, which the guest knows from nowhere
// else) comes through the cluster DNS, reached by the UDN's router.
func printGuestDNS(ctx context.Context, out io.Writer, c client.Client, svc *corev1.Service, peer labPod, timeout time.Duration) error {
	var dns corev1.Service
	if err := c.Get(ctx, client.ObjectKey{Namespace: node.DefaultClusterDNS.Namespace, Name: node.DefaultClusterDNS.Name}, &dns); err != nil {
		return fmt.Errorf("the lab's cluster DNS Service %s: %w", node.DefaultClusterDNS, err)
	}
	_, launcher, err := runningVMI(ctx, c, demoVM, timeout)
	if err != nil {
		return err
	}
	vmIP, err := netip.ParseAddr(firstAddr(primaryOf(launcher)))
	if err != nil {
		return fmt.Errorf("launcher pod %s has no primary address: %w", launcher.Name, err)
	}
	name := fmt.Sprintf("%s.%s.svc.cluster.local", svc.Name, svc.Namespace)
	wantNS := "nameserver " + dns.Spec.ClusterIP
	var got string
	deadline := time.Now().Add(timeout)
	for {
		ectx, cancel := context.WithTimeout(ctx, 5*time.Second)
		got, err = guest.Exec(ectx, peer.netns, vmIP, "cat /etc/resolv.conf; echo ---; nslookup "+name+"; true")
		cancel()
		resolv, answer, _ := strings.Cut(got, "---")
		_, answer, _ = strings.Cut(answer, name) // the answer section, after the server's lines
		if err == nil && strings.Contains(resolv, wantNS) && strings.Contains(answer, svc.Spec.ClusterIP) {
			search := ""
			for _, l := range strings.Split(resolv, "\n") {
				if s, ok := strings.CutPrefix(l, "search "); ok {
					search = s
				}
			}
			fmt.Fprintf(out, "  guest %s resolved %s to %s through the cluster DNS %s (from DHCP, search %s)\n",
				demoVM, name, svc.Spec.ClusterIP, dns.Spec.ClusterIP, search)
			return nil
		}
		if time.Now().After(deadline) {
			fmt.Fprintf(out, "  guest %s could not resolve %s through the cluster DNS   <-- WRONG\n", demoVM, name)
			return fmt.Errorf("guest %s: %s through %s: %v\n%s", demoVM, name, dns.Spec.ClusterIP, err, got)
		}
		time.Sleep(time.Second)
	}
}

// primaryOf returns pod's primary attachment, or the zero one.
func primaryOf(pod *corev1.Pod) podnetworks.Attachment {
	nets, _ := podnetworks.Parse(pod.Annotations[podnetworks.Annotation])
	for _, a := range nets {
		if a.Role == podnetworks.RolePrimary {
			return a
		}
	}
	return podnetworks.Attachment{}
}
