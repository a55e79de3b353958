package lab

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ipamclaimv1alpha1 "kvnet.io/kvnet/api/k8scni/v1alpha1"
	kubevirtv1 "kvnet.io/kvnet/api/kubevirt/v1"
	udnv1 "kvnet.io/kvnet/api/udn/v1"
	"kvnet.io/kvnet/internal/audit"
	"kvnet.io/kvnet/internal/lab/simvirt"
	"kvnet.io/kvnet/internal/podnetworks"
)

// scaleTenant is a namespace with a primary UDN (Layer2 with persistent
// IPs, where the VMs go, or Layer3) and a secondary Layer2 UDN.
type scaleTenant struct {
	ns string
	l3 bool
}

const (
	scalePrimary   = "primary"
	scaleSecondary = "sec"
	scaleGroup     = "scale.kvnet.io/group"
)

// stamps records when each object (by key) was created and when it was
// first seen done.
type stamps struct {
	mu      sync.Mutex
	created map[string]time.Time
	done    map[string]time.Time
}

func newStamps() *stamps {
	return &stamps{created: map[string]time.Time{}, done: map[string]time.Time{}}
}

func (s *stamps) create(k string) {
	s.mu.Lock()
	s.created[k] = time.Now()
	s.mu.Unlock()
}

func (s *stamps) forget(k string) {
	s.mu.Lock()
	delete(s.created, k)
	s.mu.Unlock()
}

func (s *stamps) mark(k string) {
	s.mu.Lock()
	if _, ok := s.done[k]; !ok {
		s.done[k] = time.Now()
	}
	s.mu.Unlock()
}

// count is how many of keys are done.
func (s *stamps) count(keys []string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, k := range keys {
		if _, ok := s.done[k]; ok {
			n++
		}
	}
	return n
}

// latencies of keys (created → done) and the time the last was done.
func (s *stamps) latencies(keys []string) ([]time.Duration, time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var ds []time.Duration
	var last time.Time
	for _, k := range keys {
		c, ok1 := s.created[k]
		d, ok2 := s.done[k]
		if !ok1 || !ok2 {
			continue
		}
		// Seen done before the create call returned: the informer
		// was faster than the writer's bookkeeping.
		ds = append(ds, max(0, d.Sub(c)))
		if d.After(last) {
			last = d
		}
	}
	return ds, last
}

// scaleRun drives and measures one scale run.
type scaleRun struct {
	e       *scaleEnv
	f       *scaleFlags
	tenants []scaleTenant
	cudns   []string

	pods, udns, vmis *stamps
	// running: pods of the run KWOK reported Running.
	running   *stamps
	vmIPs     sync.Map // VM key → first IP its VMI reported
	ipChanged []string
	ipMu      sync.Mutex

	// wave are the live pods of the run (namespace/name).
	wave []string
	seq  atomic.Int64
	sum  *ScaleSummary
	// deleted are churned pods deleted again (before or after their
	// allocation): a pod deleted first never gets one.
	deleted sync.Map
}

func newScaleRun(ctx context.Context, e *scaleEnv) (*scaleRun, error) {
	r := &scaleRun{e: e, f: e.f, pods: newStamps(), udns: newStamps(), vmis: newStamps(), running: newStamps(),
		sum: &ScaleSummary{Parameters: ScaleParameters{
			Nodes: e.f.nodes, RealNodes: e.f.realNodes, UDNs: e.f.udns, Pods: e.f.pods, VMs: e.f.vms,
			ChurnSeconds: e.f.churn.Seconds(), ChurnRate: e.f.churnRate, Writers: e.f.writers,
			DynamicHostSubnets: e.f.dynamicHostSubnets,
			RestartReserve:     e.f.restartReserve,
			PodScope:           e.f.podScope,
		}}}
	cudns := e.f.udns / 10
	tenants := (e.f.udns - cudns) / 2
	for i := range tenants {
		r.tenants = append(r.tenants, scaleTenant{ns: fmt.Sprintf("tenant-%d", i), l3: i%2 == 1})
	}
	for i := range e.f.udns - 2*tenants {
		r.cudns = append(r.cudns, fmt.Sprintf("scale-cudn-%d", i))
	}
	return r, r.watch(ctx)
}

