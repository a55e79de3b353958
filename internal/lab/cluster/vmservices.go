package cluster

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// ScenarioVMNodePortLB: Services of the kinds that reach a VM from
// outside the cluster, selecting vm-m (on the persistent primary UDN):
// NodePort vm-m-np (externalTrafficPolicy Cluster) answers this host at
// every node's address; LoadBalancer vm-m-lb-local (policy Local, its
// status.loadBalancer.ingress written as a cloud's controller would)
// serves its healthCheckNodePort (200 at the VM's node, 503 elsewhere),
// answers through the VM's node and drops what comes through another;
// another tenant's pod reaches neither node port.
const ScenarioVMNodePortLB = "vm-nodeport-loadbalancer"

// createVMServices creates vm-m-np and vm-m-lb-local and writes the
// latter's load balancer address.
func (s *vmScenarios) createVMServices(ctx context.Context) error {
	cs := s.t.Client.CoreV1().Services(nsVM)
	for _, svc := range []struct {
		name   string
		typ    corev1.ServiceType
		policy corev1.ServiceExternalTrafficPolicy
	}{{"vm-m-np", corev1.ServiceTypeNodePort, corev1.ServiceExternalTrafficPolicyCluster}, {"vm-m-lb-local", corev1.ServiceTypeLoadBalancer, corev1.ServiceExternalTrafficPolicyLocal}} {
		o := &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: svc.name, Namespace: nsVM},
			Spec: corev1.ServiceSpec{
				Type: svc.typ, ExternalTrafficPolicy: svc.policy,
				Selector: map[string]string{"app": "vm-m"},
				Ports:    []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(80)}},
			},
		}
		got, err := cs.Create(ctx, o, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("vm scenarios: create Service %s/%s: %w", nsVM, svc.name, err)
		}
		if svc.typ == corev1.ServiceTypeLoadBalancer {
			got.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: lbVM.String()}}
			if _, err := cs.UpdateStatus(ctx, got, metav1.UpdateOptions{}); err != nil {
				return fmt.Errorf("vm scenarios: Service %s/%s: write status.loadBalancer.ingress %s: %w", nsVM, svc.name, lbVM, err)
			}
		}
	}
	return nil
}

// vmNodePortLB: see ScenarioVMNodePortLB.
func (s *vmScenarios) vmNodePortLB(ctx context.Context) (string, error) {
	v, err := s.vm(nsVM + "/vm-m")
	if err != nil {
		return "", err
	}
	addrOf, _, err := s.nodeAddrs(ctx, nil)
	if err != nil {
		return "", err
	}
	other := ""
	for node := range addrOf {
		if node != v.node && (other == "" || node < other) {
			other = node
		}
	}
	if addrOf[v.node] == "" || other == "" {
		return "", fmt.Errorf("VM %s on %s: want its node and another among %v", v, v.node, addrOf)
	}
	np, err := s.t.Client.CoreV1().Services(nsVM).Get(ctx, "vm-m-np", metav1.GetOptions{})
	if err != nil {
		return "", err
	}
	if len(np.Spec.Ports) != 1 || np.Spec.Ports[0].NodePort == 0 {
		return "", fmt.Errorf("service %s/vm-m-np has no node port: %+v", nsVM, np.Spec.Ports)
	}
	port := strconv.Itoa(int(np.Spec.Ports[0].NodePort))
	var at []string
	for node, addr := range addrOf {
		url := "http://" + net.JoinHostPort(addr, port) + "/"
		var body string
		if err := poll(ctx, reachTimeout, func(ctx context.Context) error {
			b, err := hostFetch(ctx, url, reachTry)
			body = strings.TrimSpace(b)
			if err == nil && body != v.name {
				err = fmt.Errorf("answered %q, want %q", body, v.name)
			}
			return err
		}); err != nil {
			return strings.Join(at, ", "), fmt.Errorf("service %s/vm-m-np (policy Cluster): this host to %s (node %s): %w", nsVM, url, node, err)
		}
		at = append(at, node)
	}
	defer func() {
		if err := dropLBRoutes(); err != nil {
			s.logf("%v", err)
		}
	}()
	hc, err := s.checkHealthNodePort(ctx, nsVM, "vm-m-lb-local", addrOf, map[string]bool{v.node: true})
	if err != nil {
		return "", fmt.Errorf("service %s/vm-m-lb-local: %w", nsVM, err)
	}
	lbURL := "http://" + lbVM.String() + "/"
	if err := routeVia(lbVM, addrOf[v.node]); err != nil {
		return "", err
	}
	if err := poll(ctx, reachTimeout, func(ctx context.Context) error {
		b, err := hostFetch(ctx, lbURL, reachTry)
		if err == nil && strings.TrimSpace(b) != v.name {
			err = fmt.Errorf("answered %q, want %q", strings.TrimSpace(b), v.name)
		}
		return err
	}); err != nil {
		return "", fmt.Errorf("service %s/vm-m-lb-local (policy Local) at %s through the VM's node %s: %w", nsVM, lbVM, v.node, err)
	}
	if err := routeVia(lbVM, addrOf[other]); err != nil {
		return "", err
	}
	body, err := hostFetch(ctx, lbURL, unreachTry)
	if err := droppedErr(body, err); err != nil {
		return "", fmt.Errorf("service %s/vm-m-lb-local (policy Local) at %s through node %s, with no local endpoint: %w", nsVM, lbVM, other, err)
	}
	ps, err := s.need(ctx, nsVMB+"/vb")
	if err != nil {
		return "", err
	}
	vb := ps[0]
	// The probe works: vb reaches the outside world first.
	if s.t.EgressURL != "" {
		if _, err := s.reach(ctx, vb, s.t.EgressURL, ""); err != nil {
			return "", err
		}
	}
	var refused []string
	for _, node := range []string{vb.node, v.node} {
		url := "http://" + net.JoinHostPort(addrOf[node], port) + "/"
		if err := s.unreached(ctx, vb, url); err != nil {
			return "", fmt.Errorf("another tenant through %s/vm-m-np: %w", nsVM, err)
		}
		refused = append(refused, url)
	}
	return fmt.Sprintf("vm-m-np (node port %s, policy Cluster) answered %q at %s; vm-m-lb-local at %s: healthCheckNodePort %d 200 at %s only, answered through %s, dropped through %s; %s reached neither %s",
		port, v.name, strings.Join(at, ", "), lbVM, hc, v.node, v.node, other, vb, strings.Join(refused, " nor ")), nil
}
