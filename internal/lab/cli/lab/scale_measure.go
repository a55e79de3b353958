package lab

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"kvnet.io/kvnet/internal/lab/guest"
	"kvnet.io/kvnet/internal/node"
	"kvnet.io/kvnet/internal/podnetworks"
)

// ScaleSummary is the outcome of a scale run (_out/scale/summary.json).
// Latencies are in milliseconds, sizes in bytes unless named otherwise.
type ScaleSummary struct {
	Parameters ScaleParameters `json:"parameters"`
	// Floor is the API server's write floor measured in the same run,
	// first; FloorAfterWave the same once the wave's pods run.
	Floor          ScaleFloor `json:"floor"`
	FloorAfterWave ScaleFloor `json:"floorAfterWave"`
	// Networks: UDNs and CUDNs created → NetworkCreated.
	Networks struct {
		Count     int     `json:"count"`
		ReadyMs   Latency `json:"createToNetworkCreatedMs"`
		PerSecond float64 `json:"perSecond"`
		// VsFloor: the floor's time for the same writes over kvnet's.
		VsFloor float64 `json:"vsFloor"`
	} `json:"networks"`
	// Pods: the first wave, created at full speed.
	Pods struct {
		Count               int     `json:"count"`
		CreateToAllocatedMs Latency `json:"createToAllocatedMs"`
		PerSecond           float64 `json:"allocationsPerSecond"`
		VsFloor             float64 `json:"vsFloor"`
		// CreateToRunningMs: until KWOK reported the pod Running;
		// AllRunningSeconds: from the wave's start until the last.
		CreateToRunningMs Latency `json:"createToRunningMs"`
		AllRunningSeconds float64 `json:"allRunningSeconds"`
		// VsFloorAfterWave: against the floor measured after the wave.
		VsFloorAfterWave float64 `json:"vsFloorAfterWave"`
	} `json:"pods"`
	VMs struct {
		Count             int     `json:"count"`
		CreateToRunningMs Latency `json:"createToRunningWithIPMs"`
		PerSecond         float64 `json:"perSecond"`
		StopStarts        int     `json:"stopStarts"`
		Migrations        int     `json:"migrations"`
		// IPChanged lists VMs whose IP changed across a stop/start or a
		// migration (must be empty).
		IPChanged []string `json:"ipChanged"`
	} `json:"vms"`
	// Churn: pods deleted and created at a steady rate.
	Churn struct {
		Seconds             float64 `json:"seconds"`
		Pods                int     `json:"pods"`
		PodsPerSecond       float64 `json:"podsPerSecond"`
		CreateToAllocatedMs Latency `json:"createToAllocatedMs"`
	} `json:"churn"`
	// WebhookMs: kvnet's admission webhooks as the API server timed
	// them (its histogram, interpolated within buckets).
	WebhookMs Quantiles `json:"webhookMs"`
	// WebhookHandlerMs: the same admissions as kvnet's webhook handlers
	// timed them (kvnet_webhook_admission_duration_seconds, read before
	// the controller's restart): the rest of WebhookMs is the API
	// server's call, TLS and waiting for a CPU.
	WebhookHandlerMs Quantiles       `json:"webhookHandlerMs"`
	Controller       ScaleController `json:"controller"`
	RealNodes        []ScaleNode     `json:"realNodes"`
	// NodeObjectBytes is the largest Node object (JSON).
	NodeObjectBytes int `json:"nodeObjectBytes"`
	// EtcdBytes is etcd's database file at the end.
	EtcdBytes    int64   `json:"etcdBytes"`
	PodsInAPI    int     `json:"podsInAPI"`
	Audit        string  `json:"audit"`
	Findings     int     `json:"findings"`
	Duplicates   int     `json:"duplicates"`
	LeakedClaims int     `json:"leakedClaims"`
	Seconds      float64 `json:"seconds"`
	// Profiles are the CPU profiles of kvnet-controller taken during the
	// run (--profile-dir).
	Profiles []string `json:"profiles,omitempty"`
}

// ScaleParameters are the run's sizes.
type ScaleParameters struct {
	Nodes        int     `json:"nodes"`
	RealNodes    int     `json:"realNodes"`
	UDNs         int     `json:"udns"`
	Pods         int     `json:"pods"`
	VMs          int     `json:"vms"`
	ChurnSeconds float64 `json:"churnSeconds"`
	ChurnRate    float64 `json:"churnRate"`
	Writers      int     `json:"writers"`
	// DynamicHostSubnets: kvnet-controller ran with
	// --enable-dynamic-host-subnets.
	DynamicHostSubnets bool `json:"dynamicHostSubnets,omitempty"`
	// PodScope is the real kvnet-nodes' --pod-scope.
	PodScope string `json:"podScope,omitempty"`
	// RestartReserve is kvnet-controller's --restart-reserve.
	RestartReserve int `json:"restartReserve,omitempty"`
}

