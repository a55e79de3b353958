package node_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nadv1 "kvnet.io/kvnet/api/k8scni/v1"
	udnv1 "kvnet.io/kvnet/api/udn/v1"
	"kvnet.io/kvnet/internal/testenv"
	"kvnet.io/kvnet/internal/testenv/nstest"
	"kvnet.io/kvnet/internal/udn"
)

// The upstream NetworkPolicy e2e model on a CUDN: namespaces x, y, z
// (label ns=x/y/z), pods a, b, c in each (label pod=a/b/c), each serving
// TCP and UDP on ports 80, 81 and 82 (named serve-<port>-<protocol>), on
// two nodes. Each pod also has a TCP container port named "web", whose
// number differs from pod to pod (npWeb). Every case checks the full 9x9
// matrix on the six ports against what the test computes itself.

var (
	npNamespaces = []string{"x", "y", "z"}
	npPods       = []string{"a", "b", "c"}
	npProbes     = []struct {
		proto string
		port  int
	}{{"TCP", 80}, {"TCP", 81}, {"TCP", 82}, {"UDP", 80}, {"UDP", 81}, {"UDP", 82}}
	// npWeb is the number of each model pod's TCP container port named
	// "web": one name, a different number on different pods, and none
	// on z/c (a pod without the port is not reached through it).
	npWeb = map[string]int{
		"x/a": 80, "x/b": 81, "x/c": 82,
		"y/a": 81, "y/b": 82, "y/c": 80,
		"z/a": 82, "z/b": 80,
	}
)

// npEchoPort is where the model pods echo, for long connections; no
// matrix case probes it.
const npEchoPort = 90

// npPod is one pod of the model.
type npPod struct {
	ns, pod string // model names: x, a
	p       *pod
}

func (p *npPod) String() string { return p.ns + "/" + p.pod }

// npWorld is the model: its pods, the Kubernetes namespace of each model
// namespace, and the CUDN's NAD of each.
type npWorld struct {
	l    *lab
	pods []*npPod
	k8s  map[string]string // model namespace -> Kubernetes namespace
}

func (w *npWorld) pod(ns, name string) *npPod {
	for _, p := range w.pods {
		if p.ns == ns && p.pod == name {
			return p
		}
	}
	panic("no pod " + ns + "/" + name)
}

// serveModelPorts runs p's servers: TCP and UDP 80, 81 and 82 answering
// its model name, and an echo server on TCP npEchoPort for long
// connections.
func serveModelPorts(t *testing.T, p *pod, name string) {
	for _, port := range []int{80, 81, 82} {
		nstest.ServeLine(t, p.netns, fmt.Sprintf(":%d", port), func(net.Conn) string { return name })
		nstest.ServeUDPLine(t, p.netns, fmt.Sprintf(":%d", port), func(net.Addr) string { return name })
	}
	nstest.Serve(nstest.Listen(t, p.netns, fmt.Sprintf(":%d", npEchoPort)), func(conn net.Conn) { _, _ = io.Copy(conn, conn) })
}

// modelPorts declares the container ports of model pod name (x/a): the
// probed ports by their serve-<port>-<protocol> names, and "web".
func modelPorts(pod *corev1.Pod, name string) {
	ports := &pod.Spec.Containers[0].Ports
	for _, pr := range npProbes {
		*ports = append(*ports, corev1.ContainerPort{
			Name: fmt.Sprintf("serve-%d-%s", pr.port, strings.ToLower(pr.proto)), ContainerPort: int32(pr.port), Protocol: corev1.Protocol(pr.proto)})
	}
	if web, ok := npWeb[name]; ok {
		*ports = append(*ports, corev1.ContainerPort{Name: "web", ContainerPort: int32(web), Protocol: corev1.ProtocolTCP})
	}
}

