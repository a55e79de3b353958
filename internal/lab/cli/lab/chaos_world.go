package lab

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/netip"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ipamclaimv1alpha1 "kvnet.io/kvnet/api/k8scni/v1alpha1"
	kubevirtv1 "kvnet.io/kvnet/api/kubevirt/v1"
	udnv1 "kvnet.io/kvnet/api/udn/v1"
	"kvnet.io/kvnet/internal/audit"
	"kvnet.io/kvnet/internal/ipam"
	"kvnet.io/kvnet/internal/lab/simlauncher"
	"kvnet.io/kvnet/internal/podnetworks"
	"kvnet.io/kvnet/internal/udn"
)

// chaosLabel marks every object a chaos run makes.
const chaosLabel = "chaos.kvnet.io/run"

// The chaos tenants' networks: a persistent primary Layer2 UDN and two
// persistent secondary ones, for VMs' second interfaces and for hot plug
// (kvnet refuses a pod that selects one NAD twice).
const (
	chaosPrimary   = "primary"
	chaosSecondary = "sec"
	chaosHotplug   = "hot"
)

// chaosOp is one kind of operation and its weight in the mix.
type chaosOp struct {
	name   string
	weight int
	do     func(w *world, ctx context.Context, rng *rand.Rand) (bool, error)
}

var chaosOps = []chaosOp{
	{"pod-create", 30, (*world).createPod},
	{"pod-delete", 20, (*world).deletePod},
	{"vm-create", 10, (*world).createVM},
	{"vm-stop-start", 10, (*world).stopStartVM},
	{"vm-delete", 6, (*world).deleteVM},
	{"vm-migrate", 8, (*world).migrateVM},
	{"vm-hotplug", 4, (*world).hotplugVM},
	{"tenant-create", 3, (*world).createTenant},
	{"tenant-delete", 2, (*world).deleteTenant},
}

type tenant struct {
	ns        string
	permanent bool
}

type chaosPod struct {
	ns, name, claim string
}

type chaosVM struct {
	ns, name   string
	running    bool
	secondary  bool // has an interface on the secondary network
	hotplugged bool
	guest      bool // runs as a QEMU guest (--guests)
}

// world is the chaos run's workload: what it made and still expects to
// exist, the operation counters and the allocation latencies.
type world struct {
	e      *chaosEnv
	faults faultLog
	cache  cache.Cache
	stopC  context.CancelFunc

	mu      sync.Mutex // guards the following
	seq     int
	tenants []*tenant
	pods    map[string]*chaosPod // ns/name
	vms     map[string]*chaosVM
	busy    map[string]bool // objects an operation in flight works on
	created map[string]time.Time
	latency []time.Duration
	faulty  []time.Duration
	opsDone map[string]int
	errs    []string
	failed  int
	done    atomic.Int64
	// holdDeletes keeps tenants from being deleted (see quiet).
	holdDeletes bool
	// migrations are those the run created; disturbed records when the
	// run stopped or deleted a VM (by key) or deleted a tenant (by
	// "ns:<namespace>"), which explains a migration's failure.
	migrations []*chaosMigration
	disturbed  map[string][]time.Time
	// background are operations' tails that go on after the operation
	// returned (a claim deleted once its pod is gone).
	background sync.WaitGroup
}

func newWorld(ctx context.Context, e *chaosEnv) (*world, error) {
	w := &world{e: e, pods: map[string]*chaosPod{}, vms: map[string]*chaosVM{}, busy: map[string]bool{},
		created: map[string]time.Time{}, opsDone: map[string]int{}, disturbed: map[string][]time.Time{}}
	// Allocation latency: a pod's creation to its annotation, seen through
	// an informer (which survives API server restarts by relisting).
	sel := labels.SelectorFromSet(labels.Set{chaosLabel: "1"})
	ca, err := cache.New(e.cp.Config, cache.Options{Scheme: e.c.Scheme(), DefaultLabelSelector: sel})
	if err != nil {
		return nil, err
	}
	inf, err := ca.GetInformer(ctx, &corev1.Pod{})
	if err != nil {
		return nil, err
	}
	seen := func(o any) {
		p, ok := o.(*corev1.Pod)
		if !ok || p.Annotations[podnetworks.Annotation] == "" {
			return
		}
		now := time.Now()
		w.mu.Lock()
		defer w.mu.Unlock()
		k := p.Namespace + "/" + p.Name
		if t0, ok := w.created[k]; ok {
			delete(w.created, k)
			d := now.Sub(t0)
			w.latency = append(w.latency, d)
			if w.faults.overlaps(t0, now) {
				w.faulty = append(w.faulty, d)
			}
		}
	}
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: seen, UpdateFunc: func(_, o any) { seen(o) },
	}); err != nil {
		return nil, err
	}
	cctx, cancel := context.WithCancel(ctx)
	w.cache, w.stopC = ca, cancel
	go func() { _ = ca.Start(cctx) }()
	if !ca.WaitForCacheSync(ctx) {
		cancel()
		return nil, errors.New("chaos: pod informer did not sync")
	}
	// Two tenants that live through the run; more come and go.
	for i := range 2 {
		t := &tenant{ns: fmt.Sprintf("chaos-%d", i+1), permanent: true}
		if err := w.makeTenant(ctx, t); err != nil {
			cancel()
			return nil, err
		}
		w.tenants = append(w.tenants, t)
	}
	if err := w.createGuests(ctx, e.f.guests); err != nil {
		cancel()
		return nil, err
	}
	return w, nil
}

