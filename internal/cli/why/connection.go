package why

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nadv1 "kvnet.io/kvnet/api/k8scni/v1"
	mnpv1beta1 "kvnet.io/kvnet/api/k8scni/v1beta1"
	"kvnet.io/kvnet/internal/netconf"
	"kvnet.io/kvnet/internal/podnetworks"
	netpolicy "kvnet.io/kvnet/internal/policy"
	"kvnet.io/kvnet/internal/udn"
)

// The verdicts of "kvnet why connection" that refuse a connection.
const (
	// DifferentNetworks: the two endpoints share no kvnet network (two
	// tenants): they never reach each other over a UDN, whatever policy says.
	DifferentNetworks Code = "DifferentNetworks"
	// PolicyDeniesEgress: the source is isolated for egress and none of
	// the rules of the policies isolating it allows the connection.
	PolicyDeniesEgress Code = "PolicyDeniesEgress"
	// PolicyDeniesIngress: the destination is isolated for ingress and
	// none of the rules of the policies isolating it allows the connection.
	PolicyDeniesIngress Code = "PolicyDeniesIngress"
)

// ConnOptions is the connection kvnet why judges.
type ConnOptions struct {
	// Protocol is TCP (default), UDP or SCTP.
	Protocol string
	// Port is the destination port; 0 asks whether any port of Protocol
	// is allowed.
	Port uint16
	// Network picks the network when the endpoints share several: a
	// network name or a NAD ("namespace/name"); empty prefers the
	// primary network.
	Network string
}

// endpoint is one end of a connection: a pod, or a VM's launcher pod.
type endpoint struct {
	What string // "pod ns/name" or "vm ns/name (launcher pod name)"
	Pod  *corev1.Pod
	Nets podnetworks.Networks
}

// connFacts is what judging a connection needs, read once.
type connFacts struct {
	Src, Dst endpoint
	// Network is the shared network judged ("" when none is shared).
	Network string
	Primary bool
	// Input is the compiler's input for Network, Src and Dst local.
	Input netpolicy.Input
	// Kind is "NetworkPolicy" or "MultiNetworkPolicy".
	Kind string
}

// parseEndpoint splits "ns/name" or "name" (in namespace).
func parseEndpoint(arg, namespace string) (string, string, error) {
	ns, name, ok := strings.Cut(arg, "/")
	if !ok {
		ns, name = namespace, arg
	}
	if ns == "" || name == "" || strings.Contains(name, "/") {
		return "", "", fmt.Errorf("endpoint %q: want <namespace>/<pod or vm> or <pod or vm>", arg)
	}
	return ns, name, nil
}

// DiagnoseConnection says whether policy allows a connection from src to
// dst ("namespace/name" of a pod, or of a VM or VMI whose launcher pod is
// used). An error means the endpoints could not be read.
func DiagnoseConnection(ctx context.Context, c client.Client, src, dst, namespace string, opts ConnOptions) (*Report, error) {
	if opts.Protocol == "" {
		opts.Protocol = netpolicy.TCP
	}
	opts.Protocol = strings.ToUpper(opts.Protocol)
	switch opts.Protocol {
	case netpolicy.TCP, netpolicy.UDP, netpolicy.SCTP:
	default:
		return nil, fmt.Errorf("--protocol %q: want TCP, UDP or SCTP", opts.Protocol)
	}
	k := &collector{c: c}
	f, err := k.connFacts(ctx, src, dst, namespace, opts)
	if err != nil {
		return nil, err
	}
	r := &Report{Subject: fmt.Sprintf("connection %s -> %s %s", f.Src.What, f.Dst.What, portString(opts.Protocol, opts.Port))}
	diagnoseConnection(r, f, opts)
	return r, nil
}

func portString(proto string, port uint16) string {
	if port == 0 {
		return proto + " (any port)"
	}
	return fmt.Sprintf("%s/%d", proto, port)
}

