package node_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kvnet.io/kvnet/internal/datapath"
	"kvnet.io/kvnet/internal/lab/simcluster"
	"kvnet.io/kvnet/internal/node"
	"kvnet.io/kvnet/internal/testenv"
)

// TestAgentPodScopeNetworks: kvnet-node with --pod-scope=networks watches
// its own pods and, by their network label, the pods of the networks it
// has pods on, and no others; that is enough for everything a node does
// with other nodes' pods: reaching them, and a NetworkPolicy admitting a
// pod of another node by its labels. A network's first pod on a node
// makes the node watch it (and reach its pods elsewhere); once its last
// pod there is gone, the node stops watching it after the grace period.
func TestAgentPodScopeNetworks(t *testing.T) {
	testenv.NeedsFixture(t, env != nil)
	node.SetScopeGrace(t, time.Second)
	l := newLabWith(t, env.Config, kubeconfig, func(cfg *simcluster.Config) { cfg.PodScope = node.PodScopeNetworks }, "n1", "n2", "n3")
	nadA := tenant(t, "scope-a", "10.7.1.0/24", false)
	nadB := tenant(t, "scope-b", "10.7.2.0/24", false)
	labelled := func(k, v string) func(*corev1.Pod) {
		return func(p *corev1.Pod) { p.Labels[k] = v }
	}
	a1 := l.runPod(nadA, "a1", "n1", labelled("app", "server"))
	a2 := l.runPod(nadA, "a2", "n2", labelled("role", "client"))
	a3 := l.runPod(nadA, "a3", "n3", nil)
	b3 := l.runPod(nadB, "b3", "n3", nil)
	netA, netB := a1.a.Network, b3.a.Network

	watches := func(n string, want ...string) {
		t.Helper()
		testenv.Eventually(t, waitTimeout, fmt.Sprintf("%s watches the pods of %v", n, want), func() error {
			if got := l.agent(n).WatchedNetworks(); !slices.Equal(got, want) {
				return fmt.Errorf("it watches %v", got)
			}
			return nil
		})
	}
	t.Run("each node watches its networks only", func(t *testing.T) {
		watches("n1", netA)
		watches("n2", netA)
		watches("n3", netA, netB)
	})
	t.Run("pods of other nodes are reached", func(t *testing.T) {
		mustReach(t, a1, a2.ip())
		mustReach(t, a2, a3.ip())
		mustReach(t, a3, a1.ip())
	})
	t.Run("a policy admits another node's pod by its labels", func(t *testing.T) {
		np := &networkingv1.NetworkPolicy{
			ObjectMeta: metav1.ObjectMeta{Namespace: "scope-a", Name: "clients-only"},
			Spec: networkingv1.NetworkPolicySpec{
				PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "server"}},
				PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
				Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{
					PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"role": "client"}},
				}}}},
			},
		}
		testenv.Create(t, c, np)
		testenv.Eventually(t, waitTimeout, "a3 (no role) kept out of a1", func() error {
			if err := ping(a3, a1.ip()); err == nil {
				return fmt.Errorf("a3 still reaches %s", a1.ip())
			}
			return nil
		})
		mustReach(t, a2, a1.ip()) // on n2: known to n1 only through the watch of netA
		if err := c.Delete(context.Background(), np); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("a network's first pod on a node starts its watch, its last stops it", func(t *testing.T) {
		b1 := l.runPod(nadB, "b1", "n1", nil)
		watches("n1", netA, netB)
		mustReach(t, b1, b3.ip())
		l.deletePod(nadB, b1)
		watches("n1", netA) // after the grace period, at a reconcile (resync 5 s)
		mustReach(t, a1, a2.ip())
	})
	t.Run("a restarted node applies nothing before it has listed its networks' pods", func(t *testing.T) {
		// Its first apply with only its own pods known would take a2
		// (on n2) out of n1's datapath until the watch listed it.
		l.stopAgent("n1")
		l.startAgent("n1")
		first := l.agent("n1").FirstApplied()
		if !slices.ContainsFunc(first.State.RemoteMACs, func(m datapath.RemoteMAC) bool { return m.MAC.String() == a2.a.MACAddress }) {
			t.Errorf("n1's first apply after its restart has no FDB entry for a2 (%s) on n2: %v", a2.a.MACAddress, first.State.RemoteMACs)
		}
		mustReach(t, a1, a2.ip())
	})
}
