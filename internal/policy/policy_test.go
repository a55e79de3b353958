package policy

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// world is the upstream e2e model: namespaces x, y, z (label ns=<name>),
// pods a, b, c in each (label pod=<name>), every pod local, with a named
// port "serve-80-tcp" (80/TCP) on pod a only, a named port "web" that is
// 80/TCP on pod a and 81/TCP on pod b (none on c), and address
// 10.0.<ns index>.<pod index>.
func world() Input {
	in := Input{Network: "tenant", Namespaces: map[string]map[string]string{}}
	for i, ns := range []string{"x", "y", "z"} {
		in.Namespaces[ns] = map[string]string{"ns": ns}
		for j, pod := range []string{"a", "b", "c"} {
			e := Endpoint{Namespace: ns, Name: pod, Labels: map[string]string{"pod": pod}, Local: true,
				Addrs: []netip.Addr{netip.AddrFrom4([4]byte{10, 0, byte(i + 1), byte(j + 1)})}}
			switch pod {
			case "a":
				e.Ports = []NamedPort{{Name: "serve-80-tcp", Protocol: TCP, Port: 80}, {Name: "serve-81-udp", Protocol: UDP, Port: 81},
					{Name: "web", Protocol: TCP, Port: 80}}
			case "b":
				e.Ports = []NamedPort{{Name: "web", Protocol: TCP, Port: 81}}
			}
			in.Endpoints = append(in.Endpoints, e)
		}
	}
	return in
}

func addrOf(in Input, key string) netip.Addr {
	for _, e := range in.Endpoints {
		if e.Key() == key {
			return e.Addrs[0]
		}
	}
	panic("no endpoint " + key)
}

// reach reports whether from may open a connection to port/proto of to
// under c: from's egress and to's ingress both allow it.
func reach(in Input, c Compiled, from, to, proto string, port uint16) bool {
	fa, ta := addrOf(in, from), addrOf(in, to)
	f, t := strings.Split(from, "/"), strings.Split(to, "/")
	if p := c.Port(f[0], f[1]); p != nil {
		if _, ok := p.Egress.Allows(ta, proto, port); !ok {
			return false
		}
	}
	if p := c.Port(t[0], t[1]); p != nil {
		if _, ok := p.Ingress.Allows(fa, proto, port); !ok {
			return false
		}
	}
	return true
}

var pods = []string{"x/a", "x/b", "x/c", "y/a", "y/b", "y/c", "z/a", "z/b", "z/c"}

func np(ns, name string, spec networkingv1.NetworkPolicySpec) *networkingv1.NetworkPolicy {
	return &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: spec}
}

func sel(kv ...string) *metav1.LabelSelector {
	m := map[string]string{}
	for i := 0; i < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return &metav1.LabelSelector{MatchLabels: m}
}

func tcp(p int32) networkingv1.NetworkPolicyPort {
	proto := corev1.ProtocolTCP
	port := intstr.FromInt32(p)
	return networkingv1.NetworkPolicyPort{Protocol: &proto, Port: &port}
}

func named(proto corev1.Protocol, name string) networkingv1.NetworkPolicyPort {
	port := intstr.FromString(name)
	return networkingv1.NetworkPolicyPort{Protocol: &proto, Port: &port}
}

