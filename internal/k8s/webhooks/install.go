package webhooks

import (
	"fmt"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
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