// newNPWorld makes the CUDN over x, y and z and the nine pods.
func newNPWorld(t *testing.T, l *lab, prefix, subnet string) *npWorld {
	w := &npWorld{l: l, k8s: map[string]string{}}
	sel := map[string]string{"np-test": prefix}
	for _, ns := range npNamespaces {
		w.k8s[ns] = prefix + "-" + ns
		testenv.Create(t, c, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: w.k8s[ns],
			Labels: map[string]string{udn.PrimaryNamespaceLabel: "", "np-test": prefix, "ns": ns}}})
	}
	testenv.Create(t, c, &udnv1.ClusterUserDefinedNetwork{
		ObjectMeta: metav1.ObjectMeta{Name: prefix},
		Spec: udnv1.ClusterUserDefinedNetworkSpec{
			NamespaceSelector: metav1.LabelSelector{MatchLabels: sel},
			Network: udnv1.NetworkSpec{Topology: udnv1.NetworkTopologyLayer2, Layer2: &udnv1.Layer2Config{
				Role: udnv1.NetworkRolePrimary, Subnets: udnv1.DualStackCIDRs{udnv1.CIDR(subnet)}}},
		},
	})
	i := 0
	for _, ns := range npNamespaces {
		nad := w.nad(t, ns, prefix)
		for _, name := range npPods {
			node := []string{"n1", "n2"}[i%2]
			i++
			p := l.runPod(nad, prefix+"-"+ns+name, node, func(pod *corev1.Pod) {
				pod.Labels["pod"] = name
				modelPorts(pod, ns+"/"+name)
			})
			mp := &npPod{ns: ns, pod: name, p: p}
			serveModelPorts(t, p, mp.String())
			w.pods = append(w.pods, mp)
		}
	}
	return w
}

// nad waits for the CUDN's NAD in model namespace ns.
func (w *npWorld) nad(t *testing.T, ns, name string) *nadv1.NetworkAttachmentDefinition {
	t.Helper()
	var nad nadv1.NetworkAttachmentDefinition
	testenv.Eventually(t, waitTimeout, "NAD of "+w.k8s[ns], func() error {
		return c.Get(context.Background(), client.ObjectKey{Namespace: w.k8s[ns], Name: name}, &nad)
	})
	return &nad
}

// probe reports whether from reaches to at proto/port (to's server
// answers with its name).
func probe(from, to *npPod, proto string, port int) bool {
	addr := net.JoinHostPort(to.p.ip(), fmt.Sprint(port))
	var got string
	var err error
	if proto == "TCP" {
		got, err = nstest.ReadLine(from.p.netns, addr, time.Second)
	} else {
		got, err = nstest.UDPReadLine(from.p.netns, addr, time.Second)
	}
	return err == nil && got == to.String()
}

// expectFunc says whether from may reach to at proto/port.
type expectFunc func(from, to *npPod, proto string, port int) bool

// npCell is one probe of the matrix: from pod, to pod, npProbes index.
type npCell struct{ from, to, probe int }