func TestCompileMatrix(t *testing.T) {
	ingress := []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
	egress := []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}
	end83 := int32(83)
	type probe struct {
		proto string
		port  uint16
	}
	all := []probe{{TCP, 80}, {TCP, 81}, {UDP, 80}, {UDP, 81}}
	tcp80to84 := []probe{{TCP, 80}, {TCP, 81}, {TCP, 82}, {TCP, 83}, {TCP, 84}, {UDP, 82}}
	cases := []struct {
		name     string
		policies []*networkingv1.NetworkPolicy
		probes   []probe
		// want says whether from may reach to at proto/port.
		want func(from, to, proto string, port uint16) bool
	}{{
		name:   "no policy: everything",
		probes: all,
		want:   func(from, to, proto string, port uint16) bool { return true },
	}, {
		name:     "default deny ingress in x",
		policies: []*networkingv1.NetworkPolicy{np("x", "deny", networkingv1.NetworkPolicySpec{})},
		probes:   all,
		want:     func(from, to, _ string, _ uint16) bool { return !strings.HasPrefix(to, "x/") },
	}, {
		name:     "default deny egress in x",
		policies: []*networkingv1.NetworkPolicy{np("x", "deny", networkingv1.NetworkPolicySpec{PolicyTypes: egress})},
		probes:   all,
		want:     func(from, to, _ string, _ uint16) bool { return !strings.HasPrefix(from, "x/") },
	}, {
		name: "allow to x/a from namespace y",
		policies: []*networkingv1.NetworkPolicy{np("x", "from-y", networkingv1.NetworkPolicySpec{
			PodSelector: *sel("pod", "a"),
			Ingress:     []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: sel("ns", "y")}}}},
		})},
		probes: all,
		want: func(from, to, _ string, _ uint16) bool {
			return to != "x/a" || strings.HasPrefix(from, "y/")
		},
	}, {
		name: "allow to x/a from pod b in namespace z only (both selectors)",
		policies: []*networkingv1.NetworkPolicy{np("x", "from-zb", networkingv1.NetworkPolicySpec{
			PodSelector: *sel("pod", "a"),
			Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{
				{NamespaceSelector: sel("ns", "z"), PodSelector: sel("pod", "b")}}}},
		})},
		probes: all,
		want:   func(from, to, _ string, _ uint16) bool { return to != "x/a" || from == "z/b" },
	}, {
		name: "pod selector alone is the policy's namespace",
		policies: []*networkingv1.NetworkPolicy{np("x", "from-b", networkingv1.NetworkPolicySpec{
			PodSelector: *sel("pod", "a"),
			Ingress:     []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{PodSelector: sel("pod", "b")}}}},
		})},
		probes: all,
		want:   func(from, to, _ string, _ uint16) bool { return to != "x/a" || from == "x/b" },
	}, {
		name: "named port on ingress, TCP 80 only",
		policies: []*networkingv1.NetworkPolicy{np("x", "named", networkingv1.NetworkPolicySpec{
			Ingress: []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{named(corev1.ProtocolTCP, "serve-80-tcp")}}},
		})},
		probes: all,
		want: func(from, to, proto string, port uint16) bool {
			// Only x/a has the port: x/b and x/c allow nothing.
			return !strings.HasPrefix(to, "x/") || (to == "x/a" && proto == TCP && port == 80)
		},
	}, {
		name: "named port on egress resolves per peer",
		policies: []*networkingv1.NetworkPolicy{np("x", "named-out", networkingv1.NetworkPolicySpec{
			PolicyTypes: egress,
			Egress: []networkingv1.NetworkPolicyEgressRule{{
				To:    []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{}}},
				Ports: []networkingv1.NetworkPolicyPort{named(corev1.ProtocolUDP, "serve-81-udp")}}},
		})},
		probes: all,
		want: func(from, to, proto string, port uint16) bool {
			return !strings.HasPrefix(from, "x/") || (strings.HasSuffix(to, "/a") && proto == UDP && port == 81)
		},
	}, {
		name: "endPort range 81-83, probed inside and outside",
		policies: []*networkingv1.NetworkPolicy{np("y", "range", networkingv1.NetworkPolicySpec{
			Ingress: []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{
				func() networkingv1.NetworkPolicyPort { p := tcp(81); p.EndPort = &end83; return p }()}}},
		})},
		probes: tcp80to84,
		want: func(from, to, proto string, port uint16) bool {
			return !strings.HasPrefix(to, "y/") || (proto == TCP && port >= 81 && port <= 83)
		},
	}, {
		name: "ingress named port resolving to 80 on pods a and 81 on pods b",
		policies: []*networkingv1.NetworkPolicy{np("z", "web", networkingv1.NetworkPolicySpec{
			Ingress: []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{named(corev1.ProtocolTCP, "web")}}},
		})},
		probes: tcp80to84,
		want: func(from, to, proto string, port uint16) bool {
			return !strings.HasPrefix(to, "z/") || to == "z/a" && proto == TCP && port == 80 || to == "z/b" && proto == TCP && port == 81
		},
	}, {
		name: "egress by named port with no to resolves on every destination",
		policies: []*networkingv1.NetworkPolicy{np("x", "web-out", networkingv1.NetworkPolicySpec{
			PolicyTypes: egress,
			Egress:      []networkingv1.NetworkPolicyEgressRule{{Ports: []networkingv1.NetworkPolicyPort{named(corev1.ProtocolTCP, "web")}}},
		})},
		probes: tcp80to84,
		want: func(from, to, proto string, port uint16) bool {
			return !strings.HasPrefix(from, "x/") || strings.HasSuffix(to, "/a") && proto == TCP && port == 80 ||
				strings.HasSuffix(to, "/b") && proto == TCP && port == 81
		},
	}, {
		name: "egress by named port to an ipBlock resolves on the pods inside it",
		policies: []*networkingv1.NetworkPolicy{np("x", "web-block", networkingv1.NetworkPolicySpec{
			PolicyTypes: egress,
			Egress: []networkingv1.NetworkPolicyEgressRule{{
				To:    []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "10.0.2.0/24"}}},
				Ports: []networkingv1.NetworkPolicyPort{named(corev1.ProtocolTCP, "web")}}},
		})},
		probes: tcp80to84,
		want: func(from, to, proto string, port uint16) bool {
			return !strings.HasPrefix(from, "x/") || to == "y/a" && proto == TCP && port == 80 || to == "y/b" && proto == TCP && port == 81
		},
	}, {
		name: "ipBlock with except",
		policies: []*networkingv1.NetworkPolicy{np("z", "block", networkingv1.NetworkPolicySpec{
			PodSelector: *sel("pod", "c"),
			Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{
				{IPBlock: &networkingv1.IPBlock{CIDR: "10.0.0.0/16", Except: []string{"10.0.1.0/24", "10.0.2.2/32"}}}}}},
		})},
		probes: all,
		want: func(from, to, _ string, _ uint16) bool {
			return to != "z/c" || !(strings.HasPrefix(from, "x/") || from == "y/b")
		},
	}, {
		name: "policies add up",
		policies: []*networkingv1.NetworkPolicy{
			np("x", "one", networkingv1.NetworkPolicySpec{
				Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: sel("ns", "y")}},
					Ports: []networkingv1.NetworkPolicyPort{tcp(80)}}}}),
			np("x", "two", networkingv1.NetworkPolicySpec{
				Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: sel("ns", "z")}},
					Ports: []networkingv1.NetworkPolicyPort{tcp(81)}}}}),
		},
		probes: all,
		want: func(from, to, proto string, port uint16) bool {
			if !strings.HasPrefix(to, "x/") {
				return true
			}
			return proto == TCP && (strings.HasPrefix(from, "y/") && port == 80 || strings.HasPrefix(from, "z/") && port == 81)
		},
	}, {
		name: "egress allow-all rule with an empty to",
		policies: []*networkingv1.NetworkPolicy{np("y", "out", networkingv1.NetworkPolicySpec{
			PolicyTypes: egress,
			Egress:      []networkingv1.NetworkPolicyEgressRule{{Ports: []networkingv1.NetworkPolicyPort{tcp(80)}}},
		})},
		probes: all,
		want: func(from, to, proto string, port uint16) bool {
			return !strings.HasPrefix(from, "y/") || (proto == TCP && port == 80)
		},
	}, {
		name: "policyTypes Ingress only ignores egress rules",
		policies: []*networkingv1.NetworkPolicy{np("y", "in-only", networkingv1.NetworkPolicySpec{
			PodSelector: *sel("pod", "b"),
			PolicyTypes: ingress,
			Egress:      []networkingv1.NetworkPolicyEgressRule{{Ports: []networkingv1.NetworkPolicyPort{tcp(80)}}},
		})},
		probes: all,
		want:   func(from, to, _ string, _ uint16) bool { return to != "y/b" },
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			in := world()
			in.Policies = tc.policies
			c, errs := Compile(in)
			if len(errs) > 0 {
				t.Fatalf("Compile: %v", errs)
			}
			var bad []string
			for _, pr := range tc.probes {
				var sb strings.Builder
				mismatch := false
				fmt.Fprintf(&sb, "%s/%d (rows: from, columns: to; want/got)\n%-5s", pr.proto, pr.port, "")
				for _, to := range pods {
					fmt.Fprintf(&sb, " %-5s", to)
				}
				for _, from := range pods {
					fmt.Fprintf(&sb, "\n%-5s", from)
					for _, to := range pods {
						w, g := tc.want(from, to, pr.proto, pr.port), reach(in, c, from, to, pr.proto, pr.port)
						mark := map[bool]string{true: ".", false: "X"}
						cell := mark[w] + "/" + mark[g]
						if w != g {
							mismatch = true
							cell += "!"
						}
						fmt.Fprintf(&sb, " %-5s", cell)
					}
				}
				if mismatch {
					bad = append(bad, sb.String())
				}
			}
			if len(bad) > 0 {
				t.Errorf("reachability differs:\n%s", strings.Join(bad, "\n"))
			}
		})
	}
}

