package cluster

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"

	"kvnet.io/kvnet/internal/install"
)

// TestPrometheusConfig: config/monitoring makes one job per monitor
// endpoint (in kustomize's order of the objects), each with its selector and port, and a rule file without
// for:; promtool accepts both.
func TestPrometheusConfig(t *testing.T) {
	objs, err := install.MonitoringObjects()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	rules, err := PrometheusRules(objs, true)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(rules), "for:") || !strings.Contains(string(rules), "alert: KvnetIPPoolExhausted") {
		t.Fatalf("rule file keeps a for: or lacks the pool alert:\n%s", rules)
	}
	rulesFile := filepath.Join(dir, "kvnet.rules.yaml")
	if err := os.WriteFile(rulesFile, rules, 0o644); err != nil {
		t.Fatal(err)
	}
	conf, jobs, err := PrometheusConfig(objs, dir, 2*time.Second, []string{rulesFile})
	if err != nil {
		t.Fatal(err)
	}
	want := []PromJob{
		{Name: "podMonitor/kvnet-system/kvnet-node/0", File: filepath.Join(dir, "podMonitor-kvnet-system-kvnet-node-0.json"),
			Kind: "PodMonitor", Namespace: "kvnet-system", Monitor: "kvnet-node", Match: map[string]string{"app.kubernetes.io/name": "kvnet-node"}, Port: "metrics"},
		{Name: "serviceMonitor/kvnet-system/kvnet-controller/0", File: filepath.Join(dir, "serviceMonitor-kvnet-system-kvnet-controller-0.json"),
			Kind: "ServiceMonitor", Namespace: "kvnet-system", Monitor: "kvnet-controller", Match: map[string]string{"app.kubernetes.io/name": "kvnet-controller"}, Port: "metrics"},
	}
	if !reflect.DeepEqual(jobs, want) {
		t.Fatalf("jobs\n%+v\nwant\n%+v", jobs, want)
	}
	confFile := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(confFile, conf, 0o644); err != nil {
		t.Fatal(err)
	}
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		msg := "promtool not installed (Debian's prometheus package; hack/install-deps.sh installs it)"
		if os.Getenv("KVNET_REQUIRE_PRIVILEGED") == "1" {
			t.Fatal(msg + "; CI must run it")
		}
		t.Skip(msg)
	}
	for _, j := range jobs {
		if err := os.WriteFile(j.File, []byte("[]"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if out, err := exec.Command(promtool, "check", "config", confFile).CombinedOutput(); err != nil {
		t.Fatalf("promtool check config: %v\n%s\n%s", err, out, conf)
	}
}

// TestDiscoverTargets: a ServiceMonitor's targets are the ready
// endpoints of its Services on the named port; a PodMonitor's the
// running pods with its labels, at the named container port.
func TestDiscoverTargets(t *testing.T) {
	ns := "kvnet-system"
	sel := map[string]string{"app.kubernetes.io/name": "kvnet-controller"}
	pod := func(name, app, ip string, phase corev1.PodPhase) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{"app.kubernetes.io/name": app}},
			Spec:   corev1.PodSpec{Containers: []corev1.Container{{Name: "node", Ports: []corev1.ContainerPort{{Name: "metrics", ContainerPort: 9464}, {Name: "probes", ContainerPort: 9465}}}}},
			Status: corev1.PodStatus{Phase: phase, PodIP: ip}}
	}
	ep := func(ip, pod string, ready bool) discoveryv1.Endpoint {
		return discoveryv1.Endpoint{Addresses: []string{ip}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(ready)},
			TargetRef: &corev1.ObjectReference{Kind: "Pod", Name: pod}}
	}
	cs := fake.NewClientset(
		&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "kvnet-controller-metrics", Labels: sel}},
		&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "other", Labels: map[string]string{"app.kubernetes.io/name": "other"}}},
		&discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "m-1", Labels: map[string]string{discoveryv1.LabelServiceName: "kvnet-controller-metrics"}},
			Ports:     []discoveryv1.EndpointPort{{Name: ptr.To("metrics"), Port: ptr.To[int32](8080)}},
			Endpoints: []discoveryv1.Endpoint{ep("10.244.1.5", "kvnet-controller-a", true), ep("10.244.2.6", "kvnet-controller-b", false)}},
		&discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "o-1", Labels: map[string]string{discoveryv1.LabelServiceName: "other"}},
			Ports:     []discoveryv1.EndpointPort{{Name: ptr.To("metrics"), Port: ptr.To[int32](8080)}},
			Endpoints: []discoveryv1.Endpoint{ep("10.244.1.9", "other-a", true)}},
		pod("kvnet-node-a", "kvnet-node", "10.89.0.2", corev1.PodRunning),
		pod("kvnet-node-b", "kvnet-node", "", corev1.PodPending),
		pod("other-a", "other", "10.244.1.9", corev1.PodRunning),
	)
	ctx := context.Background()
	got, err := DiscoverTargets(ctx, cs, PromJob{Name: "s", Kind: "ServiceMonitor", Namespace: ns, Monitor: "kvnet-controller", Match: sel, Port: "metrics"})
	if err != nil {
		t.Fatal(err)
	}
	want := []TargetGroup{{Targets: []string{"10.244.1.5:8080"},
		Labels: map[string]string{"namespace": ns, "service": "kvnet-controller-metrics", "pod": "kvnet-controller-a", "__tmp_job": "kvnet-controller-metrics"}}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("ServiceMonitor targets %+v, want %+v", got, want)
	}
	got, err = DiscoverTargets(ctx, cs, PromJob{Name: "p", Kind: "PodMonitor", Namespace: ns, Monitor: "kvnet-node", Match: map[string]string{"app.kubernetes.io/name": "kvnet-node"}, Port: "metrics"})
	if err != nil {
		t.Fatal(err)
	}
	want = []TargetGroup{{Targets: []string{"10.89.0.2:9464"},
		Labels: map[string]string{"namespace": ns, "pod": "kvnet-node-a", "container": "node", "__tmp_job": "kvnet-system/kvnet-node"}}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("PodMonitor targets %+v, want %+v", got, want)
	}
}
