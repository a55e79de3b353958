package node_test

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"kvnet.io/kvnet/internal/testenv"
	"kvnet.io/kvnet/internal/testenv/nstest"
)

const (
	// benchPolicies is how many NetworkPolicies isolate the server's port
	// in BenchmarkPolicyChangeToEnforced, besides the one it changes.
	benchPolicies = 1000
	// benchPolicyChanges is how many times it changes that policy.
	benchPolicyChanges = 200
	// benchProbeEvery is how often the probe opens a new connection while
	// it waits for an admission: the resolution of an admission.
	benchProbeEvery = 25 * time.Millisecond
	// benchRefuseBound is how long a probe connection may take before it
	// counts as refused (if the plan applied refuses it then): generous,
	// past a SYN retransmission, so that an admitted connection that is
	// slow (a loaded machine) completes and counts as admitted.
	benchRefuseBound = 2 * time.Second
)

// BenchmarkPolicyChangeToEnforced measures, on a node with an in-process
// agent (as the other tests of this package), the time from writing a
// NetworkPolicy change to the API server until the datapath enforces it,
// with benchPolicies other policies selecting the same port: a server pod
// in a UDN namespace, isolated by 1,000 policies (each admitting another
// label on another TCP port), and a probe pod on the same network. The
// changed policy alternately admits the probe on TCP 80 and refuses it
// (its peer selector then matches nothing). A probe connection is
// admitted when the server answers, however long that takes (up to
// benchRefuseBound), and refused when it is not answered within
// benchRefuseBound while the plan the agent applied refuses it; one not
// answered while the applied plan still admits it is neither (lost or
// slow) and is retried. After an Update that admits, the probe opens a
// connection every benchProbeEvery, without giving up on the earlier
// ones, until one is answered (the time is its answer's); after one that
// refuses, it connects again and again, each connection after the last
// answered one, until one is refused (the time is that connection's
// start). p50 and p99 are over benchPolicyChanges changes, half of each
// kind (p99 of 200 is the 198th). Run it with -benchtime 1x: one
// iteration is one lab.
func BenchmarkPolicyChangeToEnforced(b *testing.B) {
	testenv.NeedsRoot(b)
	for range b.N {
		benchPolicyChange(b)
	}
}

