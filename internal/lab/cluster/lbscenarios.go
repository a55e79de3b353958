package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// This file holds the scenarios of LoadBalancer Services and of another
// tenant reaching a tenant's Services (ScenarioLoadBalancer,
// ScenarioServiceOtherTenant).

// The load balancer addresses the scenarios write into the status of
// web-lb and web-lb-local, as a load balancer's controller (a cloud's,
// MetalLB) would, from TEST-NET-3: nothing else on this host or in the
// cluster uses them. This host routes each to one node, as a load
// balancer delivers its address (MetalLB's BGP mode does the same).
var (
	lbRange = netip.MustParsePrefix("203.0.113.80/30")
	lbAddr  = netip.MustParseAddr("203.0.113.80") // web-lb
	lbLocal = netip.MustParseAddr("203.0.113.81") // web-lb-local
	lbVM    = netip.MustParseAddr("203.0.113.82") // the VM scenarios' vm-m-lb-local
)

// createLoadBalancers creates web-lb (policy Cluster) and web-lb-local
// (policy Local) from web and writes their load balancer addresses into
// their status.
func (s *scenarios) createLoadBalancers(ctx context.Context, web *corev1.Service) error {
	for _, lb := range []struct {
		name   string
		policy corev1.ServiceExternalTrafficPolicy
		addr   netip.Addr
	}{{"web-lb", corev1.ServiceExternalTrafficPolicyCluster, lbAddr}, {"web-lb-local", corev1.ServiceExternalTrafficPolicyLocal, lbLocal}} {
		svc := web.DeepCopy()
		svc.Name, svc.Spec.Type, svc.Spec.ExternalTrafficPolicy = lb.name, corev1.ServiceTypeLoadBalancer, lb.policy
		got, err := s.t.Client.CoreV1().Services(nsTenantA).Create(ctx, svc, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("scenarios: create Service %s/%s: %w", nsTenantA, lb.name, err)
		}
		got.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: lb.addr.String()}}
		if _, err := s.t.Client.CoreV1().Services(nsTenantA).UpdateStatus(ctx, got, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("scenarios: Service %s/%s: write status.loadBalancer.ingress %s: %w", nsTenantA, lb.name, lb.addr, err)
		}
	}
	return nil
}

// nodeAddrs returns every node's InternalIP, and a node on which none of
// ps runs.
func (s *scenarios) nodeAddrs(ctx context.Context, ps []*scenarioPod) (map[string]string, string, error) {
	nodes, err := s.t.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, "", err
	}
	addrOf := map[string]string{}
	var other string
	for _, n := range nodes.Items {
		if !NodeReady(&n) || n.Spec.Unschedulable {
			continue
		}
		for _, a := range n.Status.Addresses {
			if a.Type == corev1.NodeInternalIP && addrOf[n.Name] == "" {
				addrOf[n.Name] = a.Address
			}
		}
		free := addrOf[n.Name] != ""
		for _, p := range ps {
			free = free && p.pod.Spec.NodeName != n.Name
		}
		if free {
			other = n.Name
		}
	}
	if other == "" {
		return nil, "", fmt.Errorf("no node without %v to send connections through (nodes %d)", ps, len(nodes.Items))
	}
	return addrOf, other, nil
}

// nodePort returns the node port of Service nsTenantA/name.
func (s *scenarios) nodePort(ctx context.Context, name string) (int32, error) {
	svc, err := s.t.Client.CoreV1().Services(nsTenantA).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return 0, err
	}
	if len(svc.Spec.Ports) == 0 || svc.Spec.Ports[0].NodePort == 0 {
		return 0, fmt.Errorf("service %s/%s has no node port", nsTenantA, name)
	}
	return svc.Spec.Ports[0].NodePort, nil
}

