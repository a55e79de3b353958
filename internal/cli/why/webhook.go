package why

import (
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net/url"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"

	"kvnet.io/kvnet/internal/k8s/certs"
)

// kvnet's webhooks (config/webhook) and the Secret kvnet-controller keeps
// its CA and serving certificate in (internal/k8s/manager, internal/k8s/certs).
const (
	webhookLauncher = "ipam-claims.kvnet.io"
	webhookVMs      = "mutatevirtualmachines.kvnet.io"
	certSecretName  = "kvnet-webhook-certs"
	secretCertKey   = "tls.crt"
)

// webhookFacts are what the webhook links read.
type webhookFacts struct {
	Configs []admissionregistrationv1.MutatingWebhookConfiguration
	// Namespace is kvnet's namespace: where the Secret is when a webhook
	// calls a URL rather than the Service (the lab, tests).
	Namespace string
	// Secrets, Services by "<ns>/<name>"; nil: not found.
	Secrets  map[string]*corev1.Secret
	Services map[string]*corev1.Service
	// ReadyEndpoints counts the ready endpoints per Service key.
	ReadyEndpoints map[string]int
	Now            time.Time
}

// findWebhook returns the configuration holding the named webhook.
func (f *webhookFacts) findWebhook(name string) (*admissionregistrationv1.MutatingWebhookConfiguration, *admissionregistrationv1.MutatingWebhook) {
	for i := range f.Configs {
		wc := &f.Configs[i]
		for j := range wc.Webhooks {
			if wc.Webhooks[j].Name == name {
				return wc, &wc.Webhooks[j]
			}
		}
	}
	return nil, nil
}

// secretKey is where the serving certificate of a webhook lives.
func (f *webhookFacts) secretKey(w *admissionregistrationv1.MutatingWebhook) string {
	if s := w.ClientConfig.Service; s != nil {
		return s.Namespace + "/" + certSecretName
	}
	return f.Namespace + "/" + certSecretName
}

// serverName is the name the API server verifies the webhook's
// certificate for.
func serverName(w *admissionregistrationv1.MutatingWebhook) string {
	if s := w.ClientConfig.Service; s != nil {
		return s.Name + "." + s.Namespace + ".svc"
	}
	if w.ClientConfig.URL != nil {
		if u, err := url.Parse(*w.ClientConfig.URL); err == nil {
			return u.Hostname()
		}
	}
	return ""
}

var webhookPurpose = map[string]string{
	webhookLauncher: "adds a VM's IPAMClaim references to its virt-launcher pods",
	webhookVMs:      "gives VMs their MACs from kvnet's pool",
}

// checkWebhook checks that each named webhook is registered and that the
// API server can verify kvnet's serving certificate with its caBundle.
func checkWebhook(r *Report, f *webhookFacts, names []string) bool {
	for _, name := range names {
		wc, w := f.findWebhook(name)
		if w == nil {
			return r.fail("webhook", name+": not registered", WebhookNotRegistered,
				"apply kvnet's webhook configuration (config/webhook: MutatingWebhookConfiguration kvnet-mutator, labelled "+certs.InjectLabel+"=true); kvnet-controller then injects its CA",
				"no MutatingWebhookConfiguration has kvnet's webhook %s, which %s; without it VMs are admitted without them (a VM then gets new IPs on every start, or a MAC outside the pool)", name, webhookPurpose[name])
		}
		where := fmt.Sprintf("webhook %s of MutatingWebhookConfiguration %s", name, wc.Name)
		injectFix := "kvnet-controller writes the caBundle of every configuration labelled " + certs.InjectLabel + "=true within a second: "
		if wc.Labels[certs.InjectLabel] != "true" {
			injectFix += fmt.Sprintf("add the label (kubectl label mutatingwebhookconfiguration %s %s=true)", wc.Name, certs.InjectLabel)
		} else {
			injectFix += "check that kvnet-controller runs and its log for \"patch caBundle\" errors"
		}
		if svc := w.ClientConfig.Service; svc != nil {
			key := svc.Namespace + "/" + svc.Name
			if f.Services[key] == nil {
				return r.fail("webhook", name+": Service "+key+" not found", WebhookServiceMissing,
					"apply config/webhook (Service kvnet-webhook selecting the kvnet-controller pods)",
					"%s calls Service %s, which does not exist: every admission it handles fails (failurePolicy %s)", where, key, policy(w))
			}
			if f.ReadyEndpoints[key] == 0 {
				return r.fail("webhook", name+": Service "+key+" has no ready endpoint", WebhookNoEndpoints,
					"get kvnet-controller Ready: kubectl -n "+svc.Namespace+" get pods -l app.kubernetes.io/name=kvnet-controller; a replica is Ready once its caches and MAC index are built (the leader also once its allocators are rebuilt)",
					"%s calls Service %s, which has no ready endpoint: no kvnet-controller replica is Ready, so admissions fail (failurePolicy %s)", where, key, policy(w))
			}
		}
		if len(w.ClientConfig.CABundle) == 0 {
			return r.fail("webhook", name+": empty caBundle", WebhookCABundleMismatch, injectFix,
				"%s has an empty caBundle: the API server cannot verify kvnet's certificate and the webhook's calls fail", where)
		}
		key := f.secretKey(w)
		secret := f.Secrets[key]
		if secret == nil {
			return r.fail("webhook", name+": Secret "+key+" not found", WebhookCertMissing,
				"kvnet-controller issues the certificate when it starts: check that it runs (and, for a controller in another namespace, pass --kvnet-namespace)",
				"Secret %s with kvnet's serving certificate does not exist: kvnet-controller has not issued it, so it serves no webhook", key)
		}
		leaf, err := firstCert(secret.Data[secretCertKey])
		if err != nil {
			return r.fail("webhook", name+": Secret "+key+" unusable", WebhookCertMissing,
				"delete the Secret: kvnet-controller issues a new CA and certificate and injects the CA",
				"Secret %s has no usable %s: %v", key, secretCertKey, err)
		}
		roots := x509.NewCertPool()
		if !roots.AppendCertsFromPEM(w.ClientConfig.CABundle) {
			return r.fail("webhook", name+": caBundle unreadable", WebhookCABundleMismatch, injectFix,
				"%s has a caBundle without a PEM certificate", where)
		}
		host := serverName(w)
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, DNSName: host, CurrentTime: f.Now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
			return r.fail("webhook", name+": caBundle does not verify the serving certificate", WebhookCABundleMismatch, injectFix,
				"the caBundle of %s does not verify the certificate kvnet serves (%s in Secret %s, for %q): %v. The API server refuses the connection and the webhook's calls fail", where, secretCertKey, key, host, err)
		}
		r.ok("webhook", "%s in %s: caBundle verifies the serving certificate (valid until %s)", name, wc.Name, leaf.NotAfter.UTC().Format(time.DateOnly))
	}
	return false
}

func policy(w *admissionregistrationv1.MutatingWebhook) string {
	if w.FailurePolicy == nil {
		return string(admissionregistrationv1.Fail)
	}
	return string(*w.FailurePolicy)
}

// firstCert parses the first certificate of a PEM bundle.
func firstCert(p []byte) (*x509.Certificate, error) {
	for rest := p; ; {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			return nil, fmt.Errorf("no PEM certificate")
		}
		if b.Type == "CERTIFICATE" {
			return x509.ParseCertificate(b.Bytes)
		}
	}
}
