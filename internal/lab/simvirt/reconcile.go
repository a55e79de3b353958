package simvirt

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	kubevirtv1 "kvnet.io/kvnet/api/kubevirt/v1"
	"kvnet.io/kvnet/internal/kubevirt/launcher"
)

// reconciler reconciles one VM name at a time.
type reconciler struct {
	// client writes, and lists launcher pods from the cache to weigh nodes.
	client client.Client
	// reader reads, uncached, everything a decision depends on.
	reader client.Reader
	nodes  []string
	// agent, when set, tells what the guests hold (Config.GuestAgent).
	agent GuestAgent
}

// unit is everything about one VM name.
type unit struct {
	key   types.NamespacedName
	vm    *kubevirtv1.VirtualMachine
	vmi   *kubevirtv1.VirtualMachineInstance
	vmims []*kubevirtv1.VirtualMachineInstanceMigration // spec.vmiName == key.Name, oldest first
	pods  []*corev1.Pod                                 // launcher pods made for a VMI of this name, oldest first
	// foreignVMI: the VMI of the VM's name is not the VM's; both are left alone.
	foreignVMI bool
	// requeue, when set, is how soon the unit is reconciled again (a VM
	// holding a VMI failed for its bindings: see holdFailedVMI).
	requeue time.Duration
}

// conflictRetry is how soon a reconcile that met a concurrent change (a
// stale resourceVersion, an object deleted meanwhile) runs again.
const conflictRetry = 200 * time.Millisecond

func (r *reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	u, err := r.load(ctx, req.NamespacedName)
	if err == nil {
		err = r.sync(ctx, u)
	}
	var res reconcile.Result
	if err == nil {
		res.RequeueAfter = u.requeue
	}
	if err != nil && ctx.Err() != nil {
		return reconcile.Result{}, nil // stopping
	}
	if err != nil && (apierrors.IsConflict(err) || apierrors.IsNotFound(err) || apierrors.IsAlreadyExists(err)) {
		log.FromContext(ctx).V(1).Info("concurrent change; reconciling again", "error", err.Error())
		return reconcile.Result{RequeueAfter: conflictRetry}, nil
	}
	return res, err
}

// load reads the unit of key from the API server.
func (r *reconciler) load(ctx context.Context, key types.NamespacedName) (*unit, error) {
	u := &unit{key: key}
	var vm kubevirtv1.VirtualMachine
	switch err := r.reader.Get(ctx, key, &vm); {
	case err == nil:
		u.vm = &vm
	case !apierrors.IsNotFound(err):
		return nil, fmt.Errorf("get VirtualMachine %s: %w", key, err)
	}
	var vmi kubevirtv1.VirtualMachineInstance
	switch err := r.reader.Get(ctx, key, &vmi); {
	case err == nil:
		u.vmi = &vmi
	case !apierrors.IsNotFound(err):
		return nil, fmt.Errorf("get VirtualMachineInstance %s: %w", key, err)
	}
	var ml kubevirtv1.VirtualMachineInstanceMigrationList
	if err := r.reader.List(ctx, &ml, client.InNamespace(key.Namespace)); err != nil {
		return nil, fmt.Errorf("list VirtualMachineInstanceMigrations in namespace %s: %w", key.Namespace, err)
	}
	for i := range ml.Items {
		if ml.Items[i].Spec.VMIName == key.Name {
			u.vmims = append(u.vmims, &ml.Items[i])
		}
	}
	slices.SortFunc(u.vmims, byAge)
	var pl corev1.PodList
	if err := r.reader.List(ctx, &pl, client.InNamespace(key.Namespace),
		client.MatchingLabels{kubevirtv1.AppLabel: kubevirtv1.VirtLauncherValue}); err != nil {
		return nil, fmt.Errorf("list launcher pods in namespace %s: %w", key.Namespace, err)
	}
	for i := range pl.Items {
		p := &pl.Items[i]
		if p.Annotations[kubevirtv1.DomainAnnotation] == key.Name && p.Labels[CreatedByLabel] != "" {
			u.pods = append(u.pods, p)
		}
	}
	slices.SortFunc(u.pods, byAge)
	return u, nil
}

