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
	"math/big"
	"net"
	"slices"
	"sync/atomic"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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

// InjectLabel marks the webhook configurations whose caBundle kvnet keeps
// current.
const InjectLabel = "kvnet.io/inject-ca"

// Options configures the certificates.
type Options struct {
	Namespace  string // of the Secret
	SecretName string
	DNSNames   []string // serving certificate SANs, e.g. kvnet-webhook.kvnet-system.svc
	IPs        []net.IP // serving certificate IP SANs (the lab serves on 127.0.0.1)
	// Validity of the serving certificate (default 1 year; the CA lives 10
	// times longer). It is renewed once less than a third remains.
	Validity time.Duration
	// CheckInterval between renewal checks (default 1 hour).
	CheckInterval time.Duration
}

// Manager keeps the certificates current. GetCertificate serves the current
// serving certificate to the TLS server.
type Manager struct {
	c    client.Client
	opts Options
	cur  atomic.Pointer[tls.Certificate]
}

// New returns a manager using c (an uncached client is best: it runs before
// caches start).
func New(c client.Client, opts Options) *Manager {
	if opts.Validity == 0 {
		opts.Validity = 365 * 24 * time.Hour
	}
	if opts.CheckInterval == 0 {
		opts.CheckInterval = time.Hour
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

// Start ensures the certificates now and then at every CheckInterval, until
// ctx ends. It runs on every replica (each serves webhooks).
func (m *Manager) Start(ctx context.Context) error {
	t := time.NewTicker(m.opts.CheckInterval)
	defer t.Stop()
	for {
		if err := m.Ensure(ctx); err != nil {
			log.FromContext(ctx).Error(err, "ensure webhook certificates")
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
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
	now := time.Now()
	ca, caKey, caErr := parsePair(s.Data[keyCACert], s.Data[keyCAKey])
	if caErr != nil || now.Add(m.opts.Validity).After(ca.NotAfter) {
		// No CA, or it would expire before a fresh serving certificate:
		// a new CA; the old one stays in the bundle until it expires.
		if ca, caKey, err = newCA(now, 10*m.opts.Validity); err != nil {
			return err
		}
		s.Data = map[string][]byte{keyCACert: bundle(ca, s.Data[keyCACert], now), keyCAKey: encodeKey(caKey)}
	}
	leaf, _, leafErr := parsePair(s.Data[keyTLSCert], s.Data[keyTLSKey])
	if leafErr != nil || m.needsRenewal(leaf, ca, now) {
		certPEM, keyPEM, err := m.newServing(ca, caKey, now)
		if err != nil {
			return err
		}
		s.Data[keyTLSCert], s.Data[keyTLSKey] = certPEM, keyPEM
		s.Type = corev1.SecretTypeTLS
		if exists {
			err = m.c.Update(ctx, &s)
		} else {
			s.ObjectMeta = metav1.ObjectMeta{Namespace: m.opts.Namespace, Name: m.opts.SecretName}
			err = m.c.Create(ctx, &s)
		}
		if err != nil {
			return fmt.Errorf("write secret %s: %w", key, err)
		}
		log.FromContext(ctx).Info("issued webhook serving certificate", "secret", key.String(), "notAfter", now.Add(m.opts.Validity).UTC())
	}
	pair, err := tls.X509KeyPair(s.Data[keyTLSCert], s.Data[keyTLSKey])
	if err != nil {
		return fmt.Errorf("load serving certificate from secret %s: %w", key, err)
	}
	m.cur.Store(&pair)
	return nil
}

func (m *Manager) needsRenewal(leaf, ca *x509.Certificate, now time.Time) bool {
	if leaf.NotAfter.Sub(now) < m.opts.Validity/3 {
		return true
	}
	if leaf.CheckSignatureFrom(ca) != nil {
		return true
	}
	if !slices.Equal(leaf.DNSNames, m.opts.DNSNames) || len(leaf.IPAddresses) != len(m.opts.IPs) {
		return true
	}
	for i, ip := range m.opts.IPs {
		if !leaf.IPAddresses[i].Equal(ip) {
			return true
		}
	}
	return false
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

func newCA(now time.Time, validity time.Duration) (*x509.Certificate, *ecdsa.PrivateKey, error) {
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

// bundle returns ca's PEM followed by the still-valid certificates of old.
func bundle(ca *x509.Certificate, old []byte, now time.Time) []byte {
	out := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Raw})
	for rest := old; ; {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			return out
		}
		if c, err := x509.ParseCertificate(b.Bytes); err == nil && now.Before(c.NotAfter) {
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
