package policyevents_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	nadv1 "kvnet.io/kvnet/api/k8scni/v1"
	mnpv1beta1 "kvnet.io/kvnet/api/k8scni/v1beta1"
	"kvnet.io/kvnet/internal/k8s/controllers/policyevents"
	"kvnet.io/kvnet/internal/k8s/manager"
	"kvnet.io/kvnet/internal/testenv"
	"kvnet.io/kvnet/internal/udn"
)

var (
	env *testenv.Env
	c   client.Client
	ctl *testenv.Controller
)

func TestMain(m *testing.M) {
	flag.Parse()
	os.Exit(testenv.Main(m, testenv.Options{}, func(e *testenv.Env) (manager.Options, error) {
		c = e.Client
		return manager.Options{}, nil
	}, &env, &ctl))
}

var seq atomic.Int32

func uniq(prefix string) string { return fmt.Sprintf("%s-%d", prefix, seq.Add(1)) }

func namespace(t *testing.T, labelled bool) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: uniq("np")}}
	if labelled {
		ns.Labels = map[string]string{udn.PrimaryNamespaceLabel: ""}
	}
	testenv.Create(t, c, ns)
	return ns.Name
}

func nad(ns, name, config string) *nadv1.NetworkAttachmentDefinition {
	return &nadv1.NetworkAttachmentDefinition{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: nadv1.NetworkAttachmentDefinitionSpec{Config: config}}
}

// kvnetConf renders a kvnet-cni configuration of role on subnets.
func kvnetConf(ns, name, role, subnets string) string {
	s := fmt.Sprintf(`{"cniVersion":"1.1.0","type":"kvnet-cni","name":"%s_%s","netAttachDefName":"%s/%s","topology":"layer2","role":"%s"`, ns, name, ns, name, role)
	if subnets != "" {
		s += fmt.Sprintf(`,"subnets":"%s"`, subnets)
	}
	return s + "}"
}

func allowWeb(ns string) networkingv1.NetworkPolicySpec {
	port := intstr.FromInt32(80)
	return networkingv1.NetworkPolicySpec{
		PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
		Ingress:     []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{{Port: &port}}}},
	}
}

func netPolicy(t *testing.T, ns string) *networkingv1.NetworkPolicy {
	t.Helper()
	np := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "allow-web"}, Spec: allowWeb(ns)}
	testenv.Create(t, c, np)
	return np
}

func multiPolicy(t *testing.T, ns, policyFor string, spec networkingv1.NetworkPolicySpec) *mnpv1beta1.MultiNetworkPolicy {
	t.Helper()
	mnp := &mnpv1beta1.MultiNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: uniq("mnp")}, Spec: spec}
	if policyFor != "" {
		mnp.Annotations = map[string]string{mnpv1beta1.PolicyForAnnotation: policyFor}
	}
	testenv.Create(t, c, mnp)
	return mnp
}

// waitEvent waits for a Warning event with reason on o whose note says
// each of want, and returns the note.
func waitEvent(t *testing.T, o client.Object, kind, reason string, want ...string) string {
	t.Helper()
	var note string
	testenv.Eventually(t, 30*time.Second, fmt.Sprintf("event %s on %s %s", reason, kind, o.GetName()), func() error {
		var list eventsv1.EventList
		if err := c.List(context.Background(), &list, client.InNamespace(o.GetNamespace())); err != nil {
			return err
		}
		var seen []string
		for _, e := range list.Items {
			if e.Regarding.Kind != kind || e.Regarding.Name != o.GetName() {
				continue
			}
			seen = append(seen, e.Reason+": "+e.Note)
			if e.Reason != reason || e.Type != corev1.EventTypeWarning {
				continue
			}
			missing := ""
			for _, w := range want {
				if !strings.Contains(e.Note, w) {
					missing = w
				}
			}
			if missing == "" {
				note = e.Note
				return nil
			}
		}
		return fmt.Errorf("events so far: %q", seen)
	})
	return note
}

func TestNetworkPolicyOnUnservedPrimaryNetwork(t *testing.T) {
	t.Run("no primary NAD", func(t *testing.T) {
		ns := namespace(t, true)
		np := netPolicy(t, ns)
		waitEvent(t, np, "NetworkPolicy", policyevents.PrimaryNetworkNotServed,
			fmt.Sprintf("NetworkPolicy %s/allow-web is not enforced: namespace %q is labelled k8s.ovn.org/primary-user-defined-network but it has no primary network kvnet serves", ns, ns))
	})
	t.Run("foreign primary NAD", func(t *testing.T) {
		ns := namespace(t, true)
		testenv.Create(t, c, nad(ns, "ovn", fmt.Sprintf(`{"cniVersion":"1.0.0","type":"ovn-k8s-cni-overlay","name":"%s_ovn","topology":"layer2","role":"primary","subnets":"10.0.0.0/24","netAttachDefName":"%s/ovn"}`, ns, ns)))
		np := netPolicy(t, ns)
		waitEvent(t, np, "NetworkPolicy", policyevents.PrimaryNetworkNotServed,
			fmt.Sprintf(`its NAD %s/ovn is not kvnet's (type "ovn-k8s-cni-overlay", not "kvnet-cni")`, ns))
	})
}