// watch records, from informers, when pods get their addresses, networks
// report NetworkCreated, and VMIs run with an IP.
func (r *scaleRun) watch(ctx context.Context) error {
	c, err := cache.New(r.e.cp.Config, cache.Options{Scheme: r.e.c.Scheme(),
		DefaultLabelSelector: labels.SelectorFromSet(labels.Set{scaleLabel: "1"})})
	if err != nil {
		return err
	}
	on := func(obj client.Object, f func(any)) error {
		inf, err := c.GetInformer(ctx, obj)
		if err != nil {
			return err
		}
		_, err = inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
			AddFunc:    func(o any) { f(o) },
			UpdateFunc: func(_, o any) { f(o) },
		})
		return err
	}
	if err := on(&corev1.Pod{}, func(o any) {
		p, ok := o.(*corev1.Pod)
		if ok && p.Annotations[podnetworks.Annotation] != "" {
			r.pods.mark(p.Namespace + "/" + p.Name)
		}
		if ok && p.Status.Phase == corev1.PodRunning {
			r.running.mark(p.Namespace + "/" + p.Name)
		}
	}); err != nil {
		return err
	}
	created := func(conds []metav1.Condition) bool {
		return meta.IsStatusConditionTrue(conds, "NetworkCreated")
	}
	if err := on(&udnv1.UserDefinedNetwork{}, func(o any) {
		if u, ok := o.(*udnv1.UserDefinedNetwork); ok && created(u.Status.Conditions) {
			r.udns.mark(u.Namespace + "/" + u.Name)
		}
	}); err != nil {
		return err
	}
	if err := on(&udnv1.ClusterUserDefinedNetwork{}, func(o any) {
		if u, ok := o.(*udnv1.ClusterUserDefinedNetwork); ok && created(u.Status.Conditions) {
			r.udns.mark("/" + u.Name)
		}
	}); err != nil {
		return err
	}
	if err := on(&kubevirtv1.VirtualMachineInstance{}, func(o any) {
		v, ok := o.(*kubevirtv1.VirtualMachineInstance)
		if !ok || v.Status.Phase != simvirt.PhaseRunning || len(v.Status.Interfaces) == 0 || v.Status.Interfaces[0].IP == "" {
			return
		}
		k := v.Namespace + "/" + v.Name
		ip := v.Status.Interfaces[0].IP
		r.vmis.mark(k)
		if was, loaded := r.vmIPs.LoadOrStore(k, ip); loaded && was.(string) != ip {
			r.ipMu.Lock()
			r.ipChanged = append(r.ipChanged, fmt.Sprintf("%s: %s, then %s", k, was, ip))
			r.ipMu.Unlock()
			r.vmIPs.Store(k, ip)
		}
	}); err != nil {
		return err
	}
	go func() { _ = c.Start(ctx) }()
	if !c.WaitForCacheSync(ctx) {
		return errors.New("scale: informers did not sync")
	}
	return nil
}

func (r *scaleRun) run(ctx context.Context) (*ScaleSummary, error) {
	start := time.Now()
	s := r.sum
	var prof *profiler
	if r.f.profileDir != "" {
		prof = &profiler{addr: r.e.pprofAddr, dir: r.f.profileDir, client: &http.Client{Timeout: profileWindow + time.Minute}}
	}
	// step runs f; with --profile-dir, a step with a profile name is
	// profiled under that name.
	step := func(what, profile string, f func() error) error {
		t := time.Now()
		if prof != nil && profile != "" {
			g := f
			f = func() error {
				paths, err := prof.during(ctx, profile, g)
				s.Profiles = append(s.Profiles, paths...)
				return err
			}
		}
		if err := f(); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		fmt.Fprintf(os.Stderr, "scale: %s in %s\n", what, time.Since(t).Round(time.Millisecond))
		return nil
	}
	steps := []struct {
		what, profile string
		f             func() error
	}{
		{"write floor", "", func() error { return r.floor(ctx) }},
		{fmt.Sprintf("%d networks", r.f.udns), "networks", func() error { return r.networks(ctx) }},
		{fmt.Sprintf("%d pods", r.f.pods), "pods", func() error { return r.createPods(ctx) }},
		{"write floor after the wave", "", func() error { return r.floorAfterWave(ctx) }},
		{fmt.Sprintf("%d VMs", r.f.vms), "vms", func() error { return r.createVMs(ctx) }},
		{"churn", "churn", func() error { return r.churn(ctx) }},
		{"kvnet-controller restart", "", func() error { return r.restart(ctx) }},
		{"measurements", "", func() error { return r.measure(ctx) }},
		{"audit", "", func() error { return r.audit(ctx) }},
	}
	for _, st := range steps {
		if err := step(st.what, st.profile, st.f); err != nil {
			s.Seconds = time.Since(start).Seconds()
			return s, err
		}
	}
	s.Seconds = time.Since(start).Seconds()
	return s, nil
}

