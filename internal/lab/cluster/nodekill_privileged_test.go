//go:build cluster

package cluster

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"

	"kvnet.io/kvnet/internal/testenv"
)

// testKvnetNodeKilled: a TCP stream between two pods of a primary UDN on
// two nodes goes on, every line echoed in order, while kvnet-node is
// killed (SIGKILL, as a crash or the OOM killer does) on both nodes and
// the kubelet restarts it: the datapath stays while the agent is away,
// and the restarted agent reconciles without tearing it down.
func testKvnetNodeKilled(ctx context.Context, t *testing.T, c *Cluster) {
	dyn, err := dynamic.NewForConfig(c.CP.Config)
	if err != nil {
		t.Fatal(err)
	}
	const ns = "node-kill"
	subnet := netip.MustParsePrefix("10.151.0.0/24")
	defer primaryUDNNamespace(ctx, t, c, dyn, ns, subnet)()
	nodes, err := readyNodes(ctx, c.Client)
	if err != nil || len(nodes) < 2 {
		t.Fatalf("ready nodes %v: %v", nodes, err)
	}
	target := c.ScenarioTarget()
	if _, err := c.Client.CoreV1().Pods(ns).Create(ctx, echoServerPod(ns, "srv", nodes[1], target.Image), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var srvIP netip.Addr
	testenv.Eventually(t, 4*time.Minute, "echo server Ready with its ovn-udn1 address", func() error {
		p, err := c.Client.CoreV1().Pods(ns).Get(ctx, "srv", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if !PodReady(p) {
			return fmt.Errorf("not Ready: %s", podNotReady(ctx, c.Client, p))
		}
		srvIP, err = (&scenarioPod{ns: ns, name: "srv", pod: p}).addr("ovn-udn1", subnet)
		return err
	})
	if _, err := c.Client.CoreV1().Pods(ns).Create(ctx, echoPod(ns, "cli", nodes[0], target.Image, srvIP), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	s := &vmScenarios{scenarios: &scenarios{t: target, dyn: dyn, out: testLog{t}}}
	var lines int
	testenv.Eventually(t, 4*time.Minute, "echo client streaming", func() error {
		p, err := c.Client.CoreV1().Pods(ns).Get(ctx, "cli", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if p.Status.Phase != corev1.PodRunning {
			return fmt.Errorf("client %s", podNotReady(ctx, c.Client, p))
		}
		lines, err = s.waitEchoGrows(ctx, ns, "cli", 0)
		return err
	})

	// Kill kvnet-node on both nodes at once, as a crash does (SIGKILL).
	back, err := s.killKvnetNode(ctx, []string{nodes[0], nodes[1]})
	if err != nil {
		t.Fatal(err)
	}
	// The stream goes on past the restart, twice over: once with the
	// new agents up, once after they reconciled.
	n, err := s.waitEchoGrows(ctx, ns, "cli", lines)
	if err != nil {
		t.Fatalf("echo stream across kvnet-node's kill: %v", err)
	}
	n, err = s.waitEchoGrows(ctx, ns, "cli", n)
	if err != nil {
		t.Fatalf("echo stream after kvnet-node's restart: %v", err)
	}
	gap, err := s.echoGap(ctx, ns, "cli", lines)
	if err != nil {
		t.Fatal(err)
	}
	p, err := c.Client.CoreV1().Pods(ns).Get(ctx, "srv", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ip, err := (&scenarioPod{ns: ns, name: "srv", pod: p}).addr("ovn-udn1", subnet); err != nil || ip != srvIP {
		t.Errorf("echo server's ovn-udn1 address %s (%v), was %s", ip, err, srvIP)
	}
	t.Logf("kvnet-node killed (SIGKILL) on %s and %s, restarted and Ready after %s: echo lines %d -> %d in order, longest pause %s; server kept %s",
		nodes[0], nodes[1], back.Round(time.Second), lines, n, gap, srvIP)
}

// primaryUDNNamespace creates namespace ns labelled for a primary network
// and its primary Layer2 UDN "net" on subnet, waits until kvnet-controller
// rendered its NAD, and returns what deletes the namespace and waits until
// it is gone.
func primaryUDNNamespace(ctx context.Context, t *testing.T, c *Cluster, dyn dynamic.Interface, ns string, subnet netip.Prefix) (remove func()) {
	t.Helper()
	if _, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
		Name: ns, Labels: map[string]string{"k8s.ovn.org/primary-user-defined-network": ""},
	}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	remove = func() {
		_ = c.Client.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{})
		testenv.Eventually(t, 3*time.Minute, "namespace "+ns+" gone", func() error {
			if _, err := c.Client.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				return fmt.Errorf("still there (%v)", err)
			}
			return nil
		})
	}
	if _, err := dyn.Resource(udnGVR).Namespace(ns).Create(ctx, primaryUDNObject(ns, subnet.String()), metav1.CreateOptions{}); err != nil {
		remove()
		t.Fatal(err)
	}
	testenv.Eventually(t, 2*time.Minute, "primary UDN "+ns+"/net rendered", func() error {
		_, err := dyn.Resource(nadGVR).Namespace(ns).Get(ctx, "net", metav1.GetOptions{})
		return err
	})
	return remove
}
