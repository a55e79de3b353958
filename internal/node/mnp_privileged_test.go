package node_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	nadv1 "kvnet.io/kvnet/api/k8scni/v1"
	mnpv1beta1 "kvnet.io/kvnet/api/k8scni/v1beta1"
	udnv1 "kvnet.io/kvnet/api/udn/v1"
	"kvnet.io/kvnet/internal/podnetworks"
	"kvnet.io/kvnet/internal/testenv"
)

// TestAgentMultiNetworkPolicy: a MultiNetworkPolicy for a secondary
// Layer2 UDN that admits ingress to a server only from one client's
// address (an ipBlock, the usual peer on secondary networks): that client
// reaches the server on the secondary network, the other does not, and on
// the primary network, which the policy is not for, both still do.
// Before the policy both reach it on both networks (the positive control),
// and deleting the policy lets the other client back in.
func TestAgentMultiNetworkPolicy(t *testing.T) {
	ctx := context.Background()
	l := newLab(t, "n1", "n2")
	const ns = "agent-mnp"
	primary := tenant(t, ns, "10.30.0.0/24", false)
	testenv.Create(t, c, &udnv1.UserDefinedNetwork{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "sec"},
		Spec: udnv1.UserDefinedNetworkSpec{Topology: udnv1.NetworkTopologyLayer2, Layer2: &udnv1.Layer2Config{
			Role: udnv1.NetworkRoleSecondary, Subnets: udnv1.DualStackCIDRs{"10.31.0.0/24"},
		}},
	})
	var sec nadv1.NetworkAttachmentDefinition
	testenv.Eventually(t, waitTimeout, "NAD of "+ns+"/sec", func() error {
		return c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "sec"}, &sec)
	})
	// both attaches a pod to the primary and the secondary network and
	// returns it as seen on each.
	both := func(name, n string, labels map[string]string) (onPrimary, onSecondary *pod) {
		t.Helper()
		s := l.allocatedPod(&sec, name, n, "net1", func(p *corev1.Pod) {
			selecting("sec")(p)
			for k, v := range labels {
				p.Labels[k] = v
			}
		})
		l.cni("ADD", &sec, s)
		prim := *s
		prim.ifName = "ovn-udn1"
		testenv.Eventually(t, waitTimeout, "primary allocation of "+name, func() error {
			var got corev1.Pod
			if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &got); err != nil {
				return err
			}
			nets, err := podnetworks.Parse(got.Annotations[podnetworks.Annotation])
			if err != nil {
				return err
			}
			a, ok := nets[ns+"/udn"]
			if !ok {
				return fmt.Errorf("no entry for %s/udn", ns)
			}
			prim.a = a
			return nil
		})
		l.cni("ADD", primary, &prim)
		return &prim, s
	}
	srvP, srvS := both("server", "n1", map[string]string{"app": "server"})
	aP, aS := both("client-a", "n2", nil)
	bP, bS := both("client-b", "n2", nil)
	serveToken(t, srvS) // one server on every address of the pod
	reach := func(from *pod, to string) error { return answeredBy(from, to, "server") }
	for _, from := range []*pod{aP, bP} {
		testenv.Eventually(t, waitTimeout, from.name+" reaches the server on the primary network", func() error { return reach(from, srvP.ip()) })
	}
	for _, from := range []*pod{aS, bS} {
		testenv.Eventually(t, waitTimeout, from.name+" reaches the server on the secondary network", func() error { return reach(from, srvS.ip()) })
	}

	mnp := &mnpv1beta1.MultiNetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "only-a", Annotations: map[string]string{mnpv1beta1.PolicyForAnnotation: "sec"}},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "server"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{
				{IPBlock: &networkingv1.IPBlock{CIDR: aS.ip() + "/32"}},
			}}},
		},
	}
	testenv.Create(t, c, mnp)
	testenv.Eventually(t, waitTimeout, "client-b refused on the secondary network", func() error {
		if err := reach(bS, srvS.ip()); err == nil {
			return fmt.Errorf("client-b still reaches %s", srvS.ip())
		}
		return nil
	})
	if err := reach(aS, srvS.ip()); err != nil {
		t.Errorf("client-a, which the ipBlock admits, on the secondary network: %v", err)
	}
	for _, from := range []*pod{aP, bP} {
		if err := reach(from, srvP.ip()); err != nil {
			t.Errorf("%s on the primary network, which the policy is not for: %v", from.name, err)
		}
	}
	n1 := l.nodeName("n1")
	testenv.Eventually(t, waitTimeout, "policy metrics of n1", func() error {
		ports, pols := gaugeSum(t, "kvnet_node_policy_ports", n1), gaugeSum(t, "kvnet_node_policies", n1)
		if ports != 1 || pols != 1 {
			return fmt.Errorf("kvnet_node_policy_ports %v, kvnet_node_policies %v; want 1 and 1 (the server's secondary port, only-a)", ports, pols)
		}
		return nil
	})
	for range 2 {
		if err := reach(bS, srvS.ip()); err == nil || !strings.Contains(err.Error(), "timeout") && !strings.Contains(err.Error(), "i/o") {
			t.Errorf("client-b on the secondary network after the policy: %v, want a timeout", err)
		}
	}

	if err := c.Delete(ctx, mnp); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, waitTimeout, "client-b back in after the policy is deleted", func() error { return reach(bS, srvS.ip()) })
	// The metrics follow the Apply that removed the rules, which may
	// still be finishing (its routers) when traffic flows again.
	testenv.Eventually(t, waitTimeout, "policy metrics of n1 after the policy's deletion", func() error {
		if ports := gaugeSum(t, "kvnet_node_policy_ports", n1); ports != 0 {
			return fmt.Errorf("kvnet_node_policy_ports %v, want 0", ports)
		}
		return nil
	})
	if n := histogramCount(t, "kvnet_node_rules_sync_duration_seconds", n1); n == 0 {
		t.Error("kvnet_node_rules_sync_duration_seconds of n1 has no observation")
	}
}

// gaugeSum returns the sum of gauge name's values for node, over its
// other labels, from the process's metrics (the lab's agents run here).
func gaugeSum(t *testing.T, name, node string) float64 {
	t.Helper()
	var sum float64
	for _, m := range metricsOf(t, name, node) {
		sum += m.GetGauge().GetValue()
	}
	return sum
}

// histogramCount returns how many observations histogram name has for
// node.
func histogramCount(t *testing.T, name, node string) uint64 {
	t.Helper()
	var n uint64
	for _, m := range metricsOf(t, name, node) {
		n += m.GetHistogram().GetSampleCount()
	}
	return n
}

func metricsOf(t *testing.T, name, node string) []*dto.Metric {
	t.Helper()
	mfs, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []*dto.Metric
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if labelValue(m, "node") == node {
				out = append(out, m)
			}
		}
	}
	return out
}