func (r *reconciler) sync(ctx context.Context, u *unit) error {
	if u.vm != nil {
		if err := r.syncVM(ctx, u); err != nil {
			return err
		}
	} else if u.vmi != nil {
		if ref := controllerVM(u.vmi); ref != "" {
			if err := r.deleteVMI(ctx, u, fmt.Sprintf("its VirtualMachine %s is gone", ref)); err != nil {
				return err
			}
		}
	}
	if err := r.deleteForeignPods(ctx, u); err != nil {
		return err
	}
	if u.vmi == nil {
		p := &plan{}
		p.failMigrations(u.vmims, fmt.Sprintf("VirtualMachineInstance %s does not exist", u.key))
		if err := r.applyMigrations(ctx, p); err != nil {
			return err
		}
	} else if err := r.syncVMI(ctx, u); err != nil {
		return err
	}
	if u.vm != nil && !u.foreignVMI {
		return r.writeVMStatus(ctx, u)
	}
	return nil
}

// controllerVM returns the name of the VirtualMachine controlling vmi when
// it has the VMI's name (so it would be the unit's VM), "" otherwise.
func controllerVM(vmi *kubevirtv1.VirtualMachineInstance) string {
	if vm := vmOf(vmi); vm == vmi.Name {
		return vm
	}
	return ""
}

// syncVM creates or deletes the VM's VMI as its run strategy says.
func (r *reconciler) syncVM(ctx context.Context, u *unit) error {
	vm, vmi := u.vm, u.vmi
	logger := log.FromContext(ctx)
	if vmi != nil && !controlledBy(vmi, string(vm.UID)) {
		if controllerVM(vmi) != "" {
			// An earlier VM of the same name made it.
			return r.deleteVMI(ctx, u, "it belongs to an earlier VirtualMachine of the same name")
		}
		logger.Info("VirtualMachineInstance of the VM's name is not controlled by the VM; leaving both alone", "vm", u.key.String())
		u.foreignVMI = true
		return nil
	}
	if vm.DeletionTimestamp != nil {
		return r.deleteVMI(ctx, u, "its VirtualMachine is being deleted")
	}
	rs := runStrategy(vm)
	switch rs {
	case RunStrategyAlways, RunStrategyRerunOnFailure, RunStrategyOnce:
		if vmi == nil {
			return r.createVMI(ctx, u)
		}
		phase := vmi.Status.Phase
		if !restarts(rs, phase) {
			return nil
		}
		if failedForBindings(vmi) {
			held, err := r.holdFailedVMI(ctx, u)
			if held || err != nil {
				return err
			}
		}
		return r.deleteVMI(ctx, u, fmt.Sprintf("it is %s and the VM's run strategy is %s: it is started anew", phase, rs))
	case RunStrategyHalted:
		return r.deleteVMI(ctx, u, "the VM's run strategy is Halted")
	case RunStrategyManual:
	default:
		logger.Info("unknown spec.runStrategy; the VM is neither started nor stopped", "vm", u.key.String(), "runStrategy", rs)
	}
	return nil
}

// holdFailedVMI decides about a VMI failed for its bindings whose VM would
// start it anew: a new VMI would fail the same way as long as the VM's
// template, defaulted, has a binding the lab cannot run with the KubeVirt
// CR's binding plugins, so the failed VMI is kept (no VMI is created and
// failed in a loop), the VM says why (its failure reason annotation, and
// printableStatus CrashLoopBackOff), and the unit is looked at again after
// retryMax, since a change of the KubeVirt CR (registering a plugin)
// triggers no reconcile; a change of the VM does. It returns true when it
// keeps the VMI.
func (r *reconciler) holdFailedVMI(ctx context.Context, u *unit) (bool, error) {
	vm := u.vm
	if vm.Spec.Template == nil {
		return false, nil // createVMI says what is wrong
	}
	nc, err := r.kubeVirtNetwork(ctx)
	if err != nil {
		return false, fmt.Errorf("VirtualMachine %s: %w", u.key, err)
	}
	next := newVMI(vm, nc.NetworkInterface)
	err = checkBindings(&next.Spec, nc.Binding)
	if err == nil {
		log.FromContext(ctx).Info("the VM's bindings can run now; starting its failed VMI anew", "vm", u.key.String())
		return false, nil
	}
	u.requeue = retryMax
	return true, r.setReason(ctx, vm, "its VirtualMachineInstance failed and would fail again: "+err.Error())
}

