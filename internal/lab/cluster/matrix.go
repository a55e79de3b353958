package cluster

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

// The upstream NetworkPolicy model (Kubernetes' netpol e2e): namespaces
// x, y and z, each with pods a, b and c, every pod serving TCP ports 80
// and 81; here all on one primary Layer2 CUDN, the pods spread over two
// nodes. Each case creates policies and checks the whole matrix: 9 x 8
// pairs (a pod to itself never crosses the network) on both ports.
const (
	matrixCUDN  = "scn-np"
	matrixLabel = "lab.kvnet.io/np" // a matrix namespace's model name: x, y or z
)

var (
	matrixSubnet     = netip.MustParsePrefix("10.205.0.0/24")
	matrixNamespaces = []string{"x", "y", "z"}
	matrixPods       = []string{"a", "b", "c"}
	matrixPorts      = []int32{80, 81}
)

// matrixNS is model namespace m's namespace.
func matrixNS(m string) string { return "scn-np" + m }

// matrixPod is a model pod: it serves both ports with httpd and names
// them (serve-80-tcp, serve-81-tcp) as upstream's pods do.
func matrixPod(m, name, node, image string) *corev1.Pod {
	p := webPod(matrixNS(m), name, node, image)
	p.Labels = map[string]string{"pod": name}
	c := &p.Spec.Containers[0]
	c.Command = []string{"sh", "-c", "mkdir -p /tmp/www && echo " + m + "/" + name + " > /tmp/www/index.html && " +
		"httpd -p 81 -h /tmp/www && exec httpd -f -p 80 -h /tmp/www"}
	c.Ports = []corev1.ContainerPort{{Name: "serve-80-tcp", ContainerPort: 80}, {Name: "serve-81-tcp", ContainerPort: 81}}
	c.StartupProbe.TCPSocket.Port = intstr.FromInt32(80)
	c.ReadinessProbe.HTTPGet.Port = intstr.FromInt32(80)
	c.LivenessProbe.TCPSocket.Port = intstr.FromInt32(81)
	return p
}

// createMatrix makes the model's namespaces, CUDN and pods.
func (s *scenarios) createMatrix(ctx context.Context) error {
	for _, m := range matrixNamespaces {
		o := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: matrixNS(m), Labels: map[string]string{ScenarioLabel: "", primaryLabel: "", matrixLabel: m}}}
		if _, err := s.t.Client.CoreV1().Namespaces().Create(ctx, o, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("scenarios: create namespace %q: %w", o.Name, err)
		}
	}
	cudn := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "k8s.ovn.org/v1", "kind": "ClusterUserDefinedNetwork",
		"metadata": map[string]any{"name": matrixCUDN, "labels": map[string]any{ScenarioLabel: ""}},
		"spec": map[string]any{
			"namespaceSelector": map[string]any{"matchExpressions": []any{map[string]any{"key": matrixLabel, "operator": "Exists"}}},
			"network": map[string]any{"topology": "Layer2", "layer2": map[string]any{
				"role": "Primary", "subnets": []any{matrixSubnet.String()},
			}},
		},
	}}
	if _, err := s.dyn.Resource(cudnGVR).Create(ctx, cudn, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("scenarios: create ClusterUserDefinedNetwork %s: %w", matrixCUDN, err)
	}
	nads := map[string]string{}
	for _, m := range matrixNamespaces {
		nads[matrixNS(m)] = matrixCUDN
	}
	if err := s.waitNamespaces(ctx, nads); err != nil {
		return err
	}
	// a, b and c on different nodes where there are three.
	nodes := s.nodes[:]
	if all, err := readyNodes(ctx, s.t.Client); err == nil && len(all) >= 3 {
		nodes = []string{s.nodes[0], s.nodes[1]}
		for _, n := range all {
			if n != s.nodes[0] && n != s.nodes[1] && len(nodes) < 3 {
				nodes = append(nodes, n)
			}
		}
	}
	s.matrixNodes = nodes
	for _, m := range matrixNamespaces {
		for i, name := range matrixPods {
			s.createPod(ctx, matrixPod(m, name, nodes[i%len(nodes)], s.t.Image))
		}
	}
	return nil
}

// modelPod is a model pod found Ready, with its address on the CUDN.
type modelPod struct {
	m, name string // model namespace and pod
	p       *scenarioPod
	addr    netip.Addr
}

func (mp modelPod) String() string { return mp.m + "/" + mp.name }

// verdict says whether from reaches to's port under a case.
type verdict func(from, to modelPod, port int32) bool

// matrixCase is one case of the model: its policies, and the matrix
// they must give.
type matrixCase struct {
	name     string
	policies []*networkingv1.NetworkPolicy
	want     verdict
}

func modelPolicy(m, name string, spec networkingv1.NetworkPolicySpec) *networkingv1.NetworkPolicy {
	return &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: matrixNS(m)}, Spec: spec}
}

func sel(k, v string) *metav1.LabelSelector {
	return &metav1.LabelSelector{MatchLabels: map[string]string{k: v}}
}

