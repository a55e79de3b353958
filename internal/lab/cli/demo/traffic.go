package demo

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kubevirtv1 "kvnet.io/kvnet/api/kubevirt/v1"
	"kvnet.io/kvnet/internal/lab/cli/lab"
	"kvnet.io/kvnet/internal/lab/simkubelet"
	"kvnet.io/kvnet/internal/lab/simnet"
	"kvnet.io/kvnet/internal/lab/simvirt"
	"kvnet.io/kvnet/internal/node"
	"kvnet.io/kvnet/internal/podnetworks"
)

// labPod is a pod the simulated kubelet runs.
type labPod struct {
	pod       corev1.Pod
	a         podnetworks.Attachment   // its primary network
	secondary []podnetworks.Attachment // its secondary networks
	netns     string
}

func (p labPod) String() string { return key(p.pod.Namespace, p.pod.Name) }

func (p labPod) ip() string { return firstAddr(p.a) }

// simulatedNodes counts the lab's simulated nodes (those with a VTEP).
func simulatedNodes(ctx context.Context, c client.Client) (int, error) {
	var nodes corev1.NodeList
	if err := c.List(ctx, &nodes); err != nil {
		return 0, err
	}
	n := 0
	for _, nd := range nodes.Items {
		if nd.Annotations[node.VTEPAnnotation] != "" {
			n++
		}
	}
	return n, nil
}

// check is one traffic check of the demo.
type check struct {
	from, to string // pods ("<namespace>/<name>"); to may be "secondary:<pod>" or an address
	want     bool   // true: from must reach to; false: to must be unreachable from from
	why      string
}

// checks are the demo's traffic checks over the pods of examples/.
var checks = []check{
	{"udn-demo/web-1", "udn-demo/web-2", true, "same network, across nodes"},
	{"red-namespace/red-1", "blue-namespace/blue-1", true, "one CUDN, two namespaces, across nodes"},
	{"udn-demo/web-1", "secondary:udn-demo/web-2", true, "secondary network (pure L2), across nodes"},
	{"udn-demo/web-1", simnet.InternetIP.String(), true, "egress, masqueraded to the node's address"},
	{"tenant-b/db-1", "udn-demo/web-2", false, "another tenant on the same subnet"},
	{"tenant-b/db-1", "udn-demo/web-1", false, "another tenant on the same subnet, same node"},
	{"red-namespace/red-1", "udn-demo/web-1", false, "another tenant"},
	{"l3-demo/app-1", "l3-demo/app-2", true, "Layer3: routed from node-1's host subnet to node-2's"},
	{"l3-demo/app-1", "udn-demo/web-2", false, "another tenant, from a Layer3 network"},
	{"policy-demo/frontend", "policy-demo/api", true, "NetworkPolicy api-allow-frontend admits app=frontend"},
	{"policy-demo/intruder", "policy-demo/frontend", true, "no policy selects the frontend: reached from its network"},
	{"policy-demo/intruder", "policy-demo/api", false, "NetworkPolicy api-allow-frontend isolates app=api"},
}

// expectedPods returns the pods the checks and the VM check need, sorted.
func expectedPods(checks []check) []string {
	set := map[string]bool{demoVMPeer: true, demoServiceOutsider: true}
	for _, ch := range checks {
		set[ch.from] = true
		to := strings.TrimPrefix(ch.to, "secondary:")
		if _, err := netip.ParseAddr(to); err != nil {
			set[to] = true
		}
	}
	return slices.Sorted(maps.Keys(set))
}

// step is a check resolved against the running pods: what to probe and,
// for an isolation check, the positive control that must be answered
// first from the same source.
type step struct {
	check
	src     labPod
	target  probe
	label   string // the target as printed
	control *probe
	ctlText string // the control's target as printed
	// unprobed says why no probe can tell the result (the target has the
	// source's own address); "" for a step that probes.
	unprobed string
}

