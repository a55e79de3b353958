package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

// rolledSuffix ends the tag of the kvnet-node image the roll scenario
// rolls to; the next run rolls back to the tag without it.
const rolledSuffix = "-rolled"

// rollTarget is the image kvnet-node rolls to from ref: ref's tag with
// rolledSuffix, or without it when ref has it (a second run rolls back).
func rollTarget(ref string) (string, error) {
	tag, err := name.NewTag(ref, name.Insecure)
	if err != nil {
		return "", fmt.Errorf("kvnet-node image %q: %w", ref, err)
	}
	t := tag.TagStr()
	if base, ok := strings.CutSuffix(t, rolledSuffix); ok {
		t = base
	} else {
		t += rolledSuffix
	}
	return tag.Context().Tag(t).Name(), nil
}

// pushRolled pushes the image index at from again as to, annotated so
// that its digest differs (a new image, as a new release is), unless to
// is there already. It returns to's digest.
func pushRolled(ctx context.Context, from, to string) (v1.Hash, error) {
	src, err := name.NewTag(from, name.Insecure)
	if err != nil {
		return v1.Hash{}, err
	}
	dst, err := name.NewTag(to, name.Insecure)
	if err != nil {
		return v1.Hash{}, err
	}
	if d, err := remote.Head(dst, remote.WithContext(ctx)); err == nil {
		return d.Digest, nil
	}
	idx, err := remote.Index(src, remote.WithContext(ctx))
	if err != nil {
		return v1.Hash{}, fmt.Errorf("read %s: %w", from, err)
	}
	rolled, ok := mutate.Annotations(idx, map[string]string{"lab.kvnet.io/rolled-from": from}).(v1.ImageIndex)
	if !ok {
		return v1.Hash{}, fmt.Errorf("annotate %s: not an index", from)
	}
	if err := remote.WriteIndex(dst, rolled, remote.WithContext(ctx)); err != nil {
		return v1.Hash{}, fmt.Errorf("push %s: %w", to, err)
	}
	return rolled.Digest()
}