// ScaleFloor is the write floor: pods created and annotated by the run's
// own writers, kvnet not involved.
type ScaleFloor struct {
	Pods            int     `json:"pods"`
	Seconds         float64 `json:"seconds"`
	PodsPerSecond   float64 `json:"podsPerSecond"`
	WritesPerSecond float64 `json:"writesPerSecond"`
}

// ScaleController is kvnet-controller's cost.
type ScaleController struct {
	RSSMiB     float64 `json:"rssMiB"`
	PeakRSSMiB float64 `json:"peakRSSMiB"`
	// CPUSeconds since its (re)start; ChurnCPUCores its CPU during the
	// churn over the churn's duration.
	CPUSeconds            float64 `json:"cpuSeconds"`
	ChurnCPUCores         float64 `json:"churnCPUCores"`
	RestartClaims         int     `json:"restartClaims"`
	RestartReadySeconds   float64 `json:"restartReadySeconds"`
	RestartServingSeconds float64 `json:"restartServingSeconds"`
	// RestartAdmittedSeconds: when the restart's pod was created (once the
	// new controller's readiness check ipam-serving passed), since the
	// controller's start.
	RestartAdmittedSeconds float64 `json:"restartAdmittedSeconds"`
	// RestartFromReserve counts the attachments the restarted controller
	// served from its restart reserve before its rebuild.
	RestartFromReserve int `json:"restartFromReserve,omitempty"`
}

// ScaleNode is one real kvnet-node's cost.
type ScaleNode struct {
	Name       string  `json:"name"`
	RSSMiB     float64 `json:"rssMiB"`
	PeakRSSMiB float64 `json:"peakRSSMiB"`
	// CPUSeconds: kvnet-node's CPU time over the whole run.
	CPUSeconds float64   `json:"cpuSeconds"`
	PlanMs     Quantiles `json:"planMs"`
	ApplyMs    Quantiles `json:"applyMs"`
	NftRules   int       `json:"nftRules"`
	// APIBytesPerMinute: bytes from the API server per minute of churn
	// (kvnet-node and its node's kvnet-cni calls).
	APIBytesPerMinute float64 `json:"apiBytesPerMinute"`
	// WatchedNetworks: the networks whose pods it watched at the end
	// (--pod-scope=networks; 0 otherwise).
	WatchedNetworks int `json:"watchedNetworks"`
	// Pods and Networks: its pods at the end (the scheduler and the
	// virt-controller stand-in may place some there besides the run's
	// own), and the networks they are attached to.
	Pods     int `json:"pods"`
	Networks int `json:"networks"`
}

// Quantiles of a histogram.
type Quantiles struct {
	N   uint64  `json:"n"`
	P50 float64 `json:"p50"`
	P99 float64 `json:"p99"`
	// Sum of every observation.
	Sum float64 `json:"sum"`
}

func (s *ScaleSummary) nodeOf(name string) *ScaleNode {
	for i := range s.RealNodes {
		if s.RealNodes[i].Name == name {
			return &s.RealNodes[i]
		}
	}
	s.RealNodes = append(s.RealNodes, ScaleNode{Name: name})
	return &s.RealNodes[len(s.RealNodes)-1]
}

// problems are what make a run fail: correctness, never speed.
func (s *ScaleSummary) problems() []string {
	var p []string
	if s.Duplicates != 0 {
		p = append(p, fmt.Sprintf("%d duplicate IPs or MACs", s.Duplicates))
	}
	if s.LeakedClaims != 0 {
		p = append(p, fmt.Sprintf("%d leaked claims", s.LeakedClaims))
	}
	if len(s.VMs.IPChanged) != 0 {
		p = append(p, fmt.Sprintf("VM IPs changed: %v", s.VMs.IPChanged))
	}
	if s.Audit == "" {
		p = append(p, "no audit ran")
	}
	return p
}