// createVMI creates the VM's VMI.
func (r *reconciler) createVMI(ctx context.Context, u *unit) error {
	vm := u.vm
	if vm.Spec.Template == nil {
		return r.setReason(ctx, vm, "spec.template is missing: there is no VMI to start")
	}
	nc, err := r.kubeVirtNetwork(ctx)
	if err != nil {
		return fmt.Errorf("VirtualMachine %s: %w", u.key, err)
	}
	vmi := newVMI(vm, nc.NetworkInterface)
	if err := launcher.Validate(vmi); err != nil {
		// virt-api would refuse the VMI; a change of the VM retriggers.
		log.FromContext(ctx).Info("VM's template is not a valid VMI; not starting it", "vm", u.key.String(), "error", err.Error())
		return r.setReason(ctx, vm, "spec.template: "+err.Error())
	}
	if err := r.client.Create(ctx, vmi); err != nil {
		return fmt.Errorf("create VirtualMachineInstance %s: %w", u.key, err)
	}
	log.FromContext(ctx).Info("created VirtualMachineInstance", "vmi", u.key.String(), "runStrategy", runStrategy(vm))
	u.vmi = vmi
	return r.setReason(ctx, vm, "")
}

// deleteVMI deletes the unit's VMI (when it is not being deleted already)
// and reads it again.
func (r *reconciler) deleteVMI(ctx context.Context, u *unit, why string) error {
	vmi := u.vmi
	if vmi == nil || vmi.DeletionTimestamp != nil {
		return nil
	}
	uid := vmi.UID
	err := r.client.Delete(ctx, vmi, client.Preconditions{UID: &uid})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete VirtualMachineInstance %s (%s): %w", u.key, why, err)
	}
	log.FromContext(ctx).Info("deleting VirtualMachineInstance", "vmi", u.key.String(), "why", why)
	var cur kubevirtv1.VirtualMachineInstance
	switch err := r.reader.Get(ctx, u.key, &cur); {
	case apierrors.IsNotFound(err):
		u.vmi = nil
	case err != nil:
		return fmt.Errorf("get VirtualMachineInstance %s: %w", u.key, err)
	default:
		u.vmi = &cur
	}
	return nil
}

// deleteForeignPods deletes launcher pods made for another VMI of the
// unit's name (an earlier run).
func (r *reconciler) deleteForeignPods(ctx context.Context, u *unit) error {
	for _, p := range u.pods {
		if u.vmi != nil && p.Labels[CreatedByLabel] == string(u.vmi.UID) {
			continue
		}
		if err := r.deletePod(ctx, p, "it belongs to a VirtualMachineInstance that is gone"); err != nil {
			return err
		}
	}
	return nil
}

func (r *reconciler) deletePod(ctx context.Context, p *corev1.Pod, why string) error {
	if p.DeletionTimestamp != nil {
		return nil
	}
	uid := p.UID
	if err := r.client.Delete(ctx, p, client.Preconditions{UID: &uid}); err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return fmt.Errorf("delete launcher pod %s/%s (%s): %w", p.Namespace, p.Name, why, err)
	}
	log.FromContext(ctx).Info("deleting launcher pod", "pod", p.Namespace+"/"+p.Name, "node", p.Spec.NodeName, "why", why)
	return nil
}

// kubeVirtNetwork returns the network configuration of the KubeVirt CR
// (the oldest, in any namespace); empty when there is none.
func (r *reconciler) kubeVirtNetwork(ctx context.Context) (*kubevirtv1.NetworkConfiguration, error) {
	var l kubevirtv1.KubeVirtList
	if err := r.reader.List(ctx, &l); err != nil {
		if meta.IsNoMatchError(err) || apierrors.IsNotFound(err) {
			return &kubevirtv1.NetworkConfiguration{}, nil
		}
		return nil, fmt.Errorf("list KubeVirt CRs: %w", err)
	}
	var kvs []*kubevirtv1.KubeVirt
	for i := range l.Items {
		if l.Items[i].DeletionTimestamp == nil {
			kvs = append(kvs, &l.Items[i])
		}
	}
	if len(kvs) == 0 {
		return &kubevirtv1.NetworkConfiguration{}, nil
	}
	slices.SortFunc(kvs, byAge)
	if nc := kvs[0].Spec.Configuration.NetworkConfiguration; nc != nil {
		return nc, nil
	}
	return &kubevirtv1.NetworkConfiguration{}, nil
}

