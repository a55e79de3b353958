package webhooks_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"kvnet.io/kvnet/internal/k8s/manager"
	"kvnet.io/kvnet/internal/k8s/webhooks"
	"kvnet.io/kvnet/internal/testenv"
)

// TestMACPoolLeaderOnly runs two replicas with leader election, as the
// shipped Deployment does. Only the leader may answer VM admissions from
// its pool: the standby is not Ready and refuses a VM admission sent to it
// directly; once the leader stops, the standby takes over with a pool
// rebuilt from the API, so it never hands out a MAC the old leader gave.
func TestMACPoolLeaderOnly(t *testing.T) {
	ctx := context.Background()
	mkNS(t, "mac-ha", nil)
	main := ctl.Options().Webhook.Port
	ctl.Stop()
	defer func() {
		pointWebhooksAt(t, main)
		ctl.Start(t)
	}()

	replica := func() (manager.Options, string) {
		opts, err := env.WebhookOptions(ctx)
		if err != nil {
			t.Fatal(err)
		}
		probe := net.JoinHostPort("127.0.0.1", strconv.Itoa(testenv.FreePort(t)))
		opts.ProbeAddr = probe
		opts.LeaderElection = true
		opts.LeaderElectionNamespace = "kvnet-system"
		opts.LeaseDuration, opts.RenewDeadline, opts.RetryPeriod = 4*time.Second, 3*time.Second, 500*time.Millisecond
		return opts, "http://" + probe + "/readyz"
	}
	// WebhookOptions points the configuration at the replica it is made
	// for: make the standby's first, then the leader's.
	standbyOpts, standbyReady := replica()
	leaderOpts, _ := replica()
	stopLeader, err := env.RunController(leaderOpts)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { stopLeader() }()
	stopStandby, err := env.RunStandby(standbyOpts)
	if err != nil {
		t.Fatal(err)
	}
	defer stopStandby()

	held := map[string]string{} // MAC -> VM
	createVMs := func(prefix string, n int) {
		t.Helper()
		for i := range n {
			v := vm("mac-ha", fmt.Sprintf("%s-%02d", prefix, i), masq(), bridge("sec", ""))
			create(t, v)
			for _, m := range macs(v) {
				if other, dup := held[m]; dup {
					t.Fatalf("MAC %s given to %s and %s", m, other, v.Name)
				}
				held[m] = v.Name
			}
		}
	}
	createVMs("first", 10)

	// The standby is not Ready (so a Service does not route to it) and
	// refuses a VM admission sent to it anyway.
	if code := httpStatus(t, standbyReady); code == http.StatusOK {
		t.Fatal("standby replica reports Ready")
	}
	resp := reviewVM(t, standbyOpts.Webhook.Port, vm("mac-ha", "direct", masq()))
	if resp.Allowed || resp.Result == nil || resp.Result.Code != http.StatusServiceUnavailable ||
		!strings.Contains(resp.Result.Message, "not the leader") {
		t.Fatalf("standby answered a VM admission: %+v", resp)
	}

	// Fail-over: the leader stops and releases its lease; the standby
	// rebuilds and serves.
	stopLeader()
	stopLeader = func() {}
	pointWebhooksAt(t, standbyOpts.Webhook.Port)
	testenv.Eventually(t, timeout, "standby becomes Ready", func() error {
		if code := httpStatus(t, standbyReady); code != http.StatusOK {
			return fmt.Errorf("readyz %d", code)
		}
		return nil
	})
	createVMs("second", 10)
	// A MAC the old leader handed out is taken in the new leader's pool.
	var first string
	for m, v := range held {
		if strings.HasPrefix(v, "first-") {
			first = m
			break
		}
	}
	err = c.Create(ctx, vm("mac-ha", "thief", bridge("sec", first)))
	if err == nil || !strings.Contains(err.Error(), "is already used by VM mac-ha/first-") {
		t.Fatalf("explicit MAC %s of the old leader's VM: err = %v", first, err)
	}
}

func httpStatus(t *testing.T, url string) int {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// pointWebhooksAt makes the installed webhook configuration call the
// replica serving on 127.0.0.1:port, keeping the caBundle kvnet patched in.
func pointWebhooksAt(t *testing.T, port int) {
	t.Helper()
	ctx := context.Background()
	want, err := webhooks.Configuration(fmt.Sprintf("https://127.0.0.1:%d", port), false)
	if err != nil {
		t.Fatal(err)
	}
	var cur admissionregistrationv1.MutatingWebhookConfiguration
	if err := c.Get(ctx, client.ObjectKeyFromObject(want), &cur); err != nil {
		t.Fatal(err)
	}
	for i := range cur.Webhooks {
		cur.Webhooks[i].ClientConfig.URL = want.Webhooks[i].ClientConfig.URL
	}
	if err := c.Update(ctx, &cur); err != nil {
		t.Fatal(err)
	}
}

// reviewVM posts an AdmissionReview creating v straight to the VM webhook
// of the replica on port, bypassing the API server.
func reviewVM(t *testing.T, port int, v runtime.Object) *admissionv1.AdmissionResponse {
	t.Helper()
	raw, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	review := admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{
			UID: "direct-1", Operation: admissionv1.Create, Namespace: "mac-ha", Name: "direct",
			Kind:   metav1.GroupVersionKind{Group: "kubevirt.io", Version: "v1", Kind: "VirtualMachine"},
			Object: runtime.RawExtension{Raw: raw},
		},
	}
	body, err := json.Marshal(review)
	if err != nil {
		t.Fatal(err)
	}
	// The test checks the answer, not the certificate (the API server's
	// side of TLS is covered by every other test).
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	resp, err := hc.Post(fmt.Sprintf("https://127.0.0.1:%d%s", port, webhooks.VirtualMachinePath), "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out admissionv1.AdmissionReview
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	if out.Response == nil {
		t.Fatal("AdmissionReview without a response")
	}
	return out.Response
}