// parallel runs f(0..n-1) on workers goroutines; the first error wins.
func parallel(workers, n int, f func(i int) error) error {
	var wg sync.WaitGroup
	next := make(chan int)
	var mu sync.Mutex
	var first error
	for range workers {
		wg.Go(func() {
			for i := range next {
				if err := f(i); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
				}
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	return first
}

func scalePod(ns, name string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{scaleLabel: "1"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10"}},
			// KWOK's nodes carry no taints; the real nodes are not
			// schedulable (no allocatable), so the scheduler binds to
			// KWOK nodes only.
			TerminationGracePeriodSeconds: new(int64)},
	}
}

// floor measures the API server's write floor: the writes kvnet makes
// for a pod (the pod's creation, by its owner, and the annotation of its
// addresses) made by the run itself, with the same writers, in a
// namespace kvnet does not serve. KWOK and the scheduler act on these
// pods as on kvnet's.
func (r *scaleRun) floor(ctx context.Context) error {
	f, err := r.measureFloor(ctx, "scale-floor")
	r.sum.Floor = f
	return err
}

// floorAfterWave measures the floor again once the wave's pods are all
// in the API and running: a write costs more with every pod the API
// server holds and sends to its watchers, so the wave ran against a
// floor that fell as it went.
func (r *scaleRun) floorAfterWave(ctx context.Context) error {
	f, err := r.measureFloor(ctx, "scale-floor-after")
	r.sum.FloorAfterWave = f
	if f.PodsPerSecond > 0 {
		r.sum.Pods.VsFloorAfterWave = r.sum.Pods.PerSecond / f.PodsPerSecond
	}
	return err
}

// measureFloor creates and annotates min(--pods, 1,000) pods in namespace
// ns, which kvnet does not serve, with the run's writers, then deletes
// the namespace and waits until it is gone.
func (r *scaleRun) measureFloor(ctx context.Context, ns string) (ScaleFloor, error) {
	n := min(r.f.pods, 1000)
	if err := r.e.fast.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		return ScaleFloor{}, err
	}
	start := time.Now()
	err := parallel(r.f.writers, n, func(i int) error {
		p := scalePod(ns, fmt.Sprintf("floor-%d", i))
		if err := r.e.fast.Create(ctx, p); err != nil {
			return err
		}
		patch := []byte(`{"metadata":{"annotations":{"` + podnetworks.Annotation + `":"{}"}}}`)
		return r.e.fast.Patch(ctx, p, client.RawPatch("application/merge-patch+json", patch))
	})
	if err != nil {
		return ScaleFloor{}, err
	}
	d := time.Since(start)
	f := ScaleFloor{Pods: n, Seconds: d.Seconds(), PodsPerSecond: float64(n) / d.Seconds(), WritesPerSecond: 2 * float64(n) / d.Seconds()}
	// Gone before the run goes on.
	if err := r.e.fast.Delete(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		return f, err
	}
	return f, waitProgress(ctx, r.f.stall, "namespace "+ns+" deleted", func() (int, int, error) {
		err := r.e.fast.Get(ctx, client.ObjectKey{Name: ns}, &corev1.Namespace{})
		if apierrors.IsNotFound(err) {
			return 1, 1, nil
		}
		return 0, 1, client.IgnoreNotFound(err)
	})
}

// networks creates the tenants' namespaces and UDNs and the CUDNs, and
// waits until every one reports NetworkCreated.
func (r *scaleRun) networks(ctx context.Context) error {
	groups := max(1, len(r.cudns))
	err := parallel(r.f.writers, len(r.tenants), func(i int) error {
		t := r.tenants[i]
		return r.e.fast.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: t.ns, Labels: map[string]string{
			"k8s.ovn.org/primary-user-defined-network": "", scaleLabel: "1", scaleGroup: fmt.Sprint(i % groups)}}})
	})
	if err != nil {
		return err
	}
	type netw struct {
		key string
		obj client.Object
	}
	var nets []netw
	persistent := &udnv1.IPAMConfig{Lifecycle: udnv1.IPAMLifecyclePersistent}
	meta := func(ns, name string) metav1.ObjectMeta {
		return metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{scaleLabel: "1"}}
	}
	for _, t := range r.tenants {
		var primary udnv1.UserDefinedNetworkSpec
		if t.l3 {
			primary = udnv1.UserDefinedNetworkSpec{Topology: udnv1.NetworkTopologyLayer3, Layer3: &udnv1.Layer3Config{
				Role: udnv1.NetworkRolePrimary, Subnets: []udnv1.Layer3Subnet{{CIDR: "10.128.0.0/14", HostSubnet: 24}}}}
		} else {
			primary = udnv1.UserDefinedNetworkSpec{Topology: udnv1.NetworkTopologyLayer2, Layer2: &udnv1.Layer2Config{
				Role: udnv1.NetworkRolePrimary, Subnets: udnv1.DualStackCIDRs{"10.100.0.0/16"}, IPAM: persistent}}
		}
		nets = append(nets,
			netw{t.ns + "/" + scalePrimary, &udnv1.UserDefinedNetwork{ObjectMeta: meta(t.ns, scalePrimary), Spec: primary}},
			netw{t.ns + "/" + scaleSecondary, &udnv1.UserDefinedNetwork{ObjectMeta: meta(t.ns, scaleSecondary),
				Spec: udnv1.UserDefinedNetworkSpec{Topology: udnv1.NetworkTopologyLayer2, Layer2: &udnv1.Layer2Config{
					Role: udnv1.NetworkRoleSecondary, Subnets: udnv1.DualStackCIDRs{"10.200.0.0/16"}}}}})
	}
	for i, name := range r.cudns {
		nets = append(nets, netw{"/" + name, &udnv1.ClusterUserDefinedNetwork{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{scaleLabel: "1"}},
			Spec: udnv1.ClusterUserDefinedNetworkSpec{
				NamespaceSelector: metav1.LabelSelector{MatchLabels: map[string]string{scaleGroup: fmt.Sprint(i)}},
				Network: udnv1.NetworkSpec{Topology: udnv1.NetworkTopologyLayer2, Layer2: &udnv1.Layer2Config{
					Role: udnv1.NetworkRoleSecondary, Subnets: udnv1.DualStackCIDRs{"10.210.0.0/16"}}}}}})
	}
	keys := make([]string, len(nets))
	for i, n := range nets {
		keys[i] = n.key
	}
	start := time.Now()
	if err := parallel(r.f.writers, len(nets), func(i int) error {
		r.udns.create(nets[i].key)
		return r.e.fast.Create(ctx, nets[i].obj)
	}); err != nil {
		return err
	}
	if err := waitProgress(ctx, r.f.stall, "networks NetworkCreated", func() (int, int, error) {
		return r.udns.count(keys), len(keys), nil
	}); err != nil {
		return err
	}
	ds, last := r.udns.latencies(keys)
	d := last.Sub(start)
	s := &r.sum.Networks
	s.Count, s.ReadyMs = len(keys), latencyOf(ds)
	s.PerSecond = float64(len(keys)) / d.Seconds()
	// kvnet's writes per network: the NAD, the finalizer, the status,
	// an event; plus the user's create. At the measured write floor:
	floorS := 5 * float64(len(keys)) / r.sum.Floor.WritesPerSecond
	s.VsFloor = floorS / d.Seconds()
	return nil
}

