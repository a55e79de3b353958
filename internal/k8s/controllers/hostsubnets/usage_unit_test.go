package hostsubnets

import (
	"context"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	nadv1 "kvnet.io/kvnet/api/k8scni/v1"
	"kvnet.io/kvnet/internal/multus"
	"kvnet.io/kvnet/internal/udn"
)

func layer3NAD(ns, name, network, role string) *nadv1.NetworkAttachmentDefinition {
	return &nadv1.NetworkAttachmentDefinition{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: nadv1.NetworkAttachmentDefinitionSpec{Config: fmt.Sprintf(
			`{"cniVersion":"1.1.0","type":"kvnet-cni","name":%q,"netAttachDefName":"%s/%s","topology":"layer3","role":%q,"subnets":"10.128.0.0/16/24"}`,
			network, ns, name, role)},
	}
}

// The recount reads each namespace's primary network and each NAD once
// for all its pods, counts as useOf pod by pod does, and leaves the pods
// it is given as they were (it walks the cache's own objects).
func TestRecountMemoLeavesPodsUnchanged(t *testing.T) {
	ctx := context.Background()
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := nadv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	objs := []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "tenant", Labels: map[string]string{udn.PrimaryNamespaceLabel: ""}}},
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "plain"}},
		layer3NAD("tenant", "net", "tenant_net", "primary"),
		layer3NAD("plain", "sec", "plain_sec", "secondary"),
	}
	var pods []corev1.Pod
	for i, p := range []struct{ ns, node, networks string }{
		{"tenant", "node-a", ""}, {"tenant", "node-a", ""}, {"tenant", "node-b", ""},
		{"plain", "node-b", "sec"}, {"plain", "node-b", "sec"}, {"plain", "node-a", ""},
	} {
		pod := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: p.ns, Name: fmt.Sprintf("p%d", i)}, Spec: corev1.PodSpec{NodeName: p.node}}
		if p.networks != "" {
			pod.Annotations = map[string]string{multus.NetworksAnnotation: p.networks}
		}
		pods = append(pods, pod)
		objs = append(objs, &pod)
	}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).Build()

	// pristine to compare with; other for the reads without the memo.
	pristine, other := make([]corev1.Pod, len(pods)), make([]corev1.Pod, len(pods))
	for i := range pods {
		pods[i].DeepCopyInto(&pristine[i])
		pods[i].DeepCopyInto(&other[i])
	}
	memo := &resolver{c: c, primary: map[string]primaryOf{}, served: map[string]servedOf{}}
	for i := range pods {
		got, err := useOf(ctx, memo, &pods[i])
		if err != nil {
			t.Fatal(err)
		}
		want, err := useOf(ctx, &resolver{c: c}, &other[i])
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("pod %s: use %+v with the memo, %+v without", pods[i].Name, got, want)
		}
	}
	if !reflect.DeepEqual(pods, pristine) {
		t.Errorf("useOf changed the pods it read:\n%+v\nwant\n%+v", pods, pristine)
	}
	if len(memo.primary) != 2 || len(memo.served) != 2 {
		t.Errorf("memo read %d namespaces and %d NADs (%v, %v), want 2 and 2",
			len(memo.primary), len(memo.served), slices.Sorted(maps.Keys(memo.primary)), slices.Sorted(maps.Keys(memo.served)))
	}

	u := newUsage()
	if err := u.recount(ctx, c); err != nil {
		t.Fatal(err)
	}
	want := map[string]map[string]int{"tenant_net": {"node-a": 2, "node-b": 1}, "plain_sec": {"node-b": 2}}
	if !reflect.DeepEqual(u.nodes, want) {
		t.Errorf("recount: %v, want %v", u.nodes, want)
	}
}