// routeVia routes addr, on this host, to the node at address via, as a
// load balancer delivers its address to a node, replacing the route a
// previous call made.
func routeVia(addr netip.Addr, via string) error {
	gw, err := netip.ParseAddr(via)
	if err != nil {
		return fmt.Errorf("node address %q: %w", via, err)
	}
	r := &netlink.Route{Dst: netipNet(netip.PrefixFrom(addr, addr.BitLen())), Gw: gw.AsSlice()}
	if err := netlink.RouteReplace(r); err != nil {
		return fmt.Errorf("this host: route %s via %s: %w", addr, gw, err)
	}
	return nil
}

// dropLBRoutes removes this host's routes to lbRange's addresses.
func dropLBRoutes() error {
	var errs []error
	// Listing needs no privilege: a run without root that made no
	// route has nothing to delete.
	for a := lbRange.Addr(); lbRange.Contains(a); a = a.Next() {
		filter := &netlink.Route{Dst: netipNet(netip.PrefixFrom(a, a.BitLen()))}
		routes, err := netlink.RouteListFiltered(netlink.FAMILY_V4, filter, netlink.RT_FILTER_DST)
		if err != nil {
			errs = append(errs, fmt.Errorf("this host: list routes to %s: %w", a, err))
			continue
		}
		for _, r := range routes {
			if err := netlink.RouteDel(&r); err != nil && !errors.Is(err, unix.ESRCH) {
				errs = append(errs, fmt.Errorf("this host: delete route %s: %w", a, err))
			}
		}
	}
	return errors.Join(errs...)
}

func netipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// hostGet GETs url from this host, within timeout, and returns the
// status code and body of the answer.
func hostGet(ctx context.Context, url string, timeout time.Duration) (int, string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, "", err
	}
	resp, err := (&http.Client{Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true}}).Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	if err != nil {
		return 0, "", err
	}
	return resp.StatusCode, string(b), nil
}

// healthCheck is what a Service's healthCheckNodePort answers (the
// fields load balancers read).
type healthCheck struct {
	Service struct {
		Namespace string `json:"namespace"`
		Name      string `json:"name"`
	} `json:"service"`
	LocalEndpoints int `json:"localEndpoints"`
}

// checkHealthNodePort waits until every node answers Service ns/name's
// healthCheckNodePort (policy Local) as a load balancer needs it: 200
// and one local endpoint at the nodes in want, 503 and none elsewhere.
// It returns the port.
func (s *scenarios) checkHealthNodePort(ctx context.Context, ns, name string, addrOf map[string]string, want map[string]bool) (int32, error) {
	svc, err := s.t.Client.CoreV1().Services(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return 0, err
	}
	port := svc.Spec.HealthCheckNodePort
	if port == 0 {
		return 0, fmt.Errorf("service %s/%s (policy Local) has no healthCheckNodePort", ns, name)
	}
	for node, addr := range addrOf {
		url := fmt.Sprintf("http://%s/", net.JoinHostPort(addr, strconv.Itoa(int(port))))
		wantCode, wantN := http.StatusServiceUnavailable, 0
		if want[node] {
			wantCode, wantN = http.StatusOK, 1
		}
		err := poll(ctx, reachTimeout, func(ctx context.Context) error {
			code, body, err := hostGet(ctx, url, reachTry)
			if err != nil {
				return fmt.Errorf("this host to %s (node %s): %w", url, node, err)
			}
			var h healthCheck
			if err := json.Unmarshal([]byte(body), &h); err != nil {
				return fmt.Errorf("this host to %s (node %s): %d %q: %w", url, node, code, body, err)
			}
			if code != wantCode || h.LocalEndpoints != wantN || h.Service.Name != name || h.Service.Namespace != ns {
				return fmt.Errorf("this host to %s (node %s): %d %s, want %d with %d local endpoints of %s/%s",
					url, node, code, strings.TrimSpace(body), wantCode, wantN, ns, name)
			}
			return nil
		})
		if err != nil {
			return 0, fmt.Errorf("healthCheckNodePort %d: %w", port, err)
		}
	}
	return port, nil
}