// podName is a fresh pod name.
func (r *scaleRun) podName() string { return fmt.Sprintf("pod-%d", r.seq.Add(1)) }

// newPod creates pod name in tenant t (on node when not empty): every
// fourth attaches the tenant's secondary network too.
func (r *scaleRun) newPod(ctx context.Context, t scaleTenant, name, node string) error {
	p := scalePod(t.ns, name)
	p.Spec.NodeName = node
	if r.seq.Load()%4 == 0 {
		p.Annotations = map[string]string{"k8s.v1.cni.cncf.io/networks": scaleSecondary}
	}
	k := t.ns + "/" + name
	r.pods.create(k)
	r.running.create(k)
	if err := r.e.fast.Create(ctx, p); err != nil {
		r.pods.forget(k)
		r.running.forget(k)
		return fmt.Errorf("pod %s: %w", k, err)
	}
	return nil
}

// createPods creates the first wave: every pod, at full speed, a few on
// each real node (run by its simulated kubelet and kvnet-cni), the rest
// bound by the scheduler to KWOK nodes.
func (r *scaleRun) createPods(ctx context.Context) error {
	const perRealNode = 4
	keys := make([]string, r.f.pods)
	names := make([]string, r.f.pods)
	for i := range keys {
		names[i] = r.podName()
		keys[i] = r.tenants[i%len(r.tenants)].ns + "/" + names[i]
	}
	start := time.Now()
	if err := parallel(r.f.writers, r.f.pods, func(i int) error {
		node := ""
		if j := i / perRealNode; j < len(r.e.realNodes) {
			node = r.e.realNodes[j]
		}
		return r.newPod(ctx, r.tenants[i%len(r.tenants)], names[i], node)
	}); err != nil {
		return err
	}
	if err := waitProgress(ctx, r.f.stall, "pods allocated", func() (int, int, error) {
		return r.pods.count(keys), len(keys), nil
	}); err != nil {
		return err
	}
	ds, last := r.pods.latencies(keys)
	d := last.Sub(start)
	s := &r.sum.Pods
	s.Count, s.CreateToAllocatedMs = len(keys), latencyOf(ds)
	s.PerSecond = float64(len(keys)) / d.Seconds()
	s.VsFloor = s.PerSecond / r.sum.Floor.PodsPerSecond
	r.wave = keys
	// KWOK, playing the kubelets, runs a pod once kvnet has allocated
	// it, and its status writes queue behind the wave. The VMs step
	// waits for them: VMs measured behind that queue measure KWOK.
	if err := waitProgress(ctx, r.f.stall, "pods Running (KWOK)", func() (int, int, error) {
		return r.running.count(keys), len(keys), nil
	}); err != nil {
		return err
	}
	ds, last = r.running.latencies(keys)
	s.CreateToRunningMs, s.AllRunningSeconds = latencyOf(ds), last.Sub(start).Seconds()
	return nil
}

