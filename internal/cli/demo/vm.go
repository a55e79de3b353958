package demo

import (
	"context"
	"fmt"
	"io"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kubevirtv1 "kvnet.io/kvnet/api/kubevirt/v1"
	"kvnet.io/kvnet/internal/sim/simvirt"
)

// demoVM is the VM the demo migrates; demoVMPeer pings it.
const (
	demoVMNamespace = "udn-demo"
	demoVM          = "vm-a"
	demoVMPeer      = "udn-demo/web-1"
)

// vmState is what the demo shows of the VM.
type vmState struct {
	node, ip, mac string
}

func (s vmState) String() string { return fmt.Sprintf("on %s, IP %s, MAC %s", s.node, s.ip, s.mac) }

// runningVMI waits until the VMI runs with an address on its pod network.
func runningVMI(ctx context.Context, c client.Client, timeout time.Duration) (vmState, error) {
	deadline := time.Now().Add(timeout)
	for {
		var vmi kubevirtv1.VirtualMachineInstance
		err := c.Get(ctx, client.ObjectKey{Namespace: demoVMNamespace, Name: demoVM}, &vmi)
		if err == nil && vmi.Status.Phase == simvirt.PhaseRunning && (vmi.Status.MigrationState == nil || vmi.Status.MigrationState.Completed || vmi.Status.MigrationState.Failed) {
			for _, i := range vmi.Status.Interfaces {
				if i.Name == podNetworkName(&vmi) && i.IP != "" {
					return vmState{node: vmi.Status.NodeName, ip: i.IP, mac: i.MAC}, nil
				}
			}
		}
		if time.Now().After(deadline) {
			return vmState{}, fmt.Errorf("VMI %s/%s not running with an address after %s (phase %q, err %v)", demoVMNamespace, demoVM, timeout, vmi.Status.Phase, err)
		}
		select {
		case <-ctx.Done():
			return vmState{}, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func podNetworkName(vmi *kubevirtv1.VirtualMachineInstance) string {
	for _, n := range vmi.Spec.Networks {
		if n.Pod != nil {
			return n.Name
		}
	}
	return ""
}

// printVMMigration shows the lab's VM running on a simulated node, reached
// from a pod, then live-migrates it and shows that it kept its IP and MAC
// and is still reached. It fails if any of that does not hold.
func printVMMigration(ctx context.Context, out io.Writer, c client.Client, pods []labPod, timeout time.Duration) error {
	var peer *labPod
	for i := range pods {
		if pods[i].String() == demoVMPeer {
			peer = &pods[i]
		}
	}
	if peer == nil {
		return nil
	}
	fmt.Fprintf(out, "\n== VirtualMachine %s/%s (run by the lab's virt-controller stand-in)\n", demoVMNamespace, demoVM)
	before, err := runningVMI(ctx, c, timeout)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "  running %s\n", before)
	if err := pingVM(ctx, out, peer, before); err != nil {
		return err
	}
	mig := &kubevirtv1.VirtualMachineInstanceMigration{
		ObjectMeta: metav1.ObjectMeta{Namespace: demoVMNamespace, GenerateName: demoVM + "-migration-"},
		Spec:       kubevirtv1.VirtualMachineInstanceMigrationSpec{VMIName: demoVM},
	}
	start := time.Now()
	if err := c.Create(ctx, mig); err != nil {
		return fmt.Errorf("create migration: %w", err)
	}
	for mig.Status.Phase != simvirt.PhaseSucceeded {
		if mig.Status.Phase == simvirt.PhaseFailed {
			return fmt.Errorf("migration %s failed: %s", mig.Name, mig.Annotations[simvirt.FailureReasonAnnotation])
		}
		if time.Since(start) > timeout {
			return fmt.Errorf("migration %s not done after %s (phase %q)", mig.Name, timeout, mig.Status.Phase)
		}
		time.Sleep(200 * time.Millisecond)
		if err := c.Get(ctx, client.ObjectKeyFromObject(mig), mig); err != nil {
			return err
		}
	}
	after, err := runningVMI(ctx, c, timeout)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "  live migration %s: %s -> %s in %s\n", mig.Name, before.node, after.node, time.Since(start).Round(10*time.Millisecond))
	fmt.Fprintf(out, "  running %s\n", after)
	if after.ip != before.ip || after.mac != before.mac || after.node == before.node {
		return fmt.Errorf("after the migration the VM runs %s; before it ran %s: the node must change, the IP and MAC must not", after, before)
	}
	return pingVM(ctx, out, peer, after)
}

func pingVM(ctx context.Context, out io.Writer, peer *labPod, vm vmState) error {
	if !reachable(ctx, peer.netns, vm.ip, true) {
		fmt.Fprintf(out, "  blocked %s (%s) -> %s %s (%s)   <-- WRONG\n", peer, peer.pod.Spec.NodeName, demoVM, vm.ip, vm.node)
		return fmt.Errorf("%s cannot reach VM %s at %s on %s", peer, demoVM, vm.ip, vm.node)
	}
	fmt.Fprintf(out, "  reached %s (%s) -> %s %s (%s)\n", peer, peer.pod.Spec.NodeName, demoVM, vm.ip, vm.node)
	return nil
}
