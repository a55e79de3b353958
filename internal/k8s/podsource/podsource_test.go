package podsource_test

import (
	"context"
	"os"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kvnet.io/kvnet/internal/k8s/podsource"
	"kvnet.io/kvnet/internal/podnetworks"
	"kvnet.io/kvnet/internal/testenv"
)

var fx *testenv.Fixture

func TestMain(m *testing.M) {
	os.Exit(testenv.WithFixture(testenv.FixtureOptions{}, func(f *testenv.Fixture) int {
		fx = f
		return m.Run()
	}))
}

// TestPodNetworks: against the real API server, with a kubeconfig file
// as kvnet-cni has: a pod's annotation parsed, a pod without one nil,
// a missing pod and a bad annotation errors naming them.
func TestPodNetworks(t *testing.T) {
	ctx := context.Background()
	const ns = "podsource-test"
	testenv.Create(t, fx.Env.Client, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	pod := func(name string, annotations map[string]string) {
		testenv.Create(t, fx.Env.Client, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: annotations},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}},
		})
	}
	pod("with", map[string]string{podnetworks.Annotation: `{"podsource-test/udn":{"ip_addresses":["10.1.1.2/24"],"mac_address":"0a:58:0a:01:01:02","role":"primary","network":"podsource-test_udn"}}`})
	pod("without", nil)
	pod("bad", map[string]string{podnetworks.Annotation: `{"x":`})

	src, err := podsource.New(fx.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	nets, err := src.PodNetworks(ctx, ns, "with")
	if err != nil {
		t.Fatal(err)
	}
	if a, ok := nets["podsource-test/udn"]; !ok || len(a.IPAddresses) != 1 || a.IPAddresses[0] != "10.1.1.2/24" || a.MAC().String() != "0a:58:0a:01:01:02" {
		t.Errorf("networks %+v", nets)
	}
	if nets, err := src.PodNetworks(ctx, ns, "without"); err != nil || nets != nil {
		t.Errorf("a pod without the annotation: %v, %v; want nil, nil", nets, err)
	}
	if _, err := src.PodNetworks(ctx, ns, "missing"); err == nil || !strings.Contains(err.Error(), "pod podsource-test/missing not found") {
		t.Errorf("a missing pod: %v", err)
	}
	if _, err := src.PodNetworks(ctx, ns, "bad"); err == nil {
		t.Error("a bad annotation: no error")
	}
	if _, err := podsource.New("/nonexistent/kubeconfig"); err == nil || !strings.Contains(err.Error(), "/nonexistent/kubeconfig") {
		t.Errorf("a missing kubeconfig: %v", err)
	}
}