// vmKeys are the run's VMs (namespace/name).
func (r *scaleRun) vmKeys() []string {
	var l2 []scaleTenant
	for _, t := range r.tenants {
		if !t.l3 {
			l2 = append(l2, t)
		}
	}
	keys := make([]string, r.f.vms)
	for i := range keys {
		keys[i] = fmt.Sprintf("%s/vm-%d", l2[i%len(l2)].ns, i)
	}
	return keys
}

func (r *scaleRun) createVMs(ctx context.Context) error {
	keys := r.vmKeys()
	start := time.Now()
	if err := parallel(r.f.writers, len(keys), func(i int) error {
		ns, name, _ := strings.Cut(keys[i], "/")
		vm := &kubevirtv1.VirtualMachine{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{scaleLabel: "1"}},
			Spec: kubevirtv1.VirtualMachineSpec{RunStrategy: strategy(true), Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{scaleLabel: "1"}},
				Spec:       vmSpec(false, false),
			}},
		}
		r.vmis.create(keys[i])
		return r.e.fast.Create(ctx, vm)
	}); err != nil {
		return err
	}
	if err := waitProgress(ctx, r.f.stall, "VMIs running with an IP", func() (int, int, error) {
		return r.vmis.count(keys), len(keys), nil
	}); err != nil {
		return err
	}
	ds, last := r.vmis.latencies(keys)
	s := &r.sum.VMs
	s.Count, s.CreateToRunningMs = len(keys), latencyOf(ds)
	s.PerSecond = float64(len(keys)) / last.Sub(start).Seconds()
	return nil
}

