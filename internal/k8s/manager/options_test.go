package manager_test

import (
	"reflect"
	"strings"
	"testing"

	"k8s.io/client-go/rest"

	"kvnet.io/kvnet/internal/k8s/manager"
)

// TestWebhookOptionsValidate: the defaults are valid; New fills in no
// mode, NAD, port, namespace or ConfigMap of its own, it refuses options
// without them, naming the setting.
func TestWebhookOptionsValidate(t *testing.T) {
	d := manager.DefaultWebhookOptions()
	if err := d.Validate(); err != nil {
		t.Fatalf("defaults %+v: %v", d, err)
	}
	if d.PrimaryAttachment != manager.PrimaryByMultus || d.DefaultNetworkNAD != "" {
		t.Errorf("default mode %q NAD %q, want multus without a NAD (as kvnet-controller's flags)", d.PrimaryAttachment, d.DefaultNetworkNAD)
	}
	if o := manager.DefaultOptions(); o.Webhook == nil || !reflect.DeepEqual(*o.Webhook, d) {
		t.Errorf("DefaultOptions().Webhook %+v, want DefaultWebhookOptions %+v", o.Webhook, d)
	}
	for _, tc := range []struct {
		name   string
		mutate func(*manager.WebhookOptions)
		err    string
	}{
		{"empty mode", func(w *manager.WebhookOptions) { w.PrimaryAttachment = "" }, `primary network attachment "": want "multus", "multus-default" or "default-network"`},
		{"default-network without NAD", func(w *manager.WebhookOptions) { w.PrimaryAttachment = manager.PrimaryByDefaultNetwork },
			"default network NAD is required with primary network attachment default-network"},
		{"bad NAD", func(w *manager.WebhookOptions) {
			w.PrimaryAttachment, w.DefaultNetworkNAD = manager.PrimaryByDefaultNetwork, "default"
		}, `default network NAD "default": want <namespace>/<name>`},
		{"no port", func(w *manager.WebhookOptions) { w.Port = 0 }, "webhook port 0"},
		{"no namespace", func(w *manager.WebhookOptions) { w.Namespace = "" }, "webhook namespace is empty"},
		{"no MAC range", func(w *manager.WebhookOptions) { w.MACRangeConfigMap = "" }, "MAC range ConfigMap name is empty"},
	} {
		w := manager.DefaultWebhookOptions()
		tc.mutate(&w)
		if err := w.Validate(); err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("%s: %v, want an error containing %q", tc.name, err, tc.err)
		}
		if _, err := manager.New(&rest.Config{Host: "127.0.0.1:1"}, manager.Options{Webhook: &w}); err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("%s: New: %v, want an error containing %q", tc.name, err, tc.err)
		}
	}
}
