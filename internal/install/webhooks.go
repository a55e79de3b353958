package install

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"kvnet.io/kvnet/internal/k8s/certs"
)

// This file holds back kvnet's webhook configurations until kvnet-controller
// serves them. Their failurePolicy is Fail: a configuration the API server
// knows before a webhook server answers behind its Service (and before its
// caBundle holds the controller's CA) would fail every VM create in the
// cluster, and every pod create in a namespace with a primary network,
// until kvnet-controller is up.

// WebhookSecret is the Secret, in the webhook Service's namespace, where
// kvnet-controller keeps its webhook CA (key ca.crt) and serving
// certificate.
const WebhookSecret = certs.SecretName

// DefaultWebhookTimeout is how long Apply waits by default for
// kvnet-controller to serve its webhooks.
const DefaultWebhookTimeout = 5 * time.Minute

// ApplyOptions tune Apply.
type ApplyOptions struct {
	// WebhookTimeout bounds the wait for kvnet-controller to serve its
	// webhooks before a new webhook configuration is applied; 0 is
	// DefaultWebhookTimeout.
	WebhookTimeout time.Duration
	// Poll is the interval of that wait; 0 is one second.
	Poll time.Duration
}

// ErrWebhookNotServed is returned (wrapped) by Apply when kvnet-controller
// did not serve its webhooks in time: everything else is applied, the
// webhook configurations are not.
var ErrWebhookNotServed = errors.New("kvnet-controller does not serve its webhooks yet")

// isWebhookConfig reports whether u is an admission webhook configuration.
func isWebhookConfig(u *unstructured.Unstructured) bool {
	return u.GroupVersionKind().Group == "admissionregistration.k8s.io" &&
		(u.GetKind() == "MutatingWebhookConfiguration" || u.GetKind() == "ValidatingWebhookConfiguration")
}

// webhookService returns the Service the webhooks of u call (the first
// one named; kvnet's all call one).
func webhookService(u *unstructured.Unstructured) (namespace, name string, ok bool) {
	hooks, _, _ := unstructured.NestedSlice(u.Object, "webhooks")
	for _, h := range hooks {
		m, _ := h.(map[string]any)
		ns, _, _ := unstructured.NestedString(m, "clientConfig", "service", "namespace")
		n, _, _ := unstructured.NestedString(m, "clientConfig", "service", "name")
		if ns != "" && n != "" {
			return ns, n, true
		}
	}
	return "", "", false
}

// prepareWebhooks readies webhook configuration u for applying: a new one
// only once its Service has a ready endpoint and the controller's CA
// exists (waiting up to the timeout), an existing one (an upgrade) at
// once; both with the CA in every webhook's caBundle, so that applying
// never takes a working caBundle away.
func prepareWebhooks(ctx context.Context, c client.Client, u *unstructured.Unstructured, opts ApplyOptions, log io.Writer) (*unstructured.Unstructured, error) {
	ns, svc, ok := webhookService(u)
	if !ok {
		return u, nil
	}
	cur := &unstructured.Unstructured{}
	cur.SetGroupVersionKind(u.GroupVersionKind())
	err := c.Get(ctx, client.ObjectKeyFromObject(u), cur)
	exists := err == nil
	if err != nil && !apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("read %s %s: %w", u.GetKind(), u.GetName(), err)
	}
	var ca []byte
	if exists {
		ca, err = webhookCA(ctx, c, ns)
		if err != nil {
			return nil, err
		}
	} else {
		timeout, poll := opts.WebhookTimeout, opts.Poll
		if timeout == 0 {
			timeout = DefaultWebhookTimeout
		}
		if poll == 0 {
			poll = time.Second
		}
		fmt.Fprintf(log, "waiting up to %s for kvnet-controller to serve its webhooks (Service %s/%s) before applying %s %s\n",
			timeout, ns, svc, u.GetKind(), u.GetName())
		var why string
		waitErr := wait.PollUntilContextTimeout(ctx, poll, timeout, true, func(ctx context.Context) (bool, error) {
			reason, err := webhookNotServed(ctx, c, ns, svc)
			if err != nil {
				return false, err
			}
			if why = reason; why != "" {
				return false, nil
			}
			ca, err = webhookCA(ctx, c, ns)
			return len(ca) > 0, err
		})
		if waitErr != nil {
			if why == "" {
				why = fmt.Sprintf("Secret %s/%s has no CA", ns, WebhookSecret)
			}
			return nil, fmt.Errorf("%w after %s (%s): %s %s not applied, so that no VM or pod create fails for want of a webhook server; "+
				"see `kubectl -n %s get pods`, then run kvnet install again: %v", ErrWebhookNotServed, timeout, why, u.GetKind(), u.GetName(), ns, waitErr)
		}
	}
	if len(ca) == 0 {
		return u, nil
	}
	out := u.DeepCopy()
	hooks, _, _ := unstructured.NestedSlice(out.Object, "webhooks")
	for i := range hooks {
		if m, ok := hooks[i].(map[string]any); ok {
			// []byte travels base64-encoded in JSON.
			_ = unstructured.SetNestedField(m, base64.StdEncoding.EncodeToString(ca), "clientConfig", "caBundle")
			hooks[i] = m
		}
	}
	if err := unstructured.SetNestedSlice(out.Object, hooks, "webhooks"); err != nil {
		return nil, err
	}
	return out, nil
}

// webhookCA returns kvnet-controller's CA bundle from WebhookSecret in ns,
// nil while there is none.
func webhookCA(ctx context.Context, c client.Client, ns string) ([]byte, error) {
	var s corev1.Secret
	switch err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: WebhookSecret}, &s); {
	case apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("read Secret %s/%s: %w", ns, WebhookSecret, err)
	}
	return s.Data["ca.crt"], nil
}

// webhookNotServed says why Service ns/name has no ready endpoint, "" when
// it has one.
func webhookNotServed(ctx context.Context, c client.Client, ns, name string) (string, error) {
	var slices discoveryv1.EndpointSliceList
	if err := c.List(ctx, &slices, client.InNamespace(ns), client.MatchingLabels{discoveryv1.LabelServiceName: name}); err != nil {
		return "", fmt.Errorf("list EndpointSlices of Service %s/%s: %w", ns, name, err)
	}
	for _, sl := range slices.Items {
		for _, ep := range sl.Endpoints {
			if ep.Conditions.Ready == nil || *ep.Conditions.Ready {
				return "", nil
			}
		}
	}
	return fmt.Sprintf("Service %s/%s has no ready endpoint", ns, name), nil
}