// churn deletes and creates pods at --churn-rate for --churn, while VMs
// are stopped and started and migrated, then waits for everything to
// settle.
func (r *scaleRun) churn(ctx context.Context) error {
	if r.f.churn == 0 {
		return nil
	}
	live := slices.Clone(r.wave[len(r.e.realNodes)*4:]) // the real nodes' pods stay
	rng := rand.New(rand.NewPCG(1, 2))
	bytes0 := r.apiBytes()
	cpu0 := procCPUSeconds(r.e.ctrlPID())
	start := time.Now()
	cctx, stop := context.WithTimeout(ctx, r.f.churn)
	defer stop()

	var vmErr error
	var vmWG sync.WaitGroup
	vmWG.Go(func() { vmErr = r.churnVMs(cctx, 0) })

	var created []string
	var mu sync.Mutex
	// Operations in flight: enough for the rate even when each takes a
	// second or two on a saturated machine.
	sem := make(chan struct{}, max(r.f.writers, int(2*r.f.churnRate)))
	var wg sync.WaitGroup
	var opErr error
	tick := time.NewTicker(time.Duration(float64(time.Second) / r.f.churnRate))
	defer tick.Stop()
loop:
	for {
		select {
		case <-cctx.Done():
			break loop
		case <-tick.C:
		}
		mu.Lock()
		i := rng.IntN(len(live))
		victim := live[i]
		t := r.tenants[rng.IntN(len(r.tenants))]
		name := r.podName()
		live[i] = t.ns + "/" + name
		created = append(created, live[i])
		mu.Unlock()
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			break loop
		}
		wg.Go(func() {
			defer func() { <-sem }()
			ns, n, _ := strings.Cut(victim, "/")
			r.deleted.Store(victim, true)
			err := r.e.fast.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: n}})
			if err == nil || apierrors.IsNotFound(err) {
				err = r.newPod(ctx, t, name, "")
			}
			if err != nil {
				mu.Lock()
				opErr = errors.Join(opErr, err)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	vmWG.Wait()
	r.sum.Churn.Seconds = elapsed.Seconds()
	r.sum.Churn.PodsPerSecond = float64(len(created)) / elapsed.Seconds()
	r.sum.Controller.ChurnCPUCores = (procCPUSeconds(r.e.ctrlPID()) - cpu0) / elapsed.Seconds()
	for i, n := range r.e.realNodes {
		if i < len(bytes0) {
			r.sum.nodeOf(n).APIBytesPerMinute = float64(r.e.cl.APIBytesReceived(n)-bytes0[i]) / elapsed.Minutes()
		}
	}
	if opErr != nil {
		return opErr
	}
	if vmErr != nil {
		return vmErr
	}
	// The churned pods still there must all get their addresses.
	var kept []string
	for _, k := range created {
		if _, gone := r.deleted.Load(k); !gone {
			kept = append(kept, k)
		}
	}
	if err := waitProgress(ctx, r.f.stall, "churned pods allocated", func() (int, int, error) {
		return r.pods.count(kept), len(kept), nil
	}); err != nil {
		return err
	}
	ds, _ := r.pods.latencies(created)
	r.sum.Churn.Pods = len(created)
	r.sum.Churn.CreateToAllocatedMs = latencyOf(ds)
	r.wave = live
	return nil
}

// churnVMs stops and starts, or migrates, VMs one after another (four at
// a time) until ctx ends; each operation is waited for, and the VM's IP
// compared (the informer records a change).
func (r *scaleRun) churnVMs(ctx context.Context, seed uint64) error {
	keys := r.vmKeys()
	var next atomic.Int64
	var busy sync.Map // VMs a worker is on
	var mu sync.Mutex
	var errs error
	var wg sync.WaitGroup
	for w := range 4 {
		// Each worker alternates the two, starting with its own, so
		// both run as soon as the workers do.
		op := seed + uint64(w)
		wg.Go(func() {
			for ctx.Err() == nil {
				k := keys[int(next.Add(1)-1)%len(keys)]
				if _, taken := busy.LoadOrStore(k, true); taken {
					continue // another worker's, still
				}
				var err error
				if op%2 == 0 {
					err = r.stopStart(ctx, k)
				} else {
					err = r.migrate(ctx, k)
				}
				op++
				busy.Delete(k)
				if err != nil && ctx.Err() == nil {
					mu.Lock()
					errs = errors.Join(errs, err)
					mu.Unlock()
					return
				}
			}
		})
	}
	wg.Wait()
	return errs
}

