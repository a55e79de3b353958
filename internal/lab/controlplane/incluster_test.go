package controlplane

import (
	"crypto/tls"
	"crypto/x509"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The serving certificate verifies, against the CA written beside it, for
// every name an in-cluster or host client uses.
func TestInClusterServingCertificate(t *testing.T) {
	ic := &InCluster{Address: netip.MustParseAddr("10.89.0.1"), ServiceIP: netip.MustParseAddr("10.96.0.1")}
	dir := t.TempDir()
	caPEM, err := ic.writeCerts(dir)
	if err != nil {
		t.Fatal(err)
	}
	onDisk, err := os.ReadFile(filepath.Join(dir, caCertFile))
	if err != nil {
		t.Fatal(err)
	}
	if string(onDisk) != string(caPEM) {
		t.Fatalf("%s differs from the CA returned", caCertFile)
	}
	pair, err := tls.LoadX509KeyPair(filepath.Join(dir, servingCertFile), filepath.Join(dir, servingKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(caPEM) {
		t.Fatal("no certificate in the CA PEM")
	}
	for _, name := range []string{"10.89.0.1", "10.96.0.1", "127.0.0.1", "localhost", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"} {
		if _, err := leaf.Verify(x509.VerifyOptions{DNSName: name, Roots: roots}); err != nil {
			t.Errorf("serving certificate for %s: %v", name, err)
		}
	}
	if _, err := leaf.Verify(x509.VerifyOptions{DNSName: "10.0.0.1", Roots: roots}); err == nil {
		t.Error("serving certificate verifies for 10.0.0.1, which it does not name")
	}
	for _, f := range []string{saSignerKeyFile, saSignerPubFile} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Errorf("service-account signer: %v", err)
		}
	}
	// The front proxy's client certificate verifies as a client, named
	// as requestheader-allowed-names says, against its own CA.
	fp, err := tls.LoadX509KeyPair(filepath.Join(dir, frontProxyCertFile), filepath.Join(dir, frontProxyKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	fpLeaf, err := x509.ParseCertificate(fp.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	fpCA, err := os.ReadFile(filepath.Join(dir, frontProxyCAFile))
	if err != nil {
		t.Fatal(err)
	}
	fpRoots := x509.NewCertPool()
	fpRoots.AppendCertsFromPEM(fpCA)
	if _, err := fpLeaf.Verify(x509.VerifyOptions{Roots: fpRoots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil || fpLeaf.Subject.CommonName != frontProxyUser {
		t.Errorf("front-proxy client certificate %q: %v", fpLeaf.Subject.CommonName, err)
	}
	if _, err := fpLeaf.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err == nil {
		t.Error("front-proxy client certificate verifies against the cluster CA: it must have its own")
	}
}

func TestInClusterRejectsBadAddresses(t *testing.T) {
	for _, tc := range []struct {
		ic   InCluster
		want string
	}{
		{InCluster{ServiceIP: netip.MustParseAddr("10.96.0.1")}, `in-cluster address "invalid IP"`},
		{InCluster{Address: netip.MustParseAddr("127.0.0.1"), ServiceIP: netip.MustParseAddr("10.96.0.1")}, `in-cluster address "127.0.0.1"`},
		{InCluster{Address: netip.MustParseAddr("10.89.0.1")}, `in-cluster service IP "invalid IP"`},
	} {
		err := tc.ic.validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: got %v, want an error with %q", tc.ic, err, tc.want)
		}
	}
}
