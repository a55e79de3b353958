// Package handlers holds event handlers shared by kvnet's controllers.
package handlers

import (
	"context"

	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/priorityqueue"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// DeletingPriority is the work queue priority of an object being deleted:
// above every other event.
const DeletingPriority = 100

// DeletingFirst enqueues each object for itself, as
// handler.EnqueueRequestForObject does, but an object being deleted goes
// ahead of everything else, and the rest of a start-up's list after every
// later event (controller-runtime's default).
//
// Deletions first because they hold others up: a namespace cannot finish
// terminating while one of our finalizers stays on something in it. Under
// steady churn, with kvnet-controller restarting, a network deleted while
// it was down has no event but the start-up list, and in controller-
// runtime's order (list last, in the same order every time) a restart
// could come before its turn again and again: the 10,000-operation chaos
// run left namespaces terminating for 30 minutes that way.
func DeletingFirst() handler.EventHandler { return DeletingFirstBy(self) }

// DeletingFirstBy is DeletingFirst for the requests mapFn maps an object
// to (e.g. an IPAMClaim to its VM): with the object's priority.
func DeletingFirstBy(mapFn func(client.Object) []reconcile.Request) handler.EventHandler {
	add := func(q workqueue.TypedRateLimitingInterface[reconcile.Request], obj client.Object, initialList bool) {
		if obj == nil {
			return
		}
		for _, req := range mapFn(obj) {
			if pq, ok := q.(priorityqueue.PriorityQueue[reconcile.Request]); ok {
				pq.AddWithOpts(priorityqueue.AddOpts{Priority: Priority(obj, initialList)}, req)
				continue
			}
			q.Add(req)
		}
	}
	return handler.Funcs{
		CreateFunc: func(_ context.Context, e event.CreateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			add(q, e.Object, e.IsInInitialList)
		},
		UpdateFunc: func(_ context.Context, e event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			add(q, e.ObjectNew, false)
		},
		DeleteFunc: func(_ context.Context, e event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			add(q, e.Object, false)
		},
		GenericFunc: func(_ context.Context, e event.GenericEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			add(q, e.Object, false)
		},
	}
}

// self maps an object to its own request.
func self(obj client.Object) []reconcile.Request {
	return []reconcile.Request{{NamespacedName: client.ObjectKeyFromObject(obj)}}
}

// Priority returns the priority DeletingFirst gives obj: DeletingPriority
// while it is being deleted, handler.LowPriority for the rest of a start-
// up list, nil (the default) otherwise.
func Priority(obj client.Object, initialList bool) *int {
	switch {
	case obj.GetDeletionTimestamp() != nil:
		return new(DeletingPriority)
	case initialList:
		return new(handler.LowPriority)
	}
	return nil
}