func (r *scaleRun) setRunStrategy(ctx context.Context, k string, running bool) error {
	ns, name, _ := strings.Cut(k, "/")
	for {
		var vm kubevirtv1.VirtualMachine
		if err := r.e.fast.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &vm); err != nil {
			return err
		}
		vm.Spec.RunStrategy = strategy(running)
		err := r.e.fast.Update(ctx, &vm)
		if !apierrors.IsConflict(err) {
			return err
		}
	}
}

// waitVMI waits until VMI k is gone (want nil) or passes want.
func (r *scaleRun) waitVMI(ctx context.Context, k string, what string, want func(*kubevirtv1.VirtualMachineInstance) bool) error {
	ns, name, _ := strings.Cut(k, "/")
	// The operation, once started, finishes even when the churn's time
	// is up: the run then waits for it with its own context.
	return waitProgress(context.WithoutCancel(ctx), r.f.stall, k+" "+what, func() (int, int, error) {
		var vmi kubevirtv1.VirtualMachineInstance
		err := r.e.fast.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &vmi)
		if apierrors.IsNotFound(err) {
			if want == nil {
				return 1, 1, nil
			}
			return 0, 1, nil
		}
		if err != nil {
			return 0, 1, err
		}
		if want != nil && want(&vmi) {
			return 1, 1, nil
		}
		return 0, 1, nil
	})
}

func runningWithIP(v *kubevirtv1.VirtualMachineInstance) bool {
	return v.Status.Phase == simvirt.PhaseRunning && len(v.Status.Interfaces) > 0 && v.Status.Interfaces[0].IP != ""
}

func (r *scaleRun) stopStart(ctx context.Context, k string) error {
	ctx = context.WithoutCancel(ctx)
	if err := r.setRunStrategy(ctx, k, false); err != nil {
		return fmt.Errorf("stop %s: %w", k, err)
	}
	if err := r.waitVMI(ctx, k, "stopped", nil); err != nil {
		return err
	}
	if err := r.setRunStrategy(ctx, k, true); err != nil {
		return fmt.Errorf("start %s: %w", k, err)
	}
	if err := r.waitVMI(ctx, k, "running again", runningWithIP); err != nil {
		return err
	}
	r.ipMu.Lock()
	r.sum.VMs.StopStarts++
	r.ipMu.Unlock()
	return nil
}

func (r *scaleRun) migrate(ctx context.Context, k string) error {
	ctx = context.WithoutCancel(ctx)
	ns, name, _ := strings.Cut(k, "/")
	m := &kubevirtv1.VirtualMachineInstanceMigration{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("%s-mig-%d", name, r.seq.Add(1)), Labels: map[string]string{scaleLabel: "1"}},
		Spec:       kubevirtv1.VirtualMachineInstanceMigrationSpec{VMIName: name},
	}
	if err := r.e.fast.Create(ctx, m); err != nil {
		return fmt.Errorf("migrate %s: %w", k, err)
	}
	var phase string
	if err := waitProgress(ctx, r.f.stall, "migration "+m.Name, func() (int, int, error) {
		var got kubevirtv1.VirtualMachineInstanceMigration
		if err := r.e.fast.Get(ctx, client.ObjectKeyFromObject(m), &got); err != nil {
			return 0, 1, err
		}
		phase = got.Status.Phase
		if phase == "Succeeded" || phase == "Failed" {
			return 1, 1, nil
		}
		return 0, 1, nil
	}); err != nil {
		return err
	}
	if phase != "Succeeded" {
		return fmt.Errorf("migration %s/%s: %s", ns, m.Name, phase)
	}
	if err := r.waitVMI(ctx, k, "running after migration", runningWithIP); err != nil {
		return err
	}
	r.ipMu.Lock()
	r.sum.VMs.Migrations++
	r.ipMu.Unlock()
	return nil
}