func TestMultiNetworkPolicyEvents(t *testing.T) {
	ns := namespace(t, false)
	testenv.Create(t, c, nad(ns, "nosubnets", kvnetConf(ns, "nosubnets", "secondary", "")))
	testenv.Create(t, c, nad(ns, "good", kvnetConf(ns, "good", "secondary", "10.1.0.0/24")))
	spec := allowWeb(ns)

	t.Run("policy-for missing", func(t *testing.T) {
		mnp := multiPolicy(t, ns, "", spec)
		waitEvent(t, mnp, "MultiNetworkPolicy", policyevents.PolicyForMissing, "annotation k8s.v1.cni.cncf.io/policy-for names no NetworkAttachmentDefinition")
	})
	t.Run("NAD missing, then not kvnet's", func(t *testing.T) {
		mnp := multiPolicy(t, ns, "other/blue", spec)
		waitEvent(t, mnp, "MultiNetworkPolicy", policyevents.PolicyForNADNotFound,
			"names NetworkAttachmentDefinition other/blue, which does not exist")
		// A NAD appearing re-evaluates the policies naming it.
		testenv.Create(t, c, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "other"}})
		testenv.Create(t, c, nad("other", "blue", `{"cniVersion":"1.0.0","type":"bridge","name":"blue","bridge":"br1"}`))
		waitEvent(t, mnp, "MultiNetworkPolicy", policyevents.PolicyForNotKvnet,
			`NetworkAttachmentDefinition other/blue is not kvnet's (its type is not "kvnet-cni")`)
	})
	t.Run("no subnets", func(t *testing.T) {
		mnp := multiPolicy(t, ns, "nosubnets", spec)
		waitEvent(t, mnp, "MultiNetworkPolicy", policyevents.PolicyForNoSubnets,
			fmt.Sprintf("network %q of NetworkAttachmentDefinition %s/nosubnets has no subnets", ns+"_nosubnets", ns))
	})
	t.Run("compiler rejects", func(t *testing.T) {
		bad := spec
		bad.Ingress = []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "10.1.0.0/33"}}}}}
		mnp := multiPolicy(t, ns, "good", bad)
		waitEvent(t, mnp, "MultiNetworkPolicy", policyevents.PolicyInvalid,
			fmt.Sprintf(`on network %q: spec.ingress[0] peer[0].ipBlock.cidr "10.1.0.0/33"`, ns+"_good"), "rule spec.ingress[0] admits nothing (kvnet fails closed)")
	})
}

// notEnforced reads kvnet_policies_not_enforced{kind} from the registry
// kvnet-controller exports.
func notEnforced(kind string) (float64, error) {
	fams, err := metrics.Registry.Gather()
	if err != nil {
		return 0, err
	}
	for _, f := range fams {
		if f.GetName() != "kvnet_policies_not_enforced" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "kind" && l.GetValue() == kind {
					return m.GetGauge().GetValue(), nil
				}
			}
		}
	}
	return 0, nil
}

// TestNotEnforcedGauge: a NetworkPolicy kvnet cannot enforce counts in
// kvnet_policies_not_enforced until its namespace gets a primary network
// kvnet serves.
func TestNotEnforcedGauge(t *testing.T) {
	before, err := notEnforced("NetworkPolicy")
	if err != nil {
		t.Fatal(err)
	}
	ns := namespace(t, true)
	np := netPolicy(t, ns)
	waitEvent(t, np, "NetworkPolicy", policyevents.PrimaryNetworkNotServed)
	want := func(v float64) func() error {
		return func() error {
			got, err := notEnforced("NetworkPolicy")
			if err != nil {
				return err
			}
			if got != v {
				return fmt.Errorf("kvnet_policies_not_enforced{kind=NetworkPolicy} %v, want %v", got, v)
			}
			return nil
		}
	}
	testenv.Eventually(t, 30*time.Second, "the policy counted", want(before+1))
	testenv.Create(t, c, nad(ns, "net", kvnetConf(ns, "net", "primary", "10.9.0.0/24")))
	testenv.Eventually(t, 30*time.Second, "the policy no longer counted", want(before))
}