// resolve turns a check into a step; a pod, attachment or gateway the
// check needs and does not find is an error naming it.
func resolve(ch check, byName map[string]labPod) (step, error) {
	src, ok := byName[ch.from]
	if !ok {
		return step{}, fmt.Errorf("check %s -> %s: pod %s is not running on a simulated node", ch.from, ch.to, ch.from)
	}
	st := step{check: ch, src: src}
	st.target = probe{netns: src.netns}
	if name, ok := strings.CutPrefix(ch.to, "secondary:"); ok {
		p, ok := byName[name]
		if !ok {
			return step{}, fmt.Errorf("check %s -> %s: pod %s is not running on a simulated node", ch.from, ch.to, name)
		}
		if len(p.secondary) == 0 {
			return step{}, fmt.Errorf("check %s -> %s: pod %s has no secondary attachment", ch.from, ch.to, name)
		}
		st.target.addr = firstAddr(p.secondary[0])
		st.label = fmt.Sprintf("%s %s (%s, %s)", p, st.target.addr, p.pod.Spec.NodeName, p.secondary[0].Network)
	} else if p, ok := byName[ch.to]; ok {
		st.target.addr = p.ip()
		st.label = fmt.Sprintf("%s %s (%s)", p, p.ip(), p.pod.Spec.NodeName)
	} else if _, err := netip.ParseAddr(ch.to); err == nil {
		st.target.addr, st.label = ch.to, ch.to
	} else {
		return step{}, fmt.Errorf("check %s -> %s: pod %s is not running on a simulated node", ch.from, ch.to, ch.to)
	}
	if st.target.addr == src.ip() {
		if ch.want {
			return step{}, fmt.Errorf("check %s -> %s: the target has the source's own address %s", ch.from, ch.to, src.ip())
		}
		// The same address in the other tenant (each network allocates
		// from the start of the subnet): a ping is answered by the source
		// itself, and since the MAC is derived from the address, even an
		// ARP probe's reply could not be told apart. Say so; never print
		// "blocked" for it.
		st.unprobed = fmt.Sprintf("both pods have the address %s (and the MAC kvnet derives from it): no probe from one can tell the other apart", src.ip())
		return st, nil
	}
	if ch.want {
		return st, nil
	}
	gw := gatewayFor(src.a, st.target.addr)
	if gw == "" {
		return step{}, fmt.Errorf("check %s -> %s: pod %s has no gateway of the target's family on %s for the positive control", ch.from, ch.to, src, src.a.Network)
	}
	st.control = &probe{netns: src.netns, addr: gw}
	st.ctlText = "its gateway " + gw
	return st, nil
}

// firstAddr returns the first address of an attachment, without prefix
// length.
func firstAddr(a podnetworks.Attachment) string {
	if len(a.IPAddresses) == 0 {
		return ""
	}
	return strings.Split(a.IPAddresses[0], "/")[0]
}

// gatewayFor returns the attachment's gateway of addr's family, "" when
// there is none.
func gatewayFor(a podnetworks.Attachment, addr string) string {
	want, err := netip.ParseAddr(addr)
	if err != nil {
		return ""
	}
	for _, g := range a.GatewayIPs {
		if gw, err := netip.ParseAddr(g); err == nil && gw.Is4() == want.Is4() {
			return g
		}
	}
	return ""
}

// verdict is what a step found: the word printed, and an error when the
// check failed.
type verdict struct {
	word string
	err  error
}