// loadBalancer: this host routes web-lb's address to the node with
// neither backend and fetches it until both have answered; then checks
// web-lb-local's healthCheckNodePort at every node; then routes
// web-lb-local's address to a-1's node, where only a-1 may answer, and
// to the node with neither, where the connection must be dropped.
func (s *scenarios) loadBalancer(ctx context.Context) (string, error) {
	ps, err := s.need(ctx, nsTenantA+"/a-1", nsTenantA+"/a-2")
	if err != nil {
		return "", err
	}
	addrOf, other, err := s.nodeAddrs(ctx, ps)
	if err != nil {
		return "", err
	}
	defer func() {
		if err := dropLBRoutes(); err != nil {
			s.logf("%v", err)
		}
	}()
	fetch := func(addr netip.Addr, timeout time.Duration) func(context.Context) (string, error) {
		url := "http://" + addr.String() + "/"
		return func(ctx context.Context) (string, error) {
			body, err := hostFetch(ctx, url, timeout)
			if err != nil {
				return "", fmt.Errorf("this host to %s: %w", url, err)
			}
			return strings.TrimSpace(body), nil
		}
	}
	want := []string{"hello from a-1", "hello from a-2"}
	if err := routeVia(lbAddr, addrOf[other]); err != nil {
		return "", err
	}
	cluster, err := reachAll(ctx, serviceTries, fetch(lbAddr, reachTry), want)
	if err != nil {
		return "", fmt.Errorf("service %s/web-lb (policy Cluster) at %s through node %s: %w", nsTenantA, lbAddr, other, err)
	}
	hc, err := s.checkHealthNodePort(ctx, nsTenantA, "web-lb-local", addrOf, map[string]bool{ps[0].pod.Spec.NodeName: true, ps[1].pod.Spec.NodeName: true})
	if err != nil {
		return "", fmt.Errorf("service %s/web-lb-local: %w", nsTenantA, err)
	}
	a1 := ps[0]
	if err := routeVia(lbLocal, addrOf[a1.pod.Spec.NodeName]); err != nil {
		return "", err
	}
	f := fetch(lbLocal, reachTry)
	if err := poll(ctx, reachTimeout, func(ctx context.Context) error { _, err := f(ctx); return err }); err != nil {
		return "", fmt.Errorf("service %s/web-lb-local (policy Local) at %s through %s's node: %w", nsTenantA, lbLocal, a1, err)
	}
	count, err := answers(ctx, affinityTries, f, want)
	if err != nil {
		return "", fmt.Errorf("service %s/web-lb-local (policy Local) at %s through %s's node: %w", nsTenantA, lbLocal, a1, err)
	}
	if len(count) != 1 || count["hello from a-1"] != affinityTries {
		return "", fmt.Errorf("service %s/web-lb-local (policy Local) at %s through %s's node %s: answered %v, want %q only",
			nsTenantA, lbLocal, a1, a1.pod.Spec.NodeName, count, "hello from a-1")
	}
	if err := routeVia(lbLocal, addrOf[other]); err != nil {
		return "", err
	}
	body, err := fetch(lbLocal, unreachTry)(ctx)
	if err := droppedErr(body, err); err != nil {
		return "", fmt.Errorf("service %s/web-lb-local (policy Local) at %s through node %s, with no local endpoint: %w", nsTenantA, lbLocal, other, err)
	}
	return fmt.Sprintf("web-lb at %s through %s answered %s; web-lb-local at %s: healthCheckNodePort %d 200 at %s and %s, 503 at %s; through %s hello from a-1 ×%d; through %s dropped",
		lbAddr, other, cluster, lbLocal, hc, ps[0].pod.Spec.NodeName, ps[1].pod.Spec.NodeName, other,
		a1.pod.Spec.NodeName, affinityTries, other), nil
}

