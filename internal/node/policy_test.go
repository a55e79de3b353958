package node

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"

	nadv1 "kvnet.io/kvnet/api/k8scni/v1"
	kubevirtv1 "kvnet.io/kvnet/api/kubevirt/v1"
	"kvnet.io/kvnet/internal/datapath"
	"kvnet.io/kvnet/internal/migration"
)

func labelled(p corev1.Pod, kv ...string) corev1.Pod {
	p.Labels = map[string]string{}
	for i := 0; i < len(kv); i += 2 {
		p.Labels[kv[i]] = kv[i+1]
	}
	return p
}

func policyOf(p Plan, ifName string) *datapath.PortPolicy {
	for i := range p.State.Policies {
		if p.State.Policies[i].Port == ifName {
			return &p.State.Policies[i]
		}
	}
	return nil
}

// TestDesiredPolicies: a NetworkPolicy of a primary network's namespace
// isolates the local ports it selects, with peers from the network's
// pods on every node and a named port resolved on the selected pod; a
// pod it does not select, or in another namespace (another network),
// gets no policy; a policy in a namespace without a kvnet primary
// network is ignored.
func TestDesiredPolicies(t *testing.T) {
	web := labelled(pod("a", "web", "n1", "10.1.1.2", "0a:58:0a:01:01:02", time.Hour), "app", "web")
	web.Spec.Containers = []corev1.Container{{Name: "c", Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}}}}
	client := labelled(pod("a", "client", "n2", "10.1.1.3", "0a:58:0a:01:01:03", time.Hour), "app", "client")
	other := labelled(pod("a", "other", "n1", "10.1.1.4", "0a:58:0a:01:01:04", time.Hour), "app", "other")
	tenantB := labelled(pod("b", "web", "n1", "10.1.1.2", "0a:58:0a:01:01:02", time.Hour), "app", "web")
	http := intstr.FromString("http")
	in := Input{
		Node:  "n1",
		NADs:  []nadv1.NetworkAttachmentDefinition{primaryNAD("a", "7"), primaryNAD("b", "8")},
		Pods:  []corev1.Pod{web, client, other, tenantB},
		Nodes: []corev1.Node{kvnode("n1", "192.168.100.1"), kvnode("n2", "192.168.100.2")},
		Links: links(web, client, other, tenantB),
		NetworkPolicies: []networkingv1.NetworkPolicy{{
			ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "web-from-client"},
			Spec: networkingv1.NetworkPolicySpec{
				PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
				Ingress: []networkingv1.NetworkPolicyIngressRule{{
					From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "client"}}}},
					Ports: []networkingv1.NetworkPolicyPort{{Port: &http}}}},
			},
		}, {
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "not-a-udn"},
		}},
		Namespaces: []corev1.Namespace{{ObjectMeta: metav1.ObjectMeta{Name: "a"}}, {ObjectMeta: metav1.ObjectMeta{Name: "b"}}},
	}
	p := Desired(in)
	if len(p.Problems) > 0 {
		t.Fatalf("problems: %v", p.Problems)
	}
	if err := datapath.Validate(p.State); err != nil {
		t.Fatal(err)
	}
	if len(p.State.Policies) != 1 {
		t.Fatalf("policies: %+v, want one, for a/web's port kvp0", p.State.Policies)
	}
	pp := policyOf(p, "kvp0")
	want := datapath.PolicyRule{Name: "a/web-from-client ingress[0]", Peers: []netip.Prefix{netip.MustParsePrefix("10.1.1.3/32")},
		Ports: []datapath.PolicyPort{{Protocol: "TCP", Port: 8080}}}
	if pp == nil || pp.Egress != nil || pp.Ingress == nil || len(pp.Ingress.Rules) != 1 ||
		pp.Ingress.Rules[0].Name != want.Name || !slices.Equal(pp.Ingress.Rules[0].Peers, want.Peers) ||
		!slices.Equal(pp.Ingress.Rules[0].Ports, want.Ports) {
		t.Errorf("a/web's policy: %+v, want ingress only with %+v", pp, want)
	}

	// A bad policy is a problem naming it; the others still apply.
	bad := networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "bad"},
		Spec: networkingv1.NetworkPolicySpec{Ingress: []networkingv1.NetworkPolicyIngressRule{{
			From: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "nope"}}}}}}}
	in.NetworkPolicies = append(in.NetworkPolicies, bad)
	p = Desired(in)
	if len(p.Problems) != 1 || !strings.Contains(p.Problems[0], `"a/bad"`) || !strings.Contains(p.Problems[0], `cidr "nope"`) {
		t.Errorf("problems: %q, want one naming a/bad and its cidr", p.Problems)
	}
	if policyOf(p, "kvp0") == nil {
		t.Error("a bad policy took the good one away")
	}
}

// TestDesiredPolicyFollowsMigration: during a live migration the target
// launcher pod (same labels) is isolated on its node as the source is on
// its own, before the switch-over.
func TestDesiredPolicyFollowsMigration(t *testing.T) {
	const mac = "0a:58:0a:01:01:05"
	launcher := func(name, node string, age time.Duration) corev1.Pod {
		p := labelled(pod("a", name, node, "10.1.1.5", mac, age), "kubevirt.io", "virt-launcher", "app", "db")
		p.Annotations[kubevirtv1.DomainAnnotation] = "vm1"
		return p
	}
	src, dst := launcher("virt-launcher-vm1-src", "n1", time.Hour), launcher("virt-launcher-vm1-dst", "n2", time.Minute)
	key := types.NamespacedName{Namespace: "a", Name: "vm1"}
	in := Input{
		NADs:     []nadv1.NetworkAttachmentDefinition{primaryNAD("a", "7")},
		Pods:     []corev1.Pod{src, dst},
		Nodes:    []corev1.Node{kvnode("n1", "192.168.100.1"), kvnode("n2", "192.168.100.2")},
		Links:    links(src, dst),
		VMINodes: map[types.NamespacedName]string{key: "n1"},
		Migrations: map[types.NamespacedName]*migration.Migration{key: {VMI: key, SourceNode: "n1", TargetNode: "n2",
			SourcePod: src.Name, TargetPod: dst.Name, State: migration.Running}},
		NetworkPolicies: []networkingv1.NetworkPolicy{{
			ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "db-deny"},
			Spec:       networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}}},
		}},
	}
	for node, ifName := range map[string]string{"n1": "kvp0", "n2": "kvp1"} {
		in.Node = node
		p := Desired(in)
		if pp := policyOf(p, ifName); pp == nil || pp.Ingress == nil || !slices.Equal(pp.Ingress.Policies, []string{"a/db-deny"}) {
			t.Errorf("%s: port %s policy %+v, want isolated by a/db-deny", node, ifName, pp)
		}
		if err := datapath.Validate(p.State); err != nil {
			t.Error(err)
		}
	}
}