// resolve reads the pod, or VM/VMI launcher pod, named by arg.
func (k *collector) resolve(ctx context.Context, arg, namespace string) (endpoint, error) {
	ns, name, err := parseEndpoint(arg, namespace)
	if err != nil {
		return endpoint{}, err
	}
	var pod corev1.Pod
	found, err := notFound(k.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &pod))
	if err != nil {
		return endpoint{}, fmt.Errorf("get pod %s/%s: %w", ns, name, err)
	}
	e := endpoint{What: "pod " + ns + "/" + name, Pod: &pod}
	if !found {
		var pods corev1.PodList
		if err := k.c.List(ctx, &pods, client.InNamespace(ns)); err != nil {
			return endpoint{}, fmt.Errorf("list pods in %q: %w", ns, err)
		}
		var launchers []corev1.Pod
		for _, p := range pods.Items {
			if launcherVMI(&p) == name && !podnetworks.Completed(&p) {
				launchers = append(launchers, p)
			}
		}
		if len(launchers) == 0 {
			return endpoint{}, fmt.Errorf("endpoint %q: no pod %s/%s, nor a running VM of that name (no virt-launcher pod)", arg, ns, name)
		}
		// The newest launcher pod: the migration target once it runs;
		// policy isolates both alike (same labels and addresses).
		slices.SortFunc(launchers, func(a, b corev1.Pod) int { return b.CreationTimestamp.Compare(a.CreationTimestamp.Time) })
		e = endpoint{What: fmt.Sprintf("vm %s/%s (launcher pod %s)", ns, name, launchers[0].Name), Pod: &launchers[0]}
	}
	if v, ok := e.Pod.Annotations[podnetworks.Annotation]; ok {
		if e.Nets, err = podnetworks.Parse(v); err != nil {
			return endpoint{}, fmt.Errorf("%s: %w", e.What, err)
		}
	}
	return e, nil
}

// sharedNetwork picks the network src and dst share: opts.Network, else
// the primary one, else the first by name.
func sharedNetwork(src, dst podnetworks.Networks, want string) (name string, primary bool) {
	var shared []string
	prim := map[string]bool{}
	for key, a := range src {
		for key2, b := range dst {
			if a.Network != b.Network || slices.Contains(shared, a.Network) {
				continue
			}
			if want != "" && want != a.Network && want != key && want != key2 {
				continue
			}
			shared = append(shared, a.Network)
			prim[a.Network] = a.Role == podnetworks.RolePrimary
		}
	}
	if len(shared) == 0 {
		return "", false
	}
	slices.SortFunc(shared, func(a, b string) int {
		if prim[a] != prim[b] {
			if prim[a] {
				return -1
			}
			return 1
		}
		return strings.Compare(a, b)
	})
	return shared[0], prim[shared[0]]
}

func (k *collector) connFacts(ctx context.Context, src, dst, namespace string, opts ConnOptions) (*connFacts, error) {
	f := &connFacts{}
	var err error
	if f.Src, err = k.resolve(ctx, src, namespace); err != nil {
		return nil, err
	}
	if f.Dst, err = k.resolve(ctx, dst, namespace); err != nil {
		return nil, err
	}
	f.Network, f.Primary = sharedNetwork(f.Src.Nets, f.Dst.Nets, opts.Network)
	if f.Network == "" {
		return f, nil
	}
	// The network's NADs and namespaces, as kvnet-node reads them.
	var nads nadv1.NetworkAttachmentDefinitionList
	if err := k.listOptional(ctx, &nads); err != nil {
		return nil, fmt.Errorf("list NetworkAttachmentDefinitions: %w", err)
	}
	nadKeys := map[string]bool{}
	in := netpolicy.Input{Network: f.Network, Namespaces: map[string]map[string]string{}}
	for _, nad := range nads.Items {
		if _, refused := nad.Annotations[udn.NetworkConflictAnnotation]; refused {
			continue
		}
		conf, err := netconf.Parse(nad.Spec.Config)
		if err != nil || conf == nil || conf.Name != f.Network {
			continue
		}
		nadKeys[nad.Namespace+"/"+nad.Name] = true
		in.Namespaces[nad.Namespace] = nil
	}
	for ns := range in.Namespaces {
		var n corev1.Namespace
		if err := k.c.Get(ctx, client.ObjectKey{Name: ns}, &n); err != nil {
			return nil, fmt.Errorf("get namespace %q: %w", ns, err)
		}
		in.Namespaces[ns] = n.Labels
	}
	// Every endpoint of the network: peers of the policies' selectors.
	var pods corev1.PodList
	if err := k.c.List(ctx, &pods); err != nil {
		return nil, fmt.Errorf("list pods: %w", err)
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		v, ok := p.Annotations[podnetworks.Annotation]
		if !ok || podnetworks.Completed(p) {
			continue
		}
		nets, err := podnetworks.Parse(v)
		if err != nil {
			continue
		}
		for _, a := range nets {
			if a.Network != f.Network {
				continue
			}
			e := netpolicy.Endpoint{Namespace: p.Namespace, Name: p.Name, Labels: p.Labels, Ports: netpolicy.NamedPortsOf(p),
				Addrs: addrsOf(a), Local: p.UID == f.Src.Pod.UID || p.UID == f.Dst.Pod.UID}
			in.Endpoints = append(in.Endpoints, e)
		}
	}
	if f.Primary {
		f.Kind = "NetworkPolicy"
		var nps networkingv1.NetworkPolicyList
		if err := k.c.List(ctx, &nps); err != nil {
			return nil, fmt.Errorf("list NetworkPolicies: %w", err)
		}
		for i := range nps.Items {
			if _, ok := in.Namespaces[nps.Items[i].Namespace]; ok {
				in.Policies = append(in.Policies, &nps.Items[i])
			}
		}
	} else {
		f.Kind = "MultiNetworkPolicy"
		var mnps mnpv1beta1.MultiNetworkPolicyList
		if err := k.listOptional(ctx, &mnps); err != nil {
			return nil, fmt.Errorf("list MultiNetworkPolicies: %w", err)
		}
		for _, mnp := range mnps.Items {
			if _, ok := in.Namespaces[mnp.Namespace]; !ok {
				continue
			}
			if slices.ContainsFunc(netpolicy.PolicyFor(mnp.Namespace, mnp.Annotations[mnpv1beta1.PolicyForAnnotation]), func(k string) bool { return nadKeys[k] }) {
				in.Policies = append(in.Policies, &networkingv1.NetworkPolicy{ObjectMeta: mnp.ObjectMeta, Spec: mnp.Spec})
			}
		}
	}
	f.Input = in
	return f, nil
}

