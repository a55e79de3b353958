package webhooks_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	macpoolctl "kvnet.io/kvnet/internal/k8s/controllers/macpool"
	"kvnet.io/kvnet/internal/k8s/manager"
	"kvnet.io/kvnet/internal/k8s/webhooks"
	"kvnet.io/kvnet/internal/testenv"
)

// TestMACPoolEveryReplica runs two replicas with leader election, as the
// shipped Deployment does. Both are Ready and both answer VM admissions,
// at the same moment, without ever giving one MAC twice: each MAC is
// reserved in the API (a Lease named after it) before a replica hands it
// out. Admissions whose VM never reaches the API give their MACs back
// through the leader, and once a replica is gone the other serves alone.
func TestMACPoolEveryReplica(t *testing.T) {
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
	// for: make b's first, then a's. RunController returns once the
	// replica is Ready: a standby is Ready too.
	bOpts, bReady := replica()
	aOpts, _ := replica()
	stopA, err := env.RunController(aOpts)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { stopA() }()
	stopB, err := env.RunController(bOpts)
	if err != nil {
		t.Fatal(err)
	}
	defer stopB()
	if code := httpStatus(t, bReady); code != http.StatusOK {
		t.Fatalf("second replica readyz %d, want 200", code)
	}

	held := map[string]string{} // MAC -> VM
	hold := func(owner string, ms ...string) {
		t.Helper()
		for _, m := range ms {
			if m == "" {
				t.Fatalf("%s got no MAC", owner)
			}
			if other, dup := held[m]; dup {
				t.Fatalf("MAC %s given to %s and %s", m, other, owner)
			}
			held[m] = owner
		}
	}
	createVMs := func(prefix string, n int) {
		t.Helper()
		for i := range n {
			v := vm("mac-ha", fmt.Sprintf("%s-%02d", prefix, i), masq(), bridge("sec", ""))
			create(t, v)
			hold(v.Name, macs(v)...)
		}
	}
	createVMs("via-a", 5)
	pointWebhooksAt(t, bOpts.Webhook.Port)
	createVMs("via-b", 5)

	// Both replicas at once, straight to their webhooks: 2 x 3 goroutines,
	// each admitting VMs with three pool interfaces.
	type answer struct {
		owner string
		macs  []string
		err   string
	}
	answers := make(chan answer, 256)
	var wg sync.WaitGroup
	for r, port := range []int{aOpts.Webhook.Port, bOpts.Webhook.Port} {
		for g := range 3 {
			wg.Go(func() {
				for i := range 8 {
					name := fmt.Sprintf("direct-%d-%d-%d", r, g, i)
					resp := reviewVM(t, port, name, vm("mac-ha", name, masq(), bridge("sec", ""), bridge("third", "")))
					if !resp.Allowed {
						answers <- answer{owner: name, err: fmt.Sprintf("%+v", resp.Result)}
						continue
					}
					answers <- answer{owner: name, macs: patchedMACs(t, resp)}
				}
			})
		}
	}
	wg.Wait()
	close(answers)
	direct := 0
	for a := range answers {
		if a.err != "" {
			t.Fatalf("admission of %s refused: %s", a.owner, a.err)
		}
		if len(a.macs) != 3 {
			t.Fatalf("admission of %s assigned %v, want three MACs", a.owner, a.macs)
		}
		hold(a.owner, a.macs...)
		direct++
	}
	t.Logf("%d concurrent admissions on two replicas: %d distinct MACs", direct, len(held))

	// A MAC admitted through one replica is refused by the other.
	var viaA string
	for m, v := range held {
		if strings.HasPrefix(v, "via-a-") {
			viaA = m
		}
	}
	err = c.Create(ctx, vm("mac-ha", "thief", bridge("sec", viaA)))
	if err == nil || !strings.Contains(err.Error(), "is already used by VM mac-ha/via-a-") {
		t.Fatalf("explicit MAC %s of a VM admitted by the other replica: err = %v", viaA, err)
	}

	// The direct admissions never reached the API: once they are older
	// than the pending timeout (2 s here), the leader deletes their
	// reservations; the created VMs keep theirs.
	testenv.Eventually(t, timeout, "reservations of the admissions that never reached the API deleted", func() error {
		var leases coordinationv1.LeaseList
		if err := c.List(ctx, &leases, client.InNamespace("kvnet-system"), client.MatchingLabels{macpoolctl.ReservationLabel: "true"}); err != nil {
			return err
		}
		left, vms := 0, 0
		for _, l := range leases.Items {
			h := ptr.Deref(l.Spec.HolderIdentity, "")
			switch {
			case strings.HasPrefix(h, "mac-ha/direct-"):
				left++
			case strings.HasPrefix(h, "mac-ha/via-"):
				vms++
			}
		}
		if left > 0 || vms != 20 {
			return fmt.Errorf("%d reservations of direct admissions left, %d of the 10 VMs' 20 MACs", left, vms)
		}
		return nil
	})

	for m, owner := range held {
		if strings.HasPrefix(owner, "direct-") {
			delete(held, m) // free again
		}
	}

	// Fail-over: a stops (with its lease, if it led); b serves alone.
	stopA()
	stopA = func() {}
	createVMs("after", 5)
	err = c.Create(ctx, vm("mac-ha", "thief2", bridge("sec", viaA)))
	if err == nil || !strings.Contains(err.Error(), "is already used by VM mac-ha/via-a-") {
		t.Fatalf("explicit MAC %s after a's exit: err = %v", viaA, err)
	}
}