// measure reads the costs: kvnet-controller's and each real kvnet-node's
// process, the API server's webhook histogram, Node and etcd sizes.
func (r *scaleRun) measure(ctx context.Context) error {
	s := r.sum
	pid := r.e.ctrlPID()
	c := &s.Controller
	c.RSSMiB, c.PeakRSSMiB = procRSSMiB(pid)
	c.CPUSeconds = procCPUSeconds(pid)

	cs, err := kubernetes.NewForConfig(r.e.cp.Config)
	if err != nil {
		return err
	}
	raw, err := cs.RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return fmt.Errorf("API server metrics: %w", err)
	}
	fams, err := parseMetrics(bytes.NewReader(raw))
	if err != nil {
		return fmt.Errorf("API server metrics: %w", err)
	}
	s.WebhookMs = histogramQuantiles(fams["apiserver_admission_webhook_admission_duration_seconds"], func(m *dto.Metric) bool {
		return strings.Contains(labelOf(m, "name"), "kvnet")
	}, 1000)

	nodes, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	for _, n := range nodes.Items {
		b, _ := json.Marshal(n)
		s.NodeObjectBytes = max(s.NodeObjectBytes, len(b))
	}
	var pods corev1.PodList
	if err := r.e.fast.List(ctx, &pods); err != nil {
		return err
	}
	s.PodsInAPI = len(pods.Items)
	s.EtcdBytes = etcdBytes(r.e.dir)

	for _, n := range r.e.realNodes {
		sn := s.nodeOf(n)
		sn.Pods, sn.Networks = podsAndNetworksOn(pods.Items, n)
		sn.RSSMiB, sn.PeakRSSMiB = procRSSMiB(r.e.cl.AgentPID(n))
		sn.CPUSeconds = procCPUSeconds(r.e.cl.AgentPID(n))
		nd, err := r.e.cl.Node(n)
		if err != nil {
			return err
		}
		fams, err := scrapeInNetNS(ctx, nd.NS, agentMetricsAddr)
		if err != nil {
			return fmt.Errorf("kvnet-node on %s: metrics: %w", n, err)
		}
		all := func(*dto.Metric) bool { return true }
		sn.PlanMs = histogramQuantiles(fams["kvnet_node_plan_duration_seconds"], all, 1000)
		sn.ApplyMs = histogramQuantiles(fams["kvnet_node_apply_duration_seconds"], all, 1000)
		if f := fams["kvnet_node_watched_networks"]; f != nil {
			for _, m := range f.GetMetric() {
				sn.WatchedNetworks += int(m.GetGauge().GetValue())
			}
		}
		if sn.NftRules, err = nftRules(ctx, nd.NS); err != nil {
			return fmt.Errorf("%s: %w", n, err)
		}
	}
	return nil
}

// podsAndNetworksOn counts the running pods on node and the kvnet
// networks they are attached to.
func podsAndNetworksOn(pods []corev1.Pod, node string) (count, networks int) {
	nets := map[string]bool{}
	for i := range pods {
		p := &pods[i]
		if p.Spec.NodeName != node || podnetworks.Completed(p) || p.DeletionTimestamp != nil {
			continue
		}
		count++
		attached, err := podnetworks.Parse(p.Annotations[podnetworks.Annotation])
		if err != nil {
			continue
		}
		for _, a := range attached {
			nets[a.Network] = true
		}
	}
	return count, len(nets)
}

func parseMetrics(in io.Reader) (map[string]*dto.MetricFamily, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	return p.TextToMetricFamilies(in)
}