// matrix probes every pair on every port in parallel and returns an
// error with the want/got tables of the ports that differ. On a loaded
// machine a probe of an allowed connection may time out, so a cell want
// says reachable, reached in a round where every cell want refuses was
// refused (the policies in force), is proven: recorded in reached and
// not probed again by the same check. Refusals are decided by the last
// round.
func (w *npWorld) matrix(want expectFunc, reached map[npCell]bool) error {
	got := map[npCell]bool{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i, from := range w.pods {
		for j, to := range w.pods {
			for k, pr := range npProbes {
				cell := npCell{i, j, k}
				if reached[cell] {
					mu.Lock()
					got[cell] = true
					mu.Unlock()
					continue
				}
				wg.Go(func() {
					ok := probe(from, to, pr.proto, pr.port)
					mu.Lock()
					got[cell] = ok
					mu.Unlock()
				})
			}
		}
	}
	wg.Wait()
	var sb strings.Builder
	var proven []npCell
	leaked := false
	defer func() {
		if !leaked {
			for _, c := range proven {
				reached[c] = true
			}
		}
	}()
	for k, pr := range npProbes {
		var tb strings.Builder
		bad := 0
		fmt.Fprintf(&tb, "%s/%d: want/got, rows from, columns to (. reaches, X does not, ! differs)\n%5s", pr.proto, pr.port, "")
		for _, to := range w.pods {
			fmt.Fprintf(&tb, " %-5s", to)
		}
		for i, from := range w.pods {
			fmt.Fprintf(&tb, "\n%-5s", from)
			for j, to := range w.pods {
				// Loopback never leaves the pod: always allowed.
				wv := from == to || want(from, to, pr.proto, pr.port)
				gv := got[npCell{i, j, k}]
				if wv && gv {
					proven = append(proven, npCell{i, j, k})
				}
				if !wv && gv {
					leaked = true
				}
				mark := map[bool]string{true: ".", false: "X"}
				cell := mark[wv] + "/" + mark[gv]
				if wv != gv {
					bad++
					cell += "!"
				}
				fmt.Fprintf(&tb, " %-5s", cell)
			}
		}
		if bad > 0 {
			sb.WriteString(tb.String() + "\n")
		}
	}
	if sb.Len() > 0 {
		return fmt.Errorf("reachability differs:\n%s", sb.String())
	}
	return nil
}

// npCheckTimeout bounds each wait for the matrix to be as expected:
// generous, since the agents apply plans on a loaded machine.
const npCheckTimeout = 90 * time.Second

// check waits (the agents apply the policies) for the matrix to be want.
// A matrix that never is fails the test and lets it go on to the next
// case, which waits for its own matrix: one run reports every case that
// fails.
func (w *npWorld) check(t *testing.T, what string, want expectFunc) {
	t.Helper()
	start := time.Now()
	reached := map[npCell]bool{}
	for {
		err := w.matrix(want, reached)
		if err == nil {
			t.Logf("%s: matrix as expected after %s", what, time.Since(start).Round(10*time.Millisecond))
			return
		}
		if time.Since(start) > npCheckTimeout {
			t.Errorf("%s: not as expected after %s: %v", what, npCheckTimeout, err)
			return
		}
		time.Sleep(50 * time.Millisecond) // a polling interval, as testenv.Eventually's
	}
}

func (w *npWorld) policy(t *testing.T, ns, name string, spec networkingv1.NetworkPolicySpec) *networkingv1.NetworkPolicy {
	t.Helper()
	np := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: w.k8s[ns], Name: name}, Spec: spec}
	testenv.Create(t, c, np)
	return np
}

// echoConn opens a TCP connection from the namespace nsPath to an echo
// server at addr, closed when the test ends, and returns a round trip of
// one line over it (an error once the connection is cut: the round trip
// then times out, its packets dropped). The bound is generous, so that a
// connection still allowed answers under load.
func echoConn(t *testing.T, nsPath, addr string) func() error {
	t.Helper()
	conn, err := nstest.Dial(nsPath, addr, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	r := bufio.NewReader(conn)
	return func() error {
		_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := fmt.Fprintln(conn, "ping"); err != nil {
			return err
		}
		_, err := r.ReadString('\n')
		return err
	}
}

// waitRefused waits until the agents of to's nodes have applied, without
// error, a plan in which no port of to admits from's connections to TCP
// port: Apply programs the rules and then cuts the tracked connections
// they no longer allow, so from is refused and an open connection of its
// is gone once this returns. (Traffic can show the rules before the cut.)
func waitRefused(t *testing.T, l *lab, from *pod, port uint16, to ...*pod) {
	t.Helper()
	for _, p := range to {
		hostIf := p.hostIf(t, l)
		testenv.Eventually(t, waitTimeout, fmt.Sprintf("%s's ingress applied on %s without %s", p.name, p.node, from.name), func() error {
			for _, pp := range l.agent(p.node).LastApplied().State.Policies {
				if pp.Port != hostIf {
					continue
				}
				for _, a := range from.a.IPAddresses {
					peer := netip.MustParsePrefix(a).Addr()
					if rule, ok := pp.Ingress.Allows(peer, 6, port); ok {
						return fmt.Errorf("rule %q still admits %s", rule, peer)
					}
				}
				return nil
			}
			return fmt.Errorf("no policy applied on port %s", hostIf)
		})
	}
}

func deletePolicies(t *testing.T, nps ...*networkingv1.NetworkPolicy) {
	t.Helper()
	for _, np := range nps {
		if err := c.Delete(context.Background(), np); err != nil {
			t.Fatal(err)
		}
	}
}

func labels(kv ...string) *metav1.LabelSelector {
	m := map[string]string{}
	for i := 0; i < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return &metav1.LabelSelector{MatchLabels: m}
}

func npPort(proto string, port intstr.IntOrString, end int32) networkingv1.NetworkPolicyPort {
	p := networkingv1.NetworkPolicyPort{Protocol: (*corev1.Protocol)(&proto), Port: &port}
	if end != 0 {
		p.EndPort = &end
	}
	return p
}

var (
	ingressOnly = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
	egressOnly  = []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}
)