// nodeLoad counts the launcher pods that run or will run on each node.
func (r *reconciler) nodeLoad(ctx context.Context) (map[string]int, error) {
	var l corev1.PodList
	if err := r.client.List(ctx, &l, client.MatchingLabels{kubevirtv1.AppLabel: kubevirtv1.VirtLauncherValue}); err != nil {
		return nil, fmt.Errorf("list launcher pods: %w", err)
	}
	load := map[string]int{}
	for i := range l.Items {
		p := &l.Items[i]
		if p.Spec.NodeName != "" && podGone(p) == "" {
			load[p.Spec.NodeName]++
		}
	}
	return load, nil
}

// permanentError marks a failure retrying cannot fix.
type permanentError struct{ error }

func (e permanentError) Unwrap() error { return e.error }

// createPod creates a launcher pod of vmi on node (the target of vmim when
// set) and returns it as the API server stored it.
func (r *reconciler) createPod(ctx context.Context, vmi *kubevirtv1.VirtualMachineInstance, node string, vmim *kubevirtv1.VirtualMachineInstanceMigration, targetAddr string) (*corev1.Pod, error) {
	nc, err := r.kubeVirtNetwork(ctx)
	if err != nil {
		return nil, err
	}
	ann, err := launcher.Annotations(vmi, nc.Binding)
	if err != nil {
		return nil, permanentError{fmt.Errorf("cannot template the launcher pod: %w", err)}
	}
	pod := launcherPod(vmi, node, ann, vmim)
	if targetAddr != "" {
		pod.Annotations[TargetAddressAnnotation] = targetAddr
	}
	if err := r.client.Create(ctx, pod); err != nil {
		err = fmt.Errorf("create launcher pod of VirtualMachineInstance %s/%s on node %s: %w", vmi.Namespace, vmi.Name, node, err)
		if apierrors.IsForbidden(err) || apierrors.IsInvalid(err) || apierrors.IsBadRequest(err) {
			return nil, permanentError{err}
		}
		return nil, err
	}
	what := "launcher pod"
	if vmim != nil {
		what = "migration target pod"
	}
	log.FromContext(ctx).Info("created "+what, "vmi", vmi.Namespace+"/"+vmi.Name, "pod", pod.Name, "node", node)
	return pod, nil
}

// plan is what a VMI reconcile writes, in order: the VMI's failure reason,
// its status, pod deletions, migration updates.
type plan struct {
	st      *kubevirtv1.VirtualMachineInstanceStatus
	reason  *string // the VMI's failure reason: nil leaves it, "" removes it
	deletes []*corev1.Pod
	vmims   []vmimChange
}

type vmimChange struct {
	m      *kubevirtv1.VirtualMachineInstanceMigration
	phase  string
	reason string
}

func (p *plan) failVMI(reason string) {
	p.st.Phase = PhaseFailed
	p.reason = &reason
}

func (p *plan) setPhase(m *kubevirtv1.VirtualMachineInstanceMigration, phase, reason string) {
	p.vmims = append(p.vmims, vmimChange{m: m, phase: phase, reason: reason})
}

// failMigrations fails every migration that is not final.
func (p *plan) failMigrations(ms []*kubevirtv1.VirtualMachineInstanceMigration, reason string) {
	for _, m := range ms {
		p.setPhase(m, PhaseFailed, reason)
	}
}

