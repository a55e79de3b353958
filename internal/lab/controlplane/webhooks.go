package controlplane

import (
	"context"
	"fmt"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"kvnet.io/kvnet/internal/k8s/webhooks"
)

// InstallWebhooks creates (or updates) the namespace and webhook
// configuration for a controller serving webhooks at
// https://127.0.0.1:port. It is for the lab and the tests only: in a
// cluster, config/webhook points the API server at kvnet-controller's
// Service. Install it before the controller starts: the controller
// patches the caBundle of existing configurations when it starts.
// primaryByMultus registers the primary-network webhook (see
// webhooks.Configuration).
func InstallWebhooks(ctx context.Context, c client.Client, namespace string, port int, primaryByMultus bool) error {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}
	if err := c.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	wc, err := webhooks.Configuration(fmt.Sprintf("https://127.0.0.1:%d", port), primaryByMultus)
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
