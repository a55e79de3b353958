package controlplane

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// InCluster makes the API server serve clients inside a cluster: pods
// that reach it through the kubernetes Service with a ServiceAccount
// token, as the real-cluster lab's CoreDNS, Flannel and kvnet do. The
// simulated lab and the tests leave it nil: envtest's defaults (loopback
// only, no ServiceAccount admission) stay as they are.
type InCluster struct {
	// Address is where the API server listens and what it advertises:
	// the kubernetes Endpoints point there, so pods must reach it (the
	// real cluster's host bridge address). Every client, the host's
	// included, connects there.
	Address netip.Addr
	// ServiceIP is the kubernetes Service's cluster IP (the first of the
	// Service range), named in the serving certificate with Address.
	ServiceIP netip.Addr
}

// Files of an InCluster control plane, in its certificate directory. The
// envtest names (apiserver.crt, sa-signer.*) make envtest use them rather
// than write its own.
const (
	caCertFile      = "ca.crt"
	servingCertFile = "apiserver.crt"
	servingKeyFile  = "apiserver.key"
	saSignerKeyFile = "sa-signer.key"
	saSignerPubFile = "sa-signer.crt"
	// The front proxy: the API server proxies requests to aggregated
	// APIs (KubeVirt's virt-api) with this client certificate and the
	// user in request headers, which the aggregated server trusts from
	// requestheader-client-ca-file in the extension-apiserver-authentication
	// ConfigMap; virt-api refuses to start without it.
	frontProxyCAFile   = "front-proxy-ca.crt"
	frontProxyCertFile = "front-proxy-client.crt"
	frontProxyKeyFile  = "front-proxy-client.key"
	frontProxyUser     = "front-proxy-client"
)

// inClusterControllers are the kube-controller-manager controllers that
// in-cluster clients need: a default ServiceAccount in every namespace,
// tokens for ServiceAccount token Secrets, and the kube-root-ca.crt
// ConfigMap (the CA a pod verifies the API server with).
var inClusterControllers = []string{"serviceaccount", "serviceaccount-token", "root-ca-cert-publisher"}

// validate checks an InCluster's fields.
func (ic *InCluster) validate() error {
	if !ic.Address.Is4() || ic.Address.IsUnspecified() || ic.Address.IsLoopback() {
		return fmt.Errorf("controlplane: in-cluster address %q: want a non-loopback IPv4 address pods can reach", ic.Address)
	}
	if !ic.ServiceIP.IsValid() {
		return fmt.Errorf("controlplane: in-cluster service IP %q: want the kubernetes Service's cluster IP", ic.ServiceIP)
	}
	return nil
}

// configure writes the serving certificate (signed by a CA of its own,
// naming Address, ServiceIP, the kubernetes Service's DNS names and the
// loopback) and the service-account signing key into certDir, and sets
// the API server up to listen on and advertise Address with the
// ServiceAccount admission plugin on.
func (ic *InCluster) configure(s *envtest.APIServer, certDir string) error {
	if err := ic.validate(); err != nil {
		return err
	}
	caPEM, err := ic.writeCerts(certDir)
	if err != nil {
		return err
	}
	port, err := freePort(ic.Address)
	if err != nil {
		return err
	}
	// envtest takes both for its URLs (kubeconfigs, health check) and
	// bind-address; the CA is what its clients trust.
	s.SecureServing.Address = ic.Address.String()
	s.SecureServing.Port = strconv.Itoa(port)
	s.SecureServing.CA = caPEM
	args := s.Configure()
	args.Set("advertise-address", ic.Address.String())
	// envtest disables the ServiceAccount admission plugin (no
	// controller creates default ServiceAccounts there); here the
	// serviceaccount controller does, and pods need their token volume.
	args.Disable("disable-admission-plugins")
	args.Set("requestheader-client-ca-file", filepath.Join(certDir, frontProxyCAFile))
	args.Set("requestheader-allowed-names", frontProxyUser)
	args.Set("requestheader-username-headers", "X-Remote-User")
	args.Set("requestheader-group-headers", "X-Remote-Group")
	args.Set("requestheader-extra-headers-prefix", "X-Remote-Extra-")
	args.Set("proxy-client-cert-file", filepath.Join(certDir, frontProxyCertFile))
	args.Set("proxy-client-key-file", filepath.Join(certDir, frontProxyKeyFile))
	return nil
}