func (w *world) stop() { w.stopC() }

// retry runs f until it succeeds, the error is not one a fault explains
// (the API server or a webhook unreachable, a conflict), or a minute
// passes.
func retry(ctx context.Context, f func() error) error {
	deadline := time.Now().Add(time.Minute)
	for {
		err := f()
		if err == nil || !transient(err) || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// transient errors are those a fault in progress explains.
func transient(err error) bool {
	if apierrors.IsConflict(err) || apierrors.IsServerTimeout(err) || apierrors.IsTimeout(err) ||
		apierrors.IsTooManyRequests(err) || apierrors.IsServiceUnavailable(err) || apierrors.IsInternalError(err) {
		return true
	}
	s := err.Error()
	for _, m := range []string{"connection refused", "connection reset", "EOF", "failed calling webhook", "i/o timeout", "no endpoints available", "the server is currently unable",
		"TLS handshake timeout", "client connection lost", "http2: server sent GOAWAY", "context deadline exceeded", "broken pipe",
		// kvnet-controller's VM webhook while its MAC pool rebuilds after
		// a restart: it asks to retry.
		"MAC pool is not ready on this replica"} {
		if strings.Contains(s, m) {
			return true
		}
	}
	return false
}

func (w *world) create(ctx context.Context, o client.Object) error {
	return retry(ctx, func() error {
		err := w.e.c.Create(ctx, o)
		if apierrors.IsAlreadyExists(err) { // a retry after a lost answer
			return nil
		}
		return err
	})
}

func (w *world) delete(ctx context.Context, o client.Object) error {
	return retry(ctx, func() error {
		return client.IgnoreNotFound(w.e.c.Delete(ctx, o, client.PropagationPolicy(metav1.DeletePropagationBackground)))
	})
}

func chaosMeta(ns, name string) metav1.ObjectMeta {
	return metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{chaosLabel: "1"}}
}

// makeTenant creates a namespace labelled for a primary UDN, its primary
// and secondary UDNs (persistent IPs), and waits for their NADs.
func (w *world) makeTenant(ctx context.Context, t *tenant) error {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: t.ns, Labels: map[string]string{
		"k8s.ovn.org/primary-user-defined-network": "", chaosLabel: "1"}}}
	if err := w.create(ctx, ns); err != nil {
		return fmt.Errorf("tenant %s: %w", t.ns, err)
	}
	persistent := &udnv1.IPAMConfig{Lifecycle: udnv1.IPAMLifecyclePersistent}
	for _, u := range []struct {
		name   string
		role   udnv1.NetworkRole
		subnet udnv1.CIDR
	}{{chaosPrimary, udnv1.NetworkRolePrimary, "10.20.0.0/16"}, {chaosSecondary, udnv1.NetworkRoleSecondary, "10.30.0.0/16"},
		{chaosHotplug, udnv1.NetworkRoleSecondary, "10.40.0.0/16"}} {
		obj := &udnv1.UserDefinedNetwork{
			ObjectMeta: chaosMeta(t.ns, u.name),
			Spec: udnv1.UserDefinedNetworkSpec{Topology: udnv1.NetworkTopologyLayer2, Layer2: &udnv1.Layer2Config{
				Role: u.role, Subnets: udnv1.DualStackCIDRs{u.subnet}, IPAM: persistent}},
		}
		if err := w.create(ctx, obj); err != nil {
			return fmt.Errorf("tenant %s: UDN %s: %w", t.ns, u.name, err)
		}
	}
	return nil
}

// pick returns a random key of m not busy, marking it busy; "" if none.
func pick[V any](w *world, rng *rand.Rand, m map[string]V) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		if !w.busy[k] {
			keys = append(keys, k)
		}
	}
	if len(keys) == 0 {
		return ""
	}
	sort.Strings(keys) // map order is random; the seed decides alone
	k := keys[rng.IntN(len(keys))]
	w.busy[k] = true
	return k
}

func (w *world) release(k string) {
	w.mu.Lock()
	delete(w.busy, k)
	w.mu.Unlock()
}

// liveTenant returns a random tenant that is not being deleted.
func (w *world) liveTenant(rng *rand.Rand) *tenant {
	var ts []*tenant
	for _, t := range w.tenants {
		if !w.busy["ns:"+t.ns] {
			ts = append(ts, t)
		}
	}
	return ts[rng.IntN(len(ts))]
}

