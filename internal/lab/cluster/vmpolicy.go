package cluster

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// intruderPod is a client pod of the VM's own network that the VM
// policy scenario's NetworkPolicy refuses (label app=intruder).
const intruderPod = "vx"

// vmPolicy: see ScenarioVMPolicy. The policy admits every pod of the
// namespace but the intruder, so the other scenarios' clients and echo
// streams (unlabelled) go on; it is deleted at the end.
func (s *vmScenarios) vmPolicy(ctx context.Context) (string, error) {
	v, err := s.vm(nsVM + "/vm-m")
	if err != nil {
		return "", err
	}
	ps, err := s.need(ctx, nsVM+"/vc", nsVM+"/"+intruderPod)
	if err != nil {
		return "", err
	}
	vc, vx := ps[0], ps[1]
	url := "http://" + v.ip.String() + "/"
	// Controls: both clients reach the VM before any policy.
	for _, p := range ps {
		if _, err := s.reach(ctx, p, url, v.name); err != nil {
			return "", fmt.Errorf("control, no policy: %w", err)
		}
	}
	pols := s.t.Client.NetworkingV1().NetworkPolicies(nsVM)
	np := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "vm-m-ingress", Namespace: nsVM},
		Spec: networkingv1.NetworkPolicySpec{
			// The VMI's labels, which KubeVirt copies to its launcher pod.
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": v.name}},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{
				PodSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
					Key: "app", Operator: metav1.LabelSelectorOpNotIn, Values: []string{"intruder"},
				}}},
			}}}},
		},
	}
	if _, err := pols.Create(ctx, np, metav1.CreateOptions{}); err != nil {
		return "", fmt.Errorf("create NetworkPolicy %s/%s: %w", nsVM, np.Name, err)
	}
	defer func() { _ = pols.Delete(context.WithoutCancel(ctx), np.Name, metav1.DeleteOptions{}) }()
	check := func(when string) error {
		if err := poll(ctx, reachTimeout, func(ctx context.Context) error { return s.unreached(ctx, vx, url) }); err != nil {
			return fmt.Errorf("%s: %w", when, err)
		}
		if _, err := s.reach(ctx, vc, url, v.name); err != nil {
			return fmt.Errorf("%s: %w", when, err)
		}
		return nil
	}
	if err := check("policy " + np.Name + " on " + v.node); err != nil {
		return "", err
	}
	from := v.node
	var to string
	for _, n := range s.nodes[1:3] {
		if n != v.node {
			to = n
		}
	}
	if _, err := s.migrate(ctx, v, "mig-pol", to); err != nil {
		return "", err
	}
	v.node = to
	// The target's kvnet-node isolates the VM's new port before the
	// guest runs there: the client the policy admits gets through (the
	// VM is up on the target), and the intruder stays refused.
	if _, err := s.reach(ctx, vc, url, v.name); err != nil {
		return "", fmt.Errorf("after migration mig-pol to %s: %w", to, err)
	}
	if err := s.unreached(ctx, vx, url); err != nil {
		return "", fmt.Errorf("after migration mig-pol to %s: %w", to, err)
	}
	return fmt.Sprintf("NetworkPolicy %s selecting app=%s (the VMI's labels, on its launcher pod): %s (app=intruder) refused and %s admitted at %s on %s, and again after live migration mig-pol to %s",
		np.Name, v.name, vx, vc, v.ip, from, to), nil
}

// intruder returns the intruder client pod on node.
func intruder(node, image string) *corev1.Pod {
	p := webPod(nsVM, intruderPod, node, image)
	p.Labels["app"] = "intruder"
	return p
}
