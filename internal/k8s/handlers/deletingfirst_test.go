package handlers

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/priorityqueue"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// TestDeletingFirst: in the work queue an object being deleted comes out
// before a later event's object, which comes out before the rest of a
// start-up list, whatever order they were added in.
func TestDeletingFirst(t *testing.T) {
	q := priorityqueue.New[reconcile.Request]("test")
	defer q.ShutDown()
	h := DeletingFirst()
	ctx := context.Background()
	obj := func(name string, deleting bool) *corev1.ConfigMap {
		o := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name}}
		if deleting {
			o.DeletionTimestamp = &metav1.Time{Time: time.Now()}
			o.Finalizers = []string{"x"}
		}
		return o
	}
	h.Create(ctx, event.CreateEvent{Object: obj("listed", false), IsInInitialList: true}, q)
	h.Create(ctx, event.CreateEvent{Object: obj("listed-2", false), IsInInitialList: true}, q)
	old, changed := obj("changed", false), obj("changed", false)
	old.ResourceVersion, changed.ResourceVersion = "1", "2" // a change, not a resync
	h.Update(ctx, event.UpdateEvent{ObjectOld: old, ObjectNew: changed}, q)
	h.Create(ctx, event.CreateEvent{Object: obj("deleting", true), IsInInitialList: true}, q)
	var got []string
	for range 4 {
		req, _ := q.Get()
		got = append(got, req.Name)
		q.Done(req)
	}
	if got[0] != "deleting" || got[1] != "changed" {
		t.Fatalf("work order %v: want the deleting object first, then the later event, then the start-up list", got)
	}
	if p := Priority(obj("x", false), false); p != nil {
		t.Errorf("an ordinary event's priority is %d, want the default", *p)
	}
}

// TestDeletingFirstBy: a mapped object (an IPAMClaim to its VM) being
// deleted puts its mapped request ahead of a start-up list's.
func TestDeletingFirstBy(t *testing.T) {
	q := priorityqueue.New[reconcile.Request]("test-by")
	defer q.ShutDown()
	h := DeletingFirstBy(func(o client.Object) []reconcile.Request {
		return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: "vm-of-" + o.GetName()}}}
	})
	ctx := context.Background()
	listed := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "listed"}}
	deleting := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "claim",
		DeletionTimestamp: &metav1.Time{Time: time.Now()}, Finalizers: []string{"x"}}}
	h.Create(ctx, event.CreateEvent{Object: listed, IsInInitialList: true}, q)
	h.Create(ctx, event.CreateEvent{Object: deleting, IsInInitialList: true}, q)
	first, _ := q.Get()
	q.Done(first)
	if first.Name != "vm-of-claim" {
		t.Fatalf("first request %v, want the deleting object's mapped request vm-of-claim", first)
	}
}
