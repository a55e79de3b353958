package webhooks

import (
	"context"
	"fmt"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"kvnet.io/kvnet/config"
)

// Configuration returns kvnet's MutatingWebhookConfiguration as shipped in
// config/webhook. When baseURL is set ("https://127.0.0.1:9443"), each
// webhook calls baseURL+path instead of the in-cluster Service: the lab
// and the tests, where the controller runs outside any pod.
func Configuration(baseURL string) (*admissionregistrationv1.MutatingWebhookConfiguration, error) {
	var wc admissionregistrationv1.MutatingWebhookConfiguration
	if err := yaml.UnmarshalStrict(config.Webhooks, &wc); err != nil {
		return nil, fmt.Errorf("decode config/webhook/webhooks.yaml: %w", err)
	}
	if baseURL == "" {
		return &wc, nil
	}
	for i := range wc.Webhooks {
		cc := &wc.Webhooks[i].ClientConfig
		if cc.Service == nil || cc.Service.Path == nil {
			return nil, fmt.Errorf("webhook %s has no service path", wc.Webhooks[i].Name)
		}
		url := strings.TrimRight(baseURL, "/") + *cc.Service.Path
		cc.Service, cc.URL = nil, &url
	}
	return &wc, nil
}

// InstallLocal creates (or updates) the namespace and webhook configuration
// for a controller serving webhooks at https://127.0.0.1:port, as in the lab
// and the tests. Install it before the controller starts: the controller
// patches the caBundle of existing configurations when it starts.
func InstallLocal(ctx context.Context, c client.Client, namespace string, port int) error {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}
	if err := c.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	wc, err := Configuration(fmt.Sprintf("https://127.0.0.1:%d", port))
	if err != nil {
		return err
	}
	var cur admissionregistrationv1.MutatingWebhookConfiguration
	if err := c.Get(ctx, client.ObjectKeyFromObject(wc), &cur); err == nil {
		wc.ResourceVersion = cur.ResourceVersion
		return c.Update(ctx, wc)
	}
	return c.Create(ctx, wc)
}
