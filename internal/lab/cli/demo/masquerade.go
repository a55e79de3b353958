package demo

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/netip"
	"strings"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	kubevirtv1 "kvnet.io/kvnet/api/kubevirt/v1"
	"kvnet.io/kvnet/internal/lab/cli/lab"
	"kvnet.io/kvnet/internal/lab/guest"
	"kvnet.io/kvnet/internal/lab/simlauncher"
)

// demoMasqVM is the demo's VM with the masquerade binding, forwarding port
// 80 only.
const demoMasqVM = "vm-m"

// printMasqueradeVM shows the masquerade VM: the guest's lease is
// KubeVirt's 10.0.2.2/24, a pod fetches the guest's HTTP page through the
// launcher pod's address (the forwarded port), and the guest's echo port,
// not forwarded, does not answer there.
func printMasqueradeVM(ctx context.Context, out io.Writer, c client.Client, labDir string, pods map[string]labPod, timeout time.Duration) error {
	if err := c.Get(ctx, client.ObjectKey{Namespace: demoVMNamespace, Name: demoMasqVM}, &kubevirtv1.VirtualMachine{}); err != nil {
		return fmt.Errorf("VirtualMachine %s/%s (examples/ creates it): %w", demoVMNamespace, demoMasqVM, err)
	}
	peer, ok := pods[demoVMPeer]
	if !ok {
		return fmt.Errorf("pod %s is not running on a simulated node", demoVMPeer)
	}
	fmt.Fprintf(out, "\n== VirtualMachine %s/%s: masquerade on the pod network, port 80 forwarded\n", demoVMNamespace, demoMasqVM)
	vmi, pod, err := runningVMI(ctx, c, demoMasqVM, timeout)
	if err != nil {
		return err
	}
	var podIP netip.Addr
	for _, i := range vmi.Status.Interfaces {
		if a, err := netip.ParseAddr(i.IP); err == nil && a.Is4() {
			podIP = a
		}
	}
	if !podIP.IsValid() {
		return fmt.Errorf("VirtualMachineInstance %s/%s reports no IPv4 address on the pod network", demoVMNamespace, demoMasqVM)
	}
	// The guest's page, through the pod address: it names the VM.
	var page string
	deadline := time.Now().Add(timeout)
	for {
		page, err = httpGet(ctx, peer.netns, netip.AddrPortFrom(podIP, guest.HTTPPort))
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	if err != nil {
		fmt.Fprintf(out, "  blocked %s -> %s:%d (pod %s on %s)   <-- WRONG\n", peer, podIP, guest.HTTPPort, pod.Name, pod.Spec.NodeName)
		return fmt.Errorf("%s cannot fetch http://%s/ from VM %s: %w", peer, podIP, demoMasqVM, err)
	}
	if !strings.Contains(page, demoMasqVM) {
		return fmt.Errorf("http://%s/ answered %q, not the guest of %s", podIP, page, demoMasqVM)
	}
	fmt.Fprintf(out, "  reached %s (%s) -> http://%s/ (pod %s on %s): the guest answered %q\n", peer, peer.pod.Spec.NodeName, podIP, pod.Name, pod.Spec.NodeName, strings.TrimSpace(page))
	leases, err := consoleLeases(simlauncher.ConsoleLog(lab.VMsDir(labDir), demoVMNamespace, demoMasqVM))
	if err != nil {
		return err
	}
	l, ok := leases["eth0"]
	if !ok || l.Addr != netip.MustParsePrefix("10.0.2.2/24") || l.Router != netip.MustParseAddr("10.0.2.1") {
		return fmt.Errorf("the masquerade guest's lease is %+v, want 10.0.2.2/24 via 10.0.2.1", l)
	}
	fmt.Fprintf(out, "  guest DHCP lease eth0 %s router %s (from the launcher, behind NAT on %s)\n", l.Addr, l.Router, podIP)
	if err := echo(ctx, peer.netns, podIP); err == nil {
		fmt.Fprintf(out, "  reached %s -> %s:%d   <-- WRONG: port %d is not forwarded\n", peer, podIP, guest.EchoPort, guest.EchoPort)
		return fmt.Errorf("port %d of VM %s answers through the pod address though only 80 is forwarded", guest.EchoPort, demoMasqVM)
	}
	fmt.Fprintf(out, "  blocked %s -> %s:%d (not in ports; control: port %d answered)\n", peer, podIP, guest.EchoPort, guest.HTTPPort)
	return nil
}

// httpGet fetches / from addr, connecting from netns, and returns the body.
func httpGet(ctx context.Context, netns string, addr netip.AddrPort) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	conn, err := guest.DialContext(ctx, netns, "tcp", addr.String())
	if err != nil {
		return "", err
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl) // fails only on a closed conn, which the I/O below reports
	}
	if _, err := fmt.Fprintf(conn, "GET / HTTP/1.0\r\nHost: %s\r\n\r\n", addr.Addr()); err != nil {
		return "", err
	}
	b, err := io.ReadAll(bufio.NewReader(conn))
	if err != nil && len(b) == 0 {
		return "", err
	}
	_, body, ok := strings.Cut(string(b), "\r\n\r\n")
	if !ok {
		_, body, _ = strings.Cut(string(b), "\n\n")
	}
	return body, nil
}
