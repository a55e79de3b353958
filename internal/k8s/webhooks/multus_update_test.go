package webhooks_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	nadv1 "kvnet.io/kvnet/api/k8scni/v1"
	kubevirtv1 "kvnet.io/kvnet/api/kubevirt/v1"
	udnv1 "kvnet.io/kvnet/api/udn/v1"
	"kvnet.io/kvnet/internal/k8s/certs"
	"kvnet.io/kvnet/internal/k8s/webhooks"
	"kvnet.io/kvnet/internal/kubevirt/launcher"
	"kvnet.io/kvnet/internal/multus"
	"kvnet.io/kvnet/internal/testenv"
)

// multusTestLabel selects the namespaces whose pods also go through the
// Multus-mode webhooks serveMultusWebhooks installs.
const multusTestLabel = "kvnet-test/multus-webhooks"

// serveMultusWebhooks serves the launcher-pod and primary-network
// mutators in Multus mode (kvnet-controller --primary-network-attachment=
// multus) from this process, with the controller's serving certificate,
// and registers them with the API server for pods in namespaces labelled
// multusTestLabel, so that a test drives them through the API server as
// a Multus cluster does. The controller's own (default-network mode)
// webhooks still run first; for a primary network without persistent
// IPs they change nothing.
func serveMultusWebhooks(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	var secret corev1.Secret
	if err := c.Get(ctx, client.ObjectKey{Namespace: "kvnet-system", Name: certs.SecretName}, &secret); err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(secret.Data["tls.crt"], secret.Data["tls.key"])
	if err != nil {
		t.Fatal(err)
	}
	dec := admission.NewDecoder(env.Client.Scheme())
	mux := http.NewServeMux()
	mux.Handle("/launcher", &admission.Webhook{Handler: &webhooks.LauncherPodMutator{Reader: c, Decoder: dec, PrimaryInNetworks: true, DefaultNetworkNAD: "unused/unused"}})
	mux.Handle("/primary", &admission.Webhook{Handler: &webhooks.PrimaryPodMutator{Reader: c, Decoder: dec, Multus: true}})
	srv := httptest.NewUnstartedServer(mux)
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	srv.StartTLS()
	t.Cleanup(srv.Close)

	fail, none, ifNeeded := admissionregistrationv1.Fail, admissionregistrationv1.SideEffectClassNone, admissionregistrationv1.IfNeededReinvocationPolicy
	hook := func(name, path string, ops ...admissionregistrationv1.OperationType) admissionregistrationv1.MutatingWebhook {
		url := srv.URL + path
		return admissionregistrationv1.MutatingWebhook{
			Name: name, AdmissionReviewVersions: []string{"v1"}, ClientConfig: admissionregistrationv1.WebhookClientConfig{URL: &url},
			Rules: []admissionregistrationv1.RuleWithOperations{{Operations: ops,
				Rule: admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}}}},
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{multusTestLabel: "true"}},
			ObjectSelector:    &metav1.LabelSelector{MatchLabels: map[string]string{kubevirtv1.AppLabel: kubevirtv1.VirtLauncherValue}},
			FailurePolicy:     &fail, SideEffects: &none, ReinvocationPolicy: &ifNeeded,
		}
	}
	// The controller puts its CA in every configuration labelled for it.
	wc := &admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "kvnet-test-multus", Labels: map[string]string{certs.InjectLabel: "true"}},
		Webhooks: []admissionregistrationv1.MutatingWebhook{
			hook("launcher-multus.kvnet-test.io", "/launcher", admissionregistrationv1.Create, admissionregistrationv1.Update),
			hook("primary-multus.kvnet-test.io", "/primary", admissionregistrationv1.Create),
		},
	}
	create(t, wc)
	t.Cleanup(func() { _ = c.Delete(context.Background(), wc) })
	testenv.Eventually(t, timeout, "CA bundle in "+wc.Name, func() error {
		if err := c.Get(ctx, client.ObjectKeyFromObject(wc), wc); err != nil {
			return err
		}
		for _, w := range wc.Webhooks {
			if len(w.ClientConfig.CABundle) == 0 {
				return fmt.Errorf("webhook %s has no CA bundle yet", w.Name)
			}
		}
		return nil
	})
}

// TestLauncherPodHotPlugKeepsPrimaryThroughAPIServer: in a Multus
// cluster, a VM on a primary network without persistent IPs keeps its
// ovn-udn1 element when virt-controller rebuilds the networks annotation
// on hot plug (pkg/network/pod/annotations/generator.go
// GenerateFromActivePod, added by pkg/controller/controller.go
// SyncPodAnnotations as a JSON patch), through the API server.
func TestLauncherPodHotPlugKeepsPrimaryThroughAPIServer(t *testing.T) {
	ctx := context.Background()
	serveMultusWebhooks(t)
	const ns = "lp-multus-hotplug"
	mkNS(t, ns, map[string]string{"k8s.ovn.org/primary-user-defined-network": "", multusTestLabel: "true"})
	create(t, &udnv1.UserDefinedNetwork{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "tenant"},
		Spec: udnv1.UserDefinedNetworkSpec{Topology: udnv1.NetworkTopologyLayer2, Layer2: &udnv1.Layer2Config{
			Role: udnv1.NetworkRolePrimary, Subnets: udnv1.DualStackCIDRs{"10.122.0.0/16"}}}})
	testenv.Eventually(t, timeout, "NAD "+ns+"/tenant", func() error {
		return c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "tenant"}, &nadv1.NetworkAttachmentDefinition{})
	})
	secondaryNAD(t, ns, "blue", "192.168.40.0/24")
	vmi := primaryVMI(ns, "vm1", "02:ef:00:00:00:01", "")
	create(t, vmi)
	ann, err := launcher.Annotations(vmi, kubevirtBindings)
	if err != nil {
		t.Fatal(err)
	}
	pod := launcherPod(ns, "vm1", ann)
	create(t, pod)
	primaryFirst := func(step string, secondaries int) {
		t.Helper()
		elems, err := multus.ParseSelection(multus.NetworksAnnotation, pod.Annotations[multus.NetworksAnnotation], ns)
		if err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		if len(elems) != 1+secondaries || elems[0].Key() != ns+"/tenant" || elems[0].InterfaceRequest != multus.PrimaryInterface {
			t.Fatalf("%s: networks %s, want %s/tenant as %s first and %d more", step, pod.Annotations[multus.NetworksAnnotation], ns, multus.PrimaryInterface, secondaries)
		}
	}
	primaryFirst("after CREATE", 0)

	if err := hotPlug(ctx, vmi, pod, "blue-net", "blue", "02:ef:00:00:00:02"); err != nil {
		t.Fatalf("hot plug refused: %v", err)
	}
	primaryFirst("after hot plug", 1)
}