// matrixCases are the cases, as upstream's netpol e2e and kvnet's
// simulated-lab matrix (TestAgentNetworkPolicyMatrix) write them.
func matrixCases() []matrixCase {
	ingress := []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
	egress := []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}
	deny := modelPolicy("x", "deny-ingress", networkingv1.NetworkPolicySpec{PolicyTypes: ingress})
	return []matrixCase{{
		name: "no policy",
		want: func(_, _ modelPod, _ int32) bool { return true },
	}, {
		name:     "default deny ingress in x",
		policies: []*networkingv1.NetworkPolicy{deny},
		want:     func(_, to modelPod, _ int32) bool { return to.m != "x" },
	}, {
		name:     "default deny egress in x",
		policies: []*networkingv1.NetworkPolicy{modelPolicy("x", "deny-egress", networkingv1.NetworkPolicySpec{PolicyTypes: egress})},
		want:     func(from, _ modelPod, _ int32) bool { return from.m != "x" },
	}, {
		name: "deny in x, x/a from namespace y",
		policies: []*networkingv1.NetworkPolicy{deny, modelPolicy("x", "a-from-y", networkingv1.NetworkPolicySpec{PodSelector: *sel("pod", "a"),
			Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: sel(matrixLabel, "y")}}}}})},
		want: func(from, to modelPod, _ int32) bool { return to.m != "x" || to.name == "a" && from.m == "y" },
	}, {
		name: "deny in x, x/a from z/b",
		policies: []*networkingv1.NetworkPolicy{deny, modelPolicy("x", "a-from-zb", networkingv1.NetworkPolicySpec{PodSelector: *sel("pod", "a"),
			Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: sel(matrixLabel, "z"), PodSelector: sel("pod", "b")}}}}})},
		want: func(from, to modelPod, _ int32) bool {
			return to.m != "x" || to.String() == "x/a" && from.String() == "z/b"
		},
	}, {
		name: "deny in x, port 81 from anywhere",
		policies: []*networkingv1.NetworkPolicy{deny, modelPolicy("x", "allow-81", networkingv1.NetworkPolicySpec{
			Ingress: []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{{Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To(intstr.FromInt32(81))}}}}})},
		want: func(_, to modelPod, port int32) bool { return to.m != "x" || port == 81 },
	}, {
		name: "deny in x, named port serve-80-tcp from namespace x",
		policies: []*networkingv1.NetworkPolicy{deny, modelPolicy("x", "allow-serve-80", networkingv1.NetworkPolicySpec{
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{}}},
				Ports: []networkingv1.NetworkPolicyPort{{Port: ptr.To(intstr.FromString("serve-80-tcp"))}},
			}}})},
		want: func(from, to modelPod, port int32) bool { return to.m != "x" || from.m == "x" && port == 80 },
	}, {
		name: "x/a egress to namespace y on port 80 only",
		policies: []*networkingv1.NetworkPolicy{modelPolicy("x", "a-to-y-80", networkingv1.NetworkPolicySpec{PodSelector: *sel("pod", "a"), PolicyTypes: egress,
			Egress: []networkingv1.NetworkPolicyEgressRule{{
				To:    []networkingv1.NetworkPolicyPeer{{NamespaceSelector: sel(matrixLabel, "y")}},
				Ports: []networkingv1.NetworkPolicyPort{{Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To(intstr.FromInt32(80))}},
			}}})},
		want: func(from, to modelPod, port int32) bool { return from.String() != "x/a" || to.m == "y" && port == 80 },
	}}
}

// matrixWindow bounds the wait for a case's matrix: enforcement on three
// nodes, and probes slowed by CI's two loaded cores.
const matrixWindow = 2 * time.Minute

// matrixTry bounds one probe of the matrix: what it does not reach in
// that time is refused, once tried again for matrixRetry.
const matrixTry = 2 * time.Second

// matrixRetry bounds the second try of a probe that must be admitted and
// was not answered within matrixTry: on CI's two loaded cores a pod's
// sixteen probes at once can miss that, where a refused one is never
// answered at all.
const matrixRetry = 6 * time.Second

