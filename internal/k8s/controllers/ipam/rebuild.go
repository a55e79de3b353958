package ipam

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	nadv1 "kvnet.io/kvnet/api/k8scni/v1"
	"kvnet.io/kvnet/internal/hostsubnet"
	"kvnet.io/kvnet/internal/ipam/allocator"
	"kvnet.io/kvnet/internal/netconf"
	"kvnet.io/kvnet/internal/podnetworks"
)

// rebuilder restores every allocator from the API before any pod is
// served: networks from NADs, then IPAMClaims' IPs, then pods' annotations.
// Nothing is ever released here, so no IP can move across a restart.
type rebuilder struct {
	cache  cache.Cache // NADs and pods
	claims claimLister // claims are not cached as full objects
	st     *state
	ready  chan<- struct{}
	// claimsWatched is closed once the IPAMClaim watches, started after
	// the rebuild, have synced; if they do not within watchTimeout, the
	// manager stops (as a controller whose cache does not sync would).
	claimsWatched <-chan struct{}
	watchTimeout  time.Duration
	// reserve, if set, is loaded before the rebuild; window is closed
	// once pods may be served from it (see reserveSet).
	reserve *reserveSet
	window  chan<- struct{}
	// hold, if set, holds the rebuild after the reserve is loaded until
	// it is closed (tests).
	hold <-chan struct{}
}

func (b *rebuilder) Start(ctx context.Context) error {
	logger := log.FromContext(ctx).WithName("ipam-rebuild")
	// No cache.WaitForCacheSync: it would also wait for every informer
	// other controllers started (VMs, VMIs...); listing NADs and pods
	// waits for those two caches only.
	start := time.Now()
	stats, err := b.rebuild(ctx)
	if err != nil {
		return fmt.Errorf("ipam rebuild: %w", err)
	}
	close(b.ready)
	b.st.wakeDeferred(ctx)
	logger.Info("allocators rebuilt from the API", "networks", stats.networks, "claims", stats.claims,
		"pods", stats.pods, "conflicts", stats.conflicts, "duration", time.Since(start).String(),
		"cachesSynced", stats.cachesSynced.String(), "claimsListed", stats.claimsListed.String(),
		"claimsResourceVersion", stats.claimsRV)
	if b.claimsWatched != nil {
		select {
		case <-b.claimsWatched:
			logger.Info("IPAMClaim watches synced", "sinceStart", time.Since(start).String())
		case <-time.After(b.watchTimeout):
			return fmt.Errorf("ipam: IPAMClaim watches not synced %s after the rebuild", b.watchTimeout)
		case <-ctx.Done():
			return nil
		}
	}
	<-ctx.Done()
	return nil
}

type rebuildStats struct {
	networks, claims, pods, conflicts int
	cachesSynced, claimsListed        time.Duration
	claimsRV                          string
}

func (b *rebuilder) rebuild(ctx context.Context) (rebuildStats, error) {
	var stats rebuildStats
	logger := log.FromContext(ctx).WithName("ipam-rebuild")
	start := time.Now()

	// Claims are read while the NAD and pod caches sync (both reads are
	// consistent and independent, so their order does not matter), and
	// reserved as they arrive once those are read.
	var (
		claimsRV  string
		claimsErr error
		listTook  time.Duration
	)
	batches := make(chan []heldClaim, 4096)
	go func() {
		defer close(batches) // after claimsRV, claimsErr, listTook are set
		t := time.Now()
		claimsRV, claimsErr = b.claims.listHeld(ctx, func(c []heldClaim) {
			select {
			case batches <- c:
			case <-ctx.Done():
			}
		})
		listTook = time.Since(t)
	}()

	// The rebuild only reads the cached objects: no deep copies.
	layer3 := map[string]*layer3Net{}
	var nads nadv1.NetworkAttachmentDefinitionList
	if err := b.cache.List(ctx, &nads, client.UnsafeDisableDeepCopy); err != nil {
		return stats, err
	}
	served := map[string]*netconf.Served{}
	for i := range nads.Items {
		s, err := netconf.ParseServed(nads.Items[i].Spec.Config)
		if err != nil || s == nil {
			continue
		}
		if s.Conf != nil && s.Conf.Topology == netconf.TopologyLayer3 {
			// Allocators per host subnet, made as pods show them.
			if nw, err := hostsubnet.FromConf(s.Conf); err == nil && layer3[s.Name] == nil {
				layer3[s.Name] = &layer3Net{served: s, net: nw}
				stats.networks++
			}
			continue
		}
		n, err := b.st.network(s)
		if err != nil {
			logger.Info("network not served", "nad", client.ObjectKeyFromObject(&nads.Items[i]).String(), "reason", err.Error())
			continue
		}
		// The network's first definition, which its allocator keeps.
		served[s.Name] = n.served
		stats.networks++
	}

	if b.reserve != nil && b.reserve.opts.Size > 0 {
		switch open, err := b.reserve.load(ctx, served); {
		case err != nil:
			logger.Error(err, "restart reserve not loaded: allocating once the rebuild is done")
		case open:
			close(b.window)
			logger.Info("serving new pods from the restart reserve until the rebuild is done", "sinceStart", time.Since(start).String())
		}
	}
	if b.hold != nil {
		select {
		case <-b.hold:
		case <-ctx.Done():
			return stats, ctx.Err()
		}
	}

	var pods corev1.PodList
	if err := b.cache.List(ctx, &pods, client.UnsafeDisableDeepCopy); err != nil {
		return stats, err
	}
	// MACs of claim-backed attachments, as the pods using them show.
	claimMACs := map[types.NamespacedName]net.HardwareAddr{}
	podNets := make([]podnetworks.Networks, len(pods.Items))
	for i := range pods.Items {
		p := &pods.Items[i]
		v, ok := p.Annotations[podnetworks.Annotation]
		if !ok {
			continue
		}
		nets, err := podnetworks.Parse(v)
		if err != nil {
			logger.Info("ignoring unparsable annotation", "pod", client.ObjectKeyFromObject(p).String(), "reason", err.Error())
			continue
		}
		podNets[i] = nets
		for _, a := range nets {
			if a.IPAMClaim != "" {
				claimMACs[types.NamespacedName{Namespace: p.Namespace, Name: a.IPAMClaim}] = a.MAC()
			}
		}
	}

	stats.cachesSynced = time.Since(start)

	nets := map[string]*network{} // nil: not served
	for batch := range batches {
		b.reserveClaims(ctx, batch, nets, claimMACs, &stats)
	}
	if claimsErr != nil {
		return stats, claimsErr
	}
	if err := ctx.Err(); err != nil {
		return stats, err
	}
	stats.claimsListed, stats.claimsRV = listTook, claimsRV

	for i := range pods.Items {
		p := &pods.Items[i]
		if podNets[i] == nil || podnetworks.Completed(p) {
			continue
		}
		var owned []string
		for key, a := range podNets[i] {
			if a.IPAMClaim != "" {
				continue // held by the claim
			}
			n, ok := b.st.lookup(a.Network)
			if l3 := layer3[a.Network]; !ok && l3 != nil {
				n, ok = l3.allocatorOf(b.st, a.Addrs())
			}
			if !ok {
				continue
			}
			if _, err := b.reserveEvicting(ctx, n, podOwner(p.UID), a.Addrs(), a.MAC()); err != nil {
				stats.conflicts++
				logger.Error(err, "pod IPs conflict at rebuild", "pod", client.ObjectKeyFromObject(p).String(), "nad", key)
				continue
			}
			owned = append(owned, n.alloc.Name())
		}
		b.st.recordPod(client.ObjectKeyFromObject(p), p.UID, owned)
		stats.pods++
	}
	b.st.mu.Lock()
	all := make([]*network, 0, len(b.st.networks))
	for _, n := range b.st.networks {
		all = append(all, n)
	}
	b.st.mu.Unlock()
	for _, n := range all {
		n.updateGauges()
	}
	return stats, nil
}