func TestCompileRuleNamesAndPeers(t *testing.T) {
	in := world()
	in.Policies = []*networkingv1.NetworkPolicy{np("x", "p", networkingv1.NetworkPolicySpec{
		PodSelector: *sel("pod", "a"),
		Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{
			{NamespaceSelector: sel("ns", "y")}, {PodSelector: sel("pod", "b")}}}},
		Egress: []networkingv1.NetworkPolicyEgressRule{{
			To:    []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{}}},
			Ports: []networkingv1.NetworkPolicyPort{tcp(53), named(corev1.ProtocolTCP, "serve-80-tcp")}}},
	})}
	c, errs := Compile(in)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	if len(c.Ports) != 1 || c.Ports[0].Key() != "x/a" {
		t.Fatalf("ports: got %+v, want x/a only", c.Ports)
	}
	p := c.Ports[0]
	if !p.Ingress.Isolated || !p.Egress.Isolated || !slices.Equal(p.Ingress.Policies, []string{"x/p"}) {
		t.Fatalf("isolation: got %+v", p)
	}
	want := []netip.Prefix{
		netip.MustParsePrefix("10.0.1.2/32"), netip.MustParsePrefix("10.0.2.1/32"),
		netip.MustParsePrefix("10.0.2.2/32"), netip.MustParsePrefix("10.0.2.3/32")}
	if len(p.Ingress.Rules) != 1 || p.Ingress.Rules[0].Name != "x/p ingress[0]" || !slices.Equal(p.Ingress.Rules[0].Peers, want) {
		t.Errorf("ingress rules: got %+v, want one named x/p ingress[0] with peers %v", p.Ingress.Rules, want)
	}
	var names []string
	for _, r := range p.Egress.Rules {
		names = append(names, fmt.Sprintf("%s %v %v", r.Name, r.Peers, r.Ports))
	}
	wantNames := []string{
		"x/p egress[0] [10.0.1.1/32 10.0.1.2/32 10.0.1.3/32 10.0.2.1/32 10.0.2.2/32 10.0.2.3/32 10.0.3.1/32 10.0.3.2/32 10.0.3.3/32] [TCP/53]",
		"x/p egress[0] port TCP/80 [10.0.1.1/32 10.0.2.1/32 10.0.3.1/32] [TCP/80]",
	}
	if !slices.Equal(names, wantNames) {
		t.Errorf("egress rules:\ngot  %q\nwant %q", names, wantNames)
	}
	if r, ok := p.Egress.Allows(netip.MustParseAddr("10.0.3.1"), TCP, 80); !ok || r != "x/p egress[0] port TCP/80" {
		t.Errorf("Allows(z/a, TCP/80) = %q, %v; want the named-port rule", r, ok)
	}
}

