package hostsubnets_test

import (
	"context"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nadv1 "kvnet.io/kvnet/api/k8scni/v1"
	"kvnet.io/kvnet/internal/hostsubnet"
	"kvnet.io/kvnet/internal/k8s/controllers/hostsubnets"
	"kvnet.io/kvnet/internal/k8s/manager"
	"kvnet.io/kvnet/internal/testenv"
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

func l3NAD(ns, name, network, subnets string) *nadv1.NetworkAttachmentDefinition {
	return &nadv1.NetworkAttachmentDefinition{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: nadv1.NetworkAttachmentDefinitionSpec{Config: fmt.Sprintf(
			`{"cniVersion":"1.1.0","type":"kvnet-cni","name":%q,"netAttachDefName":"%s/%s","topology":"layer3","role":"primary","subnets":%q}`,
			network, ns, name, subnets)},
	}
}

// subnetsOf waits until every named node's annotation satisfies ok and
// returns them.
func subnetsOf(t *testing.T, what string, ok func(map[string]hostsubnet.Subnets) error, names ...string) map[string]hostsubnet.Subnets {
	t.Helper()
	var out map[string]hostsubnet.Subnets
	testenv.Eventually(t, 30*time.Second, what, func() error {
		out = map[string]hostsubnet.Subnets{}
		for _, name := range names {
			var n corev1.Node
			if err := c.Get(context.Background(), client.ObjectKey{Name: name}, &n); err != nil {
				return err
			}
			s := hostsubnet.Subnets{}
			if v, has := n.Annotations[hostsubnets.Annotation]; has {
				var err error
				if s, err = hostsubnet.Parse(v); err != nil {
					return err
				}
			}
			out[name] = s
		}
		return ok(out)
	})
	return out
}

// everyNodeHas checks that each node holds a host subnet of network inside
// cidr and that no two nodes hold the same.
func everyNodeHas(network, cidr string) func(map[string]hostsubnet.Subnets) error {
	return func(all map[string]hostsubnet.Subnets) error {
		seen := map[netip.Prefix]string{}
		for name, s := range all {
			ps := s[network]
			if len(ps) != 1 || !netip.MustParsePrefix(cidr).Contains(ps[0].Addr()) {
				return fmt.Errorf("node %s: %s subnets %v, want one inside %s", name, network, ps, cidr)
			}
			if other, dup := seen[ps[0]]; dup {
				return fmt.Errorf("nodes %s and %s both hold %s", name, other, ps[0])
			}
			seen[ps[0]] = name
		}
		return nil
	}
}

// TestHostSubnets: every node gets its own host subnet of a Layer3
// network; a hand-made duplicate is replaced; assignments survive a
// controller restart; a deleted node's subnet goes to the next node; a
// network whose NAD is deleted leaves the nodes.
func TestHostSubnets(t *testing.T) {
	ctx := context.Background()
	nodes := []string{"hs-a", "hs-b", "hs-c"}
	for _, name := range nodes {
		testenv.Create(t, c, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}})
	}
	testenv.Create(t, c, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "hs-tenant"}})
	nad := l3NAD("hs-tenant", "l3", "hs-tenant_l3", "10.100.0.0/16/24")
	testenv.Create(t, c, nad)
	got := subnetsOf(t, "a host subnet per node", everyNodeHas("hs-tenant_l3", "10.100.0.0/16"), nodes...)

	// A node restored from a backup with another node's subnet gets its own.
	dup := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "hs-dup", Annotations: map[string]string{
		hostsubnets.Annotation: hostsubnet.Format(got["hs-a"])}}}
	testenv.Create(t, c, dup)
	all := append(nodes, "hs-dup")
	after := subnetsOf(t, "duplicate replaced", everyNodeHas("hs-tenant_l3", "10.100.0.0/16"), all...)
	if !hostsubnet.Equal(after["hs-a"], got["hs-a"]) {
		t.Errorf("hs-a's subnet moved from %v to %v when another node claimed it", got["hs-a"], after["hs-a"])
	}

	ctl.Restart(t)
	testenv.Create(t, c, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "hs-late"}})
	all = append(all, "hs-late")
	restarted := subnetsOf(t, "after restart", everyNodeHas("hs-tenant_l3", "10.100.0.0/16"), all...)
	for name, s := range after {
		if !hostsubnet.Equal(restarted[name], s) {
			t.Errorf("after a controller restart node %s holds %v, held %v", name, restarted[name], s)
		}
	}

	// A deleted node's subnet is handed out again: the lowest free one.
	freed := restarted["hs-b"]["hs-tenant_l3"][0]
	if err := c.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "hs-b"}}); err != nil {
		t.Fatal(err)
	}
	testenv.Create(t, c, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "hs-next"}})
	subnetsOf(t, "freed subnet reused", func(m map[string]hostsubnet.Subnets) error {
		if ps := m["hs-next"]["hs-tenant_l3"]; len(ps) != 1 || ps[0] != freed {
			return fmt.Errorf("hs-next holds %v, want the freed %s", ps, freed)
		}
		return nil
	}, "hs-next")

	// Deleting the network's NAD removes it from every node.
	if err := c.Delete(ctx, nad); err != nil {
		t.Fatal(err)
	}
	subnetsOf(t, "network removed from nodes", func(m map[string]hostsubnet.Subnets) error {
		for name, s := range m {
			if len(s) != 0 {
				return fmt.Errorf("node %s still holds %v", name, s)
			}
		}
		return nil
	}, "hs-a", "hs-c", "hs-dup", "hs-late", "hs-next")
}
