package node_test

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nadv1 "kvnet.io/kvnet/api/k8scni/v1"
	mnpv1beta1 "kvnet.io/kvnet/api/k8scni/v1beta1"
	udnv1 "kvnet.io/kvnet/api/udn/v1"
	"kvnet.io/kvnet/internal/datapath"
	"kvnet.io/kvnet/internal/node"
	"kvnet.io/kvnet/internal/testenv"
)

// TestAgentPolicyFailsClosed: on a secondary Layer2 UDN, a
// MultiNetworkPolicy whose ipBlock CIDR the CRD accepts and the compiler
// cannot use (10.0.0.0/33) isolates the pod it selects, which every
// client reached before, and gets a Warning event naming the field; a
// pod it does not select stays reachable (the control). Then a policy
// whose rule the datapath refuses (injected) isolates its pod while the
// network's other policy keeps admitting what it allows.
func TestAgentPolicyFailsClosed(t *testing.T) {
	ctx := context.Background()
	refuse := node.RefusePolicyRules(t)
	l := newLab(t, "n1", "n2")
	const ns = "agent-failclosed"
	tenant(t, ns, "10.32.0.0/24", false)
	testenv.Create(t, c, &udnv1.UserDefinedNetwork{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "sec"},
		Spec: udnv1.UserDefinedNetworkSpec{Topology: udnv1.NetworkTopologyLayer2, Layer2: &udnv1.Layer2Config{
			Role: udnv1.NetworkRoleSecondary, Subnets: udnv1.DualStackCIDRs{"10.33.0.0/24"},
		}},
	})
	var sec nadv1.NetworkAttachmentDefinition
	testenv.Eventually(t, waitTimeout, "NAD of "+ns+"/sec", func() error {
		return c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "sec"}, &sec)
	})
	onSec := func(name, n, app string) *pod {
		t.Helper()
		p := l.allocatedPod(&sec, name, n, "net1", func(p *corev1.Pod) {
			selecting("sec")(p)
			p.Labels["app"] = app
		})
		l.cni("ADD", &sec, p)
		return p
	}
	web, db := onSec("web", "n1", "web"), onSec("db", "n1", "db")
	a, b := onSec("client-a", "n2", "client"), onSec("client-b", "n2", "client")
	serveToken(t, web)
	serveToken(t, db)
	reached := func(from, to *pod) error { return answeredBy(from, to.ip(), to.name) }
	refused := func(from, to *pod) error {
		err := reached(from, to)
		switch {
		case err == nil:
			return fmt.Errorf("%s reaches %s", from.name, to.name)
		case !strings.Contains(err.Error(), "timeout") && !strings.Contains(err.Error(), "i/o"):
			return fmt.Errorf("%s to %s: %v, want a timeout (dropped)", from.name, to.name, err)
		}
		return nil
	}
	for _, from := range []*pod{a, b} {
		for _, to := range []*pod{web, db} {
			testenv.Eventually(t, waitTimeout, from.name+" reaches "+to.name, func() error { return reached(from, to) })
		}
	}

	// portPolicy returns the policy the agent of p's node last applied to
	// p's port, nil when none.
	portPolicy := func(p *pod) *datapath.PortPolicy {
		st := l.agent(p.node).LastApplied().State
		for _, port := range st.Ports {
			if !slicesContainsAddr(port.IPs, p.ip()) {
				continue
			}
			for i := range st.Policies {
				if st.Policies[i].Port == port.HostIfName {
					return &st.Policies[i]
				}
			}
		}
		return nil
	}

	broken := &mnpv1beta1.MultiNetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "broken", Annotations: map[string]string{mnpv1beta1.PolicyForAnnotation: "sec"}},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{
				{IPBlock: &networkingv1.IPBlock{CIDR: "10.0.0.0/33"}}}}},
		},
	}
	testenv.Create(t, c, broken)
	testenv.Eventually(t, waitTimeout, "web's port isolated by "+ns+"/broken", func() error {
		if pp := portPolicy(web); pp == nil || pp.Ingress == nil || len(pp.Ingress.Rules) != 0 {
			return fmt.Errorf("web's applied policy: %+v, want ingress isolated with no rule", pp)
		}
		return nil
	})
	for _, from := range []*pod{a, b} {
		if err := reached(from, db); err != nil {
			t.Errorf("control: %s to db, which no policy selects: %v", from.name, err)
		}
		if err := refused(from, web); err != nil {
			t.Errorf("under a policy that cannot be compiled: %v", err)
		}
	}
	waitPolicyEvent(t, broken, "PolicyInvalid", `spec.ingress[0] peer[0].ipBlock.cidr "10.0.0.0/33"`, "rule spec.ingress[0] admits nothing")

	// A rule the datapath refuses: db's policy isolates db; web's, a
	// good one now, keeps admitting client-a.
	refuse(ns + "/db-from-a ingress[0]")
	if err := c.Delete(ctx, broken); err != nil {
		t.Fatal(err)
	}
	fromA := func(name, app string) *mnpv1beta1.MultiNetworkPolicy {
		return &mnpv1beta1.MultiNetworkPolicy{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: map[string]string{mnpv1beta1.PolicyForAnnotation: "sec"}},
			Spec: networkingv1.NetworkPolicySpec{
				PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": app}},
				Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{
					{IPBlock: &networkingv1.IPBlock{CIDR: a.ip() + "/32"}}}}},
			},
		}
	}
	testenv.Create(t, c, fromA("web-from-a", "web"))
	testenv.Create(t, c, fromA("db-from-a", "db"))
	testenv.Eventually(t, waitTimeout, "web's and db's policies applied", func() error {
		if pp := portPolicy(web); pp == nil || pp.Ingress == nil || len(pp.Ingress.Rules) != 1 || pp.Ingress.Rules[0].Name != ns+"/web-from-a ingress[0]" {
			return fmt.Errorf("web's applied policy: %+v, want its one rule", pp)
		}
		if pp := portPolicy(db); pp == nil || pp.Ingress == nil || len(pp.Ingress.Rules) != 0 {
			return fmt.Errorf("db's applied policy: %+v, want ingress isolated with no rule", pp)
		}
		return nil
	})
	testenv.Eventually(t, waitTimeout, "client-a, which web-from-a admits, reaches web", func() error { return reached(a, web) })
	for _, e := range []error{refused(b, web), refused(a, db), refused(b, db)} {
		if e != nil {
			t.Error(e)
		}
	}
	problems := l.agent("n1").LastApplied().Problems
	if !slices.ContainsFunc(problems, func(s string) bool {
		return strings.Contains(s, `rule "`+ns+`/db-from-a ingress[0]" admits nothing`) && strings.Contains(s, "refused by the test")
	}) {
		t.Errorf("n1's problems %q do not name the refused rule", problems)
	}
}

// slicesContainsAddr reports whether ips holds address ip.
func slicesContainsAddr(ips []netip.Prefix, ip string) bool {
	return slices.ContainsFunc(ips, func(p netip.Prefix) bool { return p.Addr().String() == ip })
}

// waitPolicyEvent waits for a Warning event with reason on o (source
// kvnet-controller, which the fixture runs; the reason is a string, as
// the node tests link no controller code) whose note has every want.
func waitPolicyEvent(t *testing.T, o client.Object, reason string, want ...string) {
	t.Helper()
	testenv.Eventually(t, waitTimeout, "event "+reason+" on "+o.GetName(), func() error {
		var list eventsv1.EventList
		if err := c.List(context.Background(), &list, client.InNamespace(o.GetNamespace())); err != nil {
			return err
		}
		var seen []string
		for _, e := range list.Items {
			if e.Regarding.Name != o.GetName() {
				continue
			}
			seen = append(seen, e.Reason+": "+e.Note)
			if e.Reason == reason && e.Type == corev1.EventTypeWarning &&
				!slices.ContainsFunc(want, func(w string) bool { return !strings.Contains(e.Note, w) }) {
				return nil
			}
		}
		return fmt.Errorf("events on %s: %q", o.GetName(), seen)
	})
}
