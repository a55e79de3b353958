package udn_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nadv1 "kvnet.io/kvnet/api/k8scni/v1"
	udnv1 "kvnet.io/kvnet/api/udn/v1"
)

const benchNetworks = 500

// BenchmarkReconcile500UDNs measures the time from creating 500 UDNs (16
// concurrent writers) until all 500 report NetworkCreated=True (NAD
// rendered), on the real apiserver. It also times the floor the API server
// sets: the same writers making, with kvnet stopped, the four writes kvnet
// makes per network, and the event it records. ratio = floor / kvnet (1 would mean kvnet adds nothing).
func BenchmarkReconcile500UDNs(b *testing.B) {
	ctx := context.Background()
	cfg := rest.CopyConfig(env.Config)
	cfg.QPS = -1
	wc, err := client.New(cfg, client.Options{Scheme: c.Scheme()})
	if err != nil {
		b.Fatal(err)
	}
	var kvnetTotal, floorTotal time.Duration
	for i := range b.N {
		ns := fmt.Sprintf("bench-%d-%d", time.Now().UnixNano(), i)

		// The floor: with kvnet stopped, the benchmark itself makes the
		// writes kvnet makes per network (create UDN, add its finalizer,
		// create the NAD, patch the status condition, record an event).
		b.StopTimer()
		ctl.Stop()
		floorNS := ns + "-floor"
		mustCreateNS(b, wc, floorNS)
		b.StartTimer()
		start := time.Now()
		parallel(b, benchNetworks, func(j int) error {
			u := l2UDN(floorNS, fmt.Sprintf("net-%d", j), udnv1.NetworkRoleSecondary, "10.0.0.0/24")
			if err := wc.Create(ctx, u); err != nil {
				return err
			}
			u.Finalizers = append(u.Finalizers, "bench/floor")
			if err := wc.Update(ctx, u); err != nil {
				return err
			}
			if err := wc.Create(ctx, &nadv1.NetworkAttachmentDefinition{
				ObjectMeta: metav1.ObjectMeta{Namespace: floorNS, Name: u.Name},
				Spec:       nadv1.NetworkAttachmentDefinitionSpec{Config: `{"cniVersion":"1.1.0","type":"bridge","name":"x"}`},
			}); err != nil {
				return err
			}
			patch := client.MergeFrom(u.DeepCopy())
			u.Status.Conditions = []metav1.Condition{{Type: "NetworkCreated", Status: metav1.ConditionTrue, Reason: "Bench", Message: "floor", LastTransitionTime: metav1.Now()}}
			if err := wc.Status().Patch(ctx, u, patch); err != nil {
				return err
			}
			return wc.Create(ctx, &eventsv1.Event{
				ObjectMeta:          metav1.ObjectMeta{Namespace: floorNS, GenerateName: u.Name + "-"},
				EventTime:           metav1.NowMicro(),
				ReportingController: "bench",
				ReportingInstance:   "bench",
				Action:              "Sync",
				Reason:              "Bench",
				Type:                corev1.EventTypeNormal,
				Regarding:           corev1.ObjectReference{Kind: "UserDefinedNetwork", Namespace: floorNS, Name: u.Name, UID: u.UID},
			})
		})
		floorTotal += time.Since(start)
		b.StopTimer()
		parallel(b, benchNetworks, func(j int) error {
			u := &udnv1.UserDefinedNetwork{}
			if err := wc.Get(ctx, client.ObjectKey{Namespace: floorNS, Name: fmt.Sprintf("net-%d", j)}, u); err != nil {
				return err
			}
			u.Finalizers = nil
			return wc.Update(ctx, u)
		})
		_ = wc.Delete(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: floorNS}})
		for {
			var left udnv1.UserDefinedNetworkList
			if err := wc.List(ctx, &left, client.InNamespace(floorNS)); err != nil {
				b.Fatal(err)
			}
			if len(left.Items) == 0 {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		ctl.Start(b)
		mustCreateNS(b, wc, ns)
		b.StartTimer()

		start = time.Now()
		parallel(b, benchNetworks, func(j int) error {
			return wc.Create(ctx, l2UDN(ns, fmt.Sprintf("net-%d", j), udnv1.NetworkRoleSecondary, "10.0.0.0/24"))
		})
		for {
			var list udnv1.UserDefinedNetworkList
			if err := wc.List(ctx, &list, client.InNamespace(ns)); err != nil {
				b.Fatal(err)
			}
			synced := 0
			for _, u := range list.Items {
				if meta.IsStatusConditionTrue(u.Status.Conditions, "NetworkCreated") {
					synced++
				}
			}
			if synced == benchNetworks {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		kvnetTotal += time.Since(start)
	}
	b.ReportMetric(kvnetTotal.Seconds()/float64(b.N), "s/500udns")
	b.ReportMetric(floorTotal.Seconds()/float64(b.N), "floor-s/500udns")
	b.ReportMetric(floorTotal.Seconds()/kvnetTotal.Seconds(), "ratio")
}

func mustCreateNS(b *testing.B, c client.Client, name string) {
	b.Helper()
	if err := c.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}); err != nil {
		b.Fatal(err)
	}
}

func parallel(b *testing.B, n int, f func(int) error) {
	b.Helper()
	const workers = 16
	var wg sync.WaitGroup
	errs := make(chan error, n)
	next := make(chan int)
	for range workers {
		wg.Go(func() {
			for j := range next {
				if err := f(j); err != nil {
					errs <- err
				}
			}
		})
	}
	for j := range n {
		next <- j
	}
	close(next)
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
}
