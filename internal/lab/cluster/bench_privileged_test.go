//go:build cluster

package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"

	"kvnet.io/kvnet/internal/cni"
	"kvnet.io/kvnet/internal/netconf"
	"kvnet.io/kvnet/internal/podnetworks"
	"kvnet.io/kvnet/internal/testenv"
)

// The benchmark's namespaces: one with a primary Layer2 UDN, one on the
// cluster default network (Flannel) alone.
const (
	benchUDNNamespace     = "bench-udn"
	benchDefaultNamespace = "bench-default"
	benchPods             = 20 // measured pods per namespace and round
	benchLabel            = "kvnet.io/bench"
)

// BenchmarkClusterPodReady brings a 3-node cluster up, installs kvnet
// with kvnet install, and measures in the same run, per round of
// benchPods pods in each of a primary Layer2 UDN namespace and a
// default-network-only namespace (docs/cluster.md, "Benchmarks", says
// what each number covers):
//
//   - pod create → Ready (udn-*, default-*, ratio-p50) and create →
//     container running (*-running-p50-ms), from client-side timestamps of
//     an informer's watch events;
//   - the CNI ADD Multus performs for each pod and kvnet-cni's delegate in
//     it (cni-add-*, kvnet-add-*, kvnet-share-p50,
//     default-cni-add-p50-ms), from the multus-daemon log lines of each
//     pod's successful ADD;
//   - the start-up of kvnet-cni and of the bridge plugin
//     (*-start-p50-ms).
//
// Pods are created one at a time (concurrency 1: each waits for the
// previous one to be Ready), alternating the two namespaces, over the
// three nodes in turn, after one unmeasured warm-up pod per node and
// namespace (image pull, the network's first port on the node).
func BenchmarkClusterPodReady(b *testing.B) {
	testenv.NeedsRoot(b)
	binDir := buildTools(b)
	fmt.Printf("load at the start: %s\n", loadAverage())
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Minute)
	defer cancel()
	c := upForBench(ctx, b, Config{Dir: b.TempDir(), BinDir: binDir, Nodes: 3, KvnetImages: true})
	installKvnet(ctx, b, c, kvnetCLI(b, c))
	if b.Failed() {
		b.FailNow()
	}
	setUpBenchNamespaces(ctx, b, c)
	enableCNITraces(b, c)
	fmt.Printf("Multus daemon CPU limit: %s\n", setMultusCPULimit(ctx, b, c))
	w := watchBenchPods(ctx, b, c)

	// Warm-up: one pod per node and namespace, not measured.
	for i := range c.Nodes {
		for _, ns := range []string{benchUDNNamespace, benchDefaultNamespace} {
			w.createAndWait(ctx, b, c, ns, fmt.Sprintf("warm-%d", i+1), NodeName(i+1))
		}
	}

	var udn, def []*benchPod
	periods0, throttled0 := multusThrottle(b)
	b.ResetTimer()
	for round := range b.N {
		for k := range benchPods {
			order := []string{benchUDNNamespace, benchDefaultNamespace}
			if k%2 == 1 {
				order[0], order[1] = order[1], order[0]
			}
			for _, ns := range order {
				p := w.createAndWait(ctx, b, c, ns, fmt.Sprintf("p%d-%d", round, k), NodeName(k%len(c.Nodes)+1))
				if ns == benchUDNNamespace {
					udn = append(udn, p)
				} else {
					def = append(def, p)
				}
			}
		}
	}
	b.StopTimer()
	periods1, throttled1 := multusThrottle(b)

	adds := multusAdds(ctx, b, c)
	starts := pluginStarts(ctx, b, c)
	fmt.Printf("load at the end: %s\n", loadAverage())
	reportBench(b, udn, def, adds, kvnetConfNames(ctx, b, c, benchUDNNamespace))
	reportTraces(b, udn, cniTraces(b, c))
	// Every measured pod's ADD ran in a Multus daemon's CPU cgroup.
	pods := float64(len(udn) + len(def))
	b.ReportMetric(float64(periods1-periods0)/pods, "multus-throttled-periods/pod")
	b.ReportMetric(float64((throttled1-throttled0)/time.Millisecond)/pods, "multus-throttled-ms/pod")
	for _, plugin := range benchStartPlugins {
		b.ReportMetric(float64(percentile(starts[plugin], 50))/float64(time.Millisecond), plugin+"-start-p50-ms")
	}
}

