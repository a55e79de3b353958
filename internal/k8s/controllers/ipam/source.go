package ipam

import (
	"context"
	"fmt"

	"k8s.io/client-go/util/workqueue"
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
