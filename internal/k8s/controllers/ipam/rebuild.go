package ipam

import (
	"context"
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
	ipamclaimv1alpha1 "kvnet.io/kvnet/api/k8scni/v1alpha1"
	"kvnet.io/kvnet/internal/ipam/allocator"
	"kvnet.io/kvnet/internal/netconf"
	"kvnet.io/kvnet/internal/podnetworks"
)

// rebuilder restores every allocator from the API before any pod is
// served: networks from NADs, then IPAMClaims' IPs, then pods' annotations.
// Nothing is ever released here, so no IP can move across a restart.
type rebuilder struct {
	cache  cache.Cache
	reader client.Reader // uncached: claims are read in pages
	st     *state
	ready  chan<- struct{}
}

func (b *rebuilder) Start(ctx context.Context) error {
	logger := log.FromContext(ctx).WithName("ipam-rebuild")
	if !b.cache.WaitForCacheSync(ctx) {
		return fmt.Errorf("ipam rebuild: caches did not sync")
	}
	start := time.Now()
	stats, err := b.rebuild(ctx)
	if err != nil {
		return fmt.Errorf("ipam rebuild: %w", err)
	}
	close(b.ready)
	logger.Info("allocators rebuilt from the API", "networks", stats.networks, "claims", stats.claims,
		"pods", stats.pods, "conflicts", stats.conflicts, "duration", time.Since(start).String())
	<-ctx.Done()
	return nil
}

type rebuildStats struct{ networks, claims, pods, conflicts int }

func (b *rebuilder) rebuild(ctx context.Context) (rebuildStats, error) {
	var stats rebuildStats
	logger := log.FromContext(ctx).WithName("ipam-rebuild")

	var nads nadv1.NetworkAttachmentDefinitionList
	if err := b.cache.List(ctx, &nads); err != nil {
		return stats, err
	}
	for i := range nads.Items {
		s, err := netconf.ParseServed(nads.Items[i].Spec.Config)
		if err != nil || s == nil {
			continue
		}
		if _, err := b.st.network(s); err != nil {
			logger.Info("network not served", "nad", client.ObjectKeyFromObject(&nads.Items[i]).String(), "reason", err.Error())
			continue
		}
		stats.networks++
	}

	var pods corev1.PodList
	if err := b.cache.List(ctx, &pods); err != nil {
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

	// Claims are paged from the API server (not cached as full objects).
	for cont := ""; ; {
		var page ipamclaimv1alpha1.IPAMClaimList
		if err := b.reader.List(ctx, &page, client.Limit(2000), client.Continue(cont)); err != nil {
			return stats, fmt.Errorf("list IPAMClaims: %w", err)
		}
		b.reserveClaims(ctx, page.Items, claimMACs, &stats)
		if cont = page.Continue; cont == "" {
			break
		}
	}

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
			if !ok {
				continue
			}
			if _, err := n.alloc.Reserve(podOwner(p.UID), a.Addrs(), a.MAC()); err != nil {
				stats.conflicts++
				logger.Error(err, "pod IPs conflict at rebuild", "pod", client.ObjectKeyFromObject(p).String(), "nad", key)
				continue
			}
			owned = append(owned, a.Network)
		}
		b.st.recordPod(client.ObjectKeyFromObject(p), p.UID, owned)
		stats.pods++
	}
	b.st.mu.Lock()
	nets := make([]*network, 0, len(b.st.networks))
	for _, n := range b.st.networks {
		nets = append(nets, n)
	}
	b.st.mu.Unlock()
	for _, n := range nets {
		n.updateGauges()
	}
	return stats, nil
}

// reserveClaims reserves the IPs of a page of claims.
func (b *rebuilder) reserveClaims(ctx context.Context, items []ipamclaimv1alpha1.IPAMClaim, claimMACs map[types.NamespacedName]net.HardwareAddr, stats *rebuildStats) {
	logger := log.FromContext(ctx).WithName("ipam-rebuild")
	for i := range items {
		c := &items[i]
		if len(c.Status.IPs) == 0 {
			continue
		}
		n, ok := b.st.lookup(c.Spec.Network)
		if !ok {
			continue
		}
		key := types.NamespacedName{Namespace: c.Namespace, Name: c.Name}
		ips := make([]netip.Addr, 0, len(c.Status.IPs))
		for _, s := range c.Status.IPs {
			if p, err := netip.ParsePrefix(s); err == nil {
				ips = append(ips, p.Addr())
			}
		}
		mac := claimMACs[key]
		if mac == nil && len(ips) > 0 {
			mac = allocator.DeriveMAC(ips[0])
		}
		if _, err := n.alloc.Reserve(claimOwner(c.Namespace, c.Name), ips, mac); err != nil {
			stats.conflicts++
			logger.Error(err, "IPAMClaim IPs conflict at rebuild", "claim", key.String())
			continue
		}
		b.st.recordClaim(key, c.Spec.Network)
		stats.claims++
	}
}
