package install_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	udnv1 "kvnet.io/kvnet/api/udn/v1"
	"kvnet.io/kvnet/internal/install"
	"kvnet.io/kvnet/internal/k8s/certs"
	"kvnet.io/kvnet/internal/testenv"
)

var (
	c   client.Client
	w   client.WithWatch // for the certificate manager
	cfg *rest.Config
)

func TestMain(m *testing.M) {
	os.Exit(testenv.MainAPI(m, testenv.Options{NoControllerManager: true}, func(e *testenv.Env) error {
		c, cfg = e.Client, e.Config
		var err error
		w, err = client.NewWithWatch(e.Config, client.Options{Scheme: e.Client.Scheme()})
		return err
	}))
}

// TestRenderImages: config/default renders with every image resolved to
// a registry and tag, the default ones and the ones asked for.
func TestRenderImages(t *testing.T) {
	for _, tc := range []struct {
		opts install.Options
		want []string
	}{
		{install.Options{}, []string{"ghcr.io/kvnet/kvnet-controller:dev", "ghcr.io/kvnet/kvnet-node:dev"}},
		{install.Options{Registry: "localhost:5000/lab/", Tag: "v1.2.3"}, []string{"localhost:5000/lab/kvnet-controller:v1.2.3", "localhost:5000/lab/kvnet-node:v1.2.3"}},
	} {
		rendered, err := install.Render(tc.opts)
		if err != nil {
			t.Fatal(err)
		}
		objs, err := install.Objects(rendered)
		if err != nil {
			t.Fatal(err)
		}
		got := install.ContainerImages(objs)
		if strings.Join(got, " ") != strings.Join(tc.want, " ") {
			t.Errorf("Render(%+v) images %v, want %v", tc.opts, got, tc.want)
		}
		kinds := map[string]int{}
		for _, o := range objs {
			kinds[o.GetKind()]++
		}
		for _, k := range []string{"CustomResourceDefinition", "Namespace", "Deployment", "DaemonSet", "MutatingWebhookConfiguration", "ValidatingAdmissionPolicy"} {
			if kinds[k] == 0 {
				t.Errorf("rendered config/default has no %s (kinds %v)", k, kinds)
			}
		}
	}
}

func TestRenderBadInput(t *testing.T) {
	for _, tc := range []struct {
		opts  install.Options
		field string
	}{
		{install.Options{Registry: "Ghcr.io/KVNET"}, `registry "Ghcr.io/KVNET"`},
		{install.Options{Registry: "host:port/x"}, `registry "host:port/x"`},
		{install.Options{Tag: "-rc1"}, `tag "-rc1"`},
		{install.Options{Tag: "v1:2"}, `tag "v1:2"`},
	} {
		_, err := install.Render(tc.opts)
		if err == nil || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("Render(%+v) error %v, want one naming %s", tc.opts, err, tc.field)
		}
	}
}

func get(t *testing.T, apiVersion, kind, ns, name string) error {
	t.Helper()
	u := &unstructured.Unstructured{}
	u.SetAPIVersion(apiVersion)
	u.SetKind(kind)
	return c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, u)
}

func findings(t *testing.T, o install.CheckOptions) map[string]install.Finding {
	t.Helper()
	fs, err := install.Check(context.Background(), c, o)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]install.Finding{}
	for _, f := range fs {
		if prev, ok := out[f.What]; ok && prev.Status != install.OK {
			continue // keep the first problem of a kind
		}
		out[f.What] = f
	}
	return out
}

