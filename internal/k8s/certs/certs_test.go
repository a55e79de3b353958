package certs_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"os"
	"testing"
	"time"

	"go.uber.org/zap/zapcore"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"kvnet.io/kvnet/internal/k8s/certs"
	"kvnet.io/kvnet/internal/testenv"
)

const (
	ns         = "kvnet-certs"
	serverName = "kvnet-webhook.kvnet-certs.svc"
)

// c can watch, as certs.Manager needs to react to webhook configurations.
var c client.WithWatch

func TestMain(m *testing.M) {
	log.SetLogger(zap.New(zap.Level(zapcore.ErrorLevel)))
	os.Exit(testenv.MainAPI(m, testenv.Options{NoControllerManager: true}, func(env *testenv.Env) (err error) {
		if c, err = client.NewWithWatch(env.Config, client.Options{Scheme: env.Client.Scheme()}); err != nil {
			return err
		}
		err = c.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
		return client.IgnoreAlreadyExists(err)
	}))
}

// clock is a settable Options.Now.
type clock struct{ t time.Time }

// newClock starts at a whole second: certificates keep no fractions.
func newClock() *clock               { return &clock{t: time.Now().Truncate(time.Second)} }
func (k *clock) Now() time.Time      { return k.t }
func (k *clock) Add(d time.Duration) { k.t = k.t.Add(d) }

// newManager serves serverName and 127.0.0.1 unless o has other SANs. Its
// Secret is deleted when the test ends, so a rerun starts afresh.
func newManager(t *testing.T, o certs.Options) *certs.Manager {
	t.Cleanup(func() {
		_ = c.Delete(context.Background(), &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: o.SecretName}})
	})
	o.Namespace = ns
	if o.DNSNames == nil {
		o.DNSNames, o.IPs = []string{serverName}, []net.IP{net.IPv4(127, 0, 0, 1)}
	}
	return certs.New(c, o)
}

func ensure(t *testing.T, m *certs.Manager) {
	t.Helper()
	if err := m.Ensure(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// webhookConfig creates a MutatingWebhookConfiguration with two webhooks
// (which the API server never calls) and no caBundle, labelled for
// injection when inject is set; it is deleted when the test ends.
func webhookConfig(t *testing.T, name string, inject bool) {
	t.Helper()
	wc := &admissionregistrationv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if inject {
		wc.Labels = map[string]string{certs.InjectLabel: "true"}
	}
	none := admissionregistrationv1.SideEffectClassNone
	for _, h := range []string{"a", "b"} {
		url := "https://127.0.0.1:1/" + h
		wc.Webhooks = append(wc.Webhooks, admissionregistrationv1.MutatingWebhook{
			Name: h + ".certs.kvnet.io", ClientConfig: admissionregistrationv1.WebhookClientConfig{URL: &url},
			SideEffects: &none, AdmissionReviewVersions: []string{"v1"},
		})
	}
	testenv.Create(t, c, wc)
	t.Cleanup(func() { _ = c.Delete(context.Background(), wc) })
}

// caBundle returns the caBundle of the configuration name, the same in
// every webhook.
func caBundle(t *testing.T, name string) []byte {
	t.Helper()
	var wc admissionregistrationv1.MutatingWebhookConfiguration
	if err := c.Get(context.Background(), client.ObjectKey{Name: name}, &wc); err != nil {
		t.Fatal(err)
	}
	for _, h := range wc.Webhooks[1:] {
		if !bytes.Equal(h.ClientConfig.CABundle, wc.Webhooks[0].ClientConfig.CABundle) {
			t.Fatalf("%s: webhooks have different caBundles", name)
		}
	}
	return wc.Webhooks[0].ClientConfig.CABundle
}

func secret(t *testing.T, name string) *corev1.Secret {
	t.Helper()
	var s corev1.Secret
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &s); err != nil {
		t.Fatal(err)
	}
	return &s
}

// certsOf parses every certificate of a PEM bundle.
func certsOf(t *testing.T, b []byte) []*x509.Certificate {
	t.Helper()
	var out []*x509.Certificate
	for blk, rest := pem.Decode(b); blk != nil; blk, rest = pem.Decode(rest) {
		cert, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, cert)
	}
	return out
}

// serve runs a TLS server taking its certificate from m, as the webhook
// server does, and returns its address.
func serve(t *testing.T, m *certs.Manager) string {
	t.Helper()
	l, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{GetCertificate: m.GetCertificate})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			_ = conn.(*tls.Conn).Handshake()
			conn.Close()
		}
	}()
	return l.Addr().String()
}

// served connects to addr as the API server would with caBundle at time
// now, and returns the verified serving certificate.
func served(addr string, caBundle []byte, now time.Time) (*x509.Certificate, error) {
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(caBundle) {
		return nil, errors.New("empty caBundle")
	}
	conn, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: roots, ServerName: serverName, Time: func() time.Time { return now }})
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0], nil
}

func mustServe(t *testing.T, addr string, caBundle []byte, now time.Time) *x509.Certificate {
	t.Helper()
	cert, err := served(addr, caBundle, now)
	if err != nil {
		t.Fatalf("TLS with caBundle at %v: %v", now, err)
	}
	return cert
}

