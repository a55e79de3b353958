package lab

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ipamclaimv1alpha1 "kvnet.io/kvnet/api/k8scni/v1alpha1"
	kubevirtv1 "kvnet.io/kvnet/api/kubevirt/v1"
	"kvnet.io/kvnet/internal/lab/guest"
	"kvnet.io/kvnet/internal/lab/simkubelet"
	"kvnet.io/kvnet/internal/lab/simvirt"
	"kvnet.io/kvnet/internal/podnetworks"
)

// probePod is the pod of a tenant the guests of that tenant are reached
// from; it is never deleted.
const probePod = "probe"

// createGuests creates the run's --guests VMs, guest-1..N, in turns in the
// permanent tenants, each with its tenant's probe pod: VMs the Launcher
// boots as QEMU guests (the others carry simlauncher's no-guest
// annotation). The run migrates, stops and starts them, but does not
// delete them nor hot-plug into them (a QEMU migration needs the same
// devices on both sides), so that each can be reached at the end.
func (w *world) createGuests(ctx context.Context, n int) error {
	probes := map[string]bool{}
	for i := range n {
		t := w.tenants[i%len(w.tenants)]
		if !probes[t.ns] {
			pod := &corev1.Pod{
				ObjectMeta: chaosMeta(t.ns, probePod),
				Spec: corev1.PodSpec{NodeName: w.e.nodes[0],
					Containers: []corev1.Container{{Name: "c", Image: "busybox"}}},
			}
			if err := w.create(ctx, pod); err != nil {
				return fmt.Errorf("probe pod %s/%s: %w", t.ns, probePod, err)
			}
			probes[t.ns] = true
		}
		v := &chaosVM{ns: t.ns, name: fmt.Sprintf("guest-%d", i+1), running: true, guest: true}
		vm := &kubevirtv1.VirtualMachine{
			ObjectMeta: chaosMeta(v.ns, v.name),
			Spec: kubevirtv1.VirtualMachineSpec{RunStrategy: strategy(true), Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{
				ObjectMeta: vmTemplateMeta(true),
				Spec:       vmSpec(false, false),
			}},
		}
		if err := w.create(ctx, vm); err != nil {
			return fmt.Errorf("guest VM %s/%s: %w", v.ns, v.name, err)
		}
		w.vms[v.ns+"/"+v.name] = v
	}
	return nil
}

// startGuests starts the guest VMs the run left stopped, so that every
// guest is checked after settling.
func (w *world) startGuests(ctx context.Context) error {
	w.mu.Lock()
	var stopped []*chaosVM
	for _, v := range w.vms {
		if v.guest && !v.running {
			stopped = append(stopped, v)
		}
	}
	w.mu.Unlock()
	for _, v := range stopped {
		if err := w.updateVM(ctx, v, func(vm *kubevirtv1.VirtualMachine) { vm.Spec.RunStrategy = strategy(true) }); err != nil {
			return fmt.Errorf("start guest VM %s/%s: %w", v.ns, v.name, err)
		}
		w.mu.Lock()
		v.running = true
		w.mu.Unlock()
	}
	return nil
}

// guestTimeout bounds how long a guest may take to answer after settling
// (a guest just started boots, and asks kvnet-node's DHCP server for its
// address).
const guestTimeout = 3 * time.Minute

// checkGuests reaches every guest VM from its tenant's probe pod, over the
// datapath: at each IP of its primary IPAMClaim, the guest's TCP echo
// (port 7) must echo and its HTTP server (port 80) answer the VMI's name.
// It returns how many guests answered and a finding for each that did
// not.
//
// A guest whose own kernel panicked (its console says so: QEMU's TCG
// emulation and migration of this machine corrupt a guest's memory now
// and then; nothing of kvnet writes it, docs/operate.md) is not a
// network finding: it is listed in crashed instead, unless no guest at
// all is left to check.
func (w *world) checkGuests(ctx context.Context) (answered int, findings, crashed []string) {
	w.mu.Lock()
	var guests []chaosVM
	for _, v := range w.vms {
		if v.guest {
			guests = append(guests, *v)
		}
	}
	w.mu.Unlock()
	for _, v := range guests {
		if err := w.reachGuest(ctx, v); err != nil {
			if line, ok := w.guestPanicked(v.ns, v.name); ok {
				crashed = append(crashed, fmt.Sprintf("guest VM %s/%s: its kernel panicked (%s), so it could not answer (%v)", v.ns, v.name, line, err))
				continue
			}
			findings = append(findings, fmt.Sprintf("guest VM %s/%s: %v\n%s", v.ns, v.name, err, w.guestState(ctx, v)))
			continue
		}
		answered++
	}
	if len(guests) > 0 && answered == 0 && len(findings) == 0 {
		findings = append(findings, fmt.Sprintf("no guest left to check: all %d guests' kernels panicked", len(guests)))
	}
	return answered, findings, crashed
}