// TestApplyCheckDelete installs config/default into a real API server,
// checks it, registers the binding plugin, and uninstalls.
func TestApplyCheckDelete(t *testing.T) {
	ctx := context.Background()
	before := findings(t, install.CheckOptions{})
	if f := before["kvnet-controller"]; f.Status != install.Missing {
		t.Errorf("before install: kvnet-controller %v, want missing", f)
	}
	if f := before["Multus"]; f.Status != install.OK {
		t.Errorf("Multus CRD finding %v, want ok (the control plane has the NAD CRD)", f)
	}

	objs, err := install.RenderObjects(install.Options{Registry: "registry.test/kvnet", Tag: "t1"})
	if err != nil {
		t.Fatal(err)
	}
	var log bytes.Buffer
	// No kvnet-controller serves the webhooks yet: everything but their
	// configuration is applied, and install says why.
	short := install.ApplyOptions{WebhookTimeout: 2 * time.Second, Poll: 100 * time.Millisecond}
	err = install.Apply(ctx, c, objs, &log, short)
	if !errors.Is(err, install.ErrWebhookNotServed) || !strings.Contains(err.Error(), "Service kvnet-system/kvnet-webhook has no ready endpoint") {
		t.Fatalf("apply without a webhook server: %v, want ErrWebhookNotServed naming the Service\n%s", err, log.String())
	}
	if err := get(t, "apps/v1", "DaemonSet", "kvnet-system", "kvnet-node"); err != nil {
		t.Fatalf("kvnet-node DaemonSet after install: %v", err)
	}
	if err := get(t, "admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration", "", "kvnet-mutator"); !apierrors.IsNotFound(err) {
		t.Fatalf("webhook configuration applied before kvnet-controller serves it: %v", err)
	}
	var ns corev1.Namespace
	if err := c.Get(ctx, client.ObjectKey{Name: "kvnet-system"}, &ns); err != nil || ns.Labels["pod-security.kubernetes.io/enforce"] != "privileged" {
		t.Errorf("kvnet-system namespace labels %v (%v), want Pod Security enforce=privileged for kvnet-node", ns.Labels, err)
	}

	// kvnet-controller comes up: its certificate manager writes the CA
	// (the real one, as kvnet-controller runs it) and, once it is Ready,
	// the EndpointSlice controller lists it behind the Service (no
	// kubelet here: the test writes that slice).
	cm := certs.New(w, certs.Options{Namespace: "kvnet-system", SecretName: certs.SecretName, DNSNames: []string{"kvnet-webhook.kvnet-system.svc"}})
	if err := cm.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	ready := true
	testenv.Create(t, c, &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "kvnet-system", Name: "kvnet-webhook-test", Labels: map[string]string{discoveryv1.LabelServiceName: "kvnet-webhook"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"10.0.0.9"}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}}},
	})
	log.Reset()
	if err := install.Apply(ctx, c, objs, &log, short); err != nil {
		t.Fatalf("apply with kvnet-controller serving: %v\n%s", err, log.String())
	}
	ca, err := cm.CABundle(ctx)
	if err != nil {
		t.Fatal(err)
	}
	caBundles := func() []string {
		var wc admissionregistrationv1.MutatingWebhookConfiguration
		if err := c.Get(ctx, client.ObjectKey{Name: "kvnet-mutator"}, &wc); err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, w := range wc.Webhooks {
			out = append(out, string(w.ClientConfig.CABundle))
		}
		return out
	}
	for i, b := range caBundles() {
		if b != string(ca) {
			t.Errorf("webhook %d's caBundle is not kvnet-controller's CA: %q", i, b)
		}
	}
	// The cluster's settings are the admin's once created: edited (as
	// kubectl edit does), an upgrade keeps them.
	edits := map[string]map[string]string{
		"kvnet-reserved-subnets": {"join-subnets": "100.66.0.0/16,fd98::/64"},
		"kvnet-node-config":      {"default-network-cidrs": "192.168.0.0/16", "cluster-dns-service": "openshift-dns/dns-default"},
	}
	for name, data := range edits {
		var cm corev1.ConfigMap
		if err := c.Get(ctx, client.ObjectKey{Namespace: "kvnet-system", Name: name}, &cm); err != nil {
			t.Fatalf("ConfigMap %s after install: %v", name, err)
		}
		if cm.Data == nil {
			cm.Data = map[string]string{}
		}
		for k, v := range data {
			cm.Data[k] = v
		}
		if err := c.Update(ctx, &cm, client.FieldOwner("kubectl-edit")); err != nil {
			t.Fatal(err)
		}
	}
	// Applying again (an upgrade) changes nothing, fails nothing and keeps
	// the caBundle.
	if err := install.Apply(ctx, c, objs, &log, install.ApplyOptions{}); err != nil {
		t.Fatalf("second apply: %v", err)
	}
	for name, data := range edits {
		var cm corev1.ConfigMap
		if err := c.Get(ctx, client.ObjectKey{Namespace: "kvnet-system", Name: name}, &cm); err != nil {
			t.Fatal(err)
		}
		for k, v := range data {
			if cm.Data[k] != v {
				t.Errorf("ConfigMap %s after an upgrade: %s = %q, want the admin's %q", name, k, cm.Data[k], v)
			}
		}
	}
	for i, b := range caBundles() {
		if b != string(ca) {
			t.Errorf("after an upgrade, webhook %d's caBundle is %q", i, b)
		}
	}

	// No kubelet runs here: the Deployment exists but is not ready, and
	// check says so; nothing else kvnet installs is missing.
	after := findings(t, install.CheckOptions{})
	if f := after["kvnet-controller"]; f.Status != install.Missing || !strings.Contains(f.Detail, "0 of 2 replicas ready") {
		t.Errorf("kvnet-controller finding %v, want missing with 0 of 2 ready", f)
	}
	if f := after["kvnet webhooks"]; f.Status != install.OK {
		t.Errorf("webhooks finding %v, want ok", f)
	}
	if f := after["kvnet CRDs"]; f.Status != install.OK {
		t.Errorf("CRDs finding %v, want ok", f)
	}
	if f := after["Multus DaemonSet"]; f.Status != install.Warning || !strings.Contains(f.Detail, "no DaemonSet named *multus*") {
		t.Errorf("Multus DaemonSet finding %v, want a warning", f)
	}

	// The binding plugin: none registered, then registered.
	kv := &unstructured.Unstructured{}
	kv.SetAPIVersion("kubevirt.io/v1")
	kv.SetKind("KubeVirt")
	kv.SetNamespace("default")
	kv.SetName("kubevirt")
	kv.Object["spec"] = map[string]any{"configuration": map[string]any{}}
	testenv.Create(t, c, kv)
	if f := findings(t, install.CheckOptions{Prerequisites: true})["KubeVirt l2bridge binding"]; f.Status != install.Warning || !strings.Contains(f.Fix, "managedTap") {
		t.Errorf("binding finding without l2bridge: %v", f)
	}
	if err := unstructured.SetNestedMap(kv.Object, map[string]any{"domainAttachmentType": "managedTap", "migration": map[string]any{}},
		"spec", "configuration", "network", "binding", "l2bridge"); err != nil {
		t.Fatal(err)
	}
	if err := c.Update(ctx, kv); err != nil {
		t.Fatal(err)
	}
	if f := findings(t, install.CheckOptions{Prerequisites: true})["KubeVirt l2bridge binding"]; f.Status != install.OK {
		t.Errorf("binding finding with l2bridge: %v", f)
	}

	// The versions: KubeVirt v1.7.0 on this API server (Kubernetes 1.36,
	// whose strict CRD formats it breaks) is flagged with the fix; v1.8.4
	// is not; without the server's version there is no finding.
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	info, err := dc.ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	kubevirtVersion := func(v string) install.Finding {
		t.Helper()
		if err := c.Get(ctx, client.ObjectKeyFromObject(kv), kv); err != nil {
			t.Fatal(err)
		}
		if err := unstructured.SetNestedField(kv.Object, v, "status", "observedKubeVirtVersion"); err != nil {
			t.Fatal(err)
		}
		if err := c.Status().Update(ctx, kv); err != nil {
			t.Fatal(err)
		}
		return findings(t, install.CheckOptions{Prerequisites: true, KubernetesVersion: info.GitVersion})[install.KubeVirtVersionCheck]
	}
	if f := kubevirtVersion("v1.7.0"); f.Status != install.Warning || !strings.Contains(f.Detail, "v1.7.0 on Kubernetes "+info.GitVersion) ||
		!strings.Contains(f.Detail, "kubevirt/kubevirt#17858") || !strings.Contains(f.Fix, "v1.8.4") {
		t.Errorf("KubeVirt v1.7.0 on Kubernetes %s: %v, want a warning naming the issue and the fix", info.GitVersion, f)
	}
	if f := kubevirtVersion("v1.8.4"); f.Status != install.OK || !strings.Contains(f.Detail, "v1.8.4 on Kubernetes "+info.GitVersion) {
		t.Errorf("KubeVirt v1.8.4 on Kubernetes %s: %v, want ok", info.GitVersion, f)
	}
	if f := kubevirtVersion("devel-7c15b01"); f.Status != install.Warning || !strings.Contains(f.Detail, `version "devel-7c15b01" not understood`) {
		t.Errorf("KubeVirt devel-7c15b01: %v, want a warning that the version is not understood", f)
	}
	if f, ok := findings(t, install.CheckOptions{Prerequisites: true})[install.KubeVirtVersionCheck]; ok {
		t.Errorf("version finding without the server's version: %v", f)
	}

	// A network left: uninstall refuses, names it and deletes nothing
	// (without kvnet-controller its finalizer would never go).
	udn := &udnv1.UserDefinedNetwork{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "left-behind"},
		Spec: udnv1.UserDefinedNetworkSpec{Topology: udnv1.NetworkTopologyLayer2, Layer2: &udnv1.Layer2Config{
			Role: udnv1.NetworkRoleSecondary, Subnets: udnv1.DualStackCIDRs{"10.9.0.0/24"}}}}
	testenv.Create(t, c, udn)
	err = install.Delete(ctx, c, objs, false, &log)
	if !errors.Is(err, install.ErrNetworksExist) || !strings.Contains(err.Error(), "UserDefinedNetwork default/left-behind") {
		t.Fatalf("uninstall with a UDN left: %v, want ErrNetworksExist naming it", err)
	}
	if err := get(t, "admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration", "", "kvnet-mutator"); err != nil {
		t.Fatalf("webhook configuration after a refused uninstall: %v, want kept", err)
	}
	if err := c.Delete(ctx, udn); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "UDN deleted", func() error {
		if err := c.Get(ctx, client.ObjectKeyFromObject(udn), udn); !apierrors.IsNotFound(err) {
			return fmt.Errorf("still there (%v)", err)
		}
		return nil
	})

	if err := install.Delete(ctx, c, objs, false, &log); err != nil {
		t.Fatal(err)
	}
	if err := get(t, "admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration", "", "kvnet-mutator"); !apierrors.IsNotFound(err) {
		t.Errorf("webhook configuration after uninstall: %v, want not found", err)
	}
	if err := get(t, "apiextensions.k8s.io/v1", "CustomResourceDefinition", "", "ipamclaims.k8s.cni.cncf.io"); err != nil {
		t.Errorf("IPAMClaim CRD after uninstall without --crds: %v, want kept", err)
	}
	// Uninstalling twice is fine.
	if err := install.Delete(ctx, c, objs, false, &log); err != nil {
		t.Errorf("second uninstall: %v", err)
	}
}

