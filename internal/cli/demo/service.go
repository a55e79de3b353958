package demo

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"kvnet.io/kvnet/internal/sim/guest"
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
// there.
func printVMService(ctx context.Context, out io.Writer, c client.Client, pods map[string]labPod, pr prober, timeout time.Duration) error {
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
	return nil
}