func TestCompileOtherNetworkNeverMatches(t *testing.T) {
	// The same namespace labels and addresses on another network: its
	// Input is another Compile, and namespaces outside in.Namespaces
	// never match a namespace selector.
	in := world()
	delete(in.Namespaces, "z")
	in.Policies = []*networkingv1.NetworkPolicy{
		np("x", "all-ns", networkingv1.NetworkPolicySpec{
			Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{}}}}}}),
		np("z", "ignored", networkingv1.NetworkPolicySpec{}),
	}
	c, errs := Compile(in)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	for _, p := range c.Ports {
		if p.Namespace == "z" {
			t.Errorf("policy of namespace z (not on the network) compiled for %s", p.Key())
		}
		for _, r := range p.Ingress.Rules {
			for _, peer := range r.Peers {
				if peer.Contains(netip.MustParseAddr("10.0.3.1")) {
					t.Errorf("rule %s has peer %s of namespace z, not on the network", r.Name, peer)
				}
			}
		}
	}
}

// TestCompileFailsClosed: a policy with a part the compiler cannot use
// still isolates the pods it selects in its directions, the unusable
// rule admits nothing, its other rules and the other policies apply, and
// the error names the policy, the field, the value and the effect.
func TestCompileFailsClosed(t *testing.T) {
	badProto := corev1.Protocol("ICMP")
	port0 := intstr.FromInt32(0)
	end := int32(70)
	p80 := intstr.FromInt32(80)
	fromB := networkingv1.NetworkPolicyIngressRule{From: []networkingv1.NetworkPolicyPeer{{PodSelector: sel("pod", "b")}}}
	toB := networkingv1.NetworkPolicyEgressRule{To: []networkingv1.NetworkPolicyPeer{{PodSelector: sel("pod", "b")}}}
	egress := []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}
	cases := []struct {
		name string
		spec networkingv1.NetworkPolicySpec
		want string // in the error
		// isolated: the pods isolated (x/a, x/b, x/c: "abc") per direction;
		// in, out: the rules x/a keeps, by name.
		isoIn, isoOut string
		in, out       []string
	}{
		{"bad cidr", networkingv1.NetworkPolicySpec{Ingress: []networkingv1.NetworkPolicyIngressRule{
			{From: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "10.0.0.0/33"}}}}, fromB}},
			`spec.ingress[0] peer[0].ipBlock.cidr "10.0.0.0/33": netip.ParsePrefix("10.0.0.0/33"): prefix length out of range: rule spec.ingress[0] admits nothing`,
			"abc", "", []string{"x/bad ingress[1]"}, nil},
		{"IPv4-mapped cidr", networkingv1.NetworkPolicySpec{Ingress: []networkingv1.NetworkPolicyIngressRule{
			{From: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "::ffff:10.0.0.0/104"}}}}}},
			`spec.ingress[0] peer[0].ipBlock.cidr "::ffff:10.0.0.0/104": an IPv4-mapped IPv6 prefix`,
			"abc", "", nil, nil},
		{"except outside", networkingv1.NetworkPolicySpec{Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "10.0.0.0/16", Except: []string{"10.1.0.0/24"}}}}}}},
			`spec.ingress[0] peer[0].ipBlock.except[0] "10.1.0.0/24": not inside cidr`, "abc", "", nil, nil},
		{"bad protocol", networkingv1.NetworkPolicySpec{PolicyTypes: egress, Egress: []networkingv1.NetworkPolicyEgressRule{
			toB, {Ports: []networkingv1.NetworkPolicyPort{{Protocol: &badProto}}}}},
			`spec.egress[1].ports[0].protocol "ICMP": want TCP, UDP or SCTP: rule spec.egress[1] admits nothing`,
			"", "abc", nil, []string{"x/bad egress[0]"}},
		{"port 0", networkingv1.NetworkPolicySpec{Ingress: []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{{Port: &port0}}}}},
			`spec.ingress[0].ports[0].port 0`, "abc", "", nil, nil},
		{"endPort below port", networkingv1.NetworkPolicySpec{Ingress: []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{{Port: &p80, EndPort: &end}}}}},
			`spec.ingress[0].ports[0].endPort 70`, "abc", "", nil, nil},
		{"empty peer", networkingv1.NetworkPolicySpec{Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{}}}}},
			`spec.ingress[0] peer[0]: one of podSelector`, "abc", "", nil, nil},
		{"bad selector selects the whole namespace", networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"pod": "a"}, MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "a", Operator: "Near"}}},
			Ingress:     []networkingv1.NetworkPolicyIngressRule{fromB}},
			`spec.podSelector: "Near" is not a valid label selector operator: the policy isolates every pod of namespace "x"`,
			"abc", "", []string{"x/bad ingress[0]"}, nil},
		{"bad policy type isolates both directions", networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{"Sideways"},
			PodSelector: *sel("pod", "a"), Ingress: []networkingv1.NetworkPolicyIngressRule{fromB}},
			`spec.policyTypes[0] "Sideways": want Ingress or Egress: the policy isolates its pods in both directions`,
			"a", "a", []string{"x/bad ingress[0]"}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			in := world()
			in.Policies = []*networkingv1.NetworkPolicy{np("x", "bad", tc.spec), np("y", "good", networkingv1.NetworkPolicySpec{})}
			c, errs := Compile(in)
			if len(errs) != 1 || !strings.Contains(errs[0].Error(), tc.want) || !strings.Contains(errs[0].Error(), `policy "x/bad" on network "tenant"`) {
				t.Fatalf("errors: got %v, want one naming x/bad and %q", errs, tc.want)
			}
			if pe := (*Error)(nil); !errors.As(errs[0], &pe) || pe.Policy != "x/bad" {
				t.Errorf("error %v is not a *Error for x/bad", errs[0])
			}
			for _, pod := range []string{"a", "b", "c"} {
				p := c.Port("x", pod)
				gotIn, gotOut := p != nil && p.Ingress.Isolated, p != nil && p.Egress.Isolated
				if gotIn != strings.Contains(tc.isoIn, pod) || gotOut != strings.Contains(tc.isoOut, pod) {
					t.Errorf("x/%s isolated for ingress %v, egress %v; want %v, %v", pod, gotIn, gotOut,
						strings.Contains(tc.isoIn, pod), strings.Contains(tc.isoOut, pod))
				}
			}
			if p := c.Port("x", "a"); p != nil {
				names := func(rs []Rule) []string {
					var out []string
					for _, r := range rs {
						out = append(out, r.Name)
					}
					return out
				}
				if got := names(p.Ingress.Rules); !slices.Equal(got, tc.in) {
					t.Errorf("x/a ingress rules %q, want %q", got, tc.in)
				}
				if got := names(p.Egress.Rules); !slices.Equal(got, tc.out) {
					t.Errorf("x/a egress rules %q, want %q", got, tc.out)
				}
			}
			if p := c.Port("y", "a"); p == nil || !p.Ingress.Isolated {
				t.Errorf("the good policy was not compiled: %+v", p)
			}
		})
	}
}