// TestApplyCRDIfAbsent: the MultiNetworkPolicy CRD, which the
// multi-networkpolicy project installs too, and the
// NetworkAttachmentDefinition CRD, which Multus installs, are applied only
// where they are absent and deleted only where kvnet install applied them.
func TestApplyCRDIfAbsent(t *testing.T) {
	for _, name := range []string{"multi-networkpolicies.k8s.cni.cncf.io", "network-attachment-definitions.k8s.cni.cncf.io"} {
		t.Run(name, func(t *testing.T) { testApplyCRDIfAbsent(t, name) })
	}
}

func testApplyCRDIfAbsent(t *testing.T, name string) {
	ctx := context.Background()
	objs, err := install.RenderObjects(install.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var crd []*unstructured.Unstructured
	for _, u := range objs {
		if u.GetKind() == "CustomResourceDefinition" && u.GetName() == name {
			crd = append(crd, u)
		}
	}
	if len(crd) != 1 || crd[0].GetAnnotations()[install.InstallAnnotation] != install.IfAbsent {
		t.Fatalf("rendered %d %s CRDs (%v), want one marked %s", len(crd), name, crd, install.IfAbsent)
	}
	managers := func() []string {
		t.Helper()
		u := &unstructured.Unstructured{}
		u.SetAPIVersion("apiextensions.k8s.io/v1")
		u.SetKind("CustomResourceDefinition")
		if err := c.Get(ctx, client.ObjectKey{Name: name}, u); err != nil {
			if apierrors.IsNotFound(err) {
				return nil
			}
			t.Fatal(err)
		}
		out := []string{}
		for _, m := range u.GetManagedFields() {
			out = append(out, m.Manager)
		}
		return out
	}

	// The control plane's own copy (someone else's): kept, untouched.
	var log bytes.Buffer
	if err := install.Apply(ctx, c, crd, &log, install.ApplyOptions{}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(log.String(), "kept CustomResourceDefinition "+name) || slices.Contains(managers(), install.FieldOwner) {
		t.Fatalf("apply over a foreign CRD: log %q, managers %v; want it kept, not managed by %s", log.String(), managers(), install.FieldOwner)
	}
	if err := install.Delete(ctx, c, crd, true, &log); err != nil {
		t.Fatal(err)
	}
	if managers() == nil {
		t.Fatal("uninstall --crds deleted a CRD kvnet did not install")
	}

	// Absent: kvnet installs it, and uninstall --crds removes it.
	if err := c.Delete(ctx, crd[0].DeepCopy()); err != nil {
		t.Fatal(err)
	}
	waitCRDGone(ctx, t, name, "CRD deleted")
	// Whatever happens, leave the CRD for the other tests.
	t.Cleanup(func() { _ = install.Apply(ctx, c, crd, io.Discard, install.ApplyOptions{}) })
	log.Reset()
	if err := install.Apply(ctx, c, crd, &log, install.ApplyOptions{}); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(managers(), install.FieldOwner) {
		t.Fatalf("apply where the CRD is absent: log %q, managers %v; want it applied by %s", log.String(), managers(), install.FieldOwner)
	}
	if err := install.Delete(ctx, c, crd, true, &log); err != nil {
		t.Fatal(err)
	}
	waitCRDGone(ctx, t, name, "CRD kvnet installed deleted by uninstall --crds")
}

// waitCRDGone waits until the CRD name is gone. The API server's CRD
// finalizer (which empties a CRD of its objects before it goes) retries
// a failed pass with an exponential back-off that, on a loaded machine,
// outgrows any wait; an update of the CRD queues it at once. So a CRD
// still there 20 s after its deletion is touched (an annotation), every
// 10 s at most (the wait polls every 50 ms), and what keeps it
// (finalizers, conditions) is in the error.
func waitCRDGone(ctx context.Context, t *testing.T, name, what string) {
	t.Helper()
	var touched time.Time
	testenv.Eventually(t, 3*time.Minute, what, func() error {
		crd := &unstructured.Unstructured{}
		crd.SetAPIVersion("apiextensions.k8s.io/v1")
		crd.SetKind("CustomResourceDefinition")
		if err := c.Get(ctx, client.ObjectKey{Name: name}, crd); err != nil {
			if apierrors.IsNotFound(err) {
				return nil
			}
			return err
		}
		var managers []string
		for _, m := range crd.GetManagedFields() {
			managers = append(managers, m.Manager)
		}
		conds, _, _ := unstructured.NestedSlice(crd.Object, "status", "conditions")
		deleted := crd.GetDeletionTimestamp()
		state := fmt.Sprintf("still there, managed by %v, deleted at %v, finalizers %v, conditions %v",
			managers, deleted, crd.GetFinalizers(), conds)
		if deleted != nil && time.Since(deleted.Time) > 20*time.Second && time.Since(touched) > 10*time.Second {
			touched = time.Now()
			patch := fmt.Appendf(nil, `{"metadata":{"annotations":{"test.kvnet.io/requeue":%q}}}`, time.Now().Format(time.RFC3339Nano))
			if err := c.Patch(ctx, crd, client.RawPatch(types.MergePatchType, patch)); err != nil && !apierrors.IsNotFound(err) {
				return fmt.Errorf("%s; touch: %w", state, err)
			}
			t.Logf("CRD %s: %s; touched it to requeue the API server's finalizer", name, state)
		}
		return errors.New(state)
	})
}

// monitoringCRD is a minimal CRD of the Prometheus Operator's kind (its
// schema left open): enough for the API server to store what --monitoring
// applies.
func monitoringCRD(kind, plural string) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
		"metadata": map[string]any{"name": plural + ".monitoring.coreos.com"},
		"spec": map[string]any{
			"group": "monitoring.coreos.com", "scope": "Namespaced",
			"names": map[string]any{"kind": kind, "plural": plural, "singular": strings.ToLower(kind), "listKind": kind + "List"},
			"versions": []any{map[string]any{"name": "v1", "served": true, "storage": true,
				"schema": map[string]any{"openAPIV3Schema": map[string]any{"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}},
		},
	}}
}

// TestMonitoring: config/monitoring renders the metrics Service, the
// ServiceMonitor, the PodMonitor and the PrometheusRule; without the
// Prometheus Operator's CRDs the check names the missing kind; with them
// the objects apply and delete.
func TestMonitoring(t *testing.T) {
	ctx := context.Background()
	objs, err := install.MonitoringObjects()
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for _, u := range objs {
		kinds = append(kinds, u.GetKind()+" "+u.GetNamespace()+"/"+u.GetName())
	}
	slices.Sort(kinds)
	want := []string{"PodMonitor kvnet-system/kvnet-node", "PrometheusRule kvnet-system/kvnet", "Service kvnet-system/kvnet-controller-metrics", "ServiceMonitor kvnet-system/kvnet-controller"}
	if !slices.Equal(kinds, want) {
		t.Fatalf("config/monitoring renders %q, want %q", kinds, want)
	}
	err = install.CheckMonitoringCRDs(c)
	if !errors.Is(err, install.ErrNoMonitoringCRDs) || !strings.Contains(err.Error(), "ServiceMonitor (monitoring.coreos.com/v1)") {
		t.Fatalf("CheckMonitoringCRDs without the CRDs: %v, want ErrNoMonitoringCRDs naming ServiceMonitor", err)
	}
	var crds []*unstructured.Unstructured
	for _, k := range [][2]string{{"ServiceMonitor", "servicemonitors"}, {"PodMonitor", "podmonitors"}, {"PrometheusRule", "prometheusrules"}} {
		crds = append(crds, monitoringCRD(k[0], k[1]))
	}
	var log bytes.Buffer
	if err := install.Apply(ctx, c, crds, &log, install.ApplyOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = install.Delete(ctx, c, crds, true, io.Discard) })
	testenv.Eventually(t, time.Minute, "the CRDs served", func() error { return install.CheckMonitoringCRDs(c) })
	// A namespace of its own: other tests delete kvnet-system, and this
	// API server has no namespace controller to finish that.
	const ns = "kvnet-monitoring-test"
	testenv.Create(t, c, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	for _, u := range objs {
		u.SetNamespace(ns)
	}
	if err := install.Apply(ctx, c, objs, &log, install.ApplyOptions{}); err != nil {
		t.Fatal(err)
	}
	rule := &unstructured.Unstructured{}
	rule.SetAPIVersion("monitoring.coreos.com/v1")
	rule.SetKind("PrometheusRule")
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "kvnet"}, rule); err != nil {
		t.Fatal(err)
	}
	groups, _, _ := unstructured.NestedSlice(rule.Object, "spec", "groups")
	if len(groups) == 0 {
		t.Fatalf("PrometheusRule %s/kvnet stored without groups: %v", ns, rule.Object)
	}
	if err := install.Delete(ctx, c, objs, false, &log); err != nil {
		t.Fatal(err)
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(rule), rule); !apierrors.IsNotFound(err) {
		t.Fatalf("PrometheusRule after delete: %v", err)
	}
}