// syncVMI runs the VMI: its launcher pod, status and migrations.
func (r *reconciler) syncVMI(ctx context.Context, u *unit) error {
	vmi := u.vmi
	var own []*corev1.Pod
	for _, pod := range u.pods {
		if pod.Labels[CreatedByLabel] == string(vmi.UID) {
			own = append(own, pod)
		}
	}
	if vmi.DeletionTimestamp != nil {
		return r.finalizeVMI(ctx, u, own)
	}
	if !controllerutil.ContainsFinalizer(vmi, VMIFinalizer) {
		patch := client.MergeFromWithOptions(vmi.DeepCopy(), client.MergeFromWithOptimisticLock{})
		controllerutil.AddFinalizer(vmi, VMIFinalizer)
		if err := r.client.Patch(ctx, vmi, patch); err != nil {
			return fmt.Errorf("add finalizer to VirtualMachineInstance %s: %w", u.key, err)
		}
	}
	p := &plan{st: vmi.Status.DeepCopy()}
	if p.st.Phase == "" {
		p.st.Phase = PhasePending
	}
	keep := map[types.UID]bool{} // pods of the VMI that stay
	switch phase := p.st.Phase; {
	case finalPhase(phase):
		p.failMigrations(u.vmims, fmt.Sprintf("VirtualMachineInstance %s is %s", u.key, phase))
	case phase == PhaseRunning:
		cur := currentPod(p.st, own)
		why := "its launcher pod vanished"
		if cur != nil {
			why = podGone(cur)
		}
		if why != "" {
			p.failVMI(why)
			p.failMigrations(u.vmims, fmt.Sprintf("VirtualMachineInstance %s failed: %s", u.key, why))
			break
		}
		keep[cur.UID] = true
		p.st.Interfaces = interfaces(vmi, cur)
		if err := r.migrate(ctx, u, own, cur, p, keep); err != nil {
			return r.applyThen(ctx, u, p, err)
		}
	default: // Pending or Scheduling: the VMI's first pod
		var first *corev1.Pod
		for _, pod := range own {
			if pod.Labels[MigrationJobUIDLabel] == "" {
				first = pod
				break
			}
		}
		switch {
		case first == nil && phase == PhaseScheduling:
			p.failVMI("its launcher pod vanished before it ran")
		case first == nil:
			nc, err := r.kubeVirtNetwork(ctx)
			if err != nil {
				return err
			}
			if err := checkBindings(&vmi.Spec, nc.Binding); err != nil {
				// No pod: a guest of these bindings cannot run in the lab,
				// and retrying cannot change that.
				p.failVMI(err.Error())
				if err := setCondition(p.st, unsupportedBindingCondition(err.Error())); err != nil {
					return fmt.Errorf("VirtualMachineInstance %s: %w", u.key, err)
				}
				break
			}
			load, err := r.nodeLoad(ctx)
			if err != nil {
				return err
			}
			pod, err := r.createPod(ctx, vmi, pickNode(r.nodes, load, ""), nil, "")
			if err != nil {
				reason := err.Error()
				p.reason = &reason
				return r.applyThen(ctx, u, p, err)
			}
			keep[pod.UID] = true
			p.st.Phase = PhaseScheduling
			p.reason = new(string)
		default:
			if why := podGone(first); why != "" {
				p.failVMI(why)
				break
			}
			keep[first.UID] = true
			if !podRunning(first) {
				p.st.Phase = PhaseScheduling
				break
			}
			p.st.Phase = PhaseRunning
			p.st.NodeName = first.Spec.NodeName
			p.st.ActivePods = map[string]string{string(first.UID): first.Spec.NodeName}
			p.st.Interfaces = interfaces(vmi, first)
		}
		if p.st.Phase == PhaseFailed {
			p.failMigrations(u.vmims, fmt.Sprintf("VirtualMachineInstance %s failed: %s", u.key, *p.reason))
		} else {
			for _, m := range u.vmims {
				p.setPhase(m, PhasePending, "") // until the VMI runs
			}
		}
	}
	for _, pod := range own {
		if !keep[pod.UID] && pod.DeletionTimestamp == nil {
			p.deletes = append(p.deletes, pod)
		}
	}
	if p.st.Phase == PhaseRunning && r.agent != nil {
		if guest, ok := r.agent.GuestInterfaces(vmi.Namespace, vmi.Name); ok {
			p.st.Interfaces = withGuest(vmi, p.st.Interfaces, guest)
			if u.requeue == 0 || u.requeue > GuestPoll {
				u.requeue = GuestPoll
			}
		}
	}
	pruneActivePods(p.st, own, keep)
	return r.apply(ctx, u, p)
}