func (w *world) createPod(ctx context.Context, rng *rand.Rand) (bool, error) {
	w.mu.Lock()
	w.seq++
	t := w.liveTenant(rng)
	p := &chaosPod{ns: t.ns, name: fmt.Sprintf("pod-%d", w.seq)}
	k := p.ns + "/" + p.name
	w.busy[k], w.busy["use:"+t.ns+":"+k] = true, true
	w.mu.Unlock()
	defer w.release(k)
	defer w.release("use:" + t.ns + ":" + k)
	pod := &corev1.Pod{
		ObjectMeta: chaosMeta(p.ns, p.name),
		Spec: corev1.PodSpec{NodeName: w.e.nodes[rng.IntN(len(w.e.nodes))],
			Containers: []corev1.Container{{Name: "c", Image: "busybox"}}},
	}
	if rng.IntN(3) == 0 {
		// A workload with a persistent IP: its own claim.
		p.claim = p.name + ".ip"
		claim := &ipamclaimv1alpha1.IPAMClaim{ObjectMeta: chaosMeta(p.ns, p.claim),
			Spec: ipamclaimv1alpha1.IPAMClaimSpec{Network: udn.NetworkName(p.ns, chaosPrimary), Interface: "ovn-udn1"}}
		if err := w.create(ctx, claim); err != nil {
			return false, fmt.Errorf("claim %s/%s: %w", p.ns, p.claim, err)
		}
		pod.Annotations = map[string]string{ipam.LegacyPrimaryClaimAnnotation: p.claim}
	}
	w.mu.Lock()
	w.created[k] = time.Now()
	w.mu.Unlock()
	if err := w.create(ctx, pod); err != nil {
		w.mu.Lock()
		delete(w.created, k)
		w.mu.Unlock()
		if p.claim != "" {
			// The workload never started: its claim goes too, or the
			// audit rightly finds it leaked. The pod may exist after all
			// (created, its answer lost, the retries refused): it goes
			// with it.
			cleanup := []client.Object{&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: p.ns, Name: p.name}},
				&ipamclaimv1alpha1.IPAMClaim{ObjectMeta: metav1.ObjectMeta{Namespace: p.ns, Name: p.claim}}}
			for _, o := range cleanup {
				if derr := w.delete(ctx, o); derr != nil {
					err = errors.Join(err, fmt.Errorf("clean up %s: %w", o.GetName(), derr))
				}
			}
		}
		return false, fmt.Errorf("pod %s: %w", k, err)
	}
	w.mu.Lock()
	w.pods[k] = p
	w.mu.Unlock()
	return true, nil
}

func (w *world) deletePod(ctx context.Context, rng *rand.Rand) (bool, error) {
	w.mu.Lock()
	k := pick(w, rng, w.pods)
	if k == "" {
		w.mu.Unlock()
		return false, nil
	}
	p := w.pods[k]
	delete(w.pods, k)
	delete(w.created, k)
	w.mu.Unlock()
	if err := w.delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: p.ns, Name: p.name}}); err != nil {
		w.release(k)
		return false, fmt.Errorf("delete pod %s: %w", k, err)
	}
	if p.claim == "" {
		w.release(k)
		return true, nil
	}
	// The workload is gone for good: so is its claim, once the pod is
	// gone, as the claim's owner would (KubeVirt's finalizer does so for
	// a VM's claims). Deleting it while the pod terminates frees its IP
	// for another pod while the terminating one still holds it, which
	// the audit snapshots rightly report as a duplicate. The wait goes
	// on in the background (the pod stays busy: its tenant is not
	// deleted meanwhile), so that it does not hold a worker.
	w.background.Go(func() {
		defer w.release(k)
		if err := w.deleteClaimAfterPod(ctx, p); err != nil {
			w.mu.Lock()
			w.failed++
			w.errs = append(w.errs, "pod-delete: "+err.Error())
			w.mu.Unlock()
		}
	})
	return true, nil
}