func TestSubtract(t *testing.T) {
	got, err := ipBlock(&networkingv1.IPBlock{CIDR: "10.0.0.0/24", Except: []string{"10.0.0.0/26", "10.0.0.128/32"}}, "b")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"10.0.0.64/26", "10.0.0.129/32", "10.0.0.130/31", "10.0.0.132/30", "10.0.0.136/29", "10.0.0.144/28", "10.0.0.160/27", "10.0.0.192/26"}
	var s []string
	for _, p := range normalize(got) {
		s = append(s, p.String())
	}
	if !slices.Equal(s, want) {
		t.Errorf("got %v, want %v", s, want)
	}
	v6, err := ipBlock(&networkingv1.IPBlock{CIDR: "fd00::/64", Except: []string{"fd00::/65"}}, "b")
	if err != nil || len(v6) != 1 || v6[0].String() != "fd00::8000:0:0:0/65" {
		t.Errorf("IPv6: got %v, %v; want [fd00::8000:0:0:0/65]", v6, err)
	}
}

// BenchmarkCompile compiles 1,000 policies over 10,000 pods (100 nodes of
// 100 pods; this node's 100 are local) in 100 namespaces.
func BenchmarkCompile(b *testing.B) {
	in := Input{Network: "bench", Namespaces: map[string]map[string]string{}}
	for n := range 100 {
		ns := fmt.Sprintf("ns%d", n)
		in.Namespaces[ns] = map[string]string{"ns": ns, "team": fmt.Sprint(n % 10)}
		for p := range 100 {
			i := n*100 + p
			in.Endpoints = append(in.Endpoints, Endpoint{Namespace: ns, Name: fmt.Sprintf("pod%d", p),
				Labels: map[string]string{"app": fmt.Sprintf("app%d", p%10), "tier": fmt.Sprint(p % 3)},
				Addrs:  []netip.Addr{netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})},
				Ports:  []NamedPort{{Name: "http", Protocol: TCP, Port: 8080}},
				Local:  i%100 == 0})
		}
	}
	for i := range 1000 {
		ns := fmt.Sprintf("ns%d", i%100)
		in.Policies = append(in.Policies, np(ns, fmt.Sprintf("p%d", i), networkingv1.NetworkPolicySpec{
			PodSelector: *sel("app", fmt.Sprintf("app%d", i%10)),
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From:  []networkingv1.NetworkPolicyPeer{{NamespaceSelector: sel("team", fmt.Sprint(i%10)), PodSelector: sel("tier", "1")}},
				Ports: []networkingv1.NetworkPolicyPort{tcp(80), named(corev1.ProtocolTCP, "http")}}},
			Egress: []networkingv1.NetworkPolicyEgressRule{{
				To: []networkingv1.NetworkPolicyPeer{{PodSelector: sel("tier", "2")}, {IPBlock: &networkingv1.IPBlock{CIDR: "192.168.0.0/16", Except: []string{"192.168.1.0/24"}}}}}},
		}))
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, errs := Compile(in); len(errs) > 0 {
			b.Fatal(errs)
		}
	}
}