// currentPod returns the pod running the VMI: the one of status.activePods
// on status.nodeName (preferring one that is not being deleted).
func currentPod(st *kubevirtv1.VirtualMachineInstanceStatus, own []*corev1.Pod) *corev1.Pod {
	var found *corev1.Pod
	for _, pod := range own {
		node, ok := st.ActivePods[string(pod.UID)]
		if !ok || node != st.NodeName || pod.Spec.NodeName != st.NodeName {
			continue
		}
		if found == nil || found.DeletionTimestamp != nil && pod.DeletionTimestamp == nil {
			found = pod
		}
	}
	return found
}

// pruneActivePods drops from status.activePods the pods that are gone.
func pruneActivePods(st *kubevirtv1.VirtualMachineInstanceStatus, own []*corev1.Pod, keep map[types.UID]bool) {
	exists := map[string]bool{}
	for _, pod := range own {
		exists[string(pod.UID)] = true
	}
	for uid := range keep {
		exists[string(uid)] = true
	}
	maps.DeleteFunc(st.ActivePods, func(uid, _ string) bool { return !exists[uid] })
	if len(st.ActivePods) == 0 {
		st.ActivePods = nil
	}
}

// migrate carries the oldest pending migration of a running VMI one step
// further; cur is the pod running the VMI.
func (r *reconciler) migrate(ctx context.Context, u *unit, own []*corev1.Pod, cur *corev1.Pod, p *plan, keep map[types.UID]bool) error {
	var active []*kubevirtv1.VirtualMachineInstanceMigration
	for _, m := range u.vmims {
		if m.DeletionTimestamp == nil && !finalPhase(m.Status.Phase) && m.UID != "" {
			active = append(active, m)
		}
	}
	ms := p.st.MigrationState
	if len(active) == 0 {
		if ms != nil && !ms.Completed && !ms.Failed {
			// Its migration is gone: aborted.
			end := metav1.Now()
			ms.Failed, ms.FailureReason, ms.EndTimestamp = true, "the migration was deleted before it completed", &end
		}
		return nil
	}
	m := active[0]
	for _, o := range active[1:] {
		p.setPhase(o, PhasePending, "") // one migration at a time
	}
	var target *corev1.Pod
	for _, pod := range own {
		if uid := pod.Labels[MigrationJobUIDLabel]; uid != "" && uid == string(m.UID) {
			target = pod
			break
		}
	}
	mine := ms != nil && target != nil && ms.TargetPod == target.Name
	now := metav1.Now()
	fail := func(reason string) {
		p.setPhase(m, PhaseFailed, reason)
		switch {
		case ms != nil && ms.MigrationUID == string(m.UID) && !ms.Completed, ms != nil && ms.MigrationUID == "" && !ms.Completed:
			ms.Failed, ms.FailureReason, ms.EndTimestamp = true, reason, &now
		case ms == nil || ms.MigrationUID != string(m.UID):
			// It failed before it had a target: the VMI's state is this
			// migration's, failed, as KubeVirt reports it.
			p.st.MigrationState = &kubevirtv1.VirtualMachineInstanceMigrationState{
				MigrationUID: string(m.UID), SourceNode: cur.Spec.NodeName, SourcePod: cur.Name,
				StartTimestamp: &now, EndTimestamp: &now, Failed: true, FailureReason: reason,
			}
		}
	}
	state := func(target *corev1.Pod) *kubevirtv1.VirtualMachineInstanceMigrationState {
		start := now
		if ms != nil && ms.MigrationUID == string(m.UID) && ms.StartTimestamp != nil {
			start = *ms.StartTimestamp
		}
		return &kubevirtv1.VirtualMachineInstanceMigrationState{
			SourceNode: cur.Spec.NodeName, SourcePod: cur.Name,
			TargetNode: target.Spec.NodeName, TargetPod: target.Name,
			MigrationUID: string(m.UID), StartTimestamp: &start,
			TargetNodeAddress: target.Annotations[TargetAddressAnnotation],
		}
	}
	addActive := func(pod *corev1.Pod) {
		if p.st.ActivePods == nil {
			p.st.ActivePods = map[string]string{}
		}
		p.st.ActivePods[string(pod.UID)] = pod.Spec.NodeName
	}
	switch {
	case mine && ms.Completed:
		p.setPhase(m, PhaseSucceeded, "")
	case target == nil && (m.Status.Phase == PhaseScheduling || m.Status.Phase == PhaseTargetReady):
		fail(fmt.Sprintf("the target launcher pod of migration %s vanished before the switch-over", m.Name))
	case target == nil:
		load, err := r.nodeLoad(ctx)
		if err != nil {
			return err
		}
		node := pickNode(r.nodes, load, cur.Spec.NodeName)
		if node == "" {
			fail(fmt.Sprintf("no node to migrate VirtualMachineInstance %s to: it runs on %s, and simvirt has no other node (nodes %v)", u.key, cur.Spec.NodeName, r.nodes))
			return nil
		}
		addr, err := r.migrationAddress(ctx, node)
		var perm permanentError
		if errors.As(err, &perm) {
			fail(err.Error())
			return nil
		}
		if err != nil {
			return err
		}
		pod, err := r.createPod(ctx, u.vmi, node, m, addr)
		if errors.As(err, &perm) {
			fail(err.Error())
			return nil
		}
		if err != nil {
			return err
		}
		keep[pod.UID] = true
		p.st.MigrationState = state(pod)
		addActive(pod)
		p.setPhase(m, PhaseScheduling, "")
	case podGone(target) != "":
		fail("migration target: " + podGone(target)) // and the target pod goes (not kept)
	default:
		keep[target.UID] = true
		if !mine {
			p.st.MigrationState = state(target)
		}
		addActive(target)
		switch {
		case !podRunning(target):
			p.setPhase(m, PhaseScheduling, "")
		case m.Status.Phase != PhaseTargetReady:
			p.setPhase(m, PhaseTargetReady, "")
		default:
			// Switch-over: the VMI runs on the target; the source goes
			// once the status says so.
			p.st.NodeName = target.Spec.NodeName
			p.st.MigrationState.Completed = true
			p.st.MigrationState.Failed = false
			p.st.MigrationState.EndTimestamp = &now
			p.st.Interfaces = interfaces(u.vmi, target)
			delete(keep, cur.UID)
			p.setPhase(m, PhaseSucceeded, "")
			log.FromContext(ctx).Info("migration switched over", "vmi", u.key.String(), "migration", m.Name,
				"from", cur.Spec.NodeName, "to", target.Spec.NodeName)
		}
	}
	return nil
}

