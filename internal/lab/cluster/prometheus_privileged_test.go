//go:build cluster

package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/utils/ptr"

	"kvnet.io/kvnet/internal/install"
	"kvnet.io/kvnet/internal/testenv"
)

// prometheusPort is where the test's Prometheus listens, on node-1's
// address.
const prometheusPort = 19090

// promServer is a Debian Prometheus the test started on the cluster
// (startPrometheus).
type promServer struct {
	bin  string // the prometheus binary
	addr string // host:port of its HTTP API
}

// promAlert is an alert of Prometheus's /api/v1/alerts.
type promAlert struct {
	Labels map[string]string `json:"labels"`
	State  string            `json:"state"`
}

// startPrometheus starts Debian's Prometheus, configured from
// config/monitoring as the Prometheus Operator would (PrometheusConfig,
// the targets DiscoverTargets finds, rediscovered every 2 s; the rules as
// shipped, without their for: durations, and scraped every 2 s), in
// node-1's network namespace, which reaches the pods' addresses; it
// returns once every kvnet-controller replica and every kvnet-node is
// scraped and up, and no component alert fires. It is stopped when t
// ends.
func startPrometheus(ctx context.Context, t *testing.T, c *Cluster) *promServer {
	t.Helper()
	prom, err := exec.LookPath("prometheus")
	if err != nil {
		t.Fatal("prometheus not installed (Debian's prometheus package; hack/install-deps.sh installs it)")
	}
	objs, err := install.MonitoringObjects()
	if err != nil {
		t.Fatal(err)
	}
	// The metrics Service, as kvnet install --monitoring applies it (the
	// operator's kinds are not served on this cluster).
	for _, u := range objs {
		if u.GetKind() != "Service" {
			continue
		}
		var svc corev1.Service
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &svc); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Client.CoreV1().Services(svc.Namespace).Create(ctx, &svc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = c.Client.CoreV1().Services(svc.Namespace).Delete(context.WithoutCancel(ctx), svc.Name, metav1.DeleteOptions{})
		})
	}

	dir := t.TempDir()
	rules, err := PrometheusRules(objs, true)
	if err != nil {
		t.Fatal(err)
	}
	rulesFile := filepath.Join(dir, "kvnet.rules.yaml")
	if err := os.WriteFile(rulesFile, rules, 0o644); err != nil {
		t.Fatal(err)
	}
	conf, jobs, err := PrometheusConfig(objs, dir, 2*time.Second, []string{rulesFile})
	if err != nil {
		t.Fatal(err)
	}
	confFile := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(confFile, conf, 0o644); err != nil {
		t.Fatal(err)
	}
	discover := func(ctx context.Context) error {
		for _, j := range jobs {
			groups, err := DiscoverTargets(ctx, c.Client, j)
			if err != nil {
				return err
			}
			b, err := json.Marshal(groups)
			if err != nil {
				return err
			}
			// Renamed into place: Prometheus never reads half a file.
			if err := os.WriteFile(j.File+".tmp", b, 0o644); err != nil {
				return err
			}
			if err := os.Rename(j.File+".tmp", j.File); err != nil {
				return err
			}
		}
		return nil
	}
	if err := discover(ctx); err != nil {
		t.Fatal(err)
	}
	dctx, stopDiscovery := context.WithCancel(context.WithoutCancel(ctx))
	discovered := make(chan struct{})
	go func() {
		defer close(discovered)
		for {
			select {
			case <-dctx.Done():
				return
			case <-time.After(2 * time.Second):
			}
			if err := discover(dctx); err != nil && dctx.Err() == nil {
				t.Logf("discovery: %v", err)
			}
		}
	}()
	t.Cleanup(func() { stopDiscovery(); <-discovered })

	node1, err := c.Client.CoreV1().Nodes().Get(ctx, NodeName(1), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var nodeIP string
	for _, a := range node1.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			nodeIP = a.Address
		}
	}
	if nodeIP == "" {
		t.Fatalf("node %s has no InternalIP", node1.Name)
	}
	addr := net.JoinHostPort(nodeIP, strconv.Itoa(prometheusPort))
	logFile := filepath.Join(dir, "prometheus.log")
	logf, err := os.Create(logFile)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { logf.Close() })
	cmd := exec.Command("ip", "netns", "exec", Netns(1), prom, "--config.file="+confFile, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr, "--log.level=info")
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// Registered after logf's: runs before it.
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
		if t.Failed() {
			b, _ := os.ReadFile(logFile)
			t.Logf("prometheus log:\n%s", lastLines(string(b), 30))
		}
	})
	ps := &promServer{bin: prom, addr: addr}
	// Positive control: every replica and every node scraped, up.
	ds, err := c.Client.AppsV1().DaemonSets(KvnetNamespace).Get(ctx, "kvnet-node", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	dep, err := c.Client.AppsV1().Deployments(KvnetNamespace).Get(ctx, "kvnet-controller", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	wantUp := map[string]int{"kvnet-controller-metrics": int(ptr.Deref(dep.Spec.Replicas, 1)), KvnetNamespace + "/kvnet-node": int(ds.Status.DesiredNumberScheduled)}
	testenv.Eventually(t, 2*time.Minute, "Prometheus scrapes every kvnet-controller replica and every kvnet-node", func() error {
		var data struct {
			ActiveTargets []struct {
				Labels    map[string]string `json:"labels"`
				Health    string            `json:"health"`
				LastError string            `json:"lastError"`
			} `json:"activeTargets"`
		}
		if err := ps.api(ctx, "targets?state=active", &data); err != nil {
			return err
		}
		up := map[string]int{}
		var down []string
		for _, tg := range data.ActiveTargets {
			if tg.Health == "up" {
				up[tg.Labels["job"]]++
			} else {
				down = append(down, tg.Labels["pod"]+": "+tg.Health+" "+tg.LastError)
			}
		}
		for job, n := range wantUp {
			if up[job] != n {
				return fmt.Errorf("job %s: %d targets up, want %d (not up: %q)", job, up[job], n, down)
			}
		}
		return nil
	})
	// The rules' first evaluation may precede the first scrapes: the
	// component alerts must be gone once the rules saw the targets.
	testenv.Eventually(t, time.Minute, "no component alert firing on a healthy cluster", func() error {
		as, err := ps.alerts(ctx)
		if err != nil {
			return err
		}
		for _, name := range []string{"KvnetControllerDown", "KvnetNodeDown", "KvnetNodeNotReady"} {
			if promFiring(as, name, "") {
				return fmt.Errorf("%s fires: %+v", name, as)
			}
		}
		return nil
	})
	return ps
}

// api GETs /api/v1/<path> and decodes its data into v.
func (ps *promServer) api(ctx context.Context, path string, v any) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+ps.addr+"/api/v1/"+path, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET /api/v1/%s: %s", path, resp.Status)
	}
	var body struct {
		Status string          `json:"status"`
		Data   json.RawMessage `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return err
	}
	if body.Status != "success" {
		return fmt.Errorf("GET /api/v1/%s: status %q", path, body.Status)
	}
	return json.Unmarshal(body.Data, v)
}

// query runs instant query q and returns its samples' values by the
// value of their label by ("" for a query with one sample).
func (ps *promServer) query(ctx context.Context, q, by string) (map[string]float64, error) {
	var data struct {
		Result []struct {
			Metric map[string]string `json:"metric"`
			Value  [2]any            `json:"value"`
		} `json:"result"`
	}
	if err := ps.api(ctx, "query?query="+url.QueryEscape(q), &data); err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for _, r := range data.Result {
		s, _ := r.Value[1].(string)
		v, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return nil, fmt.Errorf("%s: value %v", q, r.Value)
		}
		out[r.Metric[by]] = v
	}
	return out, nil
}

// alerts returns Prometheus's alerts, pending and firing.
func (ps *promServer) alerts(ctx context.Context) ([]promAlert, error) {
	var data struct {
		Alerts []promAlert `json:"alerts"`
	}
	err := ps.api(ctx, "alerts", &data)
	return data.Alerts, err
}

// promFiring reports whether alert name fires in as, for network (any if
// "").
func promFiring(as []promAlert, name, network string) bool {
	for _, a := range as {
		if a.Labels["alertname"] == name && a.State == "firing" && (network == "" || a.Labels["network"] == network) {
			return true
		}
	}
	return false
}

// testPrometheusAlerts: a real Prometheus (startPrometheus) scrapes
// kvnet; with a primary UDN's pool of a /29 filled by pods, its alerts
// KvnetIPPoolNearlyFull and KvnetIPPoolExhausted fire for that network,
// and resolve once the pods are deleted.
func testPrometheusAlerts(ctx context.Context, t *testing.T, c *Cluster) {
	ps := startPrometheus(ctx, t, c)
	// A /29's pool, filled and freed.
	dyn, err := dynamic.NewForConfig(c.CP.Config)
	if err != nil {
		t.Fatal(err)
	}
	const ns = "prom-pool"
	network := ns + "_net"
	defer primaryUDNNamespace(ctx, t, c, dyn, ns, netip.MustParsePrefix("10.153.0.0/29"))()
	target := c.ScenarioTarget()
	fill := func(i int) {
		t.Helper()
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("fill-%d", i)},
			Spec: corev1.PodSpec{TerminationGracePeriodSeconds: ptr.To[int64](0),
				Containers: []corev1.Container{{Name: "c", Image: target.Image, Command: []string{"sleep", "100000"}}}}}
		if _, err := c.Client.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// kvnet-controller exports a network's pool once it allocates there:
	// a first pod.
	fill(0)
	var size int
	testenv.Eventually(t, 2*time.Minute, "the pool of "+network+" in Prometheus", func() error {
		got, err := ps.query(ctx, fmt.Sprintf("max by (network) (kvnet_ipam_pool_size{network=%q})", network), "network")
		if err != nil {
			return err
		}
		if got[network] <= 0 {
			return fmt.Errorf("kvnet_ipam_pool_size of %s: %v", network, got)
		}
		size = int(got[network])
		return nil
	})
	if size > 12 {
		t.Fatalf("the pool of a /29 has %d addresses", size)
	}
	if size < 2 {
		t.Fatalf("the pool of a /29 has %d addresses", size)
	}
	// One address of several in use: no pool alert for the network.
	as, err := ps.alerts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if promFiring(as, "KvnetIPPoolNearlyFull", network) || promFiring(as, "KvnetIPPoolExhausted", network) {
		t.Fatalf("a pool alert fires for %s with one pod of %d: %+v", network, size, as)
	}
	for i := 1; i < size; i++ {
		fill(i)
	}
	start := time.Now()
	testenv.Eventually(t, 3*time.Minute, "KvnetIPPoolNearlyFull and KvnetIPPoolExhausted firing for "+network, func() error {
		as, err := ps.alerts(ctx)
		if err != nil {
			return err
		}
		if !promFiring(as, "KvnetIPPoolNearlyFull", network) || !promFiring(as, "KvnetIPPoolExhausted", network) {
			used, _ := ps.query(ctx, fmt.Sprintf("max by (network) (kvnet_ipam_pool_used{network=%q})", network), "network")
			return fmt.Errorf("pool used %v of %d; alerts %+v", used[network], size, as)
		}
		return nil
	})
	fired := time.Since(start)
	for i := range size {
		if err := c.Client.CoreV1().Pods(ns).Delete(ctx, fmt.Sprintf("fill-%d", i), metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
			t.Fatal(err)
		}
	}
	start = time.Now()
	testenv.Eventually(t, 3*time.Minute, "the pool alerts of "+network+" resolved", func() error {
		as, err := ps.alerts(ctx)
		if err != nil {
			return err
		}
		var left []string
		for _, a := range as {
			if a.Labels["network"] == network {
				left = append(left, a.Labels["alertname"]+" "+a.State)
			}
		}
		if len(left) > 0 {
			return fmt.Errorf("still listed: %s", strings.Join(left, ", "))
		}
		return nil
	})
	t.Logf("Prometheus (%s): pool of %s (%d addresses) full: both pool alerts firing %s after the last pods were created; resolved %s after they were deleted",
		promVersion(ps.bin), network, size, fired.Round(time.Second), time.Since(start).Round(time.Second))
}

// promVersion is the first line of prometheus --version.
func promVersion(prom string) string {
	out, _ := exec.Command(prom, "--version").CombinedOutput()
	first, _, _ := strings.Cut(string(out), "\n")
	return strings.TrimSpace(first)
}
