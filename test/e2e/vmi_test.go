package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kubevirtv1 "kvnet.io/kvnet/api/kubevirt/v1"
	"kvnet.io/kvnet/internal/lab/simvirt"
	"kvnet.io/kvnet/internal/testenv"
)

// migrate creates VirtualMachineInstanceMigration migName for VMI vmi in
// ns and waits for it to succeed; a failed migration fails the test with
// its reason.
func migrate(t *testing.T, c client.Client, ns, vmi, migName string) {
	t.Helper()
	ctx := context.Background()
	mig := &kubevirtv1.VirtualMachineInstanceMigration{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: migName},
		Spec: kubevirtv1.VirtualMachineInstanceMigrationSpec{VMIName: vmi}}
	if err := c.Create(ctx, mig); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 2*time.Minute, "migration "+migName+" Succeeded", func() error {
		if err := c.Get(ctx, client.ObjectKeyFromObject(mig), mig); err != nil {
			return err
		}
		if mig.Status.Phase == simvirt.PhaseFailed {
			t.Fatalf("migration %s failed: %s", migName, mig.Annotations[simvirt.FailureReasonAnnotation])
		}
		if mig.Status.Phase != simvirt.PhaseSucceeded {
			return fmt.Errorf("phase %q", mig.Status.Phase)
		}
		return nil
	})
}

// runningOn waits until VMI ns/name runs with no migration under way and
// returns its node.
func runningOn(t *testing.T, c client.Client, ns, name string) string {
	t.Helper()
	var vmi kubevirtv1.VirtualMachineInstance
	testenv.Eventually(t, 3*time.Minute, "VMI "+ns+"/"+name+" running", func() error {
		if err := c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &vmi); err != nil {
			return err
		}
		if vmi.Status.Phase != simvirt.PhaseRunning {
			return fmt.Errorf("phase %q", vmi.Status.Phase)
		}
		if ms := vmi.Status.MigrationState; ms != nil && !ms.Completed && !ms.Failed {
			return fmt.Errorf("migration under way")
		}
		return nil
	})
	return vmi.Status.NodeName
}

// threeNodeLab starts a lab of three simulated nodes in a temporary
// directory for the test (its log shown if the test fails, stopped when it
// ends) and returns the directory and a client of its API server. It needs
// root.
func threeNodeLab(t *testing.T) (string, client.Client) {
	t.Helper()
	testenv.NeedsRoot(t)
	_, run := buildKvnet(t)
	dir := t.TempDir()
	showLabLogOnFailure(t, dir)
	run("up", "--dir", dir, "--nodes", "3")
	t.Cleanup(func() { run("down", "--dir", dir) })
	return dir, labClient(t, dir)
}