// benchStartPlugins are the CNI plugins whose start-up pluginStarts
// times: kvnet-cni, as kvnet-node installed it, and the reference bridge
// plugin Flannel delegates to.
var benchStartPlugins = []string{"kvnet-cni", "bridge"}

// pluginStarts runs each of benchStartPlugins from node-1's /opt/cni/bin
// benchPods times, one at a time, for the CNI VERSION command alone: the
// time of exec, the Go runtime's and the packages' initialisation and
// one line of output, which every ADD of the plugin pays before its
// work. It runs on the host (the same file and kernel; not chrooted as
// multus-daemon runs it).
func pluginStarts(ctx context.Context, b *testing.B, c *Cluster) map[string][]time.Duration {
	out := map[string][]time.Duration{}
	for _, plugin := range benchStartPlugins {
		bin := filepath.Join(c.Dir, "nodes", NodeName(1), "root", "opt", "cni", "bin", plugin)
		for range benchPods {
			cmd := exec.CommandContext(ctx, bin)
			cmd.Env = []string{"CNI_COMMAND=VERSION"}
			start := time.Now()
			got, err := cmd.CombinedOutput()
			d := time.Since(start)
			if err != nil || !strings.Contains(string(got), "supportedVersions") {
				b.Fatalf("%s VERSION: %v: %s", bin, err, got)
			}
			out[plugin] = append(out[plugin], d)
		}
	}
	return out
}

// loadAverage is /proc/loadavg, for the log: the machine is shared.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return err.Error()
	}
	return strings.TrimSpace(string(b))
}

// benchLog writes the cluster's progress lines to the benchmark's log.
// upForBench brings the cluster of cfg up for benchmark b (its log to
// b, queued behind another cluster on this machine) and takes it down
// when b ends.
func upForBench(ctx context.Context, b *testing.B, cfg Config) *Cluster {
	b.Helper()
	cfg.Log, cfg.WaitForLock = benchLog{b}, true
	c, err := Up(ctx, cfg)
	if err != nil {
		b.Fatalf("up: %v", err)
	}
	b.Cleanup(func() {
		if err := c.Down(); err != nil {
			b.Errorf("down: %v", err)
		}
	})
	return c
}

type benchLog struct{ b *testing.B }

func (l benchLog) Write(p []byte) (int, error) {
	l.b.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// setUpBenchNamespaces makes the two namespaces, the UDN one labelled
// for a primary UDN with UDN l2 (10.100.0.0/16), and waits for its NAD
// and their default ServiceAccounts.
func setUpBenchNamespaces(ctx context.Context, b *testing.B, c *Cluster) {
	for ns, labels := range map[string]map[string]string{
		benchUDNNamespace:     {"k8s.ovn.org/primary-user-defined-network": ""},
		benchDefaultNamespace: nil,
	} {
		obj := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: labels}}
		if _, err := c.Client.CoreV1().Namespaces().Create(ctx, obj, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	dyn, err := dynamic.NewForConfig(c.CP.Config)
	if err != nil {
		b.Fatal(err)
	}
	udn := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "k8s.ovn.org/v1", "kind": "UserDefinedNetwork",
		"metadata": map[string]any{"name": "l2", "namespace": benchUDNNamespace},
		"spec": map[string]any{"topology": "Layer2", "layer2": map[string]any{
			"role": "Primary", "subnets": []any{"10.100.0.0/16"},
		}},
	}}
	if _, err := dyn.Resource(udnGVR).Namespace(benchUDNNamespace).Create(ctx, udn, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	testenv.Eventually(b, time.Minute, "NAD "+benchUDNNamespace+"/l2 and the ServiceAccounts default", func() error {
		for _, ns := range []string{benchUDNNamespace, benchDefaultNamespace} {
			if _, err := c.Client.CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{}); err != nil {
				return err
			}
		}
		_, err := dyn.Resource(nadGVR).Namespace(benchUDNNamespace).Get(ctx, "l2", metav1.GetOptions{})
		return err
	})
}

