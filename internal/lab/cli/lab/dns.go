package lab

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"kvnet.io/kvnet/internal/lab/simdns"
	"kvnet.io/kvnet/internal/lab/simnet"
	"kvnet.io/kvnet/internal/node"
)

// The lab's cluster DNS: the Service kube-system/kube-dns at the usual
// address, whose one endpoint is the simdns server in the lab's "internet"
// namespace (port dnsPort), as CoreDNS's pods would be on a cluster.
const (
	clusterDNSIP  = "10.96.0.10"
	dnsPort       = 53
	dnsSliceName  = "kube-dns-lab"
	dnsManagedBy  = "kvnet-lab"
	clusterDomain = "cluster.local"
)

// startClusterDNS runs the lab's cluster DNS in the namespace at extNS
// until ctx ends.
func startClusterDNS(ctx context.Context, c client.Client, extNS string) (*simdns.Server, error) {
	addr := fmt.Sprintf("%s:%d", simnet.ExternalIP, dnsPort)
	s, err := simdns.Listen(extNS, addr, c, clusterDomain)
	if err != nil {
		return nil, err
	}
	go func() {
		if err := s.Serve(ctx); err != nil {
			fmt.Println("kvnet-lab: cluster DNS stopped:", err)
		}
	}()
	return s, nil
}

// ensureClusterDNSObjects creates the cluster DNS Service and its
// EndpointSlice unless they exist (the lab keeps its etcd across runs).
// The Service asks for the usual address first, before anything else can
// take it; should it be taken all the same, it gets another.
func ensureClusterDNSObjects(ctx context.Context, c client.Client) error {
	dns := node.DefaultClusterDNS
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: dns.Namespace, Name: dns.Name, Labels: map[string]string{"k8s-app": "kube-dns"}},
		Spec: corev1.ServiceSpec{ClusterIP: clusterDNSIP, ClusterIPs: []string{clusterDNSIP},
			Ports: []corev1.ServicePort{{Name: "dns", Port: dnsPort, Protocol: corev1.ProtocolUDP}}},
	}
	err := c.Create(ctx, svc)
	if apierrors.IsInvalid(err) { // the address is taken
		svc.Spec.ClusterIP, svc.Spec.ClusterIPs = "", nil
		err = c.Create(ctx, svc)
	}
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create Service %s: %w", dns, err)
	}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: dns.Namespace, Name: dnsSliceName,
			Labels: map[string]string{discoveryv1.LabelServiceName: dns.Name, discoveryv1.LabelManagedBy: dnsManagedBy}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{simnet.ExternalIP.String()},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}},
		Ports: []discoveryv1.EndpointPort{{Name: ptr.To("dns"), Protocol: ptr.To(corev1.ProtocolUDP), Port: ptr.To(int32(dnsPort))}},
	}
	if err := c.Create(ctx, slice); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create EndpointSlice %s/%s: %w", dns.Namespace, dnsSliceName, err)
	}
	return nil
}

// clusterDNSName is the cluster DNS Service's namespace/name.
func clusterDNSName() string { return node.DefaultClusterDNS.String() }
