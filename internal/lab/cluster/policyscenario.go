package cluster

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

// podLabel carries each scenario pod's name, for policies to select one.
const podLabel = "lab.kvnet.io/pod"

// probeWindow is how long the policy scenario keeps its pods under a
// default-deny policy before it checks they stayed Ready: webPod's
// readiness probe runs every second, gives up on an answer after
// probeTimeout and fails the pod after 3 misses in a row, so a policy
// that cut the kubelet's probes would have shown within about 10 s.
const probeWindow = 20 * time.Second

// policy: see ScenarioPolicy. Every refusal follows a positive control
// with the same probe.
func (s *scenarios) policy(ctx context.Context) (string, error) {
	ps, err := s.need(ctx, nsPolicy+"/pol-1", nsPolicy+"/pol-2")
	if err != nil {
		return "", err
	}
	p1, p2 := ps[0], ps[1]
	a1, err := p1.addr(primaryInterface, policySubnet)
	if err != nil {
		return "", err
	}
	a2, err := p2.addr(primaryInterface, policySubnet)
	if err != nil {
		return "", err
	}
	web, err := s.t.Client.CoreV1().Services(nsPolicy).Get(ctx, "web", metav1.GetOptions{})
	if err != nil {
		return "", err
	}
	dns, err := s.t.Client.CoreV1().Services("kube-system").Get(ctx, "kube-dns", metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("the cluster DNS Service: %w", err)
	}
	name := "web." + nsPolicy + ".svc.cluster.local"

	// Controls, before any policy.
	if _, err := s.reach(ctx, p1, webURL(a2), "hello from pol-2"); err != nil {
		return "", fmt.Errorf("control, no policy: %w", err)
	}
	if _, err := s.reach(ctx, p2, webURL(a1), "hello from pol-1"); err != nil {
		return "", fmt.Errorf("control, no policy: %w", err)
	}
	if err := poll(ctx, reachTimeout, func(ctx context.Context) error { return s.resolves(ctx, p1, name, web.Spec.ClusterIP) }); err != nil {
		return "", fmt.Errorf("control, no policy: %w", err)
	}

	pols := s.t.Client.NetworkingV1().NetworkPolicies(nsPolicy)
	deny := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "default-deny", Namespace: nsPolicy},
		Spec: networkingv1.NetworkPolicySpec{
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
		},
	}
	deny, err = pols.Create(ctx, deny, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("create NetworkPolicy %s/default-deny: %w", nsPolicy, err)
	}
	denied := deny.CreationTimestamp.Time
	// Enforcement takes a moment: wait until pol-1's connection goes
	// unanswered, then the other way must be refused at once.
	if err := poll(ctx, reachTimeout, func(ctx context.Context) error { return s.unreached(ctx, p1, webURL(a2)) }); err != nil {
		return "", fmt.Errorf("default-deny: %w", err)
	}
	if err := s.unreached(ctx, p2, webURL(a1)); err != nil {
		return "", fmt.Errorf("default-deny: %w", err)
	}
	// DNS is refused on pol-1's own node, which may apply the policy
	// after pol-2's node did.
	if err := poll(ctx, reachTimeout, func(ctx context.Context) error { return s.unresolved(ctx, p1, name) }); err != nil {
		return "", fmt.Errorf("default-deny: %w", err)
	}

	allowDNS := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "allow-dns", Namespace: nsPolicy},
		Spec: networkingv1.NetworkPolicySpec{
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
			Egress: []networkingv1.NetworkPolicyEgressRule{{
				To: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: dns.Spec.ClusterIP + "/32"}}},
				Ports: []networkingv1.NetworkPolicyPort{
					{Protocol: ptr.To(corev1.ProtocolUDP), Port: ptr.To(intstr.FromInt32(53))},
					{Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To(intstr.FromInt32(53))},
				},
			}},
		},
	}
	if _, err := pols.Create(ctx, allowDNS, metav1.CreateOptions{}); err != nil {
		return "", fmt.Errorf("create NetworkPolicy %s/allow-dns: %w", nsPolicy, err)
	}
	if err := poll(ctx, reachTimeout, func(ctx context.Context) error { return s.resolves(ctx, p1, name, web.Spec.ClusterIP) }); err != nil {
		return "", fmt.Errorf("allow-dns (egress to %s/32 port 53): %w", dns.Spec.ClusterIP, err)
	}
	if err := s.unreached(ctx, p1, webURL(a2)); err != nil {
		return "", fmt.Errorf("allow-dns opened more than DNS: %w", err)
	}

	// pol-1 to pol-2's http port: pol-2's ingress and pol-1's egress.
	peer := func(pod string) []networkingv1.NetworkPolicyPeer {
		return []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{podLabel: pod}}}}
	}
	httpPort := []networkingv1.NetworkPolicyPort{{Port: ptr.To(intstr.FromString("http"))}}
	for _, np := range []*networkingv1.NetworkPolicy{{
		ObjectMeta: metav1.ObjectMeta{Name: "pol-2-from-pol-1", Namespace: nsPolicy},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{podLabel: "pol-2"}},
			Ingress:     []networkingv1.NetworkPolicyIngressRule{{From: peer("pol-1"), Ports: httpPort}},
		},
	}, {
		ObjectMeta: metav1.ObjectMeta{Name: "pol-1-to-pol-2", Namespace: nsPolicy},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{podLabel: "pol-1"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
			Egress:      []networkingv1.NetworkPolicyEgressRule{{To: peer("pol-2"), Ports: httpPort}},
		},
	}} {
		if _, err := pols.Create(ctx, np, metav1.CreateOptions{}); err != nil {
			return "", fmt.Errorf("create NetworkPolicy %s/%s: %w", nsPolicy, np.Name, err)
		}
	}
	if _, err := s.reach(ctx, p1, webURL(a2), "hello from pol-2"); err != nil {
		return "", fmt.Errorf("pol-1-to-pol-2 and pol-2-from-pol-1: %w", err)
	}
	if err := s.unreached(ctx, p2, webURL(a1)); err != nil {
		return "", fmt.Errorf("pol-1 to pol-2 admitted, so the other way must stay refused: %w", err)
	}
	// The network's own Service, under the same policies: pol-1 may
	// reach its backend pol-2 only (its own ingress admits nobody).
	svcURL := "http://" + name + "/"
	if _, err := s.reach(ctx, p1, svcURL, "hello from pol-2"); err != nil {
		return "", fmt.Errorf("service %s/web under the policies: %w", nsPolicy, err)
	}

	// The kubelet's probes reach the pods over eth0, which no policy of
	// the UDN touches: both pods stayed Ready all along.
	if wait := probeWindow - time.Since(denied); wait > 0 {
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return "", ctx.Err()
		case <-t.C:
		}
	}
	for _, p := range ps {
		got, err := s.t.Client.CoreV1().Pods(nsPolicy).Get(ctx, p.name, metav1.GetOptions{})
		if err != nil {
			return "", err
		}
		if err := stayedReady(got, denied); err != nil {
			return "", fmt.Errorf("under default-deny since %s: %w", denied.Format(time.TimeOnly), err)
		}
	}
	return fmt.Sprintf("default-deny: pol-1 %s and pol-2 %s refused each other and pol-1 resolved no name; allow-dns (%s/32 port 53): %s resolved to %s, pol-2 still refused; pol-1-to-pol-2: pol-1 reached pol-2, not back, and pol-2 through Service web; both pods Ready throughout (%s and more under default-deny, no restart)",
		a1, a2, dns.Spec.ClusterIP, name, web.Spec.ClusterIP, probeWindow), nil
}