// TestAgentNetworkPolicyMatrix: kvnet-node enforces NetworkPolicies on a
// CUDN's pods, on the upstream e2e model, case by case, each on the full
// matrix: default deny ingress and egress (under which a VM still gets
// its DHCP lease), allow from a namespace, from a pod of another
// namespace of the CUDN (both selectors), a named port whose number
// differs from pod to pod (ingress, resolved on each destination), an
// endPort range probed inside and outside, ipBlock with except, policies
// adding up, an update that cuts an established connection and keeps one
// it still allows, egress by named port with no "to" (resolved on every
// destination pod), and a delete; another tenant's pods (same namespace
// labels, same subnet, own UDN) are never affected.
func TestAgentNetworkPolicyMatrix(t *testing.T) {
	l := newLab(t, "n1", "n2")
	w := newNPWorld(t, l, "npm", "10.60.0.0/24")
	// Another tenant: its namespace has x's labels and the same subnet.
	other := tenant(t, "npm-other", "10.60.0.0/24", false)
	var o1, o2 *pod
	for i, name := range []string{"npm-o1", "npm-o2"} {
		p := l.runPod(other, name, []string{"n1", "n2"}[i], func(p *corev1.Pod) { p.Labels["pod"] = "a" })
		serveModelPorts(t, p, name)
		if i == 0 {
			o1 = p
		} else {
			o2 = p
		}
	}
	var ns corev1.Namespace
	if err := c.Get(context.Background(), client.ObjectKey{Name: other.Namespace}, &ns); err != nil {
		t.Fatal(err)
	}
	ns.Labels["ns"] = "x"
	if err := c.Update(context.Background(), &ns); err != nil {
		t.Fatal(err)
	}
	otherReaches := func() {
		t.Helper()
		for _, pr := range [][2]*pod{{o1, o2}, {o2, o1}} {
			if got, err := nstest.ReadLine(pr[0].netns, net.JoinHostPort(pr[1].ip(), "80"), 2*time.Second); err != nil || got != pr[1].name {
				t.Errorf("other tenant: %s to %s: %q, %v; want %s's answer", pr[0].name, pr[1].name, got, err, pr[1].name)
			}
		}
	}

	all := func(*npPod, *npPod, string, int) bool { return true }
	w.check(t, "no policy", all)
	// A VM-like pod in x, outside the matrix: it reaches y/a and y/a
	// reaches it (the control of its refusals under deny below).
	vm := w.vm(t, "npm")
	ya := w.pod("y", "a")
	testenv.Eventually(t, waitTimeout, "x/vm and y/a reach each other before any policy", func() error {
		for _, pr := range [][2]*npPod{{vm, ya}, {ya, vm}} {
			if !probe(pr[0], pr[1], "TCP", 80) {
				return fmt.Errorf("%s does not reach %s on TCP 80", pr[0], pr[1])
			}
		}
		return nil
	})

	deny := w.policy(t, "x", "deny-ingress", networkingv1.NetworkPolicySpec{PolicyTypes: ingressOnly})
	w.check(t, "default deny ingress in x", func(from, to *npPod, _ string, _ int) bool { return to.ns != "x" })
	otherReaches()
	deletePolicies(t, deny)
	w.check(t, "deny removed", all)

	denyOut := w.policy(t, "x", "deny-egress", networkingv1.NetworkPolicySpec{PolicyTypes: egressOnly})
	w.check(t, "default deny egress in x", func(from, to *npPod, _ string, _ int) bool { return from.ns != "x" })
	// Under deny in both directions, the VM in x is refused both ways
	// and still gets its lease from kvnet-node's DHCP server.
	deny = w.policy(t, "x", "deny-ingress", networkingv1.NetworkPolicySpec{PolicyTypes: ingressOnly})
	dhcpUnderDeny(t, l, vm, ya)
	deletePolicies(t, denyOut, deny)

	deny = w.policy(t, "x", "deny-ingress", networkingv1.NetworkPolicySpec{PolicyTypes: ingressOnly})
	fromY := w.policy(t, "x", "a-from-y", networkingv1.NetworkPolicySpec{PodSelector: *labels("pod", "a"),
		Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: labels("ns", "y")}}}}})
	w.check(t, "deny in x, x/a from namespace y", func(from, to *npPod, _ string, _ int) bool {
		return to.ns != "x" || to.pod == "a" && from.ns == "y"
	})
	otherReaches()
	deletePolicies(t, fromY)

	fromZB := w.policy(t, "x", "a-from-zb", networkingv1.NetworkPolicySpec{PodSelector: *labels("pod", "a"),
		Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{
			{NamespaceSelector: labels("ns", "z"), PodSelector: labels("pod", "b")}}}}})
	w.check(t, "deny in x, x/a from z/b", func(from, to *npPod, _ string, _ int) bool {
		return to.ns != "x" || to.String() == "x/a" && from.String() == "z/b"
	})
	deletePolicies(t, fromZB, deny)

	// Named ports, resolved on the destination pod: "web" is 80, 81 or
	// 82 depending on the pod (z/c has none: nothing reaches it through
	// the rule), serve-81-udp is UDP 81 everywhere.
	webX := w.policy(t, "x", "web-in", networkingv1.NetworkPolicySpec{
		Ingress: []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{
			npPort("TCP", intstr.FromString("web"), 0), npPort("UDP", intstr.FromString("serve-81-udp"), 0)}}}})
	webZ := w.policy(t, "z", "web-in", networkingv1.NetworkPolicySpec{
		Ingress: []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{
			npPort("TCP", intstr.FromString("web"), 0)}}}})
	w.check(t, "x and z: ingress on named port web (each pod's own number), x also serve-81-udp", func(from, to *npPod, proto string, port int) bool {
		return to.ns == "y" || proto == "TCP" && port == npWeb[to.String()] || to.ns == "x" && proto == "UDP" && port == 81
	})
	deletePolicies(t, webX, webZ)

	// endPort: TCP 81-82 and UDP 80-81, probed inside (both ends) and
	// outside (TCP 80 below, UDP 82 above).
	rangeY := w.policy(t, "y", "tcp-81-82-udp-80-81", networkingv1.NetworkPolicySpec{
		Ingress: []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{
			npPort("TCP", intstr.FromInt32(81), 82), npPort("UDP", intstr.FromInt32(80), 81)}}}})
	w.check(t, "y: TCP 81-82 and UDP 80-81 only", func(from, to *npPod, proto string, port int) bool {
		return to.ns != "y" || proto == "TCP" && port >= 81 && port <= 82 || proto == "UDP" && port >= 80 && port <= 81
	})
	deletePolicies(t, rangeY)

	xa := w.pod("x", "a").p.ip()
	block := w.policy(t, "z", "c-block", networkingv1.NetworkPolicySpec{PodSelector: *labels("pod", "c"),
		Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{
			{IPBlock: &networkingv1.IPBlock{CIDR: "10.60.0.0/24", Except: []string{xa + "/32"}}}}}}})
	w.check(t, "z/c from the subnet except x/a", func(from, to *npPod, _ string, _ int) bool {
		return to.String() != "z/c" || from.String() != "x/a"
	})
	deletePolicies(t, block)

	add1 := w.policy(t, "x", "tcp80-from-y", networkingv1.NetworkPolicySpec{
		Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: labels("ns", "y")}},
			Ports: []networkingv1.NetworkPolicyPort{npPort("TCP", intstr.FromInt32(80), 0)}}}})
	add2 := w.policy(t, "x", "tcp81-from-z", networkingv1.NetworkPolicySpec{
		Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: labels("ns", "z")}},
			Ports: []networkingv1.NetworkPolicyPort{npPort("TCP", intstr.FromInt32(81), 0)}}}})
	w.check(t, "x: two policies add up", func(from, to *npPod, proto string, port int) bool {
		return to.ns != "x" || proto == "TCP" && (from.ns == "y" && port == 80 || from.ns == "z" && port == 81)
	})
	deletePolicies(t, add1, add2)

	// Update: x admits namespaces y and z, then z alone. y/a's
	// established connection to x/a is cut by the update; z/a's, still
	// allowed, goes on (the control: the cut is the policy's, not a
	// broken connection or datapath). A datapath cutting every tracked
	// connection of the network passes this control too: conntrack picks
	// z/a's next packet up as a new connection, which the policy allows.
	upd := w.policy(t, "x", "from-ns", networkingv1.NetworkPolicySpec{
		Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{
			{NamespaceSelector: labels("ns", "y")}, {NamespaceSelector: labels("ns", "z")}}}}})
	w.check(t, "x from y and z", func(from, to *npPod, _ string, _ int) bool { return to.ns != "x" || from.ns != "x" })
	echo := net.JoinHostPort(xa, fmt.Sprint(npEchoPort))
	cutTrip := echoConn(t, ya.p.netns, echo)
	keptTrip := echoConn(t, w.pod("z", "a").p.netns, echo)
	for what, trip := range map[string]func() error{"y/a": cutTrip, "z/a": keptTrip} {
		if err := trip(); err != nil {
			t.Fatalf("%s's connection to x/a: %v", what, err)
		}
	}
	upd.Spec.Ingress[0].From = []networkingv1.NetworkPolicyPeer{{NamespaceSelector: labels("ns", "z")}}
	if err := c.Update(context.Background(), upd); err != nil {
		t.Fatal(err)
	}
	w.check(t, "x from z (updated)", func(from, to *npPod, _ string, _ int) bool { return to.ns != "x" || from.ns == "z" })
	waitRefused(t, l, ya.p, npEchoPort, w.pod("x", "a").p)
	if err := keptTrip(); err != nil {
		t.Errorf("z/a's established connection to x/a, still allowed, broke with the update: %v", err)
	}
	if err := cutTrip(); err == nil {
		t.Error("y/a's established connection to x/a survived the update that no longer allows it")
	}
	if err := keptTrip(); err != nil {
		t.Errorf("z/a's established connection to x/a, still allowed, broke after the cut: %v", err)
	}
	deletePolicies(t, upd)
	w.check(t, "update deleted", all)

	// Egress by named port with no "to": x's pods reach every pod of the
	// network on its own "web" number (z/c, without one, on nothing).
	webOut := w.policy(t, "x", "web-out", networkingv1.NetworkPolicySpec{PolicyTypes: egressOnly,
		Egress: []networkingv1.NetworkPolicyEgressRule{{Ports: []networkingv1.NetworkPolicyPort{
			npPort("TCP", intstr.FromString("web"), 0)}}}})
	w.check(t, "x: egress on named port web to every pod", func(from, to *npPod, proto string, port int) bool {
		return from.ns != "x" || proto == "TCP" && port == npWeb[to.String()]
	})
	deletePolicies(t, webOut)
	w.check(t, "all policies deleted", all)
	otherReaches()
}

