package node

import (
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// benchNetworkPolicies is how many NetworkPolicies BenchmarkDesiredPolicies
// adds to the cluster of BenchmarkDesired10kPods.
const benchNetworkPolicies = 1000

// BenchmarkDesiredPolicies: the plan of node n0 in the cluster of
// BenchmarkDesired10kPods (100 nodes, 10,000 pods on 50 primary networks,
// one namespace each, 100 pods on n0) with 1,000 NetworkPolicies, 20 per
// namespace, when nothing changed since the last plan (the difference with
// BenchmarkDesired10kPods is what the policies cost a plan). Pods carry
// app=a0…a9; policy k of a namespace selects app=a(k%10) and admits, on
// TCP port 8000+k, app=a((k+1)%10) of its own namespace, or (every fourth)
// of every namespace labelled tier=t(k%3); every fifth also isolates
// egress to an ipBlock with an except. Every local pod is selected, so
// n0's plan isolates all its 100 ports.
func BenchmarkDesiredPolicies(b *testing.B) {
	in := policyBenchInput()
	plan := Desired(in)
	if len(plan.Problems) > 0 {
		b.Fatal(plan.Problems)
	}
	local := 0
	for _, p := range in.Pods {
		if p.Spec.NodeName == in.Node {
			local++
		}
	}
	if len(plan.State.Policies) != local {
		b.Fatalf("plan isolates %d ports, want every local pod's: %d", len(plan.State.Policies), local)
	}
	b.ReportAllocs()
	for b.Loop() {
		plan = Desired(in)
	}
	b.ReportMetric(float64(len(in.NetworkPolicies)), "policies")
	b.ReportMetric(float64(len(plan.State.Policies)), "isolated-ports")
}

// policyBenchInput is BenchmarkDesiredPolicies's cluster: desiredBenchInput's
// with labelled pods and namespaces and 1,000 NetworkPolicies.
func policyBenchInput() Input {
	in := desiredBenchInput()
	for i := range in.Pods {
		in.Pods[i].Labels = map[string]string{"app": fmt.Sprintf("a%d", i%10)}
	}
	for i := range benchNetworks {
		in.Namespaces = append(in.Namespaces, corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
			Name: fmt.Sprintf("t%d", i), Labels: map[string]string{"tier": fmt.Sprintf("t%d", i%3)}}})
	}
	tcp := corev1.ProtocolTCP
	for j := range benchNetworkPolicies {
		ns, k := fmt.Sprintf("t%d", j%benchNetworks), j/benchNetworks
		from := networkingv1.NetworkPolicyPeer{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": fmt.Sprintf("a%d", (k+1)%10)}}}
		if k%4 == 0 {
			from.NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"tier": fmt.Sprintf("t%d", k%3)}}
		}
		port := intstr.FromInt32(int32(8000 + k))
		np := networkingv1.NetworkPolicy{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("np%d", k)},
			Spec: networkingv1.NetworkPolicySpec{
				PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": fmt.Sprintf("a%d", k%10)}},
				Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{from},
					Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &port}}}},
				PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			},
		}
		if k%5 == 0 {
			np.Spec.PolicyTypes = append(np.Spec.PolicyTypes, networkingv1.PolicyTypeEgress)
			np.Spec.Egress = []networkingv1.NetworkPolicyEgressRule{{To: []networkingv1.NetworkPolicyPeer{
				{IPBlock: &networkingv1.IPBlock{CIDR: "10.1.1.0/24", Except: []string{"10.1.1.128/25"}}}}}}
		}
		in.NetworkPolicies = append(in.NetworkPolicies, np)
	}
	return in
}