// deleteClaimAfterPod waits (up to podGoneTimeout) until pod p is gone,
// then deletes its claim.
func (w *world) deleteClaimAfterPod(ctx context.Context, p *chaosPod) error {
	deadline := time.Now().Add(podGoneTimeout)
	for {
		var pod corev1.Pod
		err := w.e.c.Get(ctx, client.ObjectKey{Namespace: p.ns, Name: p.name}, &pod)
		if apierrors.IsNotFound(err) {
			break
		}
		if err != nil && !transient(err) {
			return fmt.Errorf("wait for pod %s/%s to go: %w", p.ns, p.name, err)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pod %s/%s still there %s after its deletion (%v); its claim %s is kept", p.ns, p.name, podGoneTimeout, err, p.claim)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
	if err := w.delete(ctx, &ipamclaimv1alpha1.IPAMClaim{ObjectMeta: metav1.ObjectMeta{Namespace: p.ns, Name: p.claim}}); err != nil {
		return fmt.Errorf("delete claim %s/%s: %w", p.ns, p.claim, err)
	}
	return nil
}

// podGoneTimeout bounds the wait for a deleted pod to go before its claim
// is deleted.
const podGoneTimeout = 5 * time.Minute

func vmSpec(secondary, hotplugged bool) kubevirtv1.VirtualMachineInstanceSpec {
	s := kubevirtv1.VirtualMachineInstanceSpec{
		Networks: []kubevirtv1.Network{{Name: "default", Pod: &kubevirtv1.PodNetwork{}}},
	}
	s.Domain.Devices.Interfaces = []kubevirtv1.Interface{{Name: "default", Binding: &kubevirtv1.PluginBinding{Name: "l2bridge"}}}
	add := func(name, nad string) {
		s.Networks = append(s.Networks, kubevirtv1.Network{Name: name, Multus: &kubevirtv1.MultusNetwork{NetworkName: nad}})
		s.Domain.Devices.Interfaces = append(s.Domain.Devices.Interfaces, kubevirtv1.Interface{Name: name, Bridge: &kubevirtv1.InterfaceBridge{}})
	}
	if secondary {
		add("sec", chaosSecondary)
	}
	if hotplugged {
		add("hot", chaosHotplug)
	}
	return s
}

// vmTemplateMeta is the metadata of a VM's template: a VM that is not a
// guest gets none (simlauncher's no-guest annotation).
func vmTemplateMeta(guest bool) metav1.ObjectMeta {
	m := metav1.ObjectMeta{Labels: map[string]string{chaosLabel: "1"}}
	if !guest {
		m.Annotations = map[string]string{simlauncher.NoGuestAnnotation: "true"}
	}
	return m
}

func strategy(running bool) *string {
	s := "Halted"
	if running {
		s = "Always"
	}
	return &s
}

func (w *world) createVM(ctx context.Context, rng *rand.Rand) (bool, error) {
	w.mu.Lock()
	w.seq++
	t := w.liveTenant(rng)
	v := &chaosVM{ns: t.ns, name: fmt.Sprintf("vm-%d", w.seq), running: true, secondary: rng.IntN(2) == 0}
	k := v.ns + "/" + v.name
	w.busy[k], w.busy["use:"+t.ns+":"+k] = true, true
	w.mu.Unlock()
	defer w.release(k)
	defer w.release("use:" + t.ns + ":" + k)
	vm := &kubevirtv1.VirtualMachine{
		ObjectMeta: chaosMeta(v.ns, v.name),
		Spec: kubevirtv1.VirtualMachineSpec{RunStrategy: strategy(true), Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{
			ObjectMeta: vmTemplateMeta(false),
			Spec:       vmSpec(v.secondary, false),
		}},
	}
	if err := w.create(ctx, vm); err != nil {
		return false, fmt.Errorf("VM %s: %w", k, err)
	}
	w.mu.Lock()
	w.vms[k] = v
	w.mu.Unlock()
	return true, nil
}

// updateVM applies change to VM k, retrying conflicts and faults.
func (w *world) updateVM(ctx context.Context, v *chaosVM, change func(*kubevirtv1.VirtualMachine)) error {
	return retry(ctx, func() error {
		var vm kubevirtv1.VirtualMachine
		if err := w.e.c.Get(ctx, client.ObjectKey{Namespace: v.ns, Name: v.name}, &vm); err != nil {
			return err
		}
		change(&vm)
		return w.e.c.Update(ctx, &vm)
	})
}

func (w *world) stopStartVM(ctx context.Context, rng *rand.Rand) (bool, error) {
	w.mu.Lock()
	k := pick(w, rng, w.vms)
	if k == "" {
		w.mu.Unlock()
		return false, nil
	}
	v := w.vms[k]
	w.mu.Unlock()
	defer w.release(k)
	run := !v.running
	if !run {
		w.disturb(k)
	}
	if err := w.updateVM(ctx, v, func(vm *kubevirtv1.VirtualMachine) { vm.Spec.RunStrategy = strategy(run) }); err != nil {
		return false, fmt.Errorf("VM %s run %v: %w", k, run, err)
	}
	w.mu.Lock()
	v.running = run
	w.mu.Unlock()
	return true, nil
}

func (w *world) deleteVM(ctx context.Context, rng *rand.Rand) (bool, error) {
	w.mu.Lock()
	cands := map[string]*chaosVM{}
	for k, v := range w.vms {
		if !v.guest { // kept to be reached at the end
			cands[k] = v
		}
	}
	k := pick(w, rng, cands)
	if k == "" {
		w.mu.Unlock()
		return false, nil
	}
	v := w.vms[k]
	delete(w.vms, k)
	w.mu.Unlock()
	defer w.release(k)
	w.disturb(k)
	if err := w.delete(ctx, &kubevirtv1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: v.ns, Name: v.name}}); err != nil {
		return false, fmt.Errorf("delete VM %s: %w", k, err)
	}
	return true, nil
}

// runningVM picks a VM whose VMI runs, or "".
func (w *world) runningVM(ctx context.Context, rng *rand.Rand, want func(*chaosVM) bool) (string, *chaosVM, *kubevirtv1.VirtualMachineInstance) {
	w.mu.Lock()
	cands := map[string]*chaosVM{}
	for k, v := range w.vms {
		if v.running && want(v) {
			cands[k] = v
		}
	}
	w.mu.Unlock()
	// Several tries: a VM that was just created or started is not
	// running yet.
	for range 20 {
		w.mu.Lock()
		k := pick(w, rng, cands)
		w.mu.Unlock()
		if k == "" {
			return "", nil, nil
		}
		v := cands[k]
		delete(cands, k)
		// Deleted (alone or with its tenant) since the candidates were
		// listed: the pick came too late to keep it.
		w.mu.Lock()
		alive := w.vms[k] == v
		w.mu.Unlock()
		if !alive {
			w.release(k)
			continue
		}
		var vmi kubevirtv1.VirtualMachineInstance
		// A VMI being deleted may still say Running: the VMI of a VM
		// stopped and started again before it was gone.
		if err := w.e.c.Get(ctx, client.ObjectKey{Namespace: v.ns, Name: v.name}, &vmi); err == nil && vmi.Status.Phase == "Running" && vmi.DeletionTimestamp == nil {
			return k, v, &vmi
		}
		w.release(k)
	}
	return "", nil, nil
}

// migrate creates a migration of VM v's VMI vmi (as the run last read it).
func (w *world) migrate(ctx context.Context, v *chaosVM, vmi *kubevirtv1.VirtualMachineInstance) error {
	w.mu.Lock()
	w.seq++
	name := fmt.Sprintf("%s-mig-%d", v.name, w.seq)
	w.mu.Unlock()
	m := &kubevirtv1.VirtualMachineInstanceMigration{ObjectMeta: chaosMeta(v.ns, name),
		Spec: kubevirtv1.VirtualMachineInstanceMigrationSpec{VMIName: v.name}}
	created := time.Now()
	if err := w.create(ctx, m); err != nil {
		return err
	}
	w.mu.Lock()
	w.migrations = append(w.migrations, &chaosMigration{ns: v.ns, name: name, vm: v.ns + "/" + v.name, created: created,
		vmiCreated: vmi.CreationTimestamp.Time})
	w.mu.Unlock()
	return nil
}

