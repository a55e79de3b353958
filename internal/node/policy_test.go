package node

import (
	"errors"
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

	// A bad policy is a problem naming it; it fails closed (every pod of
	// the namespace it selects is isolated, its bad rule admits nothing)
	// and the others still apply.
	bad := networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "bad"},
		Spec: networkingv1.NetworkPolicySpec{Ingress: []networkingv1.NetworkPolicyIngressRule{{
			From: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "nope"}}}}}}}
	in.NetworkPolicies = append(in.NetworkPolicies, bad)
	p = Desired(in)
	if len(p.Problems) != 1 || !strings.Contains(p.Problems[0], `"a/bad"`) || !strings.Contains(p.Problems[0], `cidr "nope"`) {
		t.Errorf("problems: %q, want one naming a/bad and its cidr", p.Problems)
	}
	if pp := policyOf(p, "kvp0"); pp == nil || pp.Ingress == nil || len(pp.Ingress.Rules) != 1 || pp.Ingress.Rules[0].Name != want.Name {
		t.Errorf("a bad policy took the good one away: %+v", pp)
	}
	if pp := policyOf(p, "kvp2"); pp == nil || pp.Ingress == nil || len(pp.Ingress.Rules) != 0 || !slices.Equal(pp.Ingress.Policies, []string{"a/bad"}) {
		t.Errorf("a/other under the bad policy: %+v, want isolated by a/bad with no rule", pp)
	}
	if err := datapath.Validate(p.State); err != nil {
		t.Fatal(err)
	}
}

// TestDesiredPolicyDatapathRefusalFailsClosed: a rule the datapath
// refuses (injected: the compiler refuses all it knows the datapath
// would) admits nothing, its port stays isolated, the network's other
// policies keep their rules, and the problem names rule and policy; when
// the datapath refuses even the rules one by one, every selected port
// stays isolated with no rule.
func TestDesiredPolicyDatapathRefusalFailsClosed(t *testing.T) {
	web := labelled(pod("a", "web", "n1", "10.1.1.2", "0a:58:0a:01:01:02", time.Hour), "app", "web")
	client := labelled(pod("a", "client", "n1", "10.1.1.3", "0a:58:0a:01:01:03", time.Hour), "app", "client")
	db := labelled(pod("a", "db", "n1", "10.1.1.4", "0a:58:0a:01:01:04", time.Hour), "app", "db")
	fromClient := []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{
		{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "client"}}}}}}
	in := Input{
		Node:  "n1",
		NADs:  []nadv1.NetworkAttachmentDefinition{primaryNAD("a", "7")},
		Pods:  []corev1.Pod{web, client, db},
		Nodes: []corev1.Node{kvnode("n1", "192.168.100.1")},
		Links: links(web, client, db),
		NetworkPolicies: []networkingv1.NetworkPolicy{{
			ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "web"},
			Spec:       networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}, Ingress: fromClient},
		}, {
			ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "refused"},
			Spec:       networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}}, Ingress: fromClient},
		}},
		Namespaces: []corev1.Namespace{{ObjectMeta: metav1.ObjectMeta{Name: "a"}}},
	}
	refuse := func(refused func(datapath.State) bool) {
		t.Helper()
		orig := validatePolicies
		validatePolicies = func(s datapath.State) error {
			if refused(s) {
				return errors.New("injected refusal")
			}
			return orig(s)
		}
		t.Cleanup(func() { validatePolicies = orig })
	}
	hasRule := func(s datapath.State, name string) bool {
		for _, pp := range s.Policies {
			for _, d := range []*datapath.PolicyDirection{pp.Ingress, pp.Egress} {
				if d != nil && slices.ContainsFunc(d.Rules, func(r datapath.PolicyRule) bool { return r.Name == name }) {
					return true
				}
			}
		}
		return false
	}
	refuse(func(s datapath.State) bool { return hasRule(s, "a/refused ingress[0]") })
	p := Desired(in)
	if len(p.Problems) != 1 || !strings.Contains(p.Problems[0], `rule "a/refused ingress[0]" admits nothing`) ||
		!strings.Contains(p.Problems[0], "policy a/refused") || !strings.Contains(p.Problems[0], "injected refusal") {
		t.Errorf("problems: %q, want one naming the refused rule and its policy", p.Problems)
	}
	if pp := policyOf(p, "kvp0"); pp == nil || pp.Ingress == nil || len(pp.Ingress.Rules) != 1 || pp.Ingress.Rules[0].Name != "a/web ingress[0]" {
		t.Errorf("a/web, whose policy the datapath accepts: %+v, want its rule", pp)
	}
	if pp := policyOf(p, "kvp2"); pp == nil || pp.Ingress == nil || len(pp.Ingress.Rules) != 0 || !slices.Equal(pp.Ingress.Policies, []string{"a/refused"}) {
		t.Errorf("a/db, whose policy's rule the datapath refuses: %+v, want isolated with no rule", pp)
	}
	if policyOf(p, "kvp1") != nil {
		t.Error("a/client, which no policy selects, got a policy")
	}

	// Refused whatever the rules are one by one (here: two ports' policies
	// together, when one has a rule).
	refuse(func(s datapath.State) bool {
		return len(s.Policies) > 1 && slices.ContainsFunc(s.Policies, func(pp datapath.PortPolicy) bool {
			return pp.Ingress != nil && len(pp.Ingress.Rules) > 0
		})
	})
	p = Desired(in)
	if !slices.ContainsFunc(p.Problems, func(s string) bool { return strings.Contains(s, "every port they select stays isolated with no rule") }) {
		t.Errorf("problems: %q, want the fallback named", p.Problems)
	}
	for _, ifName := range []string{"kvp0", "kvp2"} {
		if pp := policyOf(p, ifName); pp == nil || pp.Ingress == nil || len(pp.Ingress.Rules) != 0 {
			t.Errorf("port %s: %+v, want isolated with no rule", ifName, pp)
		}
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