// matrix: see ScenarioMatrix.
func (s *scenarios) matrix(ctx context.Context) (string, error) {
	var pods []modelPod
	for _, m := range matrixNamespaces {
		for _, name := range matrixPods {
			ps, err := s.need(ctx, matrixNS(m)+"/"+name)
			if err != nil {
				return "", err
			}
			a, err := ps[0].addr(primaryInterface, matrixSubnet)
			if err != nil {
				return "", err
			}
			pods = append(pods, modelPod{m: m, name: name, p: ps[0], addr: a})
		}
	}
	var done []string
	for _, c := range matrixCases() {
		for _, np := range c.policies {
			if _, err := s.t.Client.NetworkingV1().NetworkPolicies(np.Namespace).Create(ctx, np.DeepCopy(), metav1.CreateOptions{}); err != nil {
				return strings.Join(done, "; "), fmt.Errorf("case %q: create NetworkPolicy %s/%s: %w", c.name, np.Namespace, np.Name, err)
			}
		}
		// Enforcement is asynchronous: probe until the matrix is the
		// model's. A pair refused that must not be, or admitted that
		// must not be, keeps it from matching.
		var diff []string
		err := pollEvery(ctx, matrixWindow, 2*time.Second, func(ctx context.Context) error {
			var err error
			if diff, err = s.matrixDiff(ctx, pods, c.want); err != nil {
				return err
			}
			if len(diff) > 0 {
				return fmt.Errorf("%d of %d probes differ from the model: %s", len(diff), len(pods)*(len(pods)-1)*len(matrixPorts), strings.Join(diff, ", "))
			}
			return nil
		})
		if err != nil {
			return strings.Join(done, "; "), fmt.Errorf("case %q: %w", c.name, err)
		}
		allowed := 0
		for _, from := range pods {
			for _, to := range pods {
				for _, port := range matrixPorts {
					if from != to && c.want(from, to, port) {
						allowed++
					}
				}
			}
		}
		done = append(done, fmt.Sprintf("%s: %d of %d admitted", c.name, allowed, len(pods)*(len(pods)-1)*len(matrixPorts)))
		for _, np := range c.policies {
			if err := s.t.Client.NetworkingV1().NetworkPolicies(np.Namespace).Delete(ctx, np.Name, metav1.DeleteOptions{}); err != nil {
				return strings.Join(done, "; "), fmt.Errorf("case %q: delete NetworkPolicy %s/%s: %w", c.name, np.Namespace, np.Name, err)
			}
		}
	}
	return fmt.Sprintf("9 pods of namespaces x, y, z on CUDN %s, a, b, c on %s, ports 80 and 81, each case's whole matrix as the model says: %s",
		matrixCUDN, strings.Join(s.matrixNodes, ", "), strings.Join(done, "; ")), nil
}

// matrixDiff probes every pair on every port (from each pod at once,
// the pods a few at a time) and returns the probes whose outcome is
// not want's. A probe that must be admitted and was not is tried once
// more, alone with the others that missed, for matrixRetry.
func (s *scenarios) matrixDiff(ctx context.Context, pods []modelPod, want verdict) ([]string, error) {
	var mu sync.Mutex
	var diff []string
	var errs []error
	sem := make(chan struct{}, 3)
	var wg sync.WaitGroup
	for _, from := range pods {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			type probe struct {
				to   modelPod
				port int32
				url  string
			}
			var probes []probe
			for _, to := range pods {
				if to == from {
					continue
				}
				for _, port := range matrixPorts {
					probes = append(probes, probe{to, port, fmt.Sprintf("http://%s:%d/", to.addr, port)})
				}
			}
			urls := make([]string, len(probes))
			for i, pr := range probes {
				urls[i] = pr.url
			}
			got, err := s.matrixProbe(ctx, from, urls, matrixTry)
			var missed []string
			for _, pr := range probes {
				if r, seen := got[pr.url]; err == nil && seen && !r && want(from, pr.to, pr.port) {
					missed = append(missed, pr.url)
				}
			}
			if err == nil && len(missed) > 0 {
				var again map[string]bool
				if again, err = s.matrixProbe(ctx, from, missed, matrixRetry); err == nil {
					maps.Copy(got, again)
				}
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			for _, pr := range probes {
				r, seen := got[pr.url]
				switch w := want(from, pr.to, pr.port); {
				case !seen:
					diff = append(diff, fmt.Sprintf("%s->%s:%d not probed", from, pr.to, pr.port))
				case r != w:
					diff = append(diff, fmt.Sprintf("%s->%s:%d %s (want %s)", from, pr.to, pr.port, word(r), word(w)))
				}
			}
		})
	}
	wg.Wait()
	slices.Sort(diff)
	if len(errs) > 0 {
		return nil, errs[0]
	}
	return diff, nil
}

// matrixProbe fetches every url from pod from at once, each given
// timeout, and returns which answered.
func (s *scenarios) matrixProbe(ctx context.Context, from modelPod, urls []string, timeout time.Duration) (map[string]bool, error) {
	var script strings.Builder
	for _, u := range urls {
		fmt.Fprintf(&script, "(httpget -timeout %s %s >/dev/null 2>&1 && echo ok %s || echo no %s) & ", timeout, u, u, u)
	}
	script.WriteString("wait")
	ctx, cancel := context.WithTimeout(ctx, execTimeout)
	defer cancel()
	out, errOut, err := PodExec(ctx, s.t.Config, s.t.Client, from.p.ns, from.p.name, "sh", "-c", script.String())
	if err != nil {
		return nil, fmt.Errorf("%s: probes: %v: %s", from, err, strings.TrimSpace(errOut))
	}
	got := map[string]bool{}
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		verdict, u, ok := strings.Cut(l, " ")
		if ok {
			got[u] = verdict == "ok"
		}
	}
	return got, nil
}

func word(ok bool) string {
	if ok {
		return "admitted"
	}
	return "refused"
}