// restart kills kvnet-controller and measures how long a new one takes
// to serve: /readyz, and a pod created as soon as its webhooks admit one
// allocated (after the rebuild, or before it from the restart reserve).
func (r *scaleRun) restart(ctx context.Context) error {
	// The controller's own metrics, before the restart resets them.
	fams, err := scrape(ctx, &http.Client{Timeout: 30 * time.Second}, r.e.metricsAddr)
	if err != nil {
		return fmt.Errorf("kvnet-controller metrics: %w", err)
	}
	r.sum.WebhookHandlerMs = histogramQuantiles(fams["kvnet_webhook_admission_duration_seconds"], func(*dto.Metric) bool { return true }, 1000)
	var claims ipamclaimv1alpha1.IPAMClaimList
	if err := r.e.fast.List(ctx, &claims); err != nil {
		return err
	}
	if err := r.e.killController(); err != nil {
		return err
	}
	// A pod is created as soon as the new controller's allocation serves
	// (its readiness check ipam-serving: once its rebuild is done, or its
	// restart reserve loaded), before its caches have all synced: a
	// user's pod during the restart.
	t := r.tenants[0]
	name := r.podName()
	k := t.ns + "/" + name
	created := make(chan error, 1)
	var admitted time.Duration // written before created is sent on
	podCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	start := time.Now()
	go func() {
		hc := &http.Client{Timeout: time.Second}
		for {
			resp, err := hc.Get("http://" + r.e.probeAddr + "/readyz/ipam-serving")
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					break
				}
			}
			select {
			case <-podCtx.Done():
				created <- podCtx.Err()
				return
			case <-time.After(20 * time.Millisecond): // not up, or not serving yet
			}
		}
		for {
			err := r.newPod(podCtx, t, name, "")
			if apierrors.IsAlreadyExists(err) {
				err = nil // created by an attempt whose answer was lost
			}
			if err == nil || podCtx.Err() != nil {
				admitted = time.Since(start)
				created <- err
				return
			}
			select {
			case <-podCtx.Done():
			case <-time.After(50 * time.Millisecond): // the webhooks are not up yet
			}
		}
	}()
	if err := r.e.startController(ctx); err != nil {
		return err
	}
	ready := time.Since(start)
	select {
	case err := <-created:
		if err != nil {
			return err
		}
	case <-time.After(r.f.stall):
		return fmt.Errorf("pod %s not admitted %s after the controller was ready", k, r.f.stall)
	}
	if err := waitProgress(ctx, r.f.stall, "pod allocated after the restart", func() (int, int, error) {
		return r.pods.count([]string{k}), 1, nil
	}); err != nil {
		return err
	}
	_, last := r.pods.latencies([]string{k})
	c := &r.sum.Controller
	c.RestartClaims = len(claims.Items)
	c.RestartReadySeconds = ready.Seconds()
	c.RestartServingSeconds = last.Sub(start).Seconds()
	c.RestartAdmittedSeconds = admitted.Seconds()
	if fams, err := scrape(ctx, &http.Client{Timeout: 30 * time.Second}, r.e.metricsAddr); err == nil {
		if f := fams["kvnet_ipam_restart_reserve_allocations_total"]; f != nil {
			for _, m := range f.GetMetric() {
				c.RestartFromReserve += int(m.GetCounter().GetValue())
			}
		}
	}
	r.wave = append(r.wave, k)
	return nil
}

// audit runs kvnet's audit over the whole cluster.
func (r *scaleRun) audit(ctx context.Context) error {
	rep, err := audit.Run(ctx, r.e.fast)
	if err != nil {
		return err
	}
	s := r.sum
	s.Audit = rep.Summary()
	for _, f := range rep.Findings {
		switch f.Kind {
		case audit.DuplicateIP, audit.DuplicateMAC, audit.DuplicateVMMAC:
			s.Duplicates++
		case audit.LeakedClaim:
			s.LeakedClaims++
		}
		s.Findings++
	}
	r.ipMu.Lock()
	s.VMs.IPChanged = append([]string{}, r.ipChanged...)
	r.ipMu.Unlock()
	return nil
}

// ctrlPID is the running kvnet-controller's process ID (0: none).
func (e *chaosEnv) ctrlPID() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.ctrl == nil {
		return 0
	}
	return e.ctrl.cmd.Process.Pid
}

// apiBytes is what each real node has received from the API so far.
func (r *scaleRun) apiBytes() []int64 {
	var b []int64
	for _, n := range r.e.realNodes {
		b = append(b, r.e.cl.APIBytesReceived(n))
	}
	return b
}

// etcdBytes is the size of etcd's database file.
func etcdBytes(dir string) int64 {
	fi, err := os.Stat(filepath.Join(dir, "etcd", "member", "snap", "db"))
	if err != nil {
		return 0
	}
	return fi.Size()
}