// kvnetConfNames are the CNI configuration names of the NADs in ns
// whose plugin (or one of whose chained plugins) is kvnet-cni: the names
// multus-daemon logs for kvnet's delegates, whichever role Multus gives
// them (cluster default network or an additional network).
func kvnetConfNames(ctx context.Context, b *testing.B, c *Cluster, ns string) map[string]bool {
	dyn, err := dynamic.NewForConfig(c.CP.Config)
	if err != nil {
		b.Fatal(err)
	}
	nads, err := dyn.Resource(nadGVR).Namespace(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		b.Fatal(err)
	}
	names := map[string]bool{}
	for _, nad := range nads.Items {
		config, _, _ := unstructured.NestedString(nad.Object, "spec", "config")
		var conf struct {
			Name    string `json:"name"`
			Type    string `json:"type"`
			Plugins []struct {
				Type string `json:"type"`
			} `json:"plugins"`
		}
		if err := json.Unmarshal([]byte(config), &conf); err != nil {
			b.Fatalf("NAD %s/%s: spec.config %q: %v", ns, nad.GetName(), config, err)
		}
		kvnet := conf.Type == netconf.PluginType
		for _, p := range conf.Plugins {
			kvnet = kvnet || p.Type == netconf.PluginType
		}
		if kvnet {
			names[conf.Name] = true
		}
	}
	if len(names) == 0 {
		b.Fatalf("no NAD of type %s in namespace %s", netconf.PluginType, ns)
	}
	return names
}

// benchPod is one measured pod: when the benchmark called Create, and
// when the watch first showed kvnet's allocation annotation, its container
// running and the pod Ready.
type benchPod struct {
	ns, name, node string
	uid            types.UID
	created        time.Time
	running, ready time.Time
	allocated      time.Time     // kvnet.io/pod-networks first seen (UDN pods)
	readyCh        chan struct{} // closed once ready is set
}

// benchWatch records, for every pod labelled benchLabel, the time its
// watch events first show the container running and the Ready
// condition True (client-side timestamps, taken in the informer's
// handler).
type benchWatch struct {
	mu   sync.Mutex
	pods map[string]*benchPod // by namespace/name
}

func watchBenchPods(ctx context.Context, b *testing.B, c *Cluster) *benchWatch {
	w := &benchWatch{pods: map[string]*benchPod{}}
	f := informers.NewSharedInformerFactoryWithOptions(c.Client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = benchLabel }))
	inf := f.Core().V1().Pods().Informer()
	seen := func(obj any) {
		now := time.Now()
		p, ok := obj.(*corev1.Pod)
		if !ok {
			return
		}
		w.mu.Lock()
		defer w.mu.Unlock()
		bp := w.pod(p.Namespace, p.Name)
		if _, ok := p.Annotations[podnetworks.Annotation]; ok && bp.allocated.IsZero() {
			bp.allocated = now
		}
		for _, s := range p.Status.ContainerStatuses {
			if s.State.Running != nil && bp.running.IsZero() {
				bp.running = now
			}
		}
		for _, cond := range p.Status.Conditions {
			if cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue && bp.ready.IsZero() {
				bp.ready = now
				close(bp.readyCh)
			}
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    seen,
		UpdateFunc: func(_, obj any) { seen(obj) },
	}); err != nil {
		b.Fatal(err)
	}
	stop := make(chan struct{})
	b.Cleanup(func() { close(stop) })
	f.Start(stop)
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		b.Fatal("pod informer never synced")
	}
	return w
}