func TestFirstStartAndRestart(t *testing.T) {
	webhookConfig(t, "certs-first", true)
	webhookConfig(t, "certs-unlabelled", false)
	k := newClock()
	m := newManager(t, certs.Options{SecretName: "first", Now: k.Now})
	ensure(t, m)

	s := secret(t, "first")
	cas := certsOf(t, s.Data["ca.crt"])
	if len(cas) != 1 || !cas[0].IsCA {
		t.Fatalf("ca.crt: want one CA, got %d", len(cas))
	}
	if got := caBundle(t, "certs-first"); !bytes.Equal(got, s.Data["ca.crt"]) {
		t.Errorf("labelled caBundle = %q, want the Secret's ca.crt", got)
	}
	if got := caBundle(t, "certs-unlabelled"); len(got) != 0 {
		t.Errorf("unlabelled configuration got a caBundle")
	}
	leaf := mustServe(t, serve(t, m), s.Data["ca.crt"], k.Now())
	if !bytes.Equal(leaf.Raw, certsOf(t, s.Data["tls.crt"])[0].Raw) {
		t.Error("served certificate is not the Secret's tls.crt")
	}

	// A restart (a new manager) reuses the Secret as it is.
	m2 := newManager(t, certs.Options{SecretName: "first", Now: k.Now})
	ensure(t, m2)
	if s2 := secret(t, "first"); s2.ResourceVersion != s.ResourceVersion {
		t.Error("restart rewrote the Secret")
	}
	if again := mustServe(t, serve(t, m2), caBundle(t, "certs-first"), k.Now()); !again.Equal(leaf) {
		t.Error("restart serves another certificate")
	}

	// A restart with other SANs re-issues the serving certificate only.
	m3 := newManager(t, certs.Options{SecretName: "first", Now: k.Now, DNSNames: []string{serverName, "kvnet-webhook.other.svc"}, IPs: []net.IP{net.IPv4(127, 0, 0, 1)}})
	ensure(t, m3)
	s3 := secret(t, "first")
	if got := certsOf(t, s3.Data["tls.crt"])[0].DNSNames; len(got) != 2 {
		t.Errorf("SANs after restart with new ones: %v", got)
	}
	if !bytes.Equal(s3.Data["ca.crt"], s.Data["ca.crt"]) {
		t.Error("a SAN change replaced the CA")
	}
}

func TestServingCertRenewal(t *testing.T) {
	webhookConfig(t, "certs-renew", true)
	k := newClock()
	m := newManager(t, certs.Options{SecretName: "renew", Validity: 3 * time.Hour, CheckInterval: time.Minute, Now: k.Now})
	ensure(t, m)
	addr := serve(t, m) // started once: renewals must reach it
	caPEM := secret(t, "renew").Data["ca.crt"]
	first := mustServe(t, addr, caPEM, k.Now())

	k.Add(time.Hour) // 2h of 3h left: not due
	ensure(t, m)
	if cur := mustServe(t, addr, caPEM, k.Now()); !cur.Equal(first) {
		t.Fatal("renewed with two thirds of the validity left")
	}
	k.Add(time.Hour + time.Minute) // less than a third left
	ensure(t, m)
	renewed := mustServe(t, addr, caBundle(t, "certs-renew"), k.Now())
	if renewed.Equal(first) {
		t.Fatal("serving certificate not renewed (or not picked up by the TLS server)")
	}
	if !renewed.NotAfter.Equal(k.Now().Add(3 * time.Hour)) {
		t.Errorf("renewed NotAfter %v, want %v", renewed.NotAfter, k.Now().Add(3*time.Hour))
	}
	if !bytes.Equal(secret(t, "renew").Data["ca.crt"], caPEM) {
		t.Error("serving certificate renewal replaced the CA")
	}
}

// TestCARollover runs checks every CheckInterval across the CA's expiry.
// At every check the served certificate must verify both with the
// caBundle the API server may still use (the one before the check) and
// with the new one until the next check.
func TestCARollover(t *testing.T) {
	webhookConfig(t, "certs-rollover", true)
	k := newClock()
	const step = 30 * time.Minute
	m := newManager(t, certs.Options{SecretName: "rollover", Validity: 3 * time.Hour, CAValidity: 9 * time.Hour, CheckInterval: step, Now: k.Now})
	ensure(t, m)
	addr := serve(t, m)
	ca1 := certsOf(t, caBundle(t, "certs-rollover"))[0]
	sawBoth := false // a check where the bundle had both CAs and the old one signed the served certificate
	for k.t.Before(ca1.NotAfter.Add(2 * step)) {
		k.Add(step)
		before := caBundle(t, "certs-rollover")
		ensure(t, m)
		after := caBundle(t, "certs-rollover")
		leaf := mustServe(t, addr, before, k.Now())
		mustServe(t, addr, after, k.Now())
		mustServe(t, addr, after, k.Now().Add(step-time.Second))
		if cas := certsOf(t, after); len(cas) == 2 && leaf.CheckSignatureFrom(ca1) == nil && !cas[0].Equal(ca1) && cas[1].Equal(ca1) {
			sawBoth = true
		}
	}
	if !sawBoth {
		t.Error("no check with the new and old CA in the caBundle while the old one still signed the serving certificate")
	}
	cas := certsOf(t, caBundle(t, "certs-rollover"))
	if len(cas) != 1 || cas[0].Equal(ca1) {
		t.Fatalf("after the old CA expired: caBundle has %d CAs (old one included: %v)", len(cas), len(cas) > 0 && cas[len(cas)-1].Equal(ca1))
	}
	if leaf := mustServe(t, addr, caBundle(t, "certs-rollover"), k.Now()); leaf.CheckSignatureFrom(cas[0]) != nil {
		t.Error("serving certificate not signed by the new CA")
	}
}

