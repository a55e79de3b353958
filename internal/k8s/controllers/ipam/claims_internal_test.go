package ipam

import (
	"context"
	"net/netip"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	ipamclaimv1alpha1 "kvnet.io/kvnet/api/k8scni/v1alpha1"
	"kvnet.io/kvnet/internal/netconf"
)

// A claim the rebuild reserved and that was deleted before the claim
// watch started sends no delete event: the sweep queues it, and its IPs
// are freed once the API server confirms it is gone. A claim only the
// cache lacks (created after its list) keeps its IPs.
func TestClaimSweepFreesOnlyConfirmedGone(t *testing.T) {
	ctx := context.Background()
	scheme := runtime.NewScheme()
	if err := ipamclaimv1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	claim := func(name string) *ipamclaimv1alpha1.IPAMClaim {
		return &ipamclaimv1alpha1.IPAMClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name}}
	}
	// The cache has "kept"; the API server has "kept" and "new" (created
	// after the cache's list); "gone" was deleted.
	cached := fake.NewClientBuilder().WithScheme(scheme).WithObjects(claim("kept")).Build()
	live := fake.NewClientBuilder().WithScheme(scheme).WithObjects(claim("kept"), claim("new")).Build()

	st := newState()
	n, err := st.network(&netconf.Served{Name: "ns_net", IPAM: &netconf.IPAMConf{Subnets: "10.0.0.0/24"}})
	if err != nil {
		t.Fatal(err)
	}
	var held []*heldClaim
	for i, name := range []string{"kept", "new", "gone"} {
		ip := netip.AddrFrom4([4]byte{10, 0, 0, byte(10 + i)})
		if _, err := n.alloc.Reserve(claimOwner("ns", name), []netip.Addr{ip}, nil); err != nil {
			t.Fatal(err)
		}
		held = append(held, &heldClaim{key: types.NamespacedName{Namespace: "ns", Name: name}, network: "ns_net"})
	}
	st.recordClaims(held)

	ready := make(chan struct{})
	close(ready)
	r := &claimReconciler{client: cached, apiReader: live, st: st, ready: ready}
	q := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[reconcile.Request]())
	defer q.ShutDown()
	r.sweep(ctx, q)
	queued := map[string]bool{}
	for q.Len() > 0 {
		req, _ := q.Get()
		queued[req.Name] = true
		if _, err := r.Reconcile(ctx, req); err != nil {
			t.Fatal(err)
		}
		q.Done(req)
	}
	if !queued["gone"] || !queued["new"] || queued["kept"] {
		t.Fatalf("queued %v, want gone and new", queued)
	}
	for name, want := range map[string]bool{"kept": true, "new": true, "gone": false} {
		if _, holds := n.alloc.Get(claimOwner("ns", name)); holds != want {
			t.Errorf("claim %s holds IPs: %v, want %v", name, holds, want)
		}
	}
	if keys := st.claimKeys(); len(keys) != 2 {
		t.Errorf("recorded claims %v", keys)
	}
}
