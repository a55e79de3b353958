package ipam_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ipamclaimv1alpha1 "kvnet.io/kvnet/api/k8scni/v1alpha1"
	udnv1 "kvnet.io/kvnet/api/udn/v1"
	"kvnet.io/kvnet/internal/podnetworks"
)

// benchClient is a client without client-side rate limiting.
func benchClient(b *testing.B) client.Client {
	cfg := rest.CopyConfig(env.Config)
	cfg.QPS = -1
	wc, err := client.New(cfg, client.Options{Scheme: c.Scheme()})
	if err != nil {
		b.Fatal(err)
	}
	return wc
}

func run(b *testing.B, n, workers int, f func(i int) error) {
	b.Helper()
	var wg sync.WaitGroup
	next := make(chan int)
	errs := make(chan error, n)
	for range workers {
		wg.Go(func() {
			for i := range next {
				if err := f(i); err != nil {
					errs <- err
				}
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
}

// BenchmarkEndToEnd1000PodsWithClaims: 1,000 pods, each referencing its
// own IPAMClaim, created by 32 concurrent writers; the time until all are
// annotated. The floor is the same run with kvnet stopped, the benchmark
// making kvnet's writes itself (create pod, write the claim's status,
// annotate the pod). ratio = floor / kvnet.
func BenchmarkEndToEnd1000PodsWithClaims(b *testing.B) {
	const pods, writers = 1000, 32
	ctx := context.Background()
	wc := benchClient(b)
	var kvnetTotal, floorTotal time.Duration
	for iter := range b.N {
		b.StopTimer()
		ns := fmt.Sprintf("e2e-%d-%d", time.Now().UnixNano(), iter)
		floorNS := ns + "-floor"
		mkNS(b, ns, false)
		mkNS(b, floorNS, false)
		mkUDN(b, ns, "net", udnv1.NetworkRoleSecondary, true, "10.128.0.0/16")
		for _, n := range []string{ns, floorNS} {
			// The floor's claims name a network kvnet does not know, so
			// the IPs the benchmark writes into them are not kvnet's.
			network := ns + "_net"
			if n == floorNS {
				network = "bench-floor"
			}
			run(b, pods, writers, func(i int) error {
				return wc.Create(ctx, &ipamclaimv1alpha1.IPAMClaim{
					ObjectMeta: metav1.ObjectMeta{Namespace: n, Name: fmt.Sprintf("vm%d.net", i)},
					Spec:       ipamclaimv1alpha1.IPAMClaimSpec{Network: network},
				})
			})
		}

		// Floor, with kvnet stopped.
		ctl.Stop()
		b.StartTimer()
		start := time.Now()
		run(b, pods, writers, func(i int) error {
			p := mkPod(floorNS, fmt.Sprintf("pod-%d", i), secondary("net", fmt.Sprintf("vm%d.net", i)))
			if err := wc.Create(ctx, p); err != nil {
				return err
			}
			var cl ipamclaimv1alpha1.IPAMClaim
			if err := wc.Get(ctx, client.ObjectKey{Namespace: floorNS, Name: fmt.Sprintf("vm%d.net", i)}, &cl); err != nil {
				return err
			}
			ip := fmt.Sprintf("10.129.%d.%d/16", i/250, i%250+1)
			cl.Status.IPs = []string{ip}
			cl.Status.OwnerPod = &ipamclaimv1alpha1.OwnerPod{Name: p.Name}
			cl.Status.Conditions = []metav1.Condition{{Type: "IPsAllocated", Status: metav1.ConditionTrue, Reason: "SuccessfulAllocation", Message: "IP addresses successfully allocated", LastTransitionTime: metav1.Now()}}
			if err := wc.Status().Update(ctx, &cl); err != nil {
				return err
			}
			patch := client.MergeFrom(p.DeepCopy())
			p.Annotations[podnetworks.Annotation] = fmt.Sprintf(`{"%s/net":{"ip_addresses":[%q],"mac_address":"0a:58:0a:81:00:01","role":"secondary","network":"bench-floor","ipam_claim":"vm%d.net"}}`, floorNS, ip, i)
			return wc.Patch(ctx, p, patch)
		})
		floorTotal += time.Since(start)
		b.StopTimer()
		// Leave kvnet nothing of the floor to look at.
		if err := wc.DeleteAllOf(ctx, &corev1.Pod{}, client.InNamespace(floorNS)); err != nil {
			b.Fatal(err)
		}
		if err := wc.DeleteAllOf(ctx, &ipamclaimv1alpha1.IPAMClaim{}, client.InNamespace(floorNS)); err != nil {
			b.Fatal(err)
		}
		ctl.Start(b)
		waitReady(b, ns)
		b.StartTimer()

		start = time.Now()
		run(b, pods, writers, func(i int) error {
			return wc.Create(ctx, mkPod(ns, fmt.Sprintf("pod-%d", i), secondary("net", fmt.Sprintf("vm%d.net", i))))
		})
		for {
			var list corev1.PodList
			if err := wc.List(ctx, &list, client.InNamespace(ns)); err != nil {
				b.Fatal(err)
			}
			done := 0
			for _, p := range list.Items {
				if _, ok := p.Annotations[podnetworks.Annotation]; ok {
					done++
				}
			}
			if done == pods {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		kvnetTotal += time.Since(start)
		b.StopTimer()
		for _, n := range []string{ns, floorNS} {
			_ = wc.Delete(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: n}})
		}
		b.StartTimer()
	}
	b.ReportMetric(kvnetTotal.Seconds()/float64(b.N), "s/1000pods")
	b.ReportMetric(floorTotal.Seconds()/float64(b.N), "floor-s/1000pods")
	b.ReportMetric(floorTotal.Seconds()/kvnetTotal.Seconds(), "ratio")
}

// waitReady waits until a freshly started controller serves pods, by
// getting one probe pod annotated.
func waitReady(b *testing.B, ns string) {
	b.Helper()
	name := fmt.Sprintf("probe-%d", time.Now().UnixNano())
	create(b, mkPod(ns, name, secondary("net", "")))
	waitAnnotated(b, ns, name)
	_ = c.Delete(context.Background(), mkPod(ns, name, nil))
}

// restartClaims is the namespace holding BenchmarkRestartWithClaims'
// claims. Go calls a benchmark function more than once (b.N=1, then
// larger); the claims are created on the first call only, so every call
// measures with exactly KVNET_BENCH_CLAIMS claims in the API server.
var restartClaims restartSetup

type restartSetup struct {
	ns     string
	claims int
	pods   int // pods created so far (names must not repeat)
	held   int // pods created with IPs (KVNET_BENCH_PODS)
}

// heldPod is pod i of KVNET_BENCH_PODS: created with its addresses on the
// network "net" of namespace ns (10.128.0.0 and up, clear of the claims'
// and the first pods'), as the controller would have annotated it.
func heldPod(ns string, i int) (*corev1.Pod, error) {
	v, err := podnetworks.Networks{ns + "/net": {
		IPAddresses: []string{fmt.Sprintf("10.%d.%d.%d/8", 128+i/65536, i/256%256, i%256)},
		MACAddress:  fmt.Sprintf("0a:58:0a:%02x:%02x:%02x", 128+i/65536, i/256%256, i%256),
		Role:        podnetworks.RoleSecondary,
		Network:     ns + "_net",
	}}.Marshal()
	if err != nil {
		return nil, fmt.Errorf("held pod %d: %w", i, err)
	}
	p := mkPod(ns, fmt.Sprintf("held-%d", i), secondary("net", ""))
	p.Annotations[podnetworks.Annotation] = v
	return p, nil
}

// BenchmarkRestartWithClaims: with N IPAMClaims holding IPs (N from
// KVNET_BENCH_CLAIMS, default 100,000) and KVNET_BENCH_PODS pods holding
// IPs (default none), the time from starting a fresh controller until
// the first new pod is annotated: cache sync, the rebuild, and one
// allocation. It also reports the CPU time the API
// server and this process (the controller and the benchmark) used
// meanwhile.
func BenchmarkRestartWithClaims(b *testing.B) {
	claims := 100000
	if v := os.Getenv("KVNET_BENCH_CLAIMS"); v != "" {
		var err error
		if claims, err = strconv.Atoi(v); err != nil {
			b.Fatalf("KVNET_BENCH_CLAIMS=%q: %v", v, err)
		}
	}
	pods := 0
	if v := os.Getenv("KVNET_BENCH_PODS"); v != "" {
		var err error
		if pods, err = strconv.Atoi(v); err != nil || pods < 0 || pods > 1<<20 {
			b.Fatalf("KVNET_BENCH_PODS=%q: want a count from 0 to %d", v, 1<<20)
		}
	}
	reserves := []int{0}
	if v := os.Getenv("KVNET_BENCH_RESERVE"); v != "" {
		reserves = nil
		for _, f := range strings.Split(v, ",") {
			r, err := strconv.Atoi(f)
			if err != nil || r < 0 || r > 1024 {
				b.Fatalf("KVNET_BENCH_RESERVE=%q: want counts from 0 to 1024, separated by commas", v)
			}
			reserves = append(reserves, r)
		}
	}
	ctx := context.Background()
	wc := benchClient(b)
	b.StopTimer()
	rc := &restartClaims
	if rc.ns == "" {
		ns := fmt.Sprintf("restart-%d", time.Now().UnixNano())
		mkNS(b, ns, false)
		mkUDN(b, ns, "net", udnv1.NetworkRoleSecondary, true, "10.0.0.0/8")
		setup := time.Now()
		run(b, claims, 64, func(i int) error {
			cl := &ipamclaimv1alpha1.IPAMClaim{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("vm%d.net", i)},
				Spec:       ipamclaimv1alpha1.IPAMClaimSpec{Network: ns + "_net"},
			}
			if err := wc.Create(ctx, cl); err != nil {
				return err
			}
			cl.Status.IPs = []string{fmt.Sprintf("10.%d.%d.%d/8", 1+i/65536, i/256%256, i%256)}
			return wc.Status().Update(ctx, cl)
		})
		b.Logf("created %d claims with IPs in %s", claims, time.Since(setup).Round(time.Second))
		setup = time.Now()
		run(b, pods, 64, func(i int) error {
			p, err := heldPod(ns, i)
			if err != nil {
				return err
			}
			return wc.Create(ctx, p)
		})
		b.Logf("created %d pods holding IPs in %s", pods, time.Since(setup).Round(time.Second))
		rc.ns, rc.claims, rc.held = ns, claims, pods
	}
	for _, reserve := range reserves {
		b.Run(fmt.Sprintf("reserve=%d", reserve), func(b *testing.B) { restartLoop(b, rc, reserve) })
	}
}

// restartLoop restarts the controller b.N times, each time measuring how
// long until a new pod is annotated.
func restartLoop(b *testing.B, rc *restartSetup, reserve int) {
	ctx := context.Background()
	wc := benchClient(b)
	b.StopTimer()
	ns := rc.ns
	// With the restart reserve (KVNET_BENCH_RESERVE sets per network), the
	// controllers keep their records in the benchmark's namespace.
	stopRunning, start := ctl.Stop, func() { ctl.Start(b) }
	if reserve > 0 {
		opts := ctl.Options()
		opts.RestartReserve, opts.Namespace = reserve, ns
		start = func() {
			s, err := env.RunController(opts)
			if err != nil {
				b.Fatal(err)
			}
			stopRunning = sync.OnceFunc(s)
		}
		ctl.Stop()
		defer ctl.Start(b)
		start()
		defer func() { stopRunning() }()
	}
	var total time.Duration
	var apiCPU, selfCPU float64
	for range b.N {
		// Restart from a steady state: the previous controller's watches
		// of every claim, which start after its rebuild, have synced, and
		// its restart reserve is full.
		if reserve > 0 {
			reserveRecord(b, ns, ns+"_net", reserve)
		}
		waitAPIServerIdle(b)
		stopRunning()
		name := fmt.Sprintf("first-%d", rc.pods)
		rc.pods++
		cpu := procCPU()
		b.StartTimer()
		begin := time.Now()
		start()
		if err := wc.Create(ctx, mkPod(ns, name, secondary("net", ""))); err != nil {
			b.Fatal(err)
		}
		a := waitAnnotated(b, ns, name)[ns+"/net"]
		d := time.Since(begin)
		total += d
		b.StopTimer()
		after := procCPU()
		api, self := after["kube-apiserver"]-cpu["kube-apiserver"], after["self"]-cpu["self"]
		apiCPU += api
		selfCPU += self
		b.Logf("%d claims, %d pods holding IPs, restart reserve %d: start → %s annotated in %s (CPU: kube-apiserver %.2fs, controller+benchmark %.2fs)",
			rc.claims, rc.held, reserve, name, d.Round(time.Millisecond), api, self)
		if ip := a.IPAddresses[0]; ip[:5] != "10.0." {
			// Claims hold 10.1.0.0 and up; the first free address is in 10.0/16.
			b.Fatalf("first pod got %s, which a claim may hold", ip)
		}
	}
	b.ReportMetric(total.Seconds()/float64(b.N), "s-to-first-allocation")
	b.ReportMetric(float64(rc.claims), "claims")
	b.ReportMetric(float64(rc.held), "pods")
	b.ReportMetric(float64(reserve), "reserve")
	b.ReportMetric(apiCPU/float64(b.N), "apiserver-cpu-s/op")
	b.ReportMetric(selfCPU/float64(b.N), "process-cpu-s/op")
}

// waitAPIServerIdle waits until the test's kube-apiserver uses less than
// a fifth of a core over half a second (at most a minute). Without /proc
// it waits 15 s.
func waitAPIServerIdle(b *testing.B) {
	b.Helper()
	last, ok := procCPU()["kube-apiserver"]
	if !ok {
		time.Sleep(15 * time.Second)
		return
	}
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); {
		time.Sleep(500 * time.Millisecond)
		cur := procCPU()["kube-apiserver"]
		if cur-last < 0.1 {
			return
		}
		last = cur
	}
	b.Logf("kube-apiserver still busy after a minute")
}

// procCPU returns the CPU seconds (user+system) of this process ("self")
// and of its child processes by command name (etcd, kube-apiserver), from
// /proc; empty where there is none.
func procCPU() map[string]float64 {
	out := map[string]float64{}
	self := os.Getpid()
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		s := string(data)
		open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || end < open || len(s) < end+2 {
			continue
		}
		f := strings.Fields(s[end+2:]) // from field 3 (state) on
		if len(f) < 13 {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		name := s[open+1 : end]
		if pid == self {
			name = "self"
		} else if ppid != self {
			continue
		}
		utime, _ := strconv.ParseFloat(f[11], 64)
		stime, _ := strconv.ParseFloat(f[12], 64)
		out[name] += (utime + stime) / 100 // USER_HZ
	}
	return out
}
