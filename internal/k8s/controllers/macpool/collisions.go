package macpool

import (
	"context"
	"net"
	"slices"
	"sync"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kubevirtv1 "kvnet.io/kvnet/api/kubevirt/v1"
)

// collisionReconciler indexes the MACs of running VMIs and reports any MAC
// two of them use (a MAC set outside the pool, or an opted-out namespace).
type collisionReconciler struct {
	client   client.Client
	recorder events.EventRecorder

	mu    sync.Mutex                                   // guards following
	byVMI map[types.NamespacedName][]string            // VMI -> MACs it runs with
	byMAC map[string]map[types.NamespacedName]struct{} // MAC -> VMIs
}

func newCollisionReconciler(c client.Client, rec events.EventRecorder) *collisionReconciler {
	return &collisionReconciler{client: c, recorder: rec, byVMI: map[types.NamespacedName][]string{}, byMAC: map[string]map[types.NamespacedName]struct{}{}}
}

func (r *collisionReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var vmi kubevirtv1.VirtualMachineInstance
	var macs []string
	switch err := r.client.Get(ctx, req.NamespacedName, &vmi); {
	case apierrors.IsNotFound(err):
	case err != nil:
		return ctrl.Result{}, err
	case vmi.Status.Phase == "Running":
		for _, i := range vmi.Status.Interfaces {
			if hw, err := net.ParseMAC(i.MAC); err == nil && !slices.Contains(macs, hw.String()) {
				macs = append(macs, hw.String())
			}
		}
	}
	r.mu.Lock()
	for _, old := range r.byVMI[req.NamespacedName] {
		delete(r.byMAC[old], req.NamespacedName)
		collisions.WithLabelValues(old).Set(float64(len(r.byMAC[old])))
		if len(r.byMAC[old]) == 0 {
			delete(r.byMAC, old)
			collisions.DeleteLabelValues(old)
		}
	}
	delete(r.byVMI, req.NamespacedName)
	var clashes map[string][]types.NamespacedName
	if len(macs) > 0 {
		r.byVMI[req.NamespacedName] = macs
		for _, m := range macs {
			if r.byMAC[m] == nil {
				r.byMAC[m] = map[types.NamespacedName]struct{}{}
			}
			r.byMAC[m][req.NamespacedName] = struct{}{}
			n := len(r.byMAC[m])
			collisions.WithLabelValues(m).Set(float64(n))
			if n > 1 {
				if clashes == nil {
					clashes = map[string][]types.NamespacedName{}
				}
				for k := range r.byMAC[m] {
					clashes[m] = append(clashes[m], k)
				}
			}
		}
	}
	r.mu.Unlock()
	for mac, vmis := range clashes {
		slices.SortFunc(vmis, func(a, b types.NamespacedName) int {
			if a.String() < b.String() {
				return -1
			}
			return 1
		})
		for _, k := range vmis {
			var o kubevirtv1.VirtualMachineInstance
			if err := r.client.Get(ctx, k, &o); err != nil {
				continue
			}
			r.recorder.Eventf(&o, nil, corev1.EventTypeWarning, "MACCollision", "Detect",
				"MAC %s is used by %d running VMIs: %v", mac, len(vmis), vmis)
		}
	}
	return ctrl.Result{}, nil
}
