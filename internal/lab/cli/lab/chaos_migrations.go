package lab

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	kubevirtv1 "kvnet.io/kvnet/api/kubevirt/v1"
	"kvnet.io/kvnet/internal/lab/simlauncher"
	"kvnet.io/kvnet/internal/lab/simvirt"
)

// chaosMigration is a VirtualMachineInstanceMigration the run created.
type chaosMigration struct {
	ns, name string
	vm       string // "<namespace>/<name>"
	created  time.Time
	// vmiCreated is the creationTimestamp of the VMI it was made for.
	vmiCreated time.Time
}

// disturb records that the run stops or deletes VM key now (or, for
// "ns:<namespace>", deletes a tenant): a migration of it created earlier
// may fail for that, as it would with KubeVirt.
func (w *world) disturb(key string) {
	w.mu.Lock()
	w.disturbed[key] = append(w.disturbed[key], time.Now())
	w.mu.Unlock()
}

// disturbedSince says whether the run stopped or deleted VM vm, or deleted
// the tenant ns, after t. w.mu is held.
func (w *world) disturbedSince(vm, ns string, t time.Time) bool {
	for _, k := range []string{vm, "ns:" + ns} {
		for _, at := range w.disturbed[k] {
			if !at.Before(t) {
				return true
			}
		}
	}
	return false
}

// Migrations counts the outcomes of the migrations a chaos run started
// (vm-migrate, and the migration that carries out each hot plug).
type Migrations struct {
	// Started: created (the API server accepted them).
	Started int `json:"started"`
	// Succeeded: status.phase Succeeded.
	Succeeded int `json:"succeeded"`
	// Failed: status.phase Failed; Expected of them failed because the
	// run stopped or deleted their VM once their VMI existed (the VMI
	// went away), as they must.
	Failed   int `json:"failed"`
	Expected int `json:"expectedFailures"`
	// Gone: deleted with their tenant (namespace) before they ended.
	Gone int `json:"gone"`
	// AfterGuestCrash: failed because their VM's guest was gone, its
	// kernel having panicked (see checkGuests): not findings.
	AfterGuestCrash int `json:"afterGuestCrash,omitempty"`
	// Unexpected are findings: a migration that failed when nothing the
	// run did explains it, or that vanished, with the reason.
	Unexpected []string `json:"unexpected,omitempty"`
}

// migrationOutcomes reads every migration the run created, once the
// cluster settled, and counts their outcomes.
func (w *world) migrationOutcomes(ctx context.Context) (Migrations, error) {
	var list kubevirtv1.VirtualMachineInstanceMigrationList
	if err := retry(ctx, func() error { return w.e.c.List(ctx, &list, client.MatchingLabels{chaosLabel: "1"}) }); err != nil {
		return Migrations{}, fmt.Errorf("list migrations: %w", err)
	}
	byKey := map[string]*kubevirtv1.VirtualMachineInstanceMigration{}
	for i := range list.Items {
		m := &list.Items[i]
		byKey[m.Namespace+"/"+m.Name] = m
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	var r Migrations
	for _, cm := range w.migrations {
		r.Started++
		key := cm.ns + "/" + cm.name
		// A stop or delete explains a failure if it came after the VMI
		// was created (creationTimestamp has whole seconds), even before
		// the migration: the VMI of a VM stopped and started again may
		// still run, not yet deleted, when the migration is created.
		explained := w.disturbedSince(cm.vm, cm.ns, cm.vmiCreated.Add(-time.Second))
		m := byKey[key]
		switch {
		case m == nil && w.disturbedSince("", cm.ns, cm.created):
			r.Gone++
		case m == nil:
			r.Unexpected = append(r.Unexpected, fmt.Sprintf("migration %s of VM %s vanished (its tenant was not deleted)", key, cm.vm))
		case m.Status.Phase == simvirt.PhaseSucceeded:
			r.Succeeded++
		case m.Status.Phase == simvirt.PhaseFailed:
			r.Failed++
			reason := m.Annotations[simvirt.FailureReasonAnnotation]
			if explained && vmiWentAway(reason) {
				r.Expected++
				continue
			}
			if vmNS, vmName, ok := strings.Cut(cm.vm, "/"); ok && strings.Contains(reason, simlauncher.ErrNoGuest.Error()) {
				if _, panicked := w.guestPanicked(vmNS, vmName); panicked {
					r.AfterGuestCrash++
					continue
				}
			}
			why := "the run neither stopped nor deleted the VM since its VMI was created"
			if explained {
				why = "not because its VMI went away"
			}
			r.Unexpected = append(r.Unexpected, fmt.Sprintf("migration %s of VM %s failed, %s: %s", key, cm.vm, why, reason))
		default:
			r.Unexpected = append(r.Unexpected, fmt.Sprintf("migration %s of VM %s did not end: phase %q", key, cm.vm, m.Status.Phase))
		}
	}
	sort.Strings(r.Unexpected)
	return r, nil
}

// vmiWentAway says whether a migration's failure reason (simvirt's) is
// that its VMI is gone, being deleted or final: what stopping or deleting
// the VM does to a migration not finished yet. Any other reason (the
// target pod failed or vanished, no node to go to) is unexpected; so is
// one worded otherwise, which errs on the side of a finding.
func vmiWentAway(reason string) bool {
	if !strings.HasPrefix(reason, "VirtualMachineInstance ") {
		return false
	}
	for _, s := range []string{" does not exist", " is being deleted", " is " + simvirt.PhaseSucceeded, " is " + simvirt.PhaseFailed} {
		if strings.HasSuffix(reason, s) {
			return true
		}
	}
	return false
}

// unfinishedMigrations lists the run's migrations that are not final yet
// (settle waits for them).
func (w *world) unfinishedMigrations(ctx context.Context) []string {
	var list kubevirtv1.VirtualMachineInstanceMigrationList
	if err := w.e.c.List(ctx, &list, client.MatchingLabels{chaosLabel: "1"}); err != nil {
		return []string{"list migrations: " + err.Error()}
	}
	var bad []string
	for _, m := range list.Items {
		if m.DeletionTimestamp == nil && m.Status.Phase != simvirt.PhaseSucceeded && m.Status.Phase != simvirt.PhaseFailed {
			bad = append(bad, fmt.Sprintf("migration %s/%s still %q", m.Namespace, m.Name, m.Status.Phase))
		}
	}
	return bad
}
