package ipam

import (
	"context"
	"slices"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	nadv1 "kvnet.io/kvnet/api/k8scni/v1"
	"kvnet.io/kvnet/internal/netconf"
	"kvnet.io/kvnet/internal/udn"
)

// exhaustedNetworks returns the networks with no free address: every
// address is held, or pods wait for one (an allocation failed for lack of
// addresses, e.g. in one family of a dual-stack network, and nothing was
// freed since).
//
// Only whole networks' pools are counted, outside st.mu (each allocator
// has its own lock): this runs every second. A Layer3 network has an
// allocator per node's host subnets, which marks no NAD; counting them
// too (tens of thousands at 1,000 nodes) took an eighth of the
// controller's CPU during a wave of 100,000 pods.
func (st *state) exhaustedNetworks() map[string]bool {
	out := map[string]bool{}
	st.mu.Lock()
	for n, pods := range st.waiting {
		if len(pods) > 0 {
			out[n] = true
		}
	}
	whole := slices.Clone(st.whole)
	st.mu.Unlock()
	for _, n := range whole {
		if size, used := n.alloc.Stats(); size > 0 && used >= size {
			out[n.alloc.Name()] = true
		}
	}
	return out
}

// exhaustionMarker keeps udn.PoolExhaustedAnnotation on the NADs of the
// networks that have pods waiting for an address, and off the others:
// kvnet-node reports them to kvnet-cni's STATUS verb, so a runtime learns
// before ADD that the network is full.
type exhaustionMarker struct {
	st       *state
	client   client.Client
	interval time.Duration
}

func (m *exhaustionMarker) NeedLeaderElection() bool { return true }

func (m *exhaustionMarker) Start(ctx context.Context) error {
	t := time.NewTicker(m.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		m.sync(ctx)
	}
}

func (m *exhaustionMarker) sync(ctx context.Context) {
	exhausted := m.st.exhaustedNetworks()
	// Every second: the cache's NADs, not copies, and a NAD's
	// configuration read only where a mark may change (at 1,000 networks,
	// copying and parsing them all took a seventh of the controller's CPU
	// during a wave of pods). Only a NAD to patch is copied.
	var nads nadv1.NetworkAttachmentDefinitionList
	if err := m.client.List(ctx, &nads, client.UnsafeDisableDeepCopy); err != nil {
		return
	}
	for i := range nads.Items {
		cached := &nads.Items[i]
		have := cached.Annotations[udn.PoolExhaustedAnnotation] == "true"
		if !have && len(exhausted) == 0 {
			continue
		}
		served, err := netconf.ParseServed(cached.Spec.Config)
		if err != nil || served == nil {
			continue
		}
		want := exhausted[served.Name]
		if want == have {
			continue
		}
		nad := cached.DeepCopy()
		patch := client.MergeFrom(cached)
		if want {
			if nad.Annotations == nil {
				nad.Annotations = map[string]string{}
			}
			nad.Annotations[udn.PoolExhaustedAnnotation] = "true"
		} else {
			delete(nad.Annotations, udn.PoolExhaustedAnnotation)
		}
		if err := m.client.Patch(ctx, nad, patch); err != nil {
			log.FromContext(ctx).Error(err, "mark NAD pool exhaustion", "nad", client.ObjectKeyFromObject(nad), "exhausted", want)
			continue
		}
		log.FromContext(ctx).Info("network address pool "+map[bool]string{true: "exhausted", false: "has free addresses again"}[want],
			"network", served.Name, "nad", client.ObjectKeyFromObject(nad))
	}
}
