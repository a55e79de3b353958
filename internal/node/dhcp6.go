package node

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	ipamclaimv1alpha1 "kvnet.io/kvnet/api/k8scni/v1alpha1"
	kubevirtv1 "kvnet.io/kvnet/api/kubevirt/v1"
	"kvnet.io/kvnet/internal/datapath"
	"kvnet.io/kvnet/internal/dhcp"
	"kvnet.io/kvnet/internal/podnetworks"
)

// ipv6Prefixes returns the IPv6 subnets among subnets: those a network's
// router advertises on-link and serves DHCPv6 in.
func ipv6Prefixes(subnets []netip.Prefix) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range subnets {
		if p.Addr().Is6() && !p.Addr().Is4In6() {
			out = append(out, p.Masked())
		}
	}
	return out
}

// guestDNS returns the DNS servers of a guest's lease, per family: the
// cluster DNS Service's cluster IPs of that family where it has some, else
// the node's servers of that family. DHCPv4 sends the IPv4 ones, DHCPv6
// the IPv6 ones.
func guestDNS(cluster, node []netip.Addr) []netip.Addr {
	var out []netip.Addr
	for _, v6 := range []bool{false, true} {
		of := func(a netip.Addr) bool { return a.Unmap().Is4() != v6 }
		fam := slices.DeleteFunc(slices.Clone(cluster), func(a netip.Addr) bool { return !of(a) })
		if len(fam) == 0 {
			fam = slices.DeleteFunc(slices.Clone(node), func(a netip.Addr) bool { return !of(a) })
		}
		out = append(out, fam...)
	}
	return out
}

// startDHCPv6 opens network w's router advertisement and DHCPv6 server in
// its router namespace at nsPath, on the gateway interface, and runs it
// under s until ctx ends. The server's DUID is the gateway MAC's, the
// same on every node, so a migrated guest's renewals are answered on its
// new node. A guest's Decline is reported with report (nil: logged only).
func startDHCPv6(ctx context.Context, s *dhcpServer, w DHCPNetwork, nsPath string, report declineReporter, logger logr.Logger) error {
	srv, err := dhcp.New6(dhcp.Config6{
		NetNS: nsPath, Interface: datapath.RouterGatewayInterface, Leases: s.leases,
		Prefixes: w.Prefixes6, MTU: w.MTU, DefaultRouter: w.DefaultRouter,
		Log: logger.WithValues("network", w.Network),
		OnDecline: func(mac net.HardwareAddr, addr netip.Addr) {
			if report == nil {
				logger.Info("DHCPv6: a guest declined its address: another node on the link holds it", "network", w.Network, "mac", mac.String(), "address", addr.String())
				return
			}
			report(w.Network, mac, addr)
		},
	})
	if err != nil {
		return err
	}
	s.done.Go(func() {
		if err := srv.Serve(ctx); err != nil && ctx.Err() == nil {
			logger.Error(err, "DHCPv6 server stopped", "network", w.Network)
		}
	})
	logger.Info("DHCPv6 server and router advertisements started", "network", w.Network, "prefixes", w.Prefixes6)
	return nil
}

// EventDHCPv6AddressDeclined is the reason of the Warning event kvnet-node
// posts when a guest declines the IPv6 address DHCPv6 gave it.
const EventDHCPv6AddressDeclined = "DHCPv6AddressDeclined"

// declineReporter reports that the guest with MAC mac on network declined
// addr: its duplicate address detection found another node on the link
// holding the address, and the DHCPv6 server withholds it (dhcp.Config6's
// OnDecline). It must not block.
type declineReporter func(network string, mac net.HardwareAddr, addr netip.Addr)

// newDeclineReporter posts the conflict as a Warning event: on the VMI
// when the guest's pod is a virt-launcher pod, else on the pod, related
// to the attachment's IPAMClaim when it has one, so that `kubectl
// describe` of the VMI shows why its guest has no IPv6 address. The pod
// is found in c by the MAC of its attachment to network on this node.
func newDeclineReporter(ctx context.Context, c client.Reader, rec events.EventRecorder, node string) declineReporter {
	logger := log.FromContext(ctx)
	return func(network string, mac net.HardwareAddr, addr netip.Addr) {
		go func() {
			regarding, related, err := declineObjects(ctx, c, node, network, mac)
			if err != nil {
				logger.Error(err, "DHCPv6: a guest declined its address; cannot tell whose", "network", network, "mac", mac.String(), "address", addr.String())
				return
			}
			logger.Info("DHCPv6: a guest declined its address: another node on the link holds it", "network", network, "mac", mac.String(), "address", addr.String(),
				"object", client.ObjectKeyFromObject(regarding).String())
			rec.Eventf(regarding, related, corev1.EventTypeWarning, EventDHCPv6AddressDeclined, "Decline",
				"the guest (MAC %s) declined its IPv6 address %s on network %s: its duplicate address detection found another node on the link holding it; kvnet-node withholds the address from it for %s",
				mac, addr, network, dhcp.DefaultDeclineHold)
		}()
	}
}

// declineObjects finds the local pod whose attachment to network has mac
// and returns the object the event is about (its VMI, or the pod) and the
// attachment's IPAMClaim (nil without one).
func declineObjects(ctx context.Context, c client.Reader, node, network string, mac net.HardwareAddr) (regarding, related client.Object, err error) {
	var pods corev1.PodList
	if err := c.List(ctx, &pods); err != nil {
		return nil, nil, fmt.Errorf("list pods: %w", err)
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.Spec.NodeName != node {
			continue
		}
		nets, err := podnetworks.Parse(p.Annotations[podnetworks.Annotation])
		if err != nil {
			continue
		}
		for _, a := range nets {
			if a.Network != network || !strings.EqualFold(a.MACAddress, mac.String()) {
				continue
			}
			regarding = p
			if vmi := p.Annotations[kubevirtv1.DomainAnnotation]; vmi != "" {
				var v kubevirtv1.VirtualMachineInstance
				if err := c.Get(ctx, types.NamespacedName{Namespace: p.Namespace, Name: vmi}, &v); err == nil {
					regarding = &v
				}
			}
			if a.IPAMClaim != "" {
				claim := &ipamclaimv1alpha1.IPAMClaim{ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: a.IPAMClaim}}
				claim.APIVersion, claim.Kind = ipamclaimv1alpha1.GroupVersion.String(), "IPAMClaim"
				related = claim
			}
			return regarding, related, nil
		}
	}
	return nil, nil, fmt.Errorf("no pod on node %q has mac %s on network %q", node, mac, network)
}
