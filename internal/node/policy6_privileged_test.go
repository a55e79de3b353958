package node_test

import (
	"context"
	"net/netip"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nadv1 "kvnet.io/kvnet/api/k8scni/v1"
	udnv1 "kvnet.io/kvnet/api/udn/v1"
	"kvnet.io/kvnet/internal/testenv"
)

// TestAgentNetworkPolicyIPv6: on a dual-stack primary UDN, a NetworkPolicy
// admitting app=frontend to app=api holds over IPv6 too: the frontend on
// another node pings the api's IPv6 address, the intruder no longer does
// once the policy is there (it did before: the positive control), and it
// still reaches the frontend, which no policy selects, over IPv6.
func TestAgentNetworkPolicyIPv6(t *testing.T) {
	ctx := context.Background()
	l := newLab(t, "n1", "n2")
	const ns = "agent-pol6"
	testenv.Create(t, c, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{"k8s.ovn.org/primary-user-defined-network": ""}}})
	testenv.Create(t, c, &udnv1.UserDefinedNetwork{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "udn"},
		Spec: udnv1.UserDefinedNetworkSpec{Topology: udnv1.NetworkTopologyLayer2, Layer2: &udnv1.Layer2Config{
			Role: udnv1.NetworkRolePrimary, Subnets: udnv1.DualStackCIDRs{"10.60.0.0/24", "fd60::/64"},
		}},
	})
	var nad nadv1.NetworkAttachmentDefinition
	testenv.Eventually(t, waitTimeout, "NAD of "+ns, func() error {
		return c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "udn"}, &nad)
	})
	labelled := func(app string) func(*corev1.Pod) {
		return func(p *corev1.Pod) { p.Labels["app"] = app }
	}
	api := l.runPod(&nad, "api", "n1", labelled("api"))
	frontend := l.runPod(&nad, "frontend", "n2", labelled("frontend"))
	intruder := l.runPod(&nad, "intruder", "n2", labelled("intruder"))
	v6 := func(p *pod) string {
		for _, a := range p.a.IPAddresses {
			if pfx := netip.MustParsePrefix(a); pfx.Addr().Is6() {
				return pfx.Addr().String()
			}
		}
		t.Fatalf("%s has no IPv6 address: %v", p.name, p.a.IPAddresses)
		return ""
	}
	mustReach(t, intruder, v6(api))
	mustReach(t, frontend, v6(api))

	testenv.Create(t, c, &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "api-allow-frontend"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "api"}},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{
				{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "frontend"}}},
			}}},
		},
	})
	// Applied on api's node: then the intruder (whose addresses the rule
	// does not list) is refused, over IPv6 as over IPv4.
	waitRefused(t, l, intruder, 0, api)
	mustReach(t, frontend, v6(api))
	mustReach(t, intruder, v6(frontend))
	mustNotReach(t, intruder, v6(api))
}