func (w *world) migrateVM(ctx context.Context, rng *rand.Rand) (bool, error) {
	k, v, vmi := w.runningVM(ctx, rng, func(*chaosVM) bool { return true })
	if k == "" {
		return false, nil
	}
	defer w.release(k)
	if err := w.migrate(ctx, v, vmi); err != nil {
		return false, fmt.Errorf("migrate %s: %w", k, err)
	}
	return true, nil
}

// hotplugVM adds an interface on the secondary network to a running VM,
// as KubeVirt does: the VM's template and the VMI's spec get it, and a
// migration moves the VMI to a launcher pod that has it.
func (w *world) hotplugVM(ctx context.Context, rng *rand.Rand) (bool, error) {
	// Not into a guest: QEMU migrates only to the same devices.
	k, v, vmi := w.runningVM(ctx, rng, func(v *chaosVM) bool { return !v.hotplugged && !v.guest })
	if k == "" {
		return false, nil
	}
	defer w.release(k)
	if err := w.updateVM(ctx, v, func(vm *kubevirtv1.VirtualMachine) { vm.Spec.Template.Spec = vmSpec(v.secondary, true) }); err != nil {
		return false, fmt.Errorf("hot plug into VM %s: %w", k, err)
	}
	err := retry(ctx, func() error {
		var vmi kubevirtv1.VirtualMachineInstance
		if err := w.e.c.Get(ctx, client.ObjectKey{Namespace: v.ns, Name: v.name}, &vmi); err != nil {
			return err
		}
		vmi.Spec = vmSpec(v.secondary, true)
		return w.e.c.Update(ctx, &vmi)
	})
	if err != nil && !apierrors.IsNotFound(err) {
		return false, fmt.Errorf("hot plug into VMI %s: %w", k, err)
	}
	w.mu.Lock()
	v.hotplugged = true
	w.mu.Unlock()
	if err == nil {
		if err := w.migrate(ctx, v, vmi); err != nil {
			return false, fmt.Errorf("hot plug migration of %s: %w", k, err)
		}
	}
	return true, nil
}

func (w *world) createTenant(ctx context.Context, _ *rand.Rand) (bool, error) {
	w.mu.Lock()
	w.seq++
	t := &tenant{ns: fmt.Sprintf("chaos-t%d", w.seq)}
	w.mu.Unlock()
	if err := w.makeTenant(ctx, t); err != nil {
		return false, err
	}
	// Operations use it once it exists.
	w.mu.Lock()
	w.tenants = append(w.tenants, t)
	w.mu.Unlock()
	return true, nil
}

// deleteTenant deletes a tenant namespace with everything in it, once no
// operation works in it.
func (w *world) deleteTenant(ctx context.Context, rng *rand.Rand) (bool, error) {
	w.mu.Lock()
	var cands []*tenant
	for _, t := range w.tenants {
		if t.permanent || w.busy["ns:"+t.ns] {
			continue
		}
		inUse := false
		for b := range w.busy {
			if strings.HasPrefix(b, "use:"+t.ns+":") || strings.HasPrefix(b, t.ns+"/") {
				inUse = true
				break
			}
		}
		if !inUse {
			cands = append(cands, t)
		}
	}
	if len(cands) == 0 || w.holdDeletes {
		w.mu.Unlock()
		return false, nil
	}
	t := cands[rng.IntN(len(cands))]
	w.busy["ns:"+t.ns] = true
	w.tenants = slices.DeleteFunc(w.tenants, func(x *tenant) bool { return x == t })
	for k := range w.pods {
		if strings.HasPrefix(k, t.ns+"/") {
			delete(w.pods, k)
			delete(w.created, k)
		}
	}
	for k := range w.vms {
		if strings.HasPrefix(k, t.ns+"/") {
			delete(w.vms, k)
		}
	}
	w.mu.Unlock()
	w.disturb("ns:" + t.ns)
	if err := w.delete(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: t.ns}}); err != nil {
		return false, fmt.Errorf("delete tenant %s: %w", t.ns, err)
	}
	return true, nil
}