// rollKvnetNode sets kvnet-node's image to image (a strategic merge
// patch of its container "node", as kubectl set image does) and waits
// until the DaemonSet's rolling update is done: every pod replaced by
// one running image, Ready. It returns how long that took.
func (s *vmScenarios) rollKvnetNode(ctx context.Context, image string) (time.Duration, error) {
	start := time.Now()
	patch, err := json.Marshal(map[string]any{"spec": map[string]any{"template": map[string]any{"spec": map[string]any{
		"containers": []any{map[string]any{"name": "node", "image": image}}}}}})
	if err != nil {
		return 0, err
	}
	ds, err := s.t.Client.AppsV1().DaemonSets(KvnetNamespace).Patch(ctx, "kvnet-node", types.StrategicMergePatchType, patch, metav1.PatchOptions{})
	if err != nil {
		return 0, fmt.Errorf("set kvnet-node's image to %s: %w", image, err)
	}
	gen := ds.Generation
	err = poll(ctx, 10*time.Minute, func(ctx context.Context) error {
		ds, err := s.t.Client.AppsV1().DaemonSets(KvnetNamespace).Get(ctx, "kvnet-node", metav1.GetOptions{})
		if err != nil {
			return err
		}
		st := ds.Status
		if st.ObservedGeneration < gen || st.UpdatedNumberScheduled != st.DesiredNumberScheduled ||
			st.NumberReady != st.DesiredNumberScheduled || st.NumberUnavailable != 0 || st.DesiredNumberScheduled == 0 {
			return fmt.Errorf("kvnet-node rolling out: generation %d observed %d, %d of %d updated, %d ready", gen, st.ObservedGeneration,
				st.UpdatedNumberScheduled, st.DesiredNumberScheduled, st.NumberReady)
		}
		pods, err := s.t.Client.CoreV1().Pods(KvnetNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=kvnet-node"})
		if err != nil {
			return err
		}
		for _, p := range pods.Items {
			if p.DeletionTimestamp != nil || !PodReady(&p) || p.Spec.Containers[0].Image != image {
				return fmt.Errorf("kvnet-node pod %s on %s: image %s, Ready %v, deleting %v", p.Name, p.Spec.NodeName, p.Spec.Containers[0].Image, PodReady(&p), p.DeletionTimestamp != nil)
			}
		}
		if len(pods.Items) != int(st.DesiredNumberScheduled) {
			return fmt.Errorf("%d kvnet-node pods, want %d", len(pods.Items), st.DesiredNumberScheduled)
		}
		return nil
	})
	return time.Since(start), err
}

// killKvnetNode kills kvnet-node on each of nodes as a crash or the
// OOM killer does: SIGKILL to the processes of its container (found by
// the container's ID in their cgroup), no signal handler, no clean-up.
// It first waits for each node's kvnet-node to be Ready and running, and
// reports any restart it had before as a finding; after the kill it waits
// until the kubelet restarted the container (its restart count up) and
// the pod is Ready again, and returns how long that took.
func (s *vmScenarios) killKvnetNode(ctx context.Context, nodes []string) (time.Duration, error) {
	const selector = "app.kubernetes.io/name=kvnet-node"
	type killedPod struct {
		name, containerID string
		uid               types.UID
		restarts          int32
	}
	killed := map[string]killedPod{} // node -> its kvnet-node pod before the kill
	// Each node's agent is killed once it is Ready and running; a kill
	// that finds no process (the container restarted since the status
	// the kubelet last wrote) is tried again with a fresh status.
	err := poll(ctx, 2*time.Minute, func(ctx context.Context) error {
		pods, err := s.t.Client.CoreV1().Pods(KvnetNamespace).List(ctx, metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			return err
		}
		for _, n := range nodes {
			if _, done := killed[n]; done {
				continue
			}
			var k *killedPod
			for _, p := range pods.Items {
				if p.Spec.NodeName != n || p.DeletionTimestamp != nil || !PodReady(&p) || len(p.Status.ContainerStatuses) == 0 {
					continue
				}
				if cs := p.Status.ContainerStatuses[0]; cs.State.Running != nil && cs.ContainerID != "" {
					k = &killedPod{p.Name, cs.ContainerID, p.UID, cs.RestartCount}
				}
			}
			if k == nil {
				return fmt.Errorf("no Ready, running kvnet-node pod on node %s", n)
			}
			if k.restarts > 0 {
				s.logf("FINDING: kvnet-node %s on node %s restarted %d times before the kill: %s", k.name, n, k.restarts, s.lastTermination(ctx, k.name))
			}
			if err := sigkillContainer(k.containerID); err != nil {
				return fmt.Errorf("node %s: pod %s: %w", n, k.name, err)
			}
			killed[n] = *k
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	s.logf("kvnet-node killed (SIGKILL) on %v", nodes)
	start := time.Now()
	err = poll(ctx, 5*time.Minute, func(ctx context.Context) error {
		pods, err := s.t.Client.CoreV1().Pods(KvnetNamespace).List(ctx, metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			return err
		}
		var waiting []string
		for n, k := range killed {
			back := false
			for _, p := range pods.Items {
				if p.Spec.NodeName != n || !PodReady(&p) || len(p.Status.ContainerStatuses) == 0 {
					continue
				}
				// Restarted in place by the kubelet, or a new pod.
				back = back || p.UID != k.uid || p.Status.ContainerStatuses[0].RestartCount > k.restarts
			}
			if !back {
				waiting = append(waiting, n)
			}
		}
		if len(waiting) > 0 {
			return fmt.Errorf("kvnet-node not restarted and Ready yet on %v", waiting)
		}
		return nil
	})
	return time.Since(start), err
}

// lastTermination describes how kvnet-node pod name's container last
// ended, with the last lines its previous instance logged.
func (s *vmScenarios) lastTermination(ctx context.Context, name string) string {
	p, err := s.t.Client.CoreV1().Pods(KvnetNamespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err.Error()
	}
	desc := "no last state"
	if len(p.Status.ContainerStatuses) > 0 {
		if t := p.Status.ContainerStatuses[0].LastTerminationState.Terminated; t != nil {
			desc = fmt.Sprintf("exit code %d, reason %q, signal %d, at %s", t.ExitCode, t.Reason, t.Signal, t.FinishedAt.UTC().Format(time.RFC3339))
		}
	}
	tail := int64(15)
	b, err := s.t.Client.CoreV1().Pods(KvnetNamespace).GetLogs(name, &corev1.PodLogOptions{Previous: true, TailLines: &tail}).DoRaw(ctx)
	if err != nil {
		return desc + "; previous log: " + err.Error()
	}
	return desc + "; previous log:\n" + strings.TrimRight(string(b), "\n")
}

// sigkillContainer sends SIGKILL to every process of this host in the
// container whose runtime ID is containerID ("containerd://<id>"): the
// processes whose cgroup path names the ID, as the cgroupfs and the
// systemd drivers both do. None is an error naming what was searched.
func sigkillContainer(containerID string) error {
	_, id, ok := strings.Cut(containerID, "://")
	if !ok || len(id) < 12 {
		return fmt.Errorf("container ID %q: not <runtime>://<id>", containerID)
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return err
	}
	n := 0
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cg, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
		if err != nil || !strings.Contains(string(cg), id) {
			continue
		}
		if err := unix.Kill(pid, unix.SIGKILL); err != nil && !errors.Is(err, unix.ESRCH) {
			return fmt.Errorf("kill pid %d of container %s: %w", pid, id, err)
		}
		n++
	}
	if n == 0 {
		return fmt.Errorf("no process of this host in container %s (searched /proc/*/cgroup)", id)
	}
	return nil
}

// echoServerPod is a pod on node serving TCP echo on port 7 (busybox
// nc, one cat per connection), Ready once the port accepts.
func echoServerPod(ns, name, node, image string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{
			NodeSelector:                  map[string]string{corev1.LabelHostname: node},
			TerminationGracePeriodSeconds: ptr.To[int64](0),
			Containers: []corev1.Container{{
				Name: "echo", Image: image, Command: []string{"/bin/nc", "-ll", "-p", "7", "-e", "/bin/cat"},
				ReadinessProbe: &corev1.Probe{
					ProbeHandler:  corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(7)}},
					PeriodSeconds: 1,
				},
			}},
		},
	}
}