// evaluate runs a step. A check that must reach passes when its probe is
// answered. An isolation check first proves the source can reach
// something: its control must be answered, else the source is broken and
// "blocked" would prove nothing. Then its probe must go unanswered; an
// answer is a leak, and a probe that could not be made is an error, never
// "blocked".
func evaluate(ctx context.Context, pr prober, st step) verdict {
	what := fmt.Sprintf("%s -> %s", st.src, st.label)
	if st.unprobed != "" {
		return verdict{word: "NOT CHECKED"}
	}
	if st.want {
		switch r := expectAnswer(ctx, pr, st.target); r.outcome {
		case answered:
			return verdict{word: "reached"}
		case noAnswer:
			return verdict{word: "blocked", err: fmt.Errorf("%s: blocked, want reached", what)}
		default:
			return verdict{word: "ERROR", err: fmt.Errorf("%s: %w", what, r.err)}
		}
	}
	if st.control == nil {
		return verdict{word: "ERROR", err: fmt.Errorf("%s: isolation check without a positive control", what)}
	}
	switch r := expectAnswer(ctx, pr, *st.control); r.outcome {
	case noAnswer:
		return verdict{word: "ERROR", err: fmt.Errorf("%s: source %s is broken: %s (the positive control) did not answer, so \"blocked\" would prove nothing",
			what, st.src, st.ctlText)}
	case failed:
		return verdict{word: "ERROR", err: fmt.Errorf("%s: source %s is broken: the positive control, a ping to %s, failed: %w; \"blocked\" would prove nothing",
			what, st.src, st.ctlText, r.err)}
	}
	switch r := expectSilence(ctx, pr, st.target); r.outcome {
	case noAnswer:
		return verdict{word: "blocked"}
	case answered:
		return verdict{word: "reached", err: fmt.Errorf("%s: reached, want blocked", what)}
	default:
		return verdict{word: "ERROR", err: fmt.Errorf("%s: %w", what, r.err)}
	}
}