// droppedErr returns nil if a fetch that returned body and err was
// dropped: no answer within its timeout, and no refusal either.
func droppedErr(body string, err error) error {
	var ne net.Error
	switch {
	case err == nil:
		return fmt.Errorf("answered %q", body)
	case !errors.Is(err, context.DeadlineExceeded) && !(errors.As(err, &ne) && ne.Timeout()):
		return fmt.Errorf("%v; want the connection dropped (no answer within %s), as kube-proxy drops it under policy Local", err, unreachTry)
	}
	return nil
}

// serviceOtherTenant: b-1, a pod of tenant B, must reach none of tenant
// A's Service web: not its cluster IP, not web-np's node port at its own
// node's address or at another node's, not web-lb's load balancer
// address. Each refusal follows a positive control: a-1 reaches the
// cluster IP, this host the node ports and the load balancer address,
// and b-1, with the same probe, its own network's b-2.
func (s *scenarios) serviceOtherTenant(ctx context.Context) (string, error) {
	ps, err := s.need(ctx, nsTenantA+"/a-1", nsTenantA+"/a-2", nsTenantB+"/b-1", nsTenantB+"/b-2")
	if err != nil {
		return "", err
	}
	a1, b1, b2 := ps[0], ps[2], ps[3]
	addrOf, other, err := s.nodeAddrs(ctx, ps[:2])
	if err != nil {
		return "", err
	}
	defer func() {
		if err := dropLBRoutes(); err != nil {
			s.logf("%v", err)
		}
	}()
	b2Addr, err := b2.addr(primaryInterface, tenantSubnet)
	if err != nil {
		return "", err
	}
	if _, err := s.reach(ctx, b1, webURL(b2Addr), "hello from b-2"); err != nil {
		return "", fmt.Errorf("control, b-1 to its own network's b-2: %w", err)
	}
	svc, err := s.t.Client.CoreV1().Services(nsTenantA).Get(ctx, "web", metav1.GetOptions{})
	if err != nil {
		return "", err
	}
	clusterURL := "http://" + net.JoinHostPort(svc.Spec.ClusterIP, "80") + "/"
	if _, err := s.reach(ctx, a1, clusterURL, "hello from a-"); err != nil {
		return "", fmt.Errorf("control, a-1 to Service web's cluster IP: %w", err)
	}
	if err := s.unreached(ctx, b1, clusterURL); err != nil {
		return "", fmt.Errorf("service %s/web's cluster IP from tenant B: %w", nsTenantA, err)
	}
	port, err := s.nodePort(ctx, "web-np")
	if err != nil {
		return "", err
	}
	var refused []string
	for _, node := range []string{b1.pod.Spec.NodeName, other} {
		url := fmt.Sprintf("http://%s/", net.JoinHostPort(addrOf[node], strconv.Itoa(int(port))))
		if err := poll(ctx, reachTimeout, func(ctx context.Context) error { _, err := hostFetch(ctx, url, reachTry); return err }); err != nil {
			return "", fmt.Errorf("control, this host to Service %s/web-np at node %s: %w", nsTenantA, node, err)
		}
		if err := s.unreached(ctx, b1, url); err != nil {
			return "", fmt.Errorf("service %s/web-np's node port at node %s from tenant B: %w", nsTenantA, node, err)
		}
		refused = append(refused, url)
	}
	if err := routeVia(lbAddr, addrOf[other]); err != nil {
		return "", err
	}
	lbURL := "http://" + lbAddr.String() + "/"
	if err := poll(ctx, reachTimeout, func(ctx context.Context) error { _, err := hostFetch(ctx, lbURL, reachTry); return err }); err != nil {
		return "", fmt.Errorf("control, this host to Service %s/web-lb at %s: %w", nsTenantA, lbURL, err)
	}
	if err := s.unreached(ctx, b1, lbURL); err != nil {
		return "", fmt.Errorf("service %s/web-lb's load balancer address from tenant B: %w", nsTenantA, err)
	}
	refused = append(refused, lbURL)
	return fmt.Sprintf("b-1 (which reaches b-2) reached none of %s (a-1 reaches it), %s (this host reaches them)",
		clusterURL, strings.Join(refused, ", ")), nil
}