// guestPanicked says whether the guest console of VM ns/name shows a
// kernel panic, with its line.
func (w *world) guestPanicked(ns, name string) (string, bool) {
	if w.e.launcher == nil {
		return "", false
	}
	return kernelPanic(w.e.launcher.ConsoleLog(ns, name))
}

// kernelPanic returns the "Kernel panic" line of the console log at path.
func kernelPanic(path string) (string, bool) {
	data, err := os.ReadFile(path)
	if err != nil {
		return "", false
	}
	for _, l := range strings.Split(string(data), "\n") {
		if i := strings.Index(l, "Kernel panic - not syncing"); i >= 0 {
			return strings.TrimSpace(l[i:]), true
		}
	}
	return "", false
}

func (w *world) reachGuest(ctx context.Context, v chaosVM) error {
	deadline := time.Now().Add(guestTimeout)
	var last error
	for {
		last = w.reachGuestOnce(ctx, v)
		if last == nil || time.Now().After(deadline) || ctx.Err() != nil {
			return last
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

func (w *world) reachGuestOnce(ctx context.Context, v chaosVM) error {
	c := w.e.c
	var pod corev1.Pod
	if err := c.Get(ctx, client.ObjectKey{Namespace: v.ns, Name: probePod}, &pod); err != nil {
		return fmt.Errorf("probe pod: %w", err)
	}
	if pod.Status.Phase != corev1.PodRunning || pod.Annotations[podnetworks.Annotation] == "" {
		return fmt.Errorf("probe pod %s/%s is %s, not Running with addresses", v.ns, probePod, pod.Status.Phase)
	}
	netns := simkubelet.PodNetNS(KubeletConfig(w.e.dir, pod.Spec.NodeName), &pod)
	claimName := v.name + ".default"
	var claim ipamclaimv1alpha1.IPAMClaim
	if err := c.Get(ctx, client.ObjectKey{Namespace: v.ns, Name: claimName}, &claim); err != nil {
		return fmt.Errorf("claim %s: %w", claimName, err)
	}
	if len(claim.Status.IPs) == 0 {
		return fmt.Errorf("claim %s holds no IP", claimName)
	}
	for _, s := range claim.Status.IPs {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return fmt.Errorf("claim %s: IP %q: %w", claimName, s, err)
		}
		if err := echoGuest(ctx, netns, p.Addr()); err != nil {
			return fmt.Errorf("from pod %s/%s, TCP echo at %s (its claim %s's): %w", v.ns, probePod, p.Addr(), claimName, err)
		}
		body, err := httpGuest(ctx, netns, netip.AddrPortFrom(p.Addr(), guest.HTTPPort))
		if err != nil {
			return fmt.Errorf("from pod %s/%s, HTTP at %s (its claim %s's): %w", v.ns, probePod, p.Addr(), claimName, err)
		}
		if strings.TrimSpace(body) != v.name {
			return fmt.Errorf("from pod %s/%s, HTTP at %s answered %q, not the VMI's name: another guest holds its IP", v.ns, probePod, p.Addr(), body)
		}
	}
	return nil
}

// echoGuest sends a line to the guest's TCP echo at addr from netns and
// checks it comes back.
func echoGuest(ctx context.Context, netns string, addr netip.Addr) error {
	conn, err := dialGuest(ctx, netns, netip.AddrPortFrom(addr, guest.EchoPort))
	if err != nil {
		return err
	}
	defer conn.Close()
	const msg = "kvnet-chaos"
	if _, err := fmt.Fprintln(conn, msg); err != nil {
		return err
	}
	got, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return err
	}
	if got != msg+"\n" {
		return fmt.Errorf("echo returned %q, sent %q", got, msg)
	}
	return nil
}

// httpGuest fetches / from the guest's HTTP server at addr from netns and
// returns the body.
func httpGuest(ctx context.Context, netns string, addr netip.AddrPort) (string, error) {
	conn, err := dialGuest(ctx, netns, addr)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	if _, err := fmt.Fprintf(conn, "GET / HTTP/1.0\r\nHost: %s\r\n\r\n", addr.Addr()); err != nil {
		return "", err
	}
	b, err := io.ReadAll(conn)
	if err != nil && len(b) == 0 {
		return "", err
	}
	_, body, ok := strings.Cut(string(b), "\r\n\r\n")
	if !ok {
		if _, body, ok = strings.Cut(string(b), "\n\n"); !ok {
			return "", errors.New("no HTTP response: " + string(b))
		}
	}
	return body, nil
}

// dialGuest connects to addr from netns, with a 3 s deadline for the
// connection and what follows.
func dialGuest(ctx context.Context, netns string, addr netip.AddrPort) (net.Conn, error) {
	dctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	conn, err := guest.DialContext(dctx, netns, "tcp", addr.String())
	if err != nil {
		return nil, err
	}
	if err := conn.SetDeadline(time.Now().Add(3 * time.Second)); err != nil {
		conn.Close()
		return nil, err
	}
	return conn, nil
}

// guestState describes what the lab knows of a guest that did not
// answer, so that a finding made where the run's logs are gone (CI) still
// says where to look: its VMI's phase, node and last migration, its
// launcher pods with their nodes and network-status, and the end of its
// console log.
func (w *world) guestState(ctx context.Context, v chaosVM) string {
	var b strings.Builder
	var vmi kubevirtv1.VirtualMachineInstance
	if err := w.e.c.Get(ctx, client.ObjectKey{Namespace: v.ns, Name: v.name}, &vmi); err != nil {
		fmt.Fprintf(&b, "  VMI: %v\n", err)
	} else {
		fmt.Fprintf(&b, "  VMI: phase %s, node %s, interfaces %+v\n", vmi.Status.Phase, vmi.Status.NodeName, vmi.Status.Interfaces)
		if m := vmi.Status.MigrationState; m != nil {
			fmt.Fprintf(&b, "  last migration: %s (%s) -> %s (%s), completed %t, failed %t\n",
				m.SourceNode, m.SourcePod, m.TargetNode, m.TargetPod, m.Completed, m.Failed)
		}
		var pods corev1.PodList
		if err := w.e.c.List(ctx, &pods, client.InNamespace(v.ns), client.MatchingLabels{simvirt.CreatedByLabel: string(vmi.UID)}); err != nil {
			fmt.Fprintf(&b, "  launcher pods: %v\n", err)
		}
		for _, p := range pods.Items {
			fmt.Fprintf(&b, "  launcher pod %s: node %s, %s, deleting %t, pod-networks %s\n",
				p.Name, p.Spec.NodeName, p.Status.Phase, p.DeletionTimestamp != nil, p.Annotations[podnetworks.Annotation])
		}
	}
	var probe corev1.Pod
	if err := w.e.c.Get(ctx, client.ObjectKey{Namespace: v.ns, Name: probePod}, &probe); err == nil {
		fmt.Fprintf(&b, "  probe pod: node %s, pod-networks %s\n", probe.Spec.NodeName, probe.Annotations[podnetworks.Annotation])
	}
	if w.e.launcher != nil {
		fmt.Fprintf(&b, "  console (end):\n%s", consoleTail(w.e.launcher.ConsoleLog(v.ns, v.name), 15))
	}
	return b.String()
}

// consoleTail is the last n lines of the console log at path, indented.
func consoleTail(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return "    " + err.Error() + "\n"
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	var b strings.Builder
	for _, l := range lines {
		b.WriteString("    " + strings.TrimRight(l, "\r") + "\n")
	}
	return b.String()
}
