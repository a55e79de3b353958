package cluster

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"kvnet.io/kvnet/internal/migration"
)

// drainVMs are the VMs the drain scenario adds beside vm-m, on vm-m's
// node.
var drainVMs = []string{"vm-d1", "vm-d2"}

// setUnschedulable cordons (true) or uncordons a node, as kubectl
// cordon does.
func (s *vmScenarios) setUnschedulable(ctx context.Context, node string, on bool) error {
	patch := fmt.Sprintf(`{"spec":{"unschedulable":%t}}`, on)
	if _, err := s.t.Client.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("set node %s unschedulable=%t: %w", node, on, err)
	}
	return nil
}

// launcherPodsOn lists the virt-launcher pods running on node, in every
// namespace.
func (s *vmScenarios) launcherPodsOn(ctx context.Context, node string) ([]corev1.Pod, error) {
	pods, err := s.t.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{
		LabelSelector: "kubevirt.io=virt-launcher", FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		return nil, err
	}
	var out []corev1.Pod
	for _, p := range pods.Items {
		if p.Status.Phase == corev1.PodRunning || p.Status.Phase == corev1.PodPending {
			out = append(out, p)
		}
	}
	return out, nil
}

// drainNode does what `kubectl drain --pod-selector kubevirt.io=virt-launcher`
// does: cordons node and evicts every launcher pod on it through the
// Eviction API, again every few seconds while KubeVirt answers that it
// is migrating the VM away (429), until none runs there.
func (s *vmScenarios) drainNode(ctx context.Context, node string) error {
	if err := s.setUnschedulable(ctx, node, true); err != nil {
		return err
	}
	return pollEvery(ctx, 10*time.Minute, 3*time.Second, func(ctx context.Context) error {
		pods, err := s.launcherPodsOn(ctx, node)
		if err != nil {
			return err
		}
		var left []string
		for _, p := range pods {
			ev := &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace}}
			// One call must not take the whole wait: KubeVirt's
			// eviction webhook (virt-api) answers it.
			ectx, cancel := context.WithTimeout(ctx, time.Minute)
			err := s.t.Client.PolicyV1().Evictions(p.Namespace).Evict(ectx, ev)
			timedOut := ectx.Err() == context.DeadlineExceeded
			cancel()
			switch {
			case err == nil, apierrors.IsNotFound(err):
			case apierrors.IsTooManyRequests(err), timedOut && ctx.Err() == nil:
				left = append(left, p.Namespace+"/"+p.Name+" (migrating: "+err.Error()+")")
			default:
				return &stopPolling{fmt.Errorf("evict %s/%s: %w", p.Namespace, p.Name, err)}
			}
			if err != nil {
				continue
			}
			left = append(left, p.Namespace+"/"+p.Name+" (evicted, terminating)")
		}
		if len(left) > 0 {
			return fmt.Errorf("drain %s: launcher pods left: %s", node, strings.Join(left, "; "))
		}
		return nil
	})
}

// drainedVM is a VM of the drain scenario and what its echo client saw.
type drainedVM struct {
	v     *runningVM
	echo  string // the echo client pod, in v's namespace
	lines int
}

