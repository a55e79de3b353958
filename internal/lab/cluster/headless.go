package cluster

import (
	"context"
	"fmt"
	"net/netip"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// headlessName is tenant A's headless Service over a-1 and a-2, which
// are also its subdomain (spec.hostname and spec.subdomain).
const headlessName = "web-hl"

// createHeadless makes tenant A's headless Service.
func (s *scenarios) createHeadless(ctx context.Context) error {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: headlessName, Namespace: nsTenantA},
		Spec: corev1.ServiceSpec{
			ClusterIP: corev1.ClusterIPNone,
			Selector:  map[string]string{"app": "web"},
			Ports:     []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromString("http")}},
		},
	}
	if _, err := s.t.Client.CoreV1().Services(nsTenantA).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("scenarios: create Service %s/%s: %w", nsTenantA, headlessName, err)
	}
	return nil
}

// headless: see ScenarioHeadless. CoreDNS answers from the Service's
// EndpointSlices, which hold the pods' default-network addresses: the
// controls show that answer (to a default-network pod), then a pod of
// the UDN must get the UDN addresses.
func (s *scenarios) headless(ctx context.Context) (string, error) {
	ps, err := s.need(ctx, nsTenantA+"/a-1", nsTenantA+"/a-2", nsPlain+"/plain-1", nsTenantB+"/b-1")
	if err != nil {
		return "", err
	}
	a1, a2, plain, b1 := ps[0], ps[1], ps[2], ps[3]
	var udn, eth0 [2]netip.Addr
	for i, p := range ps[:2] {
		if udn[i], err = p.addr(primaryInterface, tenantSubnet); err != nil {
			return "", err
		}
		if eth0[i], err = netip.ParseAddr(p.pod.Status.PodIP); err != nil {
			return "", fmt.Errorf("pod %s: status.podIP %q: %w", p, p.pod.Status.PodIP, err)
		}
	}
	name := headlessName + "." + nsTenantA + ".svc.cluster.local"
	host2 := a2.name + "." + name

	// Control: CoreDNS's own answer, to a pod of the default network,
	// holds both pods' default-network addresses.
	for _, a := range eth0 {
		if err := poll(ctx, reachTimeout, func(ctx context.Context) error { return s.resolves(ctx, plain, name, a.String()) }); err != nil {
			return "", fmt.Errorf("control, the default network's answer: %w", err)
		}
	}
	// A pod of the UDN gets their UDN addresses, and none of eth0's.
	for _, a := range udn {
		if err := poll(ctx, reachTimeout, func(ctx context.Context) error { return s.resolves(ctx, a1, name, a.String()) }); err != nil {
			return "", fmt.Errorf("headless Service from a pod of the UDN: %w", err)
		}
	}
	if err := s.resolvesNone(ctx, a1, name, eth0[:]...); err != nil {
		return "", err
	}
	if err := poll(ctx, reachTimeout, func(ctx context.Context) error { return s.resolves(ctx, a1, host2, udn[1].String()) }); err != nil {
		return "", fmt.Errorf("hostname.subdomain: %w", err)
	}
	if _, err := s.reach(ctx, a1, "http://"+host2+":8080/", "hello from a-2"); err != nil {
		return "", fmt.Errorf("fetch by hostname.subdomain: %w", err)
	}
	// Another tenant learns nothing of tenant A's network: its answer
	// is CoreDNS's own.
	if err := poll(ctx, reachTimeout, func(ctx context.Context) error { return s.resolves(ctx, b1, name, eth0[0].String()) }); err != nil {
		return "", fmt.Errorf("tenant B's answer: %w", err)
	}
	if err := s.resolvesNone(ctx, b1, name, udn[:]...); err != nil {
		return "", fmt.Errorf("tenant B saw tenant A's UDN addresses: %w", err)
	}
	return fmt.Sprintf("%s: CoreDNS answers %s and %s (default network, to plain-1); a-1 on the UDN gets %s and %s and fetched a-2 at %s; b-1 (tenant B) gets CoreDNS's answer",
		name, eth0[0], eth0[1], udn[0], udn[1], host2), nil
}

// resolvesNone checks that pod p resolves name to none of addrs.
func (s *scenarios) resolvesNone(ctx context.Context, p *scenarioPod, name string, addrs ...netip.Addr) error {
	out, errOut, err := s.nslookup(ctx, p, name)
	if err != nil {
		return fmt.Errorf("%s: nslookup %s: %v: %s %s", p, name, err, strings.TrimSpace(out), strings.TrimSpace(errOut))
	}
	for _, a := range addrs {
		if strings.Contains(out, "Address: "+a.String()+"\n") {
			return fmt.Errorf("%s: nslookup %s: address %s in %q", p, name, a, out)
		}
	}
	return nil
}