// reserveClaims reserves the IPs of the claims. nets caches network
// lookups across calls.
func (b *rebuilder) reserveClaims(ctx context.Context, claims []heldClaim, nets map[string]*network, claimMACs map[types.NamespacedName]net.HardwareAddr, stats *rebuildStats) {
	logger := log.FromContext(ctx).WithName("ipam-rebuild")
	reserved := make([]*heldClaim, 0, len(claims))
	for i := range claims {
		c := &claims[i]
		n, seen := nets[c.network]
		if !seen {
			n, _ = b.st.lookup(c.network)
			nets[c.network] = n
		}
		if n == nil {
			continue
		}
		mac := claimMACs[c.key]
		if mac == nil && len(c.ips) > 0 {
			mac = allocator.DeriveMAC(c.ips[0])
		}
		if _, err := b.reserveEvicting(ctx, n, claimOwner(c.key.Namespace, c.key.Name), c.ips, mac); err != nil {
			stats.conflicts++
			logger.Error(err, "IPAMClaim IPs conflict at rebuild", "claim", c.key.String())
			continue
		}
		reserved = append(reserved, c)
	}
	stats.claims += len(reserved)
	b.st.recordClaims(reserved)
}

// reserveEvicting is n.alloc.Reserve; where the addresses are in the
// restart reserve, which must not happen (the reserve is free addresses),
// they are taken out of it and the holder keeps them.
func (b *rebuilder) reserveEvicting(ctx context.Context, n *network, owner string, ips []netip.Addr, mac net.HardwareAddr) (allocator.Allocation, error) {
	return withEviction(ctx, b.reserve, n, ips, mac, func() (allocator.Allocation, error) {
		return n.alloc.Reserve(owner, ips, mac)
	})
}

// withEviction runs f, and once more if it failed while the restart
// reserve held some of ips or mac, which it then frees (a claim or a
// static request takes addresses from the reserve), or while the network
// was full and the reserve held sets, which it then gives back.
func withEviction(ctx context.Context, rs *reserveSet, n *network, ips []netip.Addr, mac net.HardwareAddr, f func() (allocator.Allocation, error)) (allocator.Allocation, error) {
	a, err := f()
	if err == nil || rs == nil {
		return a, err
	}
	var (
		evicted bool
		eerr    error
	)
	switch {
	case errors.Is(err, allocator.ErrFull):
		// Once more even if another allocation gave the reserve back
		// first: it may have left an address.
		_, eerr = rs.giveBack(ctx, n)
		evicted = eerr == nil
	case len(ips) > 0 || mac != nil:
		evicted, eerr = rs.evict(ctx, n, ips, mac)
	}
	if eerr != nil {
		return a, fmt.Errorf("%w (and the restart reserve holding them could not give them back: %v)", err, eerr)
	}
	if !evicted {
		return a, err
	}
	return f()
}

// layer3Net is a Layer3 network met during the rebuild.
type layer3Net struct {
	served *netconf.Served
	net    hostsubnet.Network
}

// allocatorOf returns the allocator of the host subnets holding addrs: the
// allocator the pod's addresses were taken from.
func (l *layer3Net) allocatorOf(st *state, addrs []netip.Addr) (*network, bool) {
	subnets := make([]netip.Prefix, 0, len(addrs))
	for _, a := range addrs {
		p, ok := l.net.HostSubnetOf(a)
		if !ok {
			return nil, false
		}
		subnets = append(subnets, p)
	}
	n, err := st.hostNetwork(l.served, subnets)
	return n, err == nil
}
