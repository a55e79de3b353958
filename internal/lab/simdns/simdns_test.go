package simdns_test

import (
	"context"
	"errors"
	"net"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"kvnet.io/kvnet/internal/lab/simdns"
)

// TestResolve: Go's DNS client, pointed at the server, resolves a
// Service's cluster IPs (both families) by its full name, case aside; an
// unknown Service, a name outside the cluster domain and a malformed
// Service name are NXDOMAIN.
func TestResolve(t *testing.T) {
	svc := func(ns, name string, ips ...string) *corev1.Service {
		return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: corev1.ServiceSpec{ClusterIPs: ips}}
	}
	c := fake.NewClientBuilder().WithObjects(svc("udn-demo", "vm-a-web", "10.96.0.20", "fd00:96::20"), svc("kube-system", "kube-dns", "10.96.0.10")).Build()
	s, err := simdns.Listen("", "127.0.0.1:0", c, "cluster.local")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = s.Serve(ctx) }()
	r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "udp", s.Addr().String())
	}}
	lctx, lcancel := context.WithTimeout(ctx, 5*time.Second)
	defer lcancel()
	got, err := r.LookupHost(lctx, "VM-A-web.udn-demo.svc.cluster.local")
	slices.Sort(got)
	if err != nil || !slices.Equal(got, []string{"10.96.0.20", "fd00:96::20"}) {
		t.Errorf("LookupHost(vm-a-web) = %v, %v", got, err)
	}
	for _, name := range []string{"nope.udn-demo.svc.cluster.local", "example.com", "a.b.c.svc.cluster.local", "svc.cluster.local"} {
		_, err := r.LookupHost(lctx, name)
		var dnsErr *net.DNSError
		if !errors.As(err, &dnsErr) || !dnsErr.IsNotFound {
			t.Errorf("LookupHost(%s) = %v, want not found", name, err)
		}
	}
}