func labelOf(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// histogramQuantiles sums the series of fam that keep passes and
// estimates p50 and p99 by linear interpolation within the bucket, as
// Prometheus' histogram_quantile does; scale converts the unit.
func histogramQuantiles(fam *dto.MetricFamily, keep func(*dto.Metric) bool, scale float64) Quantiles {
	if fam == nil {
		return Quantiles{}
	}
	counts := map[float64]uint64{}
	var total uint64
	var sum float64
	for _, m := range fam.GetMetric() {
		h := m.GetHistogram()
		if h == nil || !keep(m) {
			continue
		}
		total += h.GetSampleCount()
		sum += h.GetSampleSum()
		for _, b := range h.GetBucket() {
			counts[b.GetUpperBound()] += b.GetCumulativeCount()
		}
	}
	if total == 0 {
		return Quantiles{}
	}
	bounds := make([]float64, 0, len(counts))
	for b := range counts {
		bounds = append(bounds, b)
	}
	sort.Float64s(bounds)
	q := func(p float64) float64 {
		rank := p * float64(total)
		lo, loCount := 0.0, uint64(0)
		for _, b := range bounds {
			c := counts[b]
			if math.IsInf(b, 1) {
				break // past the last finite bound: all we know is that
			}
			if float64(c) >= rank {
				if c == loCount {
					return b * scale
				}
				return (lo + (b-lo)*(rank-float64(loCount))/float64(c-loCount)) * scale
			}
			lo, loCount = b, c
		}
		// Past the last finite bucket: its bound is all we know.
		return lo * scale
	}
	return Quantiles{N: total, P50: q(0.50), P99: q(0.99), Sum: sum * scale}
}

// scrapeInNetNS reads Prometheus metrics served at addr inside the
// network namespace nsPath.
func scrapeInNetNS(ctx context.Context, nsPath, addr string) (map[string]*dto.MetricFamily, error) {
	tr := &http.Transport{DialContext: func(ctx context.Context, network, a string) (net.Conn, error) {
		return guest.DialContext(ctx, nsPath, network, a)
	}}
	defer tr.CloseIdleConnections()
	return scrape(ctx, &http.Client{Transport: tr, Timeout: 30 * time.Second}, addr)
}

// scrape reads Prometheus metrics served at addr with hc.
func scrape(ctx context.Context, hc *http.Client, addr string) (map[string]*dto.MetricFamily, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	return parseMetrics(resp.Body)
}

// nftRules counts the nftables rules in network namespace nsPath.
func nftRules(ctx context.Context, nsPath string) (int, error) {
	out, err := exec.CommandContext(ctx, "nsenter", "--net="+nsPath, "--", "nft", "-j", "list", "ruleset").Output()
	if err != nil {
		return 0, fmt.Errorf("nft list ruleset: %w", err)
	}
	var doc struct {
		Nftables []map[string]json.RawMessage `json:"nftables"`
	}
	if err := json.Unmarshal(out, &doc); err != nil {
		return 0, fmt.Errorf("nft list ruleset: %w", err)
	}
	n := 0
	for _, o := range doc.Nftables {
		if _, ok := o["rule"]; ok {
			n++
		}
	}
	return n, nil
}

// procRSSMiB is a process's resident set and its peak (VmRSS, VmHWM).
func procRSSMiB(pid int) (rss, peak float64) {
	if pid == 0 {
		return 0, 0
	}
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
		if err != nil {
			continue
		}
		switch k {
		case "VmRSS":
			rss = kb / 1024
		case "VmHWM":
			peak = kb / 1024
		}
	}
	return rss, peak
}

