// Package certs gives kvnet's webhook server its TLS certificates without
// cert-manager: a self-signed CA and a serving certificate, kept in a
// Secret shared by all replicas, renewed before they expire, and the CA
// patched into the caBundle of kvnet's webhook configurations.
package certs

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"maps"
	"math/big"
	"net"
	"slices"
	"sync/atomic"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
)

// Secret keys.
const (
	keyCACert  = "ca.crt"
	keyCAKey   = "ca.key"
	keyTLSCert = "tls.crt"
	keyTLSKey  = "tls.key"
)

// SecretName is the Secret, in kvnet-controller's namespace, that holds
// the webhook CA and serving certificate.
const SecretName = "kvnet-webhook-certs"

// InjectLabel marks the webhook configurations whose caBundle kvnet keeps
// current.
const InjectLabel = "kvnet.io/inject-ca"

// Options configures the certificates.
type Options struct {
	Namespace  string // of the Secret
	SecretName string
	DNSNames   []string // serving certificate SANs, e.g. kvnet-webhook.kvnet-system.svc
	IPs        []net.IP // serving certificate IP SANs (the lab serves on 127.0.0.1)
	// Validity of the serving certificate (default 1 year). It is renewed
	// once less than a third remains.
	Validity time.Duration
	// CAValidity of the CA (default 10 times Validity). A new CA is issued
	// once the current one would expire before a fresh serving certificate.
	CAValidity time.Duration
	// CheckInterval between renewal checks (default 1 hour). Webhook
	// configurations are also watched and fixed at once.
	CheckInterval time.Duration
	// Now is the clock (default time.Now); tests move it.
	Now func() time.Time
}

// Manager keeps the certificates current. GetCertificate serves the current
// serving certificate to the TLS server.
type Manager struct {
	c    client.WithWatch
	opts Options
	cur  atomic.Pointer[tls.Certificate]
}

// New returns a manager using c, an uncached client (it runs before caches
// start) that can watch: Start watches the labelled webhook configurations
// and restores a missing or stale caBundle at once.
func New(c client.WithWatch, opts Options) *Manager {
	if opts.Validity == 0 {
		opts.Validity = 365 * 24 * time.Hour
	}
	if opts.CAValidity == 0 {
		opts.CAValidity = 10 * opts.Validity
	}
	if opts.CheckInterval == 0 {
		opts.CheckInterval = time.Hour
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Manager{c: c, opts: opts}
}

// GetCertificate is a tls.Config.GetCertificate callback.
func (m *Manager) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	if c := m.cur.Load(); c != nil {
		return c, nil
	}
	return nil, errors.New("webhook serving certificate not ready")
}

// Start ensures the certificates now and then at every CheckInterval, and
// re-injects the CA whenever a labelled webhook configuration is added or
// changed, until ctx ends. It runs on every replica (each serves webhooks).
func (m *Manager) Start(ctx context.Context) error {
	t := time.NewTicker(m.opts.CheckInterval)
	defer t.Stop()
	changed := m.watchConfigurations(ctx)
	check := m.Ensure
	for {
		if err := check(ctx); err != nil {
			log.FromContext(ctx).Error(err, "ensure webhook certificates")
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			check = m.Ensure
		case <-changed:
			check = m.injectCA
		}
	}
}

// watchConfigurations signals (coalesced) every added or modified labelled
// webhook configuration, including our own patches (which then find
// nothing to change).
func (m *Manager) watchConfigurations(ctx context.Context) <-chan struct{} {
	changed := make(chan struct{}, 1)
	// A watch without a resourceVersion starts with an ADDED event per
	// existing configuration, so re-watching (after the server ends a
	// watch, or an error) also covers whatever happened in between.
	go wait.UntilWithContext(ctx, func(ctx context.Context) {
		w, err := m.c.Watch(ctx, &admissionregistrationv1.MutatingWebhookConfigurationList{}, client.MatchingLabels{InjectLabel: "true"})
		if err != nil {
			log.FromContext(ctx).Error(err, "watch webhook configurations")
			return
		}
		defer w.Stop()
		for ev := range w.ResultChan() {
			if ev.Type == watch.Added || ev.Type == watch.Modified {
				select {
				case changed <- struct{}{}:
				default: // a check is already due
				}
			}
		}
	}, time.Second)
	return changed
}

