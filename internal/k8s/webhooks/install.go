package webhooks

import (
	"fmt"
	"slices"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"sigs.k8s.io/yaml"

	"kvnet.io/kvnet/config"
)

// PrimaryWebhookName is the webhook of PrimaryPodMutator in
// config/webhook/webhooks.yaml.
const PrimaryWebhookName = "primary-network.kvnet.io"

// Configuration returns kvnet's MutatingWebhookConfiguration as shipped in
// config/webhook. When baseURL is set ("https://127.0.0.1:9443"), each
// webhook calls baseURL+path instead of the in-cluster Service: the lab
// and the tests, where the controller runs outside any pod. Unless
// primaryByMultus, the primary-network webhook (PrimaryWebhookName) is left
// out: a controller attaching primary networks the OVN-Kubernetes way
// would only answer it with "allowed", and every pod creation in a
// primary-UDN namespace would depend on the controller being up.
func Configuration(baseURL string, primaryByMultus bool) (*admissionregistrationv1.MutatingWebhookConfiguration, error) {
	var wc admissionregistrationv1.MutatingWebhookConfiguration
	if err := yaml.UnmarshalStrict(config.Webhooks, &wc); err != nil {
		return nil, fmt.Errorf("decode config/webhook/webhooks.yaml: %w", err)
	}
	if !primaryByMultus {
		wc.Webhooks = slices.DeleteFunc(wc.Webhooks, func(w admissionregistrationv1.MutatingWebhook) bool { return w.Name == PrimaryWebhookName })
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