// TestRolloverTwoReplicas: replica a issues a new CA but its caBundle
// patch has not landed (it failed, or a crashed a moment later); replica b,
// sharing the Secret, must not move its serving certificate to a CA the API
// server does not trust yet.
func TestRolloverTwoReplicas(t *testing.T) {
	webhookConfig(t, "certs-two", true)
	k := newClock()
	const step = 30 * time.Minute
	opts := certs.Options{SecretName: "two", Validity: 3 * time.Hour, CAValidity: 9 * time.Hour, CheckInterval: step, Now: k.Now}
	a, b := newManager(t, opts), newManager(t, opts)
	ensure(t, a)
	ensure(t, b)
	addrB := serve(t, b)
	ca1 := certsOf(t, caBundle(t, "certs-two"))[0]
	for {
		k.Add(step)
		if k.t.After(ca1.NotAfter) {
			t.Fatal("no new CA issued before the first expired")
		}
		before := caBundle(t, "certs-two")
		ensure(t, a)
		if certsOf(t, caBundle(t, "certs-two"))[0].Equal(ca1) {
			ensure(t, b)
			continue
		}
		// a issued a new CA: undo its caBundle patch, as if it never landed.
		setCABundle(t, "certs-two", before)
		ensure(t, b)
		if leaf := mustServe(t, addrB, before, k.Now()); leaf.CheckSignatureFrom(ca1) != nil {
			t.Fatal("replica b serves a certificate of the new CA")
		}
		return
	}
}

func setCABundle(t *testing.T, name string, bundle []byte) {
	t.Helper()
	var wc admissionregistrationv1.MutatingWebhookConfiguration
	if err := c.Get(context.Background(), client.ObjectKey{Name: name}, &wc); err != nil {
		t.Fatal(err)
	}
	for i := range wc.Webhooks {
		wc.Webhooks[i].ClientConfig.CABundle = bundle
	}
	if err := c.Update(context.Background(), &wc); err != nil {
		t.Fatal(err)
	}
}

// TestRolloverAfterDowntime: after the controller was down, a check that
// issues a new CA does not keep, for that round, a serving certificate
// expiring before the next check.
func TestRolloverAfterDowntime(t *testing.T) {
	webhookConfig(t, "certs-downtime", true)
	k := newClock()
	m := newManager(t, certs.Options{SecretName: "downtime", Validity: 3 * time.Hour, CAValidity: 4 * time.Hour, Now: k.Now})
	ensure(t, m)
	addr := serve(t, m)
	// First the CA is due and the serving certificate has 10 minutes left,
	// then both have expired.
	for _, down := range []time.Duration{2*time.Hour + 50*time.Minute, 20 * time.Hour} {
		k.Add(down)
		ensure(t, m)
		mustServe(t, addr, caBundle(t, "certs-downtime"), k.Now().Add(time.Hour-time.Second))
	}
}

// TestWatchWebhookConfigurations: with the manager running, a labelled
// configuration created, or whose caBundle is wiped, gets the CA at once,
// not at the next hourly check.
func TestWatchWebhookConfigurations(t *testing.T) {
	m := newManager(t, certs.Options{SecretName: "watch"})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- m.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	testenv.Eventually(t, 10*time.Second, "Secret", func() error {
		return c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "watch"}, &corev1.Secret{})
	})
	want := secret(t, "watch").Data["ca.crt"]
	injected := func(what string) {
		t.Helper()
		testenv.Eventually(t, 10*time.Second, what, func() error {
			if got := caBundle(t, "certs-late"); !bytes.Equal(got, want) {
				return fmt.Errorf("caBundle %q", got)
			}
			return nil
		})
	}

	webhookConfig(t, "certs-late", true)
	injected("caBundle of a configuration created after start")

	var wc admissionregistrationv1.MutatingWebhookConfiguration
	if err := c.Get(ctx, client.ObjectKey{Name: "certs-late"}, &wc); err != nil {
		t.Fatal(err)
	}
	for i := range wc.Webhooks {
		wc.Webhooks[i].ClientConfig.CABundle = nil
	}
	if err := c.Update(ctx, &wc); err != nil {
		t.Fatal(err)
	}
	injected("caBundle restored after it was wiped")
}
