package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"kvnet.io/kvnet/internal/cli/lab"
	"kvnet.io/kvnet/internal/node"
	"kvnet.io/kvnet/internal/podnetworks"
	"kvnet.io/kvnet/internal/sim/simkubelet"
	"kvnet.io/kvnet/internal/sim/simnet"
)

// labPod is a pod the simulated kubelet runs.
type labPod struct {
	pod       corev1.Pod
	a         podnetworks.Attachment   // its primary network
	secondary []podnetworks.Attachment // its secondary networks
	netns     string
}

func (p labPod) String() string { return key(p.pod.Namespace, p.pod.Name) }

func (p labPod) ip() string { return strings.Split(p.a.IPAddresses[0], "/")[0] }

// printTraffic shows the pods on the lab's simulated nodes and checks, by
// pinging from inside them, that each network connects its pods across
// nodes, that tenants are isolated and that egress works. It returns an
// error when traffic does not behave as it must.
func printTraffic(ctx context.Context, out io.Writer, c client.Client, labDir string, timeout time.Duration) error {
	var nodes corev1.NodeList
	if err := c.List(ctx, &nodes); err != nil {
		return err
	}
	simulated := 0
	for _, n := range nodes.Items {
		if n.Annotations[node.VTEPAnnotation] != "" {
			simulated++
		}
	}
	if simulated == 0 {
		fmt.Fprintf(out, "\n== Traffic: the lab has no simulated nodes (they need root), so no pod runs\n")
		return nil
	}
	pods, err := waitPods(ctx, c, labDir, timeout)
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
	type check struct {
		from, to string // pods; to may be an IP
		want     bool
		why      string
	}
	checks := []check{
		{"udn-demo/web-1", "udn-demo/web-2", true, "same network, across nodes"},
		{"red-namespace/red-1", "blue-namespace/blue-1", true, "one CUDN, two namespaces, across nodes"},
		{"udn-demo/web-1", "secondary:udn-demo/web-2", true, "secondary network (pure L2), across nodes"},
		{"udn-demo/web-1", simnet.InternetIP.String(), true, "egress, masqueraded to the node's address"},
		{"tenant-b/db-1", "udn-demo/web-2", false, "another tenant on the same subnet"},
		{"tenant-b/db-1", "udn-demo/web-1", false, "another tenant on the same subnet, same node"},
		{"red-namespace/red-1", "udn-demo/web-1", false, "another tenant"},
	}
	fmt.Fprintf(out, "\n== Traffic (ping from inside the pods)\n")
	tw = tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	var failed []string
	for _, ch := range checks {
		from, ok := byName[ch.from]
		if !ok {
			continue
		}
		target, label := ch.to, ch.to
		if name, ok := strings.CutPrefix(ch.to, "secondary:"); ok {
			p, ok := byName[name]
			if !ok || len(p.secondary) == 0 {
				continue
			}
			ip := strings.Split(p.secondary[0].IPAddresses[0], "/")[0]
			target, label = ip, fmt.Sprintf("%s %s (%s, %s)", p, ip, p.pod.Spec.NodeName, p.secondary[0].Network)
		} else if p, ok := byName[ch.to]; ok {
			target, label = p.ip(), fmt.Sprintf("%s %s (%s)", p, p.ip(), p.pod.Spec.NodeName)
			if !ch.want && target == from.ip() {
				continue // the same address in the other tenant: pinging it proves nothing
			}
		}
		got := reachable(ctx, from.netns, target, ch.want)
		result := map[bool]string{true: "reached", false: "blocked"}[got]
		mark := ""
		if got != ch.want {
			mark = "   <-- WRONG"
			failed = append(failed, fmt.Sprintf("%s -> %s: %s, want %s", from, label, result, map[bool]string{true: "reached", false: "blocked"}[ch.want]))
		}
		fmt.Fprintf(tw, "  %s\t%s (%s)\t-> %s\t%s%s\n", result, from, from.pod.Spec.NodeName, label, ch.why, mark)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(failed) > 0 {
		return fmt.Errorf("traffic not as expected:\n  %s", strings.Join(failed, "\n  "))
	}
	return printVMMigration(ctx, out, c, pods, timeout)
}

// reachable pings ip from the namespace. Pings that should pass are retried
// for a few seconds (a port may be attached just now); pings that should
// fail are tried three times.
func reachable(ctx context.Context, netns, ip string, expect bool) bool {
	tries := 3
	if expect {
		tries = 10
	}
	for range tries {
		cmd := exec.CommandContext(ctx, "ip", "netns", "exec", filepath.Base(netns), "busybox", "ping", "-c", "1", "-W", "1", ip)
		if cmd.Run() == nil {
			return true
		}
	}
	return false
}

// waitPods waits until every pod bound to a node runs and has its
// allocation, and returns them.
func waitPods(ctx context.Context, c client.Client, labDir string, timeout time.Duration) ([]labPod, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("pinging from pods needs root (ip netns exec)")
	}
	deadline := time.Now().Add(timeout)
	for {
		var list corev1.PodList
		if err := c.List(ctx, &list); err != nil {
			return nil, err
		}
		var pods []labPod
		var waiting []string
		for _, pod := range list.Items {
			if pod.Spec.NodeName == "" || pod.DeletionTimestamp != nil {
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