// NeedLeaderElection reports false: every replica needs certificates.
func (m *Manager) NeedLeaderElection() bool { return false }

// Ensure creates or renews the Secret as needed, loads the serving
// certificate and patches the CA into every labelled webhook configuration.
func (m *Manager) Ensure(ctx context.Context) error {
	for attempt := 0; ; attempt++ {
		err := m.ensureSecret(ctx)
		if err == nil {
			break
		}
		if attempt >= 3 || !(apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err)) {
			return err
		}
		// Another replica wrote the Secret first: use theirs.
	}
	return m.injectCA(ctx)
}

func (m *Manager) ensureSecret(ctx context.Context) error {
	var s corev1.Secret
	key := client.ObjectKey{Namespace: m.opts.Namespace, Name: m.opts.SecretName}
	err := m.c.Get(ctx, key, &s)
	exists := err == nil
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("get secret %s: %w", key, err)
	}
	now := m.opts.Now()
	read := maps.Clone(s.Data)
	if s.Data == nil {
		s.Data = map[string][]byte{}
	}
	ca, caKey, caErr := parsePair(s.Data[keyCACert], s.Data[keyCAKey])
	newCA := caErr != nil || now.Add(m.opts.Validity).After(ca.NotAfter)
	if newCA {
		// No CA, or it would expire before a fresh serving certificate.
		if ca, caKey, err = issueCA(now, m.opts.CAValidity); err != nil {
			return err
		}
		s.Data[keyCAKey] = encodeKey(caKey)
		log.FromContext(ctx).Info("issued webhook CA", "secret", key.String(), "notAfter", ca.NotAfter)
	}
	s.Data[keyCACert] = bundle(ca, s.Data[keyCACert], now)
	leaf, _, leafErr := parsePair(s.Data[keyTLSCert], s.Data[keyTLSKey])
	usable := leafErr == nil && m.usable(leaf, s.Data[keyCACert], now)
	// A new CA reaches the caBundles only at the end of the round that
	// issued it (and the API server a moment later), perhaps the round of
	// another replica: keep serving a certificate signed by the previous CA,
	// which stays in the bundle, until every labelled configuration trusts
	// the new one.
	if !usable || !newCA && m.stale(leaf, ca, now) && (leaf.CheckSignatureFrom(ca) == nil || m.trustedEverywhere(ctx, ca)) {
		certPEM, keyPEM, err := m.newServing(ca, caKey, now)
		if err != nil {
			return err
		}
		s.Data[keyTLSCert], s.Data[keyTLSKey] = certPEM, keyPEM
		log.FromContext(ctx).Info("issued webhook serving certificate", "secret", key.String(), "notAfter", now.Add(m.opts.Validity).UTC())
	}
	if !maps.EqualFunc(read, s.Data, bytes.Equal) {
		if exists {
			err = m.c.Update(ctx, &s)
		} else {
			s.ObjectMeta = metav1.ObjectMeta{Namespace: m.opts.Namespace, Name: m.opts.SecretName}
			s.Type = corev1.SecretTypeTLS
			err = m.c.Create(ctx, &s)
		}
		if err != nil {
			return fmt.Errorf("write secret %s: %w", key, err)
		}
	}
	pair, err := tls.X509KeyPair(s.Data[keyTLSCert], s.Data[keyTLSKey])
	if err != nil {
		return fmt.Errorf("load serving certificate from secret %s: %w", key, err)
	}
	m.cur.Store(&pair)
	return nil
}

// trustedEverywhere reports whether the caBundle of every webhook of every
// labelled configuration holds ca. An error reads as no: the caller then
// keeps a certificate that still verifies.
func (m *Manager) trustedEverywhere(ctx context.Context, ca *x509.Certificate) bool {
	var list admissionregistrationv1.MutatingWebhookConfigurationList
	if err := m.c.List(ctx, &list, client.MatchingLabels{InjectLabel: "true"}); err != nil {
		log.FromContext(ctx).Error(err, "list webhook configurations before moving to the new CA")
		return false
	}
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Raw})
	for _, wc := range list.Items {
		for _, w := range wc.Webhooks {
			if !bytes.Contains(w.ClientConfig.CABundle, caPEM) {
				return false
			}
		}
	}
	return true
}