// drain: a node running three VMs of the persistent primary UDN (vm-m
// and two more placed there), each with a TCP echo stream from a pod on
// the client's node, is drained as an admin does for maintenance; every
// VM live-migrates off it (the KubeVirt CR's evictionStrategy is
// LiveMigrate) with its IP, MAC and claim, every stream goes on in
// order, and each switch-over is read from the logs: kvnet opening the
// target port at the guest's first frame, or not seen (a finding).
func (s *vmScenarios) drain(ctx context.Context) (string, error) {
	vm, err := s.vm(nsVM + "/vm-m")
	if err != nil {
		return "", err
	}
	from := vm.node
	var other string
	for _, n := range s.nodes[1:] {
		if n != from {
			other = n
			break
		}
	}
	if from == s.nodes[0] || other == "" {
		return "", fmt.Errorf("VM %s on %s: want it away from the client's %s with a third node to move to", vm, from, s.nodes[0])
	}
	// The two new VMs land beside vm-m: every other node is the client's
	// (which they avoid) or cordoned while they start.
	if err := s.setUnschedulable(ctx, other, true); err != nil {
		return "", err
	}
	defer func() { _ = s.setUnschedulable(context.WithoutCancel(ctx), other, false) }()
	for _, n := range drainVMs {
		if err := s.createVM(ctx, vmSpec{ns: nsVM, name: n, binding: "masquerade", avoid: s.nodes[0], image: s.t.GuestImage}); err != nil {
			return "", err
		}
	}
	s.waitVMs(ctx, drainVMs...)
	vms := []*drainedVM{{v: vm, echo: "echo"}}
	for _, n := range drainVMs {
		v, err := s.vm(nsVM + "/" + n)
		if err != nil {
			return "", err
		}
		if v.node != from {
			return "", fmt.Errorf("VM %s started on %s, want %s beside vm-m", v, v.node, from)
		}
		vms = append(vms, &drainedVM{v: v, echo: "echo-" + n})
	}
	if err := s.setUnschedulable(ctx, other, false); err != nil {
		return "", err
	}
	for _, d := range vms {
		if d.echo != "echo" {
			if _, err := s.t.Client.CoreV1().Pods(nsVM).Create(ctx, echoPod(nsVM, d.echo, s.nodes[0], s.t.Image, d.v.ip), metav1.CreateOptions{}); err != nil {
				return "", fmt.Errorf("create echo pod %s: %w", d.echo, err)
			}
		}
		if d.lines, err = s.waitEchoGrows(ctx, nsVM, d.echo, 0); err != nil {
			return "", fmt.Errorf("echo stream to VM %s before the drain: %w", d.v, err)
		}
	}
	launchers, err := s.launcherPodsOn(ctx, from)
	if err != nil {
		return "", err
	}
	s.logf("draining %s: %d launcher pods (%d of them the UDN VMs with echo streams)", from, len(launchers), len(vms))
	since := time.Now()
	defer func() { _ = s.setUnschedulable(context.WithoutCancel(ctx), from, false) }()
	if err := s.drainNode(ctx, from); err != nil {
		return "", err
	}
	drained := time.Since(since)

	var parts []string
	atFirstFrame := 0
	for _, d := range vms {
		vmi, err := s.dyn.Resource(vmiGVR).Namespace(nsVM).Get(ctx, d.v.name, metav1.GetOptions{})
		if err != nil {
			return "", err
		}
		claim, err := s.claimIP(ctx, nsVM, d.v.name+".default")
		if err != nil {
			return "", err
		}
		// Running on another node with the claim's address, the same MAC.
		var mac, node string
		err = poll(ctx, 2*time.Minute, func(ctx context.Context) error {
			vmi, err = s.dyn.Resource(vmiGVR).Namespace(nsVM).Get(ctx, d.v.name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			mac, node, err = vmiClaimIP(vmi, claim)
			if err == nil && node == from {
				err = fmt.Errorf("VMI %s still on %s", d.v, from)
			}
			return err
		})
		if err != nil {
			return strings.Join(parts, "; "), fmt.Errorf("after the drain: %w", err)
		}
		if claim != d.v.ip || mac != d.v.mac {
			return strings.Join(parts, "; "), fmt.Errorf("VM %s: %s %s before the drain, %s %s after", d.v, d.v.ip, d.v.mac, claim, mac)
		}
		ms, _, _ := unstructured.NestedMap(vmi.Object, "status", "migrationState")
		n, err := s.waitEchoGrows(ctx, nsVM, d.echo, d.lines)
		if err != nil {
			return strings.Join(parts, "; "), fmt.Errorf("echo stream to VM %s after the drain: %w (%s)", d.v, err, s.streamDiag(ctx, d.v, d.echo, ms, node, since))
		}
		gap, err := s.echoGap(ctx, nsVM, d.echo, d.lines)
		if err != nil {
			return strings.Join(parts, "; "), err
		}
		b, berr := s.logBlackout(ctx, d.v, ms, node, since)
		switchOver := "switch-over: " + b.String()
		if berr != nil {
			switchOver = "switch-over: the logs not read: " + berr.Error()
		} else if _, ok := b.switchOver(); ok {
			atFirstFrame++
		}
		// kvnet-node on the target reported the switch-over on the VMI.
		var event string
		if err := poll(ctx, time.Minute, func(ctx context.Context) (err error) {
			event, err = s.switchoverEvent(ctx, d.v, node, since)
			return err
		}); err != nil {
			return strings.Join(parts, "; "), fmt.Errorf("VM %s after the drain: %w", d.v, err)
		}
		reason, _, _ := strings.Cut(event, ":")
		if reason == migration.EventSwitchedByAPI {
			// A finding: the Event says how long the target port waited
			// and what the source saw last.
			reason = event
		}
		parts = append(parts, fmt.Sprintf("%s %s -> %s, %s %s kept, echo lines %d -> %d in order, longest pause %s, %s, kvnet-node's event %s",
			d.v, from, node, claim, mac, d.lines, n, gap, switchOver, reason))
		d.v.node = node
	}
	// Every other launcher pod the drain found moved too (VMs of the
	// default network change address when they move: not compared).
	for _, p := range launchers {
		if slices.ContainsFunc(vms, func(d *drainedVM) bool { return d.v.ns == p.Namespace && strings.Contains(p.Name, d.v.name) }) {
			continue
		}
		parts = append(parts, fmt.Sprintf("launcher %s/%s evicted", p.Namespace, p.Name))
	}
	return fmt.Sprintf("drained %s in %s: %d VMs moved, %d of %d switch-overs at the guest's first frame on the target; %s",
		from, drained.Round(time.Second), len(vms), atFirstFrame, len(vms), strings.Join(parts, "; ")), nil
}