// writeCerts writes the CA, the serving certificate and key and the
// service-account signing keys into certDir; it returns the CA's PEM.
func (ic *InCluster) writeCerts(certDir string) ([]byte, error) {
	caKey, caCert, caDER, err := newCA()
	if err != nil {
		return nil, err
	}
	ips := []net.IP{net.ParseIP(ic.Address.String()), net.ParseIP(ic.ServiceIP.String()), net.IPv4(127, 0, 0, 1)}
	dns := []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"}
	servingKey, servingDER, err := newLeaf(caKey, caCert, "kube-apiserver", ips, dns)
	if err != nil {
		return nil, err
	}
	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	saPub, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		return nil, err
	}
	fpKey, fpCert, fpDER, err := newCA()
	if err != nil {
		return nil, err
	}
	fpClientKey, fpClientDER, err := newLeafFor(fpKey, fpCert, frontProxyUser, nil, nil, x509.ExtKeyUsageClientAuth)
	if err != nil {
		return nil, err
	}
	files := map[string][]byte{
		caCertFile:         pemBlock("CERTIFICATE", caDER),
		servingCertFile:    append(pemBlock("CERTIFICATE", servingDER), pemBlock("CERTIFICATE", caDER)...),
		saSignerPubFile:    pemBlock("PUBLIC KEY", saPub),
		frontProxyCAFile:   pemBlock("CERTIFICATE", fpDER),
		frontProxyCertFile: pemBlock("CERTIFICATE", fpClientDER),
	}
	for name, key := range map[string]*ecdsa.PrivateKey{servingKeyFile: servingKey, saSignerKeyFile: saKey, frontProxyKeyFile: fpClientKey} {
		der, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			return nil, err
		}
		files[name] = pemBlock("EC PRIVATE KEY", der)
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(certDir, name), b, 0o600); err != nil {
			return nil, fmt.Errorf("controlplane: in-cluster %s: %w", name, err)
		}
	}
	return files[caCertFile], nil
}

// inClusterControllerManagerArgs are kube-controller-manager's flags for an
// InCluster control plane: the CA it publishes in kube-root-ca.crt and
// the key it signs ServiceAccount token Secrets with.
func inClusterControllerManagerArgs(certDir string) []string {
	return []string{
		"--root-ca-file=" + filepath.Join(certDir, caCertFile),
		"--service-account-private-key-file=" + filepath.Join(certDir, saSignerKeyFile),
	}
}

// CACertFile is the path of the CA that signed an InCluster control
// plane's serving certificate ("" without InCluster).
func (cp *ControlPlane) CACertFile() string {
	if !cp.inCluster {
		return ""
	}
	return filepath.Join(cp.certDir, caCertFile)
}

func newCA() (*ecdsa.PrivateKey, *x509.Certificate, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "kvnet-lab cluster CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("controlplane: CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, nil, err
	}
	return key, cert, der, nil
}

func newLeaf(caKey *ecdsa.PrivateKey, ca *x509.Certificate, cn string, ips []net.IP, dns []string) (*ecdsa.PrivateKey, []byte, error) {
	return newLeafFor(caKey, ca, cn, ips, dns, x509.ExtKeyUsageServerAuth)
}

// newLeafFor is newLeaf for the extended key usage use (server or client).
func newLeafFor(caKey *ecdsa.PrivateKey, ca *x509.Certificate, cn string, ips []net.IP, dns []string, use x509.ExtKeyUsage) (*ecdsa.PrivateKey, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return nil, nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{use},
		IPAddresses:  ips,
		DNSNames:     dns,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, nil, fmt.Errorf("controlplane: certificate %s: %w", cn, err)
	}
	return key, der, nil
}

func pemBlock(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}

// freePort returns a TCP port free on addr now.
func freePort(addr netip.Addr) (int, error) {
	ln, err := net.Listen("tcp", netip.AddrPortFrom(addr, 0).String())
	if err != nil {
		return 0, fmt.Errorf("controlplane: in-cluster address %s: %w", addr, err)
	}
	defer func() { _ = ln.Close() }()
	return ln.Addr().(*net.TCPAddr).Port, nil
}