// printTraffic shows the pods on the lab's simulated nodes and checks, by
// probing from inside them, that each network connects its pods across
// nodes, that tenants are isolated and that egress works. It returns an
// error when traffic does not behave as it must, or when a check cannot be
// made (a pod missing, a probe that cannot run, a broken source).
func printTraffic(ctx context.Context, out io.Writer, c client.Client, applied appliedSet, labDir string, simulated int, timeout time.Duration, pr prober, tl tools) error {
	pods, err := waitPods(ctx, c, labDir, applied, expectedPods(checks), timeout)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "\n== Pods on %d simulated nodes (plumbed by kvnet-cni, wired by kvnet-node)\n", simulated)
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "POD\tNODE\tNETWORK\tIPS\tMAC")
	for _, p := range pods {
		for _, a := range append([]podnetworks.Attachment{p.a}, p.secondary...) {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", p, p.pod.Spec.NodeName, a.Network, strings.Join(a.IPAddresses, ","), a.MACAddress)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}

	byName := map[string]labPod{}
	for _, p := range pods {
		byName[p.String()] = p
	}
	fmt.Fprintf(out, "\n== Traffic (ping from inside the pods; each isolation check first proves its source reaches its gateway)\n")
	tw = tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	var failed, unchecked []string
	for _, ch := range checks {
		st, err := resolve(ch, byName)
		if err != nil {
			failed = append(failed, err.Error())
			fmt.Fprintf(tw, "  ERROR\t%s\t-> %s\t%s   <-- %v\n", ch.from, ch.to, ch.why, err)
			continue
		}
		v := evaluate(ctx, pr, st)
		why := ch.why
		switch {
		case st.unprobed != "":
			why += ": " + st.unprobed
			unchecked = append(unchecked, fmt.Sprintf("%s -> %s", st.src, st.label))
		case st.control != nil && v.word != "ERROR":
			why += fmt.Sprintf(" (control: %s answered)", st.ctlText)
		}
		mark := ""
		if v.err != nil {
			failed = append(failed, v.err.Error())
			mark = "   <-- WRONG"
			if v.word == "ERROR" {
				mark = fmt.Sprintf("   <-- %v", v.err)
			}
		}
		fmt.Fprintf(tw, "  %s\t%s (%s)\t-> %s\t%s%s\n", v.word, st.src, st.src.pod.Spec.NodeName, st.label, why, mark)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(failed) > 0 {
		return fmt.Errorf("traffic not as expected:\n  %s", strings.Join(failed, "\n  "))
	}
	if len(unchecked) > 0 {
		fmt.Fprintf(out, "  note: %d isolation check(s) NOT CHECKED, their pods share an address: %s\n", len(unchecked), strings.Join(unchecked, "; "))
	}
	if err := printVMMigration(ctx, out, c, labDir, byName, timeout); err != nil {
		return err
	}
	if err := printMasqueradeVM(ctx, out, c, labDir, byName, timeout); err != nil {
		return err
	}
	return printVMService(ctx, out, c, labDir, byName, pr, timeout)
}

// waitPods waits until every pod the demo applied, and every pod of
// expected, runs and has its allocation, and returns them; other pods (a
// user's own, VMs' launcher pods) are neither waited for nor returned. A
// pod of expected that does not exist, or is bound to no node, is an error
// at once; one that does not run in time is an error naming it.
func waitPods(ctx context.Context, c client.Client, labDir string, applied appliedSet, expected []string, timeout time.Duration) ([]labPod, error) {
	deadline := time.Now().Add(timeout)
	for {
		var list corev1.PodList
		if err := c.List(ctx, &list); err != nil {
			return nil, err
		}
		if err := requirePods(list.Items, expected); err != nil {
			return nil, err
		}
		var pods []labPod
		var waiting []string
		for _, pod := range list.Items {
			if !applied.has("Pod", pod.Namespace, pod.Name) && !slices.Contains(expected, key(pod.Namespace, pod.Name)) {
				continue // not the demo's
			}
			if pod.Spec.NodeName == "" || pod.Labels[kubevirtv1.AppLabel] == simvirt.HandlerValue {
				continue // unbound, or KubeVirt's per-node handler (no primary network)
			}
			if pod.DeletionTimestamp != nil {
				if slices.Contains(expected, key(pod.Namespace, pod.Name)) {
					waiting = append(waiting, key(pod.Namespace, pod.Name)+" (being deleted)")
				}
				continue
			}
			nets, err := podnetworks.Parse(pod.Annotations[podnetworks.Annotation])
			var primary *podnetworks.Attachment
			for _, a := range nets {
				if a.Role == podnetworks.RolePrimary && len(a.IPAddresses) > 0 {
					primary = &a
				}
			}
			if err != nil || primary == nil || pod.Status.Phase != corev1.PodRunning {
				waiting = append(waiting, fmt.Sprintf("%s (%s)", key(pod.Namespace, pod.Name), pod.Status.Phase))
				continue
			}
			kc := lab.KubeletConfig(labDir, pod.Spec.NodeName)
			lp := labPod{pod: pod, a: *primary, netns: simkubelet.PodNetNS(kc, &pod)}
			for _, a := range nets {
				if a.Role == podnetworks.RoleSecondary && len(a.IPAddresses) > 0 {
					lp.secondary = append(lp.secondary, a)
				}
			}
			pods = append(pods, lp)
		}
		if len(waiting) == 0 {
			return pods, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("pods not running after %s: %s", timeout, strings.Join(waiting, ", "))
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// requirePods returns an error naming each pod of expected that is not in
// pods or is bound to no node: the demo checks traffic from and to them,
// and a check that cannot run must not pass by being left out.
func requirePods(pods []corev1.Pod, expected []string) error {
	nodeOf := map[string]string{}
	for _, p := range pods {
		nodeOf[key(p.Namespace, p.Name)] = p.Spec.NodeName
	}
	var problems []string
	for _, name := range expected {
		switch node, ok := nodeOf[name]; {
		case !ok:
			problems = append(problems, fmt.Sprintf("pod %s does not exist (examples/ creates it)", name))
		case node == "":
			problems = append(problems, fmt.Sprintf("pod %s is bound to no node (the lab has no scheduler: spec.nodeName must name a simulated node)", name))
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("the demo cannot check traffic: %s", strings.Join(problems, "; "))
	}
	return nil
}