// stayedReady checks that p is Ready, has been since before since, and
// never restarted.
func stayedReady(p *corev1.Pod, since time.Time) error {
	for _, cs := range p.Status.ContainerStatuses {
		if cs.RestartCount != 0 {
			return fmt.Errorf("pod %s/%s: container %s restarted %d times", p.Namespace, p.Name, cs.Name, cs.RestartCount)
		}
	}
	for _, c := range p.Status.Conditions {
		if c.Type != corev1.PodReady {
			continue
		}
		if c.Status != corev1.ConditionTrue {
			return fmt.Errorf("pod %s/%s not Ready: %s %s", p.Namespace, p.Name, c.Reason, c.Message)
		}
		// Condition times have a second's precision.
		if c.LastTransitionTime.After(since) {
			return fmt.Errorf("pod %s/%s: Ready again at %s: it was not Ready for a while after the policy", p.Namespace, p.Name, c.LastTransitionTime.Format(time.TimeOnly))
		}
		return nil
	}
	return fmt.Errorf("pod %s/%s has no Ready condition", p.Namespace, p.Name)
}

// nslookupTry bounds one name lookup of the scenarios.
const nslookupTry = 4 * time.Second

// resolves checks that pod p resolves name (busybox nslookup, through
// the pod's resolv.conf: the cluster DNS) to addr.
func (s *scenarios) resolves(ctx context.Context, p *scenarioPod, name, addr string) error {
	out, errOut, err := s.nslookup(ctx, p, name)
	if err != nil {
		return fmt.Errorf("%s: nslookup %s: %v: %s %s", p, name, err, strings.TrimSpace(out), strings.TrimSpace(errOut))
	}
	if !strings.Contains(out, "Address: "+addr) {
		return fmt.Errorf("%s: nslookup %s: want address %s in %q", p, name, addr, out)
	}
	return nil
}