// pod returns the record of pod ns/name, making it; w.mu is held.
func (w *benchWatch) pod(ns, name string) *benchPod {
	key := ns + "/" + name
	if w.pods[key] == nil {
		w.pods[key] = &benchPod{ns: ns, name: name, readyCh: make(chan struct{})}
	}
	return w.pods[key]
}

// benchWebPod is webPod as the benchmarks time it from creation to
// Ready: the readiness probe alone decides when (a startup probe would
// hold it back by up to its period), the liveness probe waiting 3 s for
// httpd instead.
func benchWebPod(ns, name, node, image string) *corev1.Pod {
	p := webPod(ns, name, node, image)
	c := &p.Spec.Containers[0]
	c.StartupProbe = nil
	c.LivenessProbe.InitialDelaySeconds = 3
	return p
}

// createAndWait creates a web pod (webPod: busybox httpd with an HTTP
// readiness probe every second) on node and waits until the watch has
// seen it Ready, failing the benchmark after 3 minutes.
func (w *benchWatch) createAndWait(ctx context.Context, b *testing.B, c *Cluster, ns, name, node string) *benchPod {
	b.Helper()
	pod := benchWebPod(ns, name, node, c.Images["busybox"])
	pod.Labels[benchLabel] = "pod-ready"
	w.mu.Lock()
	bp := w.pod(ns, name)
	bp.node = node
	bp.created = time.Now()
	w.mu.Unlock()
	created, err := c.Client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		b.Fatalf("create pod %s/%s: %v", ns, name, err)
	}
	select {
	case <-bp.readyCh:
	case <-time.After(3 * time.Minute):
		p, err := c.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			b.Fatalf("pod %s/%s not Ready after 3m: %v", ns, name, err)
		}
		b.Fatalf("pod %s/%s not Ready after 3m: phase %s, conditions %+v, containers %+v", ns, name, p.Status.Phase, p.Status.Conditions, p.Status.ContainerStatuses)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	bp.uid = created.UID
	if bp.running.IsZero() {
		// The Ready event carries the running state; a pod is never Ready
		// with no container running.
		b.Fatalf("pod %s/%s: Ready seen without its container running", ns, name)
	}
	return bp
}

// multusAdds reads every multus-daemon's log through the API with the
// kubelet's timestamps (containerd stamps each line as it reads it, to
// the nanosecond; multus's own stamps have whole seconds) and returns
// the ADDs by pod UID.
func multusAdds(ctx context.Context, b *testing.B, c *Cluster) map[types.UID][]*multusAdd {
	pods, err := c.Client.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{LabelSelector: "name=multus"})
	if err != nil {
		b.Fatal(err)
	}
	if len(pods.Items) != len(c.Nodes) {
		b.Fatalf("multus-daemon pods: %d, want one per node (%d)", len(pods.Items), len(c.Nodes))
	}
	adds := map[types.UID][]*multusAdd{}
	for _, p := range pods.Items {
		raw, err := c.Client.CoreV1().Pods("kube-system").GetLogs(p.Name, &corev1.PodLogOptions{Container: "kube-multus", Timestamps: true}).DoRaw(ctx)
		if err != nil {
			b.Fatalf("logs of %s: %v", p.Name, err)
		}
		if err := parseMultusLog(string(raw), adds); err != nil {
			b.Fatalf("log of %s (%s): %v", p.Name, p.Spec.NodeName, err)
		}
	}
	return adds
}