// procCPUSeconds is a process's user + system CPU time, with that of
// the children it waited for (kvnet-node's nft runs), in clock ticks of
// 1/100 s, Linux's USER_HZ.
func procCPUSeconds(pid int) float64 {
	if pid == 0 {
		return 0
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The command may hold spaces: fields count from its closing paren.
	_, rest, ok := strings.Cut(string(b), ") ")
	if !ok {
		return 0
	}
	f := strings.Fields(rest)
	if len(f) < 15 {
		return 0
	}
	var ticks float64
	for _, v := range f[11:15] { // utime, stime, cutime, cstime
		t, _ := strconv.ParseFloat(v, 64)
		ticks += t
	}
	return ticks / 100
}

// dynamicNote names dynamic host subnets in the size row.
// fromReserveNote says how many attachments the restart reserve served.
func fromReserveNote(n int) string {
	if n > 0 {
		return fmt.Sprintf("; %d attachments from the restart reserve", n)
	}
	return ""
}

// reserveNote says whether the controller ran with a restart reserve.
func reserveNote(n int) string {
	if n > 0 {
		return fmt.Sprintf("; restart reserve %d", n)
	}
	return ""
}

func dynamicNote(on bool) string {
	if on {
		return "; dynamic host subnets"
	}
	return ""
}

// watchedNote says how many networks' pods a node watched, if any.
func watchedNote(n int) string {
	if n == 0 {
		return ""
	}
	return fmt.Sprintf("; watches the pods of %d networks", n)
}

// scopeNote names the real nodes' pod scope in the size row, unless the
// default.
func scopeNote(scope string) string {
	if scope == "" || scope == node.PodScopeCluster {
		return ""
	}
	return "; kvnet-node --pod-scope=" + scope
}

func (s *ScaleSummary) print(w io.Writer) {
	p := s.Parameters
	ms := func(l Latency) string { return fmt.Sprintf("p50 %.0f ms, p99 %.0f ms (n %d)", l.P50, l.P99, l.N) }
	q := func(l Quantiles) string {
		return fmt.Sprintf("p50 %.1f ms, p99 %.1f ms (n %d, %.1f s in all)", l.P50, l.P99, l.N, l.Sum/1000)
	}
	rows := [][2]string{
		{"size", fmt.Sprintf("%d KWOK nodes + %d real, %d networks, %d pods, %d VMs; churn %.0f s at %g pods/s%s",
			p.Nodes, p.RealNodes, p.UDNs, p.Pods, p.VMs, p.ChurnSeconds, p.ChurnRate, dynamicNote(p.DynamicHostSubnets)+scopeNote(p.PodScope)+reserveNote(p.RestartReserve))},
		{"API write floor", fmt.Sprintf("%.0f pods/s (%.0f writes/s; %d pods created + annotated by %d writers)",
			s.Floor.PodsPerSecond, s.Floor.WritesPerSecond, s.Floor.Pods, p.Writers)},
		{"networks → NetworkCreated", fmt.Sprintf("%s; %.1f/s, %.2f× the floor", ms(s.Networks.ReadyMs), s.Networks.PerSecond, s.Networks.VsFloor)},
		{"pods → allocated (wave)", fmt.Sprintf("%s; %.0f/s, %.2f× the floor", ms(s.Pods.CreateToAllocatedMs), s.Pods.PerSecond, s.Pods.VsFloor)},
		{"API write floor after wave", fmt.Sprintf("%.0f pods/s with the wave's pods in the API; the wave ran at %.2f× it",
			s.FloorAfterWave.PodsPerSecond, s.Pods.VsFloorAfterWave)},
		{"pods → Running (KWOK)", fmt.Sprintf("%s; all %.0f s after the wave began", ms(s.Pods.CreateToRunningMs), s.Pods.AllRunningSeconds)},
		{"pods → allocated (churn)", fmt.Sprintf("%s at %.1f pods/s", ms(s.Churn.CreateToAllocatedMs), s.Churn.PodsPerSecond)},
		{"VMs → running with IP", fmt.Sprintf("%s; %.1f/s", ms(s.VMs.CreateToRunningMs), s.VMs.PerSecond)},
		{"VM stop/starts, migrations", fmt.Sprintf("%d, %d; IP changed: %d", s.VMs.StopStarts, s.VMs.Migrations, len(s.VMs.IPChanged))},
		{"webhooks (API server)", q(s.WebhookMs)},
		{"webhooks (kvnet's handlers)", q(s.WebhookHandlerMs)},
		{"kvnet-controller", fmt.Sprintf("RSS %.0f MiB (peak %.0f), CPU %.1f s, %.2f cores during churn",
			s.Controller.RSSMiB, s.Controller.PeakRSSMiB, s.Controller.CPUSeconds, s.Controller.ChurnCPUCores)},
		{"controller restart", fmt.Sprintf("ready %.2f s, serving %.2f s (%d claims; its pod created at %.2f s, once allocation served)%s",
			s.Controller.RestartReadySeconds, s.Controller.RestartServingSeconds, s.Controller.RestartClaims,
			s.Controller.RestartAdmittedSeconds, fromReserveNote(s.Controller.RestartFromReserve))},
	}
	for _, n := range s.RealNodes {
		rows = append(rows, [2]string{"kvnet-node " + n.Name, fmt.Sprintf("RSS %.0f MiB (peak %.0f), CPU %.1f s; plan %s; apply %s; %d nft rules; %.0f KiB/min from the API; %d pods on %d networks%s",
			n.RSSMiB, n.PeakRSSMiB, n.CPUSeconds, q(n.PlanMs), q(n.ApplyMs), n.NftRules, n.APIBytesPerMinute/1024, n.Pods, n.Networks, watchedNote(n.WatchedNetworks))})
	}
	rows = append(rows,
		[2]string{"largest Node object", fmt.Sprintf("%d bytes", s.NodeObjectBytes)},
		[2]string{"etcd database", fmt.Sprintf("%.1f MiB (%d pods in the API)", float64(s.EtcdBytes)/(1<<20), s.PodsInAPI)},
		[2]string{"audit", fmt.Sprintf("%s; duplicates %d, leaked claims %d", s.Audit, s.Duplicates, s.LeakedClaims)},
		[2]string{"run", fmt.Sprintf("%.0f s", s.Seconds)},
	)
	if len(s.Profiles) > 0 {
		rows = append(rows, [2]string{"controller CPU profiles", fmt.Sprintf("%d in %s (go tool pprof -top %s)",
			len(s.Profiles), filepath.Dir(s.Profiles[0]), filepath.Join(filepath.Dir(s.Profiles[0]), "controller-pods-*.pprof"))})
	}
	printRows(w, rows)
}