// quiet(true) holds back tenant deletions and waits until no chaos
// namespace is terminating; quiet(false) waits until the API server serves
// every API group the namespace controller must empty, then lets
// deletions go again (see injectOnce).
func (w *world) quiet(ctx context.Context, on bool) error {
	if on {
		w.mu.Lock()
		w.holdDeletes = true
		w.mu.Unlock()
	}
	// Namespace deletions take minutes when many are under way at once
	// (the namespace controller backs off while pods terminate).
	wait := 2 * time.Minute
	if on {
		wait = 15 * time.Minute
	}
	deadline := time.Now().Add(wait)
	for {
		var err error
		if on {
			err = w.noneTerminating(ctx)
		} else {
			err = w.allGroupsServed()
		}
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			if on {
				// The restart goes ahead; kvnet audit reports any
				// object the race leaves as Orphaned.
				fmt.Fprintf(os.Stderr, "chaos: restarting the API server with a namespace still terminating after %s: %v\n", wait, err)
				w.explainTerminating(ctx, os.Stderr)
				return nil
			}
			return fmt.Errorf("around the API server restart: %w", err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
	if !on {
		w.mu.Lock()
		w.holdDeletes = false
		w.mu.Unlock()
	}
	return nil
}

func (w *world) noneTerminating(ctx context.Context) error {
	var nsList corev1.NamespaceList
	if err := w.e.c.List(ctx, &nsList, client.MatchingLabels{chaosLabel: "1"}); err != nil {
		return err
	}
	for _, ns := range nsList.Items {
		if ns.DeletionTimestamp != nil {
			return fmt.Errorf("namespace %s still terminating", ns.Name)
		}
	}
	return nil
}

// explainTerminating prints, for each chaos namespace still terminating,
// what the namespace controller says remains, and for each UDN and NAD in
// it (and each IPAMClaim) the object as etcd holds it next to the API server's watch cache's
// copy (a list with resourceVersion "0", as informers make): when they
// differ, controllers never saw the newer one.
func (w *world) explainTerminating(ctx context.Context, out io.Writer) {
	var nsList corev1.NamespaceList
	if err := w.e.c.List(ctx, &nsList, client.MatchingLabels{chaosLabel: "1"}); err != nil {
		fmt.Fprintf(out, "chaos: list namespaces: %v\n", err)
		return
	}
	dc, err := dynamic.NewForConfig(w.e.cp.Config)
	if err != nil {
		fmt.Fprintf(out, "chaos: %v\n", err)
		return
	}
	for _, ns := range nsList.Items {
		if ns.DeletionTimestamp == nil {
			continue
		}
		for _, c := range ns.Status.Conditions {
			if c.Status == corev1.ConditionTrue {
				fmt.Fprintf(out, "chaos: namespace %s: %s: %s\n", ns.Name, c.Type, c.Message)
			}
		}
		for _, gvr := range []schema.GroupVersionResource{
			udnv1.GroupVersion.WithResource("userdefinednetworks"),
			{Group: "k8s.cni.cncf.io", Version: "v1", Resource: "network-attachment-definitions"},
			ipamclaimv1alpha1.GroupVersion.WithResource("ipamclaims"),
		} {
			fresh, err := dc.Resource(gvr).Namespace(ns.Name).List(ctx, metav1.ListOptions{})
			if err != nil {
				fmt.Fprintf(out, "chaos: list %s in %s: %v\n", gvr.Resource, ns.Name, err)
				continue
			}
			cached, err := dc.Resource(gvr).Namespace(ns.Name).List(ctx, metav1.ListOptions{ResourceVersion: "0"})
			if err != nil {
				fmt.Fprintf(out, "chaos: list %s in %s from the watch cache: %v\n", gvr.Resource, ns.Name, err)
				continue
			}
			seen := map[string]string{}
			for _, o := range cached.Items {
				seen[o.GetName()] = o.GetResourceVersion()
			}
			for _, o := range fresh.Items {
				conds, _, _ := unstructured.NestedSlice(o.Object, "status", "conditions")
				fmt.Fprintf(out, "chaos:   %s %s/%s: resourceVersion %s (watch cache %q), deletionTimestamp %v, finalizers %v, conditions %v\n",
					gvr.Resource, ns.Name, o.GetName(), o.GetResourceVersion(), seen[o.GetName()], o.GetDeletionTimestamp(), o.GetFinalizers(), conds)
			}
		}
	}
}

// chaosGroups are the API groups of the custom resources in a tenant.
var chaosGroups = []string{"kubevirt.io/v1", "k8s.cni.cncf.io/v1", "k8s.cni.cncf.io/v1alpha1", "k8s.ovn.org/v1"}

func (w *world) allGroupsServed() error {
	dc, err := discovery.NewDiscoveryClientForConfig(w.e.cp.Config)
	if err != nil {
		return err
	}
	for _, gv := range chaosGroups {
		if _, err := dc.ServerResourcesForGroupVersion(gv); err != nil {
			return fmt.Errorf("discovery of %s: %w", gv, err)
		}
	}
	return nil
}

// run drives the operations and the faults, lets the cluster settle and
// audits it.
func (w *world) run(ctx context.Context) (*ChaosResult, error) {
	f := w.e.f
	rng := rand.New(rand.NewPCG(f.seed, f.seed^0x6b766e6574))
	faultRng := rand.New(rand.NewPCG(f.seed+1, f.seed^0x63686173))
	total := 0
	for _, o := range chaosOps {
		total += o.weight
	}
	start := time.Now()
	// Audit snapshots during the churn and the settling: a duplicate at
	// any moment is a finding, even one gone by the end.
	var snaps snapshots
	stopSnaps, snapsDone := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(snapsDone)
		snaps.run(ctx, w.e.c, start, f.auditEvery, stopSnaps)
	}()
	endSnaps := func(res *ChaosResult) {
		close(stopSnaps)
		<-snapsDone
		res.Snapshots, res.SnapshotsFailed, res.Duplicates = snaps.result()
	}
	stopFaults := make(chan struct{})
	faultErr := make(chan error, 2)
	go func() {
		faultErr <- w.e.killControllers(ctx, stopFaults, faultRng, &w.faults)
	}()
	onceRng := rand.New(rand.NewPCG(faultRng.Uint64(), faultRng.Uint64()))
	go func() {
		faultErr <- w.e.injectOnce(ctx, stopFaults, onceRng, &w.faults, func() float64 { return float64(w.done.Load()) / float64(f.ops) }, w.quiet)
	}()
	sem := make(chan struct{}, f.workers)
	var wg sync.WaitGroup
	tick := time.NewTicker(time.Duration(float64(time.Second) / f.rate))
	var fatal error
	faultsEnded := 0
loop:
	for i := 0; i < f.ops; i++ {
		select {
		case <-ctx.Done():
			fatal = ctx.Err()
			break loop
		case err := <-faultErr:
			faultsEnded++
			if err != nil {
				fatal = fmt.Errorf("fault injection: %w", err)
				break loop
			}
		case <-tick.C:
		}
		if err := w.e.cl.Err(); err != nil {
			fatal = fmt.Errorf("simulated nodes: %w", err)
			break
		}
		// The operation is drawn here, in sequence, so the seed alone
		// decides the mix.
		n := rng.IntN(total)
		var op chaosOp
		for _, o := range chaosOps {
			if n < o.weight {
				op = o
				break
			}
			n -= o.weight
		}
		opRng := rand.New(rand.NewPCG(rng.Uint64(), rng.Uint64()))
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			did, err := op.do(w, ctx, opRng)
			w.mu.Lock()
			switch {
			case err != nil:
				w.failed++
				w.errs = append(w.errs, op.name+": "+err.Error())
			case did:
				w.opsDone[op.name]++
			default:
				w.opsDone[op.name+" (nothing to do)"]++
			}
			w.mu.Unlock()
			w.done.Add(1)
		})
	}
	tick.Stop()
	wg.Wait()
	w.background.Wait()
	close(stopFaults)
	for range 2 - faultsEnded {
		if err := <-faultErr; err != nil && fatal == nil {
			fatal = fmt.Errorf("fault injection: %w", err)
		}
	}
	if fatal == nil {
		fatal = w.startGuests(ctx)
	}
	res := &ChaosResult{Seed: f.seed, Operations: map[string]int{}}
	w.mu.Lock()
	for k, v := range w.opsDone {
		res.Operations[k] = v
		if !strings.HasSuffix(k, ")") {
			res.OpsDone += v
		}
	}
	res.OpsFailed, res.Errors = w.failed, slices.Clone(w.errs)
	w.mu.Unlock()
	res.Duration = time.Since(start).Round(time.Millisecond).String()
	res.ControllerKills = int(w.faults.kills.Load())
	res.APIServerRestarts = int(w.faults.api.Load())
	res.NodeAgentKills = int(w.faults.agents.Load())
	res.ControllerStartFailures = int(w.e.startFailures.Load())
	res.FromRestartReserve = w.e.fromReserve()
	if fatal != nil {
		endSnaps(res)
		return res, fatal
	}

	settleStart := time.Now()
	unsettled, pods, vms, findings, err := w.settle(ctx, f.quiesce)
	res.Settle = time.Since(settleStart).Round(time.Millisecond).String()
	endSnaps(res)
	res.Unsettled, res.PodsChecked, res.VMsChecked = unsettled, pods, vms
	w.mu.Lock()
	res.Allocation, res.AllocationFaults = latencyOf(w.latency), latencyOf(w.faulty)
	w.mu.Unlock()
	if err != nil {
		return res, fmt.Errorf("audit: %w", err)
	}
	if res.Migrations, err = w.migrationOutcomes(ctx); err != nil {
		return res, err
	}
	res.Guests = f.guests
	res.GuestsAnswered, res.GuestFindings, res.GuestCrashes = w.checkGuests(ctx)
	res.Audit = []string{}
	for _, fd := range findings {
		res.Audit = append(res.Audit, fmt.Sprintf("%s %s %s: %s", fd.Kind, fd.Network, fd.Object, fd.Detail))
	}
	return res, nil
}