// reportBench computes and reports the metrics and prints a table of
// the pods to standard output (the benchmark's log is cut to ten lines
// when it passes); a missing measurement fails the benchmark.
func reportBench(b *testing.B, udn, def []*benchPod, adds map[types.UID][]*multusAdd, kvnetConfs map[string]bool) {
	type sample struct{ ready, running, cniAdd, kvnetAdd []time.Duration }
	var samples [2]sample // UDN, default
	var shares []float64
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "pod\tnode\tready\trunning\tallocated\tto-cni\tcni-add\tkvnet-cni\tcni-to-running\tdelegates (from the previous mark)")
	for i, pods := range [][]*benchPod{udn, def} {
		for _, p := range pods {
			a, err := successfulAdd(adds, p.ns+"/"+p.name, p.uid)
			if err != nil {
				b.Fatal(err)
			}
			kv, ok := delegateTime(a, kvnetConfs)
			switch {
			case i == 0 && !ok:
				b.Fatalf("pod %s/%s: no delegate of kvnet's CNI configurations %v in its ADD (delegates %+v)", p.ns, p.name, slices.Sorted(maps.Keys(kvnetConfs)), a.delegates)
			case i == 1 && ok:
				b.Fatalf("pod %s/%s of the default-network namespace went through kvnet's delegate (delegates %+v)", p.ns, p.name, a.delegates)
			}
			total := a.end.Sub(a.start)
			s := &samples[i]
			s.ready, s.running, s.cniAdd = append(s.ready, p.ready.Sub(p.created)), append(s.running, p.running.Sub(p.created)), append(s.cniAdd, total)
			kvCol, allocCol := "-", "-"
			if i == 0 {
				s.kvnetAdd = append(s.kvnetAdd, kv)
				shares = append(shares, float64(kv)/float64(total))
				kvCol = msString(kv)
				if !p.allocated.IsZero() {
					allocCol = msString(p.allocated.Sub(p.created))
				}
			}
			fmt.Fprintf(tw, "%s/%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", p.ns, p.name, p.node,
				msString(p.ready.Sub(p.created)), msString(p.running.Sub(p.created)), allocCol,
				msString(a.start.Sub(p.created)), msString(total), kvCol, msString(p.running.Sub(a.end)), delegateSummary(a))
		}
	}
	if err := tw.Flush(); err != nil {
		b.Fatal(err)
	}
	udnS, defS := samples[0], samples[1]
	if len(udnS.ready) == 0 || len(defS.ready) == 0 {
		b.Fatalf("no measured pods (%d UDN, %d default)", len(udnS.ready), len(defS.ready))
	}
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	b.ReportMetric(ms(percentile(udnS.ready, 50)), "udn-p50-ms")
	b.ReportMetric(ms(percentile(udnS.ready, 99)), "udn-p99-ms")
	b.ReportMetric(ms(percentile(defS.ready, 50)), "default-p50-ms")
	b.ReportMetric(ms(percentile(defS.ready, 99)), "default-p99-ms")
	b.ReportMetric(float64(percentile(udnS.ready, 50))/float64(percentile(defS.ready, 50)), "ratio-p50")
	b.ReportMetric(ms(percentile(udnS.running, 50)), "udn-running-p50-ms")
	b.ReportMetric(ms(percentile(defS.running, 50)), "default-running-p50-ms")
	b.ReportMetric(ms(percentile(udnS.cniAdd, 50)), "cni-add-p50-ms")
	b.ReportMetric(ms(percentile(udnS.cniAdd, 99)), "cni-add-p99-ms")
	b.ReportMetric(ms(percentile(udnS.kvnetAdd, 50)), "kvnet-add-p50-ms")
	b.ReportMetric(ms(percentile(udnS.kvnetAdd, 99)), "kvnet-add-p99-ms")
	b.ReportMetric(percentile(shares, 50), "kvnet-share-p50")
	b.ReportMetric(ms(percentile(defS.cniAdd, 50)), "default-cni-add-p50-ms")
	b.ReportMetric(0, "ns/op") // minutes of cluster set-up: not a measurement
}

// enableCNITraces makes kvnet-cni's trace directory on every node: each
// ADD then writes where its time went (internal/cni, Trace).
func enableCNITraces(b *testing.B, c *Cluster) {
	for i := range c.Nodes {
		if err := os.MkdirAll(traceDirOf(c, i+1), 0o755); err != nil {
			b.Fatal(err)
		}
	}
}