func benchPolicyChange(b *testing.B) {
	b.StopTimer()
	l := newLab(b, "n1")
	nad := tenant(b, "npbench", "10.61.0.0/16", false)
	srv := l.runPod(nad, "npbench-srv", "n1", func(p *corev1.Pod) { p.Labels["app"] = "srv" })
	nstest.ServeLine(b, srv.netns, ":80", func(net.Conn) string { return srv.name })
	probe := l.runPod(nad, "npbench-probe", "n1", func(p *corev1.Pod) { p.Labels["role"] = "probe" })
	addr := net.JoinHostPort(srv.ip(), "80")
	ctx := context.Background()

	// The 1,000 policies, created by a few writers at once.
	created := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, benchPolicies)
	for w := range 8 {
		wg.Go(func() {
			for i := w; i < benchPolicies; i += 8 {
				np := &networkingv1.NetworkPolicy{
					ObjectMeta: metav1.ObjectMeta{Namespace: nad.Namespace, Name: fmt.Sprintf("p%d", i)},
					Spec: networkingv1.NetworkPolicySpec{PodSelector: *labels("app", "srv"),
						Ingress: []networkingv1.NetworkPolicyIngressRule{{
							From:  []networkingv1.NetworkPolicyPeer{{PodSelector: labels("client", fmt.Sprint(i))}},
							Ports: []networkingv1.NetworkPolicyPort{npPort("TCP", intstr.FromInt32(int32(1000+i)), 0)}}}},
				}
				if err := c.Create(ctx, np); err != nil {
					errs <- fmt.Errorf("policy %s: %w", np.Name, err)
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	peer := func(admit bool) []networkingv1.NetworkPolicyPeer {
		if admit {
			return []networkingv1.NetworkPolicyPeer{{PodSelector: labels("role", "probe")}}
		}
		return []networkingv1.NetworkPolicyPeer{{PodSelector: labels("role", "nobody")}}
	}
	toggle := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: nad.Namespace, Name: "toggle"},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: *labels("app", "srv"),
			Ingress: []networkingv1.NetworkPolicyIngressRule{{From: peer(true),
				Ports: []networkingv1.NetworkPolicyPort{npPort("TCP", intstr.FromInt32(80), 0)}}}},
	}
	testenv.Create(b, c, toggle)
	testenv.Eventually(b, 5*time.Minute, fmt.Sprintf("the server's port isolated by %d policies", benchPolicies+1), func() error {
		plan := l.agent("n1").LastPlan()
		for _, pp := range plan.State.Policies {
			if pp.Ingress != nil && len(pp.Ingress.Policies) == benchPolicies+1 {
				return nil
			}
		}
		return fmt.Errorf("no port with %d ingress policies in the plan", benchPolicies+1)
	})
	testenv.Eventually(b, waitTimeout, "the probe admitted", func() error {
		_, err := nstest.ReadLine(probe.netns, addr, time.Second)
		return err
	})
	b.Logf("%d policies created and programmed in %s", benchPolicies+1, time.Since(created).Round(time.Millisecond))

	// attempt reports whether the probe's connection is answered by the
	// server within benchRefuseBound.
	attempt := func() bool {
		got, err := nstest.ReadLine(probe.netns, addr, benchRefuseBound)
		return err == nil && got == srv.name
	}
	probeAddr := netip.MustParseAddr(probe.ip())
	srvAddr := netip.MustParseAddr(srv.ip())
	// planRefuses reports whether the plan the agent last applied without
	// error refuses the probe on the server's TCP 80.
	planRefuses := func() bool {
		st := l.agent("n1").LastApplied().State
		for _, p := range st.Ports {
			if !slices.ContainsFunc(p.IPs, func(q netip.Prefix) bool { return q.Addr() == srvAddr }) {
				continue
			}
			for _, pp := range st.Policies {
				if pp.Port == p.HostIfName {
					_, ok := pp.Ingress.Allows(probeAddr, 6, 80)
					return !ok
				}
			}
		}
		return false
	}
	var pending sync.WaitGroup // admission attempts still connecting
	defer pending.Wait()
	// admitted returns when a probe connection is answered, with the time
	// of the answer.
	admitted := func(i int, start time.Time) time.Time {
		answered := make(chan time.Time, 1)
		tick := time.NewTicker(benchProbeEvery)
		defer tick.Stop()
		for {
			if time.Since(start) > waitTimeout {
				b.Fatalf("change %d (admit) not enforced after %s", i, waitTimeout)
			}
			pending.Go(func() {
				if attempt() {
					select {
					case answered <- time.Now():
					default:
					}
				}
			})
			select {
			case at := <-answered:
				return at
			case <-tick.C:
			}
		}
	}
	// refused returns when a probe connection is refused, with the time
	// it started.
	refused := func(i int, start time.Time) time.Time {
		for {
			if time.Since(start) > waitTimeout {
				b.Fatalf("change %d (refuse) not enforced after %s", i, waitTimeout)
			}
			at := time.Now()
			if attempt() {
				continue // admitted, however long it took: not yet refused
			}
			if planRefuses() {
				return at
			}
			b.Logf("change %d: a probe connection unanswered while the applied plan admits it (lost or slow): not a refusal", i)
		}
	}
	var all, admits, refusals []time.Duration
	b.StartTimer()
	for i := range benchPolicyChanges {
		admit := i%2 == 1 // the policy admits the probe now: refuse first
		toggle.Spec.Ingress[0].From = peer(admit)
		start := time.Now()
		if err := c.Update(ctx, toggle); err != nil {
			b.Fatal(err)
		}
		var took time.Duration
		if admit {
			took = admitted(i, start).Sub(start)
			admits = append(admits, took)
		} else {
			took = refused(i, start).Sub(start)
			refusals = append(refusals, took)
		}
		all = append(all, took)
	}
	b.StopTimer()
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	b.ReportMetric(ms(percentile(all, 50)), "p50-ms")
	b.ReportMetric(ms(percentile(all, 99)), "p99-ms")
	b.ReportMetric(ms(percentile(refusals, 50)), "refuse-p50-ms")
	b.ReportMetric(ms(percentile(admits, 50)), "admit-p50-ms")
	b.ReportMetric(benchPolicies+1, "policies")
	b.Logf("change to enforced, in order: %v", all)
}

// percentile returns the p-th percentile of ds (nearest rank).
func percentile(ds []time.Duration, p int) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	i := (len(s)*p + 99) / 100
	return s[max(i-1, 0)]
}