// usable reports whether leaf has the configured SANs and verifies against
// the CAs of bundlePEM until the next check.
func (m *Manager) usable(leaf *x509.Certificate, bundlePEM []byte, now time.Time) bool {
	if !slices.Equal(leaf.DNSNames, m.opts.DNSNames) || !slices.EqualFunc(leaf.IPAddresses, m.opts.IPs, net.IP.Equal) {
		return false
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(bundlePEM)
	_, err := leaf.Verify(x509.VerifyOptions{
		Roots: roots, CurrentTime: now.Add(m.opts.CheckInterval), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
	return err == nil
}

// stale reports whether a usable leaf is due for renewal: less than a third
// of its validity left, or not signed by the current CA.
func (m *Manager) stale(leaf, ca *x509.Certificate, now time.Time) bool {
	return leaf.NotAfter.Sub(now) < m.opts.Validity/3 || leaf.CheckSignatureFrom(ca) != nil
}

func (m *Manager) newServing(ca *x509.Certificate, caKey *ecdsa.PrivateKey, now time.Time) ([]byte, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	serial, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: "kvnet-webhook"},
		DNSNames:     m.opts.DNSNames,
		IPAddresses:  m.opts.IPs,
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(m.opts.Validity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, nil, fmt.Errorf("sign serving certificate: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), encodeKey(key), nil
}

func issueCA(now time.Time, validity time.Duration) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	serial, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: fmt.Sprintf("kvnet-webhook-ca@%d", now.Unix())},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(validity),
		IsCA:                  true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, fmt.Errorf("self-sign CA: %w", err)
	}
	ca, err := x509.ParseCertificate(der)
	return ca, key, err
}

// bundle returns ca's PEM followed by the other still-valid certificates of
// old: clients keep trusting what a previous CA signed until it expires.
func bundle(ca *x509.Certificate, old []byte, now time.Time) []byte {
	out := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Raw})
	for rest := old; ; {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			return out
		}
		if c, err := x509.ParseCertificate(b.Bytes); err == nil && now.Before(c.NotAfter) && !c.Equal(ca) {
			out = append(out, pem.EncodeToMemory(b)...)
		}
	}
}

func encodeKey(k *ecdsa.PrivateKey) []byte {
	der, _ := x509.MarshalECPrivateKey(k)
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der})
}

// parsePair returns the first certificate of certPEM and its key.
func parsePair(certPEM, keyPEM []byte) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	cb, _ := pem.Decode(certPEM)
	kb, _ := pem.Decode(keyPEM)
	if cb == nil || kb == nil {
		return nil, nil, errors.New("missing certificate or key")
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, nil, err
	}
	key, err := x509.ParseECPrivateKey(kb.Bytes)
	if err != nil {
		return nil, nil, err
	}
	return cert, key, nil
}

// CABundle returns the PEM CA bundle from the Secret.
func (m *Manager) CABundle(ctx context.Context) ([]byte, error) {
	var s corev1.Secret
	if err := m.c.Get(ctx, client.ObjectKey{Namespace: m.opts.Namespace, Name: m.opts.SecretName}, &s); err != nil {
		return nil, err
	}
	return s.Data[keyCACert], nil
}

func (m *Manager) injectCA(ctx context.Context) error {
	caPEM, err := m.CABundle(ctx)
	if err != nil {
		return err
	}
	var list admissionregistrationv1.MutatingWebhookConfigurationList
	if err := m.c.List(ctx, &list, client.MatchingLabels{InjectLabel: "true"}); err != nil {
		return fmt.Errorf("list webhook configurations: %w", err)
	}
	for i := range list.Items {
		wc := &list.Items[i]
		patch := client.MergeFrom(wc.DeepCopy())
		changed := false
		for j := range wc.Webhooks {
			if !bytes.Equal(wc.Webhooks[j].ClientConfig.CABundle, caPEM) {
				wc.Webhooks[j].ClientConfig.CABundle = caPEM
				changed = true
			}
		}
		if !changed {
			continue
		}
		if err := m.c.Patch(ctx, wc, patch); err != nil {
			return fmt.Errorf("patch caBundle of %s: %w", wc.Name, err)
		}
		log.FromContext(ctx).Info("patched webhook caBundle", "configuration", wc.Name)
	}
	return nil
}
