package why

import (
	"fmt"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

// kvnet-node publishes nothing about its readiness in the API: at start it
// writes only its Node's kvnet.io/vtep annotation (internal/node
// publishVTEP), and its readiness is its /readyz probe, which the kubelet
// turns into the Ready condition of its DaemonSet pod (config/node,
// label app.kubernetes.io/name=kvnet-node). So the node link is read from
// that pod; where kvnet-node runs without one (the lab runs it as a
// process), the annotation says at least that it started there.
const (
	agentLabelKey   = "app.kubernetes.io/name"
	agentLabelValue = "kvnet-node"
	vtepAnnotation  = "kvnet.io/vtep"
)

// nodeFacts are what the node link reads.
type nodeFacts struct {
	Node       *corev1.Node       // nil: not found
	Agents     []corev1.Pod       // kvnet-node pods bound to the node
	DaemonSets []appsv1.DaemonSet // kvnet-node DaemonSets of the cluster
}

// checkNode checks the kvnet-node agent of the pod's node.
func checkNode(r *Report, f *nodeFacts, pod *corev1.Pod) bool {
	name := pod.Spec.NodeName
	if name == "" {
		r.ok("node", "not scheduled yet")
		return false
	}
	if f.Node == nil {
		return r.fail("node", name+": not found", NodeNotFound,
			"delete the pod so that it is scheduled again (its controller recreates it)",
			"pod %s is bound to node %s, which does not exist", pod.Name, name)
	}
	var notReady []string
	for i := range f.Agents {
		a := &f.Agents[i]
		if a.DeletionTimestamp != nil {
			continue
		}
		ready, why := podReady(a)
		if ready {
			r.ok("node", "%s: kvnet-node pod %s/%s Ready", name, a.Namespace, a.Name)
			return false
		}
		notReady = append(notReady, fmt.Sprintf("%s/%s (%s)", a.Namespace, a.Name, why))
	}
	if len(notReady) > 0 {
		a := &f.Agents[0]
		return r.fail("node", name+": kvnet-node not Ready", KvnetNodeNotReady,
			fmt.Sprintf("see why: kubectl -n %s describe pod %s; kubectl -n %s logs %s. kvnet-node turns Ready once it has applied the node's datapath; until then kvnet-cni's STATUS fails on the node and new pods there get no network", a.Namespace, a.Name, a.Namespace, a.Name),
			"kvnet-node on node %s is not Ready: %s", name, strings.Join(notReady, ", "))
	}
	if len(f.DaemonSets) > 0 {
		ds := &f.DaemonSets[0]
		return r.fail("node", name+": no kvnet-node pod", KvnetNodeMissing,
			fmt.Sprintf("see why the DaemonSet does not run there: kubectl -n %s describe daemonset %s (node selector, affinity; it tolerates every taint), kubectl describe node %s", ds.Namespace, ds.Name, name),
			"DaemonSet %s/%s has no kvnet-node pod on node %s, so nothing programs the pod's network there", ds.Namespace, ds.Name, name)
	}
	if v := f.Node.Annotations[vtepAnnotation]; v != "" {
		r.ok("node", "%s: kvnet-node started here (%s=%s); no kvnet-node pod, so its readiness is not visible in the API (the lab runs it as a process)", name, vtepAnnotation, v)
		return false
	}
	return r.fail("node", name+": no kvnet-node", KvnetNodeMissing,
		"deploy kvnet-node (config/node: DaemonSet kvnet-node) so that it runs on every node",
		"no kvnet-node pod runs on node %s, and the node has no %s annotation, which kvnet-node writes when it starts: nothing programs the pod's network there", name, vtepAnnotation)
}

// podReady reports a pod's Ready condition, or why it is not.
func podReady(p *corev1.Pod) (bool, string) {
	for _, c := range p.Status.Conditions {
		if c.Type != corev1.PodReady {
			continue
		}
		if c.Status == corev1.ConditionTrue {
			return true, ""
		}
		why := "Ready=" + string(c.Status)
		if c.Reason != "" {
			why += " " + c.Reason
		}
		if c.Message != "" {
			why += ": " + c.Message
		}
		for _, cs := range p.Status.ContainerStatuses {
			if w := cs.State.Waiting; w != nil && w.Reason != "" {
				why += fmt.Sprintf("; container %s %s", cs.Name, w.Reason)
			}
		}
		return false, why
	}
	return false, "phase " + string(p.Status.Phase) + ", no Ready condition"
}