// finalizeVMI deletes a deleted VMI's pods and releases it once they are
// gone.
func (r *reconciler) finalizeVMI(ctx context.Context, u *unit, own []*corev1.Pod) error {
	vmi := u.vmi
	p := &plan{st: vmi.Status.DeepCopy()}
	p.failMigrations(u.vmims, fmt.Sprintf("VirtualMachineInstance %s is being deleted", u.key))
	for _, pod := range own {
		if pod.DeletionTimestamp == nil {
			p.deletes = append(p.deletes, pod)
		}
	}
	pruneActivePods(p.st, own, nil)
	if err := r.apply(ctx, u, p); err != nil {
		return err
	}
	if len(own) > 0 || !controllerutil.ContainsFinalizer(vmi, VMIFinalizer) {
		return nil
	}
	patch := client.MergeFromWithOptions(vmi.DeepCopy(), client.MergeFromWithOptimisticLock{})
	controllerutil.RemoveFinalizer(vmi, VMIFinalizer)
	if err := r.client.Patch(ctx, vmi, patch); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("remove finalizer of VirtualMachineInstance %s: %w", u.key, err)
	}
	log.FromContext(ctx).Info("VirtualMachineInstance released: its launcher pods are gone", "vmi", u.key.String())
	if len(vmi.Finalizers) == 0 {
		u.vmi = nil // deleted for good
	}
	return nil
}

// applyThen applies p and returns err (or the apply's error).
func (r *reconciler) applyThen(ctx context.Context, u *unit, p *plan, err error) error {
	if aerr := r.apply(ctx, u, p); aerr != nil {
		return errors.Join(err, aerr)
	}
	return err
}