// addrsOf returns an attachment's addresses.
func addrsOf(a podnetworks.Attachment) []netip.Addr {
	var out []netip.Addr
	for _, s := range a.IPAddresses {
		if p, err := netip.ParsePrefix(s); err == nil {
			out = append(out, p.Addr())
		}
	}
	return out
}

// networksOf lists an endpoint's networks for a message.
func networksOf(n podnetworks.Networks) string {
	var out []string
	for key, a := range n {
		out = append(out, fmt.Sprintf("%s (%s, NAD %s)", a.Network, a.Role, key))
	}
	if len(out) == 0 {
		return "no kvnet network"
	}
	slices.Sort(out)
	return strings.Join(out, ", ")
}

// addrOn returns the endpoint's addresses on the network.
func addrOn(e endpoint, network string) []netip.Addr {
	keys := make([]string, 0, len(e.Nets))
	for key := range e.Nets {
		keys = append(keys, key)
	}
	slices.Sort(keys)
	for _, key := range keys {
		if e.Nets[key].Network == network {
			return addrsOf(e.Nets[key])
		}
	}
	return nil
}

// verdict is one direction's answer.
type verdict struct {
	allowed bool
	// rule names the allowing rule; "" with allowed: not isolated.
	rule  string
	ports string // the ports the rule allows when the question is any port
}

// judge asks d whether peer may speak proto on port (0: any port of
// proto), with the compiler's own matching (netpolicy.Rule.Allows).
func judge(d *netpolicy.Direction, peer netip.Addr, proto string, port uint16) verdict {
	if d == nil || !d.Isolated {
		return verdict{allowed: true}
	}
	if port != 0 {
		rule, ok := d.Allows(peer, proto, port)
		return verdict{allowed: ok, rule: rule}
	}
	for i := range d.Rules {
		r := &d.Rules[i]
		if len(r.Ports) == 0 {
			if r.Allows(peer, proto, 0) {
				return verdict{allowed: true, rule: r.Name}
			}
			continue
		}
		for _, p := range r.Ports {
			if p.Protocol == proto && r.Allows(peer, p.Protocol, p.Port) {
				return verdict{allowed: true, rule: r.Name, ports: p.String()}
			}
		}
	}
	return verdict{}
}

