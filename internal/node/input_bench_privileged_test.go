package node_test

import (
	"context"
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nadv1 "kvnet.io/kvnet/api/k8scni/v1"
	"kvnet.io/kvnet/internal/node"
	"kvnet.io/kvnet/internal/testenv"
	"kvnet.io/kvnet/internal/udn"
)

// BenchmarkCacheListNodesNADs: what listing the cluster's Nodes and NADs
// from kvnet-node's informer cache (its options: cacheOptions) costs a
// plan, with and without a copy of each object, at 1,000 Nodes (as a
// KWOK node: addresses, pod CIDR, conditions and images, which the cache
// trims) and 1,000 primary-network NADs. Agent.input lists every kind
// without a copy.
func BenchmarkCacheListNodesNADs(b *testing.B) {
	testenv.NeedsFixture(b, env != nil)
	const n = 1000
	ctx := context.Background()
	opts, err := node.CacheOptionsForTest(types.NamespacedName{Namespace: "kube-system", Name: "kube-dns"})
	if err != nil {
		b.Fatal(err)
	}
	cl, err := client.New(env.Config, client.Options{Scheme: opts.Scheme})
	if err != nil {
		b.Fatal(err)
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "bench-list"}}
	testenv.Create(b, cl, ns)
	for i := range n {
		nd := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("bench-list-%d", i),
			Labels:      map[string]string{"kubernetes.io/hostname": fmt.Sprintf("bench-list-%d", i), "type": "kwok"},
			Annotations: map[string]string{node.VTEPAnnotation: fmt.Sprintf("192.168.%d.%d", i/250, i%250+1)}},
			Spec: corev1.NodeSpec{PodCIDR: fmt.Sprintf("10.%d.%d.0/24", 100+i/256, i%256)}}
		testenv.Create(b, cl, nd)
		before := nd.DeepCopy()
		nd.Status = corev1.NodeStatus{
			Addresses:  []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: fmt.Sprintf("192.168.%d.%d", i/250, i%250+1)}},
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", Message: "kubelet is posting ready status"}},
			Images:     []corev1.ContainerImage{{Names: []string{"registry.example/kvnet/kvnet-node:dev"}, SizeBytes: 1 << 25}},
		}
		if err := cl.Status().Patch(ctx, nd, client.MergeFrom(before)); err != nil {
			b.Fatal(err)
		}
		nad := &nadv1.NetworkAttachmentDefinition{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: fmt.Sprintf("udn-%d", i),
			Annotations: map[string]string{udn.NetworkIDAnnotation: fmt.Sprint(i + 1)}}}
		nad.Spec.Config = fmt.Sprintf(`{"cniVersion":"1.1.0","type":"kvnet-cni","name":"t%d_udn","netAttachDefName":"%s/udn-%d","topology":"layer2","role":"primary","subnets":"10.1.1.0/24"}`, i, ns.Name, i)
		testenv.Create(b, cl, nad)
	}
	b.Cleanup(func() {
		_ = cl.DeleteAllOf(ctx, &corev1.Node{}, client.MatchingLabels{"type": "kwok"})
		_ = cl.Delete(ctx, ns)
	})
	c, err := cache.New(env.Config, opts)
	if err != nil {
		b.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { _ = c.Start(cctx) }()
	testenv.Eventually(b, waitTimeout, "the cache lists every Node and NAD", func() error {
		var nodes corev1.NodeList
		var nads nadv1.NetworkAttachmentDefinitionList
		if err := c.List(ctx, &nodes, client.MatchingLabels{"type": "kwok"}); err != nil {
			return err
		}
		if err := c.List(ctx, &nads, client.InNamespace(ns.Name)); err != nil {
			return err
		}
		if len(nodes.Items) != n || len(nads.Items) != n {
			return fmt.Errorf("%d Nodes and %d NADs cached, want %d each", len(nodes.Items), len(nads.Items), n)
		}
		return nil
	})
	for _, bc := range []struct {
		name string
		opts []client.ListOption
	}{{"copied", nil}, {"not-copied", []client.ListOption{client.UnsafeDisableDeepCopy}}} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				var nodes corev1.NodeList
				var nads nadv1.NetworkAttachmentDefinitionList
				if err := c.List(ctx, &nodes, bc.opts...); err != nil {
					b.Fatal(err)
				}
				if err := c.List(ctx, &nads, bc.opts...); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