// apply writes p: a failure reason before the status that shows the
// failure, pod deletions only once the status is written.
func (r *reconciler) apply(ctx context.Context, u *unit, p *plan) error {
	vmi := u.vmi
	if p.reason != nil && *p.reason != "" {
		if err := r.setReason(ctx, vmi, *p.reason); err != nil {
			return err
		}
	}
	if !equality.Semantic.DeepEqual(*p.st, vmi.Status) {
		if p.st.Phase != vmi.Status.Phase {
			kv := []any{"vmi", u.key.String(), "from", vmi.Status.Phase, "to", p.st.Phase, "node", p.st.NodeName}
			if p.reason != nil && *p.reason != "" {
				kv = append(kv, "reason", *p.reason)
			}
			log.FromContext(ctx).Info("VirtualMachineInstance phase", kv...)
		}
		patch := client.MergeFromWithOptions(vmi.DeepCopy(), client.MergeFromWithOptimisticLock{})
		vmi.Status = *p.st
		if err := r.client.Status().Patch(ctx, vmi, patch); err != nil {
			return fmt.Errorf("update status of VirtualMachineInstance %s: %w", u.key, err)
		}
	}
	if p.reason != nil && *p.reason == "" {
		if err := r.setReason(ctx, vmi, ""); err != nil {
			return err
		}
	}
	for _, pod := range p.deletes {
		why := "it no longer runs the VMI"
		switch {
		case vmi.DeletionTimestamp != nil:
			why = "its VMI is being deleted"
		case finalPhase(p.st.Phase):
			why = "its VMI is " + p.st.Phase
		}
		if err := r.deletePod(ctx, pod, why); err != nil {
			return err
		}
	}
	return r.applyMigrations(ctx, p)
}

// applyMigrations writes the migration phase changes of p; a final
// migration never changes.
func (r *reconciler) applyMigrations(ctx context.Context, p *plan) error {
	for _, c := range p.vmims {
		m := c.m
		if m.DeletionTimestamp != nil || finalPhase(m.Status.Phase) {
			continue
		}
		if c.reason != "" {
			if err := r.setReason(ctx, m, c.reason); err != nil {
				return err
			}
		}
		if m.Status.Phase == c.phase {
			continue
		}
		patch := client.MergeFromWithOptions(m.DeepCopy(), client.MergeFromWithOptimisticLock{})
		from := m.Status.Phase
		m.Status.Phase = c.phase
		if err := r.client.Status().Patch(ctx, m, patch); err != nil {
			return fmt.Errorf("update status of VirtualMachineInstanceMigration %s/%s: %w", m.Namespace, m.Name, err)
		}
		kv := []any{"migration", m.Namespace + "/" + m.Name, "vmi", m.Spec.VMIName, "from", from, "to", c.phase}
		if c.reason != "" {
			kv = append(kv, "reason", c.reason)
		}
		log.FromContext(ctx).Info("migration phase", kv...)
	}
	return nil
}

// setReason sets (or, with "", removes) the failure reason annotation of o.
func (r *reconciler) setReason(ctx context.Context, o client.Object, reason string) error {
	cur, ok := o.GetAnnotations()[FailureReasonAnnotation]
	if reason == "" && !ok || reason != "" && ok && cur == reason {
		return nil
	}
	patch := client.MergeFrom(o.DeepCopyObject().(client.Object))
	ann := maps.Clone(o.GetAnnotations())
	if ann == nil {
		ann = map[string]string{}
	}
	if reason == "" {
		delete(ann, FailureReasonAnnotation)
	} else {
		ann[FailureReasonAnnotation] = reason
	}
	o.SetAnnotations(ann)
	if err := r.client.Patch(ctx, o, patch); err != nil {
		return fmt.Errorf("annotate %T %s/%s with %s: %w", o, o.GetNamespace(), o.GetName(), FailureReasonAnnotation, err)
	}
	return nil
}

// writeVMStatus writes the VM's status from its VMI.
func (r *reconciler) writeVMStatus(ctx context.Context, u *unit) error {
	vm := u.vm
	want := vmStatus(runStrategy(vm), u.vmi)
	if equality.Semantic.DeepEqual(want, vm.Status) {
		return nil
	}
	patch := client.MergeFrom(vm.DeepCopy())
	vm.Status = want
	if err := r.client.Status().Patch(ctx, vm, patch); err != nil {
		return fmt.Errorf("update status of VirtualMachine %s: %w", u.key, err)
	}
	return nil
}