func diagnoseConnection(r *Report, f *connFacts, opts ConnOptions) {
	r.ok("source", "%s on %s", f.Src.What, networksOf(f.Src.Nets))
	r.ok("destination", "%s on %s", f.Dst.What, networksOf(f.Dst.Nets))
	if f.Network == "" {
		what := "share no kvnet network"
		if opts.Network != "" {
			what = fmt.Sprintf("do not share network %q", opts.Network)
		}
		r.fail("network", "none shared", DifferentNetworks,
			"nothing to fix in policy: put both on one network (the same namespace's UDN, or namespaces one CUDN spans) if they must talk",
			"%s and %s %s: they are on different networks (tenants), which never reach each other whatever policy says", f.Src.What, f.Dst.What, what)
		return
	}
	role := "secondary"
	if f.Primary {
		role = "primary"
	}
	r.ok("network", "%s (%s): policed by %s, %d in its namespaces", f.Network, role, f.Kind, len(f.Input.Policies))
	compiled, errs := netpolicy.Compile(f.Input)
	for _, err := range errs {
		r.ok("fails closed", "%v", err) // kvnet-controller reports it as an event
	}
	srcAddrs, dstAddrs := addrOn(f.Src, f.Network), addrOn(f.Dst, f.Network)
	var sa, da netip.Addr
	for _, s := range srcAddrs {
		if i := slices.IndexFunc(dstAddrs, func(d netip.Addr) bool { return d.Is4() == s.Is4() }); i >= 0 {
			sa, da = s, dstAddrs[i]
			break
		}
	}
	if !sa.IsValid() {
		r.fail("addresses", fmt.Sprintf("%v -> %v", srcAddrs, dstAddrs), DifferentNetworks,
			"give both endpoints an address of one family on the network (its subnets)",
			"%s and %s have no addresses of one family on network %s", f.Src.What, f.Dst.What, f.Network)
		return
	}
	r.ok("addresses", "%s -> %s", sa, da)
	conn := portString(opts.Protocol, opts.Port)
	var egress, ingress *netpolicy.Direction
	if p := compiled.Port(f.Src.Pod.Namespace, f.Src.Pod.Name); p != nil {
		egress = &p.Egress
	}
	if p := compiled.Port(f.Dst.Pod.Namespace, f.Dst.Pod.Name); p != nil {
		ingress = &p.Ingress
	}
	eg := judge(egress, da, opts.Protocol, opts.Port)
	in := judge(ingress, sa, opts.Protocol, opts.Port)
	describe := func(v verdict, d *netpolicy.Direction, who, dir string) string {
		switch {
		case v.allowed && v.rule == "":
			return fmt.Sprintf("%s is not isolated for %s (no %s selects it for %s)", who, dir, f.Kind, dir)
		case v.allowed && v.ports != "":
			return fmt.Sprintf("allowed by %s %s on %s", f.Kind, v.rule, v.ports)
		case v.allowed:
			return fmt.Sprintf("allowed by %s %s", f.Kind, v.rule)
		}
		their := "its"
		if len(d.Policies) > 1 {
			their = "their"
		}
		return fmt.Sprintf("%s is isolated for %s by %s %s and none of %s rules allows %s", who, dir, plural(f.Kind, len(d.Policies)), strings.Join(d.Policies, ", "), their, conn)
	}
	if !eg.allowed {
		r.fail("egress", describe(eg, egress, f.Src.What, "egress"), PolicyDeniesEgress,
			fmt.Sprintf("add an egress rule allowing %s on %s to one of %s (or a new policy selecting the source)", da, conn, strings.Join(egress.Policies, ", ")),
			"refused: %s", describe(eg, egress, f.Src.What, "egress"))
	} else {
		r.ok("egress", "%s", describe(eg, egress, f.Src.What, "egress"))
	}
	if !in.allowed {
		msg := describe(in, ingress, f.Dst.What, "ingress")
		fix := fmt.Sprintf("add an ingress rule allowing %s on %s to one of %s (or a new policy selecting the destination)", sa, conn, strings.Join(ingress.Policies, ", "))
		if r.Problem == nil {
			r.fail("ingress", msg, PolicyDeniesIngress, fix, "refused: %s", msg)
		} else {
			r.Links = append(r.Links, Link{Kind: "ingress", Detail: msg, Broken: true})
		}
	} else {
		r.ok("ingress", "%s", describe(in, ingress, f.Dst.What, "ingress"))
	}
	if r.Problem == nil {
		r.Summary = fmt.Sprintf("allowed on network %s: egress: %s; ingress: %s", f.Network,
			describe(eg, egress, "the source", "egress"), describe(in, ingress, "the destination", "ingress"))
	}
}

func plural(kind string, n int) string {
	if n == 1 {
		return kind
	}
	return strings.TrimSuffix(kind, "y") + "ies"
}
