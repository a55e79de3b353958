package ipam

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"
)

// deferredSource starts src only once after is closed, and does not hold
// the controller's workers until src has synced (it is no
// source.SyncingSource).
//
// The IPAM controllers watch IPAMClaims through it: the rebuild reads
// every claim from the API already, and a claim informer syncing at the
// same time would make the API server serialize every claim twice, on
// the critical path of the first allocation after a restart.
type deferredSource struct {
	after <-chan struct{}
	src   source.SyncingSource
	// synced, if set, is called once src has synced (its handler has seen
	// every object of the initial list).
	synced func(ctx context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request])
}

func (d *deferredSource) Start(ctx context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request]) error {
	go func() {
		select {
		case <-d.after:
		case <-ctx.Done():
			return
		}
		if err := d.src.Start(ctx, q); err != nil {
			log.FromContext(ctx).Error(err, "start deferred watch", "source", d.String())
			return
		}
		if err := d.src.WaitForSync(ctx); err != nil {
			log.FromContext(ctx).Error(err, "deferred watch did not sync", "source", d.String())
			return
		}
		if ctx.Err() == nil && d.synced != nil {
			d.synced(ctx, q)
		}
	}()
	return nil
}

func (d *deferredSource) String() string {
	return fmt.Sprintf("deferred %v", d.src)
}

// newPodsSource queues the pods created while the restart reserve serves
// (window closed, ready not yet): the pod informer sends no event before
// it has listed every pod of the cluster, which takes seconds with
// 100,000 pods; this watch starts at the current resourceVersion, so the
// API server sends it new events only. It stops at the rebuild's end, or
// at the first error (the informer serves those pods then).
type newPodsSource struct {
	watcher client.WithWatch
	cache   client.Reader // namespaces (waitsForAllocation)
	window  <-chan struct{}
	ready   <-chan struct{}
	// mark records that a pod came from this watch (state.markNew).
	mark func(types.NamespacedName)
	// watching is closed once the watch runs: pods created from then on
	// are served before the rebuild.
	watching chan<- struct{}
}

func (s *newPodsSource) Start(ctx context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request]) error {
	go func() {
		select {
		case <-s.window:
		case <-s.ready:
			return
		case <-ctx.Done():
			return
		}
		logger := log.FromContext(ctx).WithName("ipam-new-pods")
		if err := s.run(ctx, q); err != nil && ctx.Err() == nil {
			logger.Info("watch of new pods ended; they are served once the pod cache has synced", "reason", err.Error())
		}
	}()
	return nil
}

func (s *newPodsSource) run(ctx context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request]) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-s.ready:
			cancel()
		case <-ctx.Done():
		}
	}()
	// The collection's resourceVersion, from a one-item list.
	var head metav1.PartialObjectMetadataList
	head.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("PodList"))
	if err := s.watcher.List(ctx, &head, client.Limit(1)); err != nil {
		return err
	}
	w, err := s.watcher.Watch(ctx, &corev1.PodList{}, &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: head.ResourceVersion}})
	if err != nil {
		return err
	}
	defer w.Stop()
	close(s.watching)
	for ev := range w.ResultChan() {
		switch ev.Type {
		case watch.Error:
			return apierrors.FromObject(ev.Object)
		case watch.Added:
			p, ok := ev.Object.(*corev1.Pod)
			if !ok || !waitsForAllocation(ctx, s.cache, p) {
				continue
			}
			key := types.NamespacedName{Namespace: p.Namespace, Name: p.Name}
			s.mark(key)
			q.Add(reconcile.Request{NamespacedName: key})
		}
	}
	return ctx.Err()
}

func (s *newPodsSource) String() string { return "new pods (restart reserve)" }