// settle waits until every pod the run keeps has its addresses and is
// running, every VM meant to run has a running VMI whose interfaces carry
// its claims' IPs, nothing is left terminating, no migration is in
// progress and kvnet audit finds nothing (kvnet-controller mends some
// findings, such as a claim left in a deleted namespace, on its own); it
// returns what did not settle in time, the counts of what did and the
// last audit's findings.
//
// timeout is measured from the last progress, not from the start: while
// fewer things are unsettled than ever before (queued migrations of one VM
// run one after the other, namespaces empty one by one) the deadline moves
// on, up to settleCap timeouts in all.
func (w *world) settle(ctx context.Context, timeout time.Duration) (unsettled []string, pods, vms int, findings []audit.Finding, err error) {
	start := time.Now()
	deadline := start.Add(timeout)
	fewest := -1
	for {
		unsettled, pods, vms = w.check(ctx)
		if fewest < 0 || len(unsettled) < fewest {
			fewest = len(unsettled)
			deadline = time.Now().Add(timeout)
			if limit := start.Add(settleCap * timeout); deadline.After(limit) {
				deadline = limit
			}
		}
		findings = nil
		if len(unsettled) == 0 {
			rep, err := audit.Run(ctx, w.e.c)
			if err != nil && (!transient(err) || time.Now().After(deadline)) {
				return unsettled, pods, vms, nil, err
			}
			findings = rep.Findings
			if err == nil && len(findings) == 0 {
				return unsettled, pods, vms, nil, nil
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			if len(unsettled) > 20 {
				unsettled = append(unsettled[:20], fmt.Sprintf("... and %d more", len(unsettled)-20))
			}
			if len(unsettled) > 0 {
				// The audit of an unsettled cluster is still worth
				// reading.
				rep, err := audit.Run(ctx, w.e.c)
				if err != nil {
					return unsettled, pods, vms, nil, err
				}
				findings = rep.Findings
			}
			return unsettled, pods, vms, findings, nil
		}
		time.Sleep(time.Second)
	}
}

// settleCap bounds settle's wait, in quiesce timeouts, however long the
// cluster keeps making progress.
const settleCap = 4

func (w *world) check(ctx context.Context) (bad []string, pods, vms int) {
	c := w.e.c
	w.mu.Lock()
	wantPods := map[string]*chaosPod{}
	for k, p := range w.pods {
		wantPods[k] = p
	}
	wantVMs := map[string]chaosVM{}
	for k, v := range w.vms {
		wantVMs[k] = *v
	}
	w.mu.Unlock()

	var nsList corev1.NamespaceList
	if err := c.List(ctx, &nsList, client.MatchingLabels{chaosLabel: "1"}); err != nil {
		return []string{"list namespaces: " + err.Error()}, 0, 0
	}
	for _, ns := range nsList.Items {
		if ns.DeletionTimestamp != nil {
			bad = append(bad, "namespace "+ns.Name+" still terminating")
		}
	}
	var podList corev1.PodList
	if err := c.List(ctx, &podList); err != nil {
		return []string{"list pods: " + err.Error()}, 0, 0
	}
	byKey := map[string]*corev1.Pod{}
	for i := range podList.Items {
		p := &podList.Items[i]
		if !strings.HasPrefix(p.Namespace, "chaos-") {
			continue
		}
		k := p.Namespace + "/" + p.Name
		byKey[k] = p
		if p.DeletionTimestamp != nil {
			bad = append(bad, "pod "+k+" still terminating")
		}
	}
	for k, want := range wantPods {
		p := byKey[k]
		switch {
		case p == nil:
			bad = append(bad, "pod "+k+" is gone")
			continue
		case p.Status.Phase != corev1.PodRunning:
			bad = append(bad, fmt.Sprintf("pod %s is %s", k, p.Status.Phase))
			continue
		}
		nets, err := podnetworks.Parse(p.Annotations[podnetworks.Annotation])
		if err != nil || len(nets) == 0 {
			bad = append(bad, fmt.Sprintf("pod %s has no addresses (%v)", k, err))
			continue
		}
		if want.claim != "" {
			var cl ipamclaimv1alpha1.IPAMClaim
			if err := c.Get(ctx, client.ObjectKey{Namespace: want.ns, Name: want.claim}, &cl); err != nil {
				bad = append(bad, fmt.Sprintf("pod %s: claim %s: %v", k, want.claim, err))
				continue
			}
			if ips := primaryIPs(nets); !sameIPs(ips, cl.Status.IPs) {
				bad = append(bad, fmt.Sprintf("pod %s: IPs %v, its claim %s holds %v", k, ips, want.claim, cl.Status.IPs))
				continue
			}
		}
		pods++
	}
	for k, want := range wantVMs {
		var vmi kubevirtv1.VirtualMachineInstance
		err := c.Get(ctx, client.ObjectKey{Namespace: want.ns, Name: want.name}, &vmi)
		if !want.running {
			if err == nil {
				bad = append(bad, "VM "+k+" is stopped but its VMI exists")
			}
			continue
		}
		if err != nil || vmi.Status.Phase != "Running" || vmi.DeletionTimestamp != nil {
			bad = append(bad, fmt.Sprintf("VM %s: VMI not running (%v, phase %q)", k, err, vmi.Status.Phase))
			continue
		}
		if ms := vmi.Status.MigrationState; ms != nil && !ms.Completed && !ms.Failed {
			bad = append(bad, "VM "+k+": migration in progress")
			continue
		}
		ok := true
		for _, ifc := range vmi.Status.Interfaces {
			claim := want.name + "." + ifc.Name
			var cl ipamclaimv1alpha1.IPAMClaim
			if err := c.Get(ctx, client.ObjectKey{Namespace: want.ns, Name: claim}, &cl); err != nil {
				bad = append(bad, fmt.Sprintf("VM %s interface %s: claim %s: %v", k, ifc.Name, claim, err))
				ok = false
				continue
			}
			if ifc.IP == "" || !sameIPs(withoutPrefixes(cl.Status.IPs), ifc.IPs) {
				bad = append(bad, fmt.Sprintf("VM %s interface %s: IPs %v, claim %s holds %v", k, ifc.Name, ifc.IPs, claim, cl.Status.IPs))
				ok = false
			}
		}
		if len(vmi.Status.Interfaces) != len(vmi.Spec.Networks) {
			bad = append(bad, fmt.Sprintf("VM %s: %d interfaces reported, %d networks", k, len(vmi.Status.Interfaces), len(vmi.Spec.Networks)))
			ok = false
		}
		if ok {
			vms++
		}
	}
	bad = append(bad, w.unfinishedMigrations(ctx)...)
	sort.Strings(bad)
	return bad, pods, vms
}

func primaryIPs(nets podnetworks.Networks) []string {
	for _, a := range nets {
		if a.Role == podnetworks.RolePrimary {
			return a.IPAddresses
		}
	}
	return nil
}

func withoutPrefixes(cidrs []string) []string {
	out := make([]string, 0, len(cidrs))
	for _, c := range cidrs {
		if p, err := netip.ParsePrefix(c); err == nil {
			out = append(out, p.Addr().String())
		} else {
			out = append(out, c)
		}
	}
	return out
}

func sameIPs(a, b []string) bool {
	a, b = withoutPrefixes(a), withoutPrefixes(b)
	slices.Sort(a)
	slices.Sort(b)
	return len(a) > 0 && slices.Equal(a, b)
}
