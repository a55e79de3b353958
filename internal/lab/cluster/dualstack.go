package cluster

import (
	"context"
	"fmt"
	"net/netip"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

// ScenarioDualStack runs on a dual-stack cluster only
// (ScenarioTarget.DualStack, make cluster-up CLUSTER_IP_FAMILY=dual):
// pods of a dual-stack primary Layer2 UDN on two nodes reach each other
// over IPv4 and IPv6 at their ovn-udn1 addresses, and a RequireDualStack
// Service over them resolves by name to both its cluster IPs and answers
// at each.
const ScenarioDualStack = "dual-stack-udn"

const nsDual = "scn-dual" // primary Layer2 UDN "net", both families: pods d-1, d-2, Service web

var (
	dualSubnet4 = netip.MustParsePrefix("10.206.0.0/24")
	dualSubnet6 = netip.MustParsePrefix("fd10:206::/64")
)

// createDualStack makes the dual-stack scenario's namespace, UDN,
// Service and pods.
func (s *scenarios) createDualStack(ctx context.Context) error {
	cs := s.t.Client
	o := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: nsDual, Labels: map[string]string{ScenarioLabel: "", primaryLabel: ""}}}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, o, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("scenarios: create namespace %q: %w", nsDual, err)
	}
	udn := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "k8s.ovn.org/v1", "kind": "UserDefinedNetwork",
		"metadata": map[string]any{"name": "net", "namespace": nsDual},
		"spec": map[string]any{"topology": "Layer2", "layer2": map[string]any{
			"role": "Primary", "subnets": []any{dualSubnet4.String(), dualSubnet6.String()},
		}},
	}}
	if _, err := s.dyn.Resource(udnGVR).Namespace(nsDual).Create(ctx, udn, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("scenarios: create UserDefinedNetwork %s/net: %w", nsDual, err)
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: nsDual},
		Spec: corev1.ServiceSpec{
			IPFamilyPolicy: ptr.To(corev1.IPFamilyPolicyRequireDualStack),
			IPFamilies:     []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol},
			Selector:       map[string]string{"app": "web"},
			Ports:          []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromString("http")}},
		},
	}
	if _, err := cs.CoreV1().Services(nsDual).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("scenarios: create Service %s/web: %w", nsDual, err)
	}
	if err := s.waitNamespaces(ctx, map[string]string{nsDual: "net"}); err != nil {
		return err
	}
	for i, name := range []string{"d-1", "d-2"} {
		p := webPod(nsDual, name, s.nodes[i], s.t.Image)
		p.Labels[podLabel] = name
		s.createPod(ctx, p)
	}
	return nil
}

// dualStack: see ScenarioDualStack.
func (s *scenarios) dualStack(ctx context.Context) (string, error) {
	ps, err := s.need(ctx, nsDual+"/d-1", nsDual+"/d-2")
	if err != nil {
		return "", err
	}
	var v4, v6 [2]netip.Addr
	for i, p := range ps {
		if v4[i], err = p.addr(primaryInterface, dualSubnet4); err != nil {
			return "", err
		}
		if v6[i], err = p.addr6(primaryInterface, dualSubnet6); err != nil {
			return "", err
		}
	}
	var seen []string
	for i, p := range ps {
		peer := ps[1-i]
		for _, a := range []netip.Addr{v4[1-i], v6[1-i]} {
			if _, err := s.reach(ctx, p, webURL(a), "hello from "+peer.name); err != nil {
				return strings.Join(seen, "; "), err
			}
			seen = append(seen, fmt.Sprintf("%s -> %s", p.name, a))
		}
	}
	svc, err := s.t.Client.CoreV1().Services(nsDual).Get(ctx, "web", metav1.GetOptions{})
	if err != nil {
		return "", err
	}
	if len(svc.Spec.ClusterIPs) != 2 {
		return "", fmt.Errorf("service %s/web: cluster IPs %v, want one of each family", nsDual, svc.Spec.ClusterIPs)
	}
	name := "web." + nsDual + ".svc.cluster.local"
	for _, ip := range svc.Spec.ClusterIPs {
		if err := poll(ctx, reachTimeout, func(ctx context.Context) error { return s.resolves(ctx, ps[0], name, ip) }); err != nil {
			return strings.Join(seen, "; "), err
		}
		a, err := netip.ParseAddr(ip)
		if err != nil {
			return "", err
		}
		url := "http://" + netip.AddrPortFrom(a, 80).String() + "/"
		if _, err := reachAll(ctx, serviceTries, func(ctx context.Context) (string, error) {
			out, errOut, err := s.fetch(ctx, ps[0], url, reachTry)
			if err != nil {
				return "", fmt.Errorf("%s: httpget %s: %v: %s", ps[0], url, err, strings.TrimSpace(errOut))
			}
			return strings.TrimSpace(out), nil
		}, []string{"hello from d-1", "hello from d-2"}); err != nil {
			return strings.Join(seen, "; "), fmt.Errorf("service %s/web at %s: %w", nsDual, ip, err)
		}
	}
	return fmt.Sprintf("d-1 %s %s, d-2 %s %s: %s; %s resolves to %s, each answered by both backends",
		v4[0], v6[0], v4[1], v6[1], strings.Join(seen, ", "), name, strings.Join(svc.Spec.ClusterIPs, " and ")), nil
}