func traceDirOf(c *Cluster, node int) string {
	return filepath.Join(c.Dir, "nodes", NodeName(node), "root", "var/lib/cni/kvnet/trace")
}

// cniTraces reads every node's kvnet-cni traces: per pod
// (namespace/name), its last successful ADD's.
func cniTraces(b *testing.B, c *Cluster) map[string]cni.Trace {
	out := map[string]cni.Trace{}
	for i := range c.Nodes {
		files, err := filepath.Glob(filepath.Join(traceDirOf(c, i+1), "*.json"))
		if err != nil {
			b.Fatal(err)
		}
		for _, f := range files {
			raw, err := os.ReadFile(f)
			if err != nil {
				b.Fatal(err)
			}
			var t cni.Trace
			if err := json.Unmarshal(raw, &t); err != nil {
				b.Fatalf("trace %s: %v", f, err)
			}
			if prev, ok := out[t.Pod]; t.Error == "" && (!ok || prev.Start.Before(t.Start)) {
				out[t.Pod] = t
			}
		}
	}
	return out
}

// reportTraces reports, over the UDN pods, kvnet-cni's own time (its
// start-up and its ADD without the cluster default network's ADD it runs
// inside: kvnet-own-p50-ms) and the median of each phase, and prints
// each pod's phases. A UDN pod without a trace fails the benchmark.
func reportTraces(b *testing.B, udn []*benchPod, traces map[string]cni.Trace) {
	var own, cpu []time.Duration
	phases := map[string][]time.Duration{}
	var order []string
	paths := map[string]int{}
	ms := func(v float64) time.Duration { return time.Duration(v * float64(time.Millisecond)) }
	for _, p := range udn {
		t, ok := traces[p.ns+"/"+p.name]
		if !ok {
			b.Fatalf("pod %s/%s: no kvnet-cni trace of a successful ADD", p.ns, p.name)
		}
		paths[t.Path]++
		d := ms(t.StartupMS + t.Total)
		var line []string
		for _, ph := range t.Phases {
			if ph.Name == "defaultnet" {
				d -= ms(ph.MS)
			}
			if _, seen := phases[ph.Name]; !seen {
				order = append(order, ph.Name)
			}
			phases[ph.Name] = append(phases[ph.Name], ms(ph.MS))
			line = append(line, fmt.Sprintf("%s %.1f", ph.Name, ph.MS))
		}
		own, cpu = append(own, d), append(cpu, ms(t.CPUMS))
		fmt.Printf("trace %s/%s (%s): startup %.0f, %s; own %s, cpu %.1f ms (plugins run %.1f ms)\n", p.ns, p.name, t.Path, t.StartupMS, strings.Join(line, ", "), msString(d), t.CPUMS, t.ChildCPUMS)
	}
	fmt.Printf("kvnet-cni paths: %v\n", paths)
	f := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	b.ReportMetric(f(percentile(own, 50)), "kvnet-own-p50-ms")
	b.ReportMetric(f(percentile(own, 99)), "kvnet-own-p99-ms")
	b.ReportMetric(f(percentile(cpu, 50)), "kvnet-cpu-p50-ms")
	for _, name := range order {
		b.ReportMetric(f(percentile(phases[name], 50)), "phase-"+name+"-p50-ms")
	}
}

// msString is d in milliseconds, for the table.
func msString(d time.Duration) string { return fmt.Sprintf("%dms", d.Milliseconds()) }

// delegateSummary lists a's delegates with their times, for the log.
func delegateSummary(a *multusAdd) string {
	var parts []string
	prev := a.start
	for _, d := range a.delegates {
		parts = append(parts, fmt.Sprintf("%s(%s):%s %s", d.network, d.conf, d.ifName, msString(d.end.Sub(prev))))
		prev = d.end
	}
	parts = append(parts, "then "+msString(a.end.Sub(prev)))
	return strings.Join(parts, ", ")
}