// patchedMACs returns the MACs a VM admission's patch writes.
func patchedMACs(t *testing.T, resp *admissionv1.AdmissionResponse) []string {
	t.Helper()
	var ops []struct {
		Op    string `json:"op"`
		Path  string `json:"path"`
		Value any    `json:"value"`
	}
	if err := json.Unmarshal(resp.Patch, &ops); err != nil {
		t.Fatalf("patch %q: %v", resp.Patch, err)
	}
	var out []string
	for _, op := range ops {
		if strings.HasSuffix(op.Path, "/macAddress") {
			out = append(out, fmt.Sprint(op.Value))
		}
	}
	return out
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

// reviewVM posts an AdmissionReview creating v (named name) straight to
// the VM webhook of the replica on port, bypassing the API server. It may
// run on any goroutine: a failure to get an answer is a refusal whose
// message says why (and the test is marked failed).
func reviewVM(t *testing.T, port int, name string, v runtime.Object) *admissionv1.AdmissionResponse {
	t.Helper()
	failed := func(err error) *admissionv1.AdmissionResponse {
		t.Error(err)
		return &admissionv1.AdmissionResponse{Result: &metav1.Status{Message: err.Error()}}
	}
	raw, err := json.Marshal(v)
	if err != nil {
		return failed(err)
	}
	review := admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{
			UID: types.UID("uid-" + name), Operation: admissionv1.Create, Namespace: "mac-ha", Name: name,
			Kind:   metav1.GroupVersionKind{Group: "kubevirt.io", Version: "v1", Kind: "VirtualMachine"},
			Object: runtime.RawExtension{Raw: raw},
		},
	}
	body, err := json.Marshal(review)
	if err != nil {
		return failed(err)
	}
	// The test checks the answer, not the certificate (the API server's
	// side of TLS is covered by every other test).
	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	resp, err := hc.Post(fmt.Sprintf("https://127.0.0.1:%d%s", port, webhooks.VirtualMachinePath), "application/json", bytes.NewReader(body))
	if err != nil {
		return failed(err)
	}
	defer resp.Body.Close()
	var out admissionv1.AdmissionReview
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return failed(err)
	}
	if out.Response == nil {
		return failed(errors.New("AdmissionReview without a response"))
	}
	return out.Response
}