// unresolved checks that pod p's lookup of name went unanswered: killed
// by timeout after nslookupTry (exit 143), or given up by nslookup
// itself (";; connection timed out"). An answer of any kind, a name
// error included, means the DNS server was reached.
func (s *scenarios) unresolved(ctx context.Context, p *scenarioPod, name string) error {
	out, errOut, err := s.nslookup(ctx, p, name)
	if err == nil {
		return fmt.Errorf("%s: nslookup %s was answered, which it must not be: %q", p, name, strings.TrimSpace(out))
	}
	code, ok := ExitStatus(err)
	if !ok {
		return fmt.Errorf("%s: nslookup %s: %v: %s", p, name, err, strings.TrimSpace(errOut))
	}
	if code == 143 || strings.Contains(out+errOut, "timed out") {
		return nil
	}
	return fmt.Errorf("%s: nslookup %s failed (exit %d), but not for want of an answer: %s %s", p, name, code, strings.TrimSpace(out), strings.TrimSpace(errOut))
}

// nslookup runs busybox's nslookup of name (absolute: no search domain
// is tried) in p, stopped after nslookupTry (busybox's timeout).
func (s *scenarios) nslookup(ctx context.Context, p *scenarioPod, name string) (string, string, error) {
	ctx, cancel := context.WithTimeout(ctx, execTimeout)
	defer cancel()
	secs := fmt.Sprint(int(nslookupTry / time.Second))
	return PodExec(ctx, s.t.Config, s.t.Client, p.ns, p.name, "timeout", secs, "nslookup", name+".")
}

var mnpGVR = schema.GroupVersionResource{Group: "k8s.cni.cncf.io", Version: "v1beta1", Resource: "multi-networkpolicies"}

// multiPolicy: see ScenarioMultiPolicy.
func (s *scenarios) multiPolicy(ctx context.Context) (string, error) {
	ps, err := s.need(ctx, nsSecondary+"/sec-1", nsSecondary+"/sec-2")
	if err != nil {
		return "", err
	}
	p1, p2 := ps[0], ps[1]
	a1, err := p1.addr("net1", secondarySubnet)
	if err != nil {
		return "", err
	}
	a2, err := p2.addr("net1", secondarySubnet)
	if err != nil {
		return "", err
	}
	// Controls, before any policy: each reaches the other over net1.
	if _, err := s.reach(ctx, p1, webURL(a2), "hello from sec-2"); err != nil {
		return "", fmt.Errorf("control, no policy: %w", err)
	}
	if _, err := s.reach(ctx, p2, webURL(a1), "hello from sec-1"); err != nil {
		return "", fmt.Errorf("control, no policy: %w", err)
	}
	mnp := func(name string, spec map[string]any) *unstructured.Unstructured {
		return &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "k8s.cni.cncf.io/v1beta1", "kind": "MultiNetworkPolicy",
			"metadata": map[string]any{"name": name, "namespace": nsSecondary,
				"annotations": map[string]any{"k8s.v1.cni.cncf.io/policy-for": nsSecondary + "/sec"}},
			"spec": spec,
		}}
	}
	create := func(u *unstructured.Unstructured) error {
		if _, err := s.dyn.Resource(mnpGVR).Namespace(nsSecondary).Create(ctx, u, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create MultiNetworkPolicy %s/%s: %w", nsSecondary, u.GetName(), err)
		}
		return nil
	}
	if err := create(mnp("deny-ingress", map[string]any{"podSelector": map[string]any{}, "policyTypes": []any{"Ingress"}})); err != nil {
		return "", err
	}
	// Each pod's ingress is enforced on its own node: wait for both.
	for _, d := range []struct {
		from *scenarioPod
		to   netip.Addr
	}{{p1, a2}, {p2, a1}} {
		if err := poll(ctx, reachTimeout, func(ctx context.Context) error { return s.unreached(ctx, d.from, webURL(d.to)) }); err != nil {
			return "", fmt.Errorf("deny-ingress on net1: %w", err)
		}
	}
	allow := mnp("sec-2-from-sec-1", map[string]any{
		"podSelector": map[string]any{"matchLabels": map[string]any{podLabel: "sec-2"}},
		"ingress": []any{map[string]any{
			"from":  []any{map[string]any{"podSelector": map[string]any{"matchLabels": map[string]any{podLabel: "sec-1"}}}},
			"ports": []any{map[string]any{"protocol": "TCP", "port": "http"}},
		}},
	})
	if err := create(allow); err != nil {
		return "", err
	}
	if _, err := s.reach(ctx, p1, webURL(a2), "hello from sec-2"); err != nil {
		return "", fmt.Errorf("sec-2-from-sec-1: %w", err)
	}
	if err := s.unreached(ctx, p2, webURL(a1)); err != nil {
		return "", fmt.Errorf("sec-2-from-sec-1 admits sec-1 to sec-2 only: %w", err)
	}
	return fmt.Sprintf("net1 %s and %s: under deny-ingress (policy-for %s/sec) neither reached the other; sec-2-from-sec-1 let sec-1 reach sec-2 on http, not back",
		a1, a2, nsSecondary), nil
}