// vm runs a VM-like pod in model namespace x on n1, outside the matrix
// (label pod=vm), serving the model's ports as x/vm.
func (w *npWorld) vm(t *testing.T, nadName string) *npPod {
	t.Helper()
	p := w.l.runPod(w.nad(t, "x", nadName), w.k8s["x"]+"-vm", "n1", func(p *corev1.Pod) { p.Labels["pod"] = "vm" })
	vm := &npPod{ns: "x", pod: "vm", p: p}
	serveModelPorts(t, p, vm.String())
	return vm
}

// leaseRE is what busybox udhcpc prints on a lease.
var leaseRE = regexp.MustCompile(`lease of (\S+) obtained`)

// dhcpUnderDeny: once the plan isolating vm's own port both ways is
// applied on its node, vm and peer are refused both ways (they reached
// each other before: the caller's control); vm, without addresses,
// then gets a lease of its address from kvnet-node's DHCP server
// (DISCOVER and REQUEST from 0.0.0.0, broadcast), configures it and
// renews it (a unicast REQUEST from its address to the server, as a
// client does at T1, answered without the client starting over), and
// is still refused both ways after. Removing the isolated ports' DHCPv4
// accept rules did not make the lease or the renewal fail here (the
// server's answers, broadcast, leave conntrack entries the renewal
// may ride on: not established); the datapath's TestPolicyEnforcement
// is where those rules are seen failing (a client's datagram to the
// router's port 67 from an isolated port, dropped without them).
func dhcpUnderDeny(t *testing.T, l *lab, vm, peer *npPod) {
	t.Helper()
	hostIf := vm.p.hostIf(t, l)
	testenv.Eventually(t, waitTimeout, vm.String()+"'s port isolated both ways in the applied plan", func() error {
		for _, pp := range l.agent(vm.p.node).LastApplied().State.Policies {
			if pp.Port == hostIf {
				if pp.Ingress == nil || pp.Egress == nil {
					return fmt.Errorf("port %s: ingress isolated %v, egress isolated %v", hostIf, pp.Ingress != nil, pp.Egress != nil)
				}
				return nil
			}
		}
		return fmt.Errorf("no policy applied on port %s", hostIf)
	})
	refusedBothWays := func(when string) {
		t.Helper()
		for _, pr := range [][2]*npPod{{vm, peer}, {peer, vm}} {
			for range 2 {
				if probe(pr[0], pr[1], "TCP", 80) {
					t.Errorf("%s: %s reached %s on TCP 80 under deny", when, pr[0], pr[1])
					break
				}
			}
		}
	}
	refusedBothWays("before the lease")
	if err := nstest.Exec(vm.p.netns, "ip", "addr", "flush", "dev", vm.p.ifName); err != nil {
		t.Fatal(err)
	}
	want := vm.p.ip()
	// udhcpc stays in the foreground after its lease (no -q); its script
	// configures nothing, the test adds the address, then SIGUSR1 makes
	// it renew.
	var out testenv.Buffer
	cmd := exec.Command("ip", "netns", "exec", filepath.Base(vm.p.netns), "busybox", "udhcpc",
		"-i", vm.p.ifName, "-f", "-t", "10", "-T", "2", "-A", "1", "-s", "/bin/true")
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	leases := func() (n int, err error) {
		for _, m := range leaseRE.FindAllStringSubmatch(out.String(), -1) {
			if m[1] != want {
				return n, fmt.Errorf("udhcpc leased %s, want %s:\n%s", m[1], want, out.String())
			}
			n++
		}
		return n, nil
	}
	testenv.Eventually(t, waitTimeout, "DHCP lease under deny-all", func() error {
		n, err := leases()
		if err == nil && n == 0 {
			err = fmt.Errorf("no lease yet:\n%s", out.String())
		}
		return err
	})
	if err := nstest.Exec(vm.p.netns, "ip", "addr", "add", vm.p.a.IPAddresses[0], "dev", vm.p.ifName); err != nil {
		t.Fatal(err)
	}
	mark := len(out.String())
	if err := cmd.Process.Signal(syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, waitTimeout, "DHCP renewal (unicast, from "+want+") under deny-all", func() error {
		n, err := leases()
		if err == nil && n < 2 {
			err = fmt.Errorf("%d leases, want the renewal's too:\n%s", n, out.String())
		}
		return err
	})
	// Answered as a renewal: busybox udhcpc, its unicast renewal not
	// answered, starts over from a broadcast DISCOVER (from 0.0.0.0,
	// which no port chain judges) and would get the lease that way.
	if after := out.String()[mark:]; !strings.Contains(after, "sending renew to server") ||
		strings.Contains(after, "sending discover") || strings.Contains(after, "sending select") {
		t.Errorf("udhcpc's renewal was not answered by unicast:\n%s", after)
	}
	refusedBothWays("after the lease")
}