// kvnetNodeRoll: kvnet-node rolled to a new image on every node, then
// killed on the VM's node and the pod server's, while two TCP streams
// run, one to the VM (the migration scenario's echo client, still
// connected) and one to a pod on the UDN: both go on with every line
// echoed in order, and the VM's address and MAC, its claim and the
// pod's address stay.
func (s *vmScenarios) kvnetNodeRoll(ctx context.Context) (string, error) {
	v, err := s.vm(nsVM + "/vm-m")
	if err != nil {
		return "", err
	}
	vmLines, err := s.waitEchoGrows(ctx, nsVM, "echo", 0)
	if err != nil {
		return "", fmt.Errorf("the echo stream to VM %s before the roll: %w", v, err)
	}
	claim, err := s.claimIP(ctx, nsVM, "vm-m.default")
	if err != nil {
		return "", err
	}
	// A pod's stream: a server on the node the VM is not on and not the
	// client's, a client on the client's node.
	srvNode := s.nodes[1]
	if srvNode == v.node {
		srvNode = s.nodes[2]
	}
	s.createPod(ctx, echoServerPod(nsVM, "echo-srv", srvNode, s.t.Image))
	s.waitPods(ctx)
	srv, err := s.need(ctx, nsVM+"/echo-srv")
	if err != nil {
		return "", err
	}
	srvIP, err := srv[0].addr(primaryInterface, tenantSubnet)
	if err != nil {
		return "", err
	}
	if _, err := s.t.Client.CoreV1().Pods(nsVM).Create(ctx, echoPod(nsVM, "echo-pod", s.nodes[0], s.t.Image, srvIP), metav1.CreateOptions{}); err != nil {
		return "", fmt.Errorf("create echo client pod: %w", err)
	}
	podLines, err := s.waitEchoGrows(ctx, nsVM, "echo-pod", 0)
	if err != nil {
		return "", fmt.Errorf("the echo stream to pod %s at %s before the roll: %w", srv[0], srvIP, err)
	}

	ds, err := s.t.Client.AppsV1().DaemonSets(KvnetNamespace).Get(ctx, "kvnet-node", metav1.GetOptions{})
	if err != nil {
		return "", err
	}
	from := ds.Spec.Template.Spec.Containers[0].Image
	to, err := rollTarget(from)
	if err != nil {
		return "", err
	}
	digest, err := pushRolled(ctx, from, to)
	if err != nil {
		return "", err
	}
	s.logf("rolling kvnet-node from %s to %s (%s)", from, to, digest)
	took, err := s.rollKvnetNode(ctx, to)
	if err != nil {
		return "", err
	}

	vmAfter, err := s.waitEchoGrows(ctx, nsVM, "echo", vmLines)
	if err != nil {
		return "", fmt.Errorf("the echo stream to VM %s after the roll: %w", v, err)
	}
	podAfter, err := s.waitEchoGrows(ctx, nsVM, "echo-pod", podLines)
	if err != nil {
		return "", fmt.Errorf("the echo stream to pod %s after the roll: %w", srv[0], err)
	}

	// Then kvnet-node is killed where the VM and the pod server run, as a
	// crash or the OOM killer does (SIGKILL). The streams must go on
	// across the restart and after the restarted agents reconciled.
	killedOn := []string{v.node, srvNode}
	back, err := s.killKvnetNode(ctx, killedOn)
	if err != nil {
		return "", err
	}
	for i := 0; i < 2; i++ {
		if vmAfter, err = s.waitEchoGrows(ctx, nsVM, "echo", vmAfter); err != nil {
			return "", fmt.Errorf("the echo stream to VM %s after kvnet-node was killed on %v: %w", v, killedOn, err)
		}
		if podAfter, err = s.waitEchoGrows(ctx, nsVM, "echo-pod", podAfter); err != nil {
			return "", fmt.Errorf("the echo stream to pod %s after kvnet-node was killed on %v: %w", srv[0], killedOn, err)
		}
	}
	vmGap, err := s.echoGap(ctx, nsVM, "echo", vmLines)
	if err != nil {
		return "", err
	}
	podGap, err := s.echoGap(ctx, nsVM, "echo-pod", podLines)
	if err != nil {
		return "", err
	}
	vmi, err := s.dyn.Resource(vmiGVR).Namespace(nsVM).Get(ctx, v.name, metav1.GetOptions{})
	if err != nil {
		return "", err
	}
	mac, node, err := vmiClaimIP(vmi, claim)
	if err != nil {
		return "", fmt.Errorf("after the roll: %w", err)
	}
	if mac != v.mac || node != v.node {
		return "", fmt.Errorf("after the roll VMI %s has MAC %s on %s, before %s on %s", v, mac, node, v.mac, v.node)
	}
	if c, err := s.claimIP(ctx, nsVM, "vm-m.default"); err != nil || c != claim {
		return "", fmt.Errorf("after the roll IPAMClaim vm-m.default holds %s (%v), before %s", c, err, claim)
	}
	srv, err = s.need(ctx, nsVM+"/echo-srv")
	if err != nil {
		return "", err
	}
	if a, err := srv[0].addr(primaryInterface, tenantSubnet); err != nil || a != srvIP {
		return "", fmt.Errorf("after the roll pod %s has %s (%v) on %s, before %s", srv[0], a, err, primaryInterface, srvIP)
	}
	return fmt.Sprintf("kvnet-node rolled from %s to %s on %d nodes in %s, then killed (SIGKILL) on %s and restarted and Ready after %s; echo to VM %s at %s: lines %d -> %d in order, longest pause %s; echo to pod %s at %s: lines %d -> %d in order, longest pause %s; VM kept IP %s (claim) and MAC %s, pod kept %s",
		from, to, ds.Status.DesiredNumberScheduled, took.Round(time.Second), strings.Join(killedOn, " and "), back.Round(time.Second),
		v, v.ip, vmLines, vmAfter, vmGap, srv[0], srvIP, podLines, podAfter, podGap, claim, v.mac, srvIP), nil
}
