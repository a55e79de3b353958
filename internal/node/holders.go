package node

import (
	"cmp"
	"maps"
	"net"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	kubevirtv1 "kvnet.io/kvnet/api/kubevirt/v1"
	"kvnet.io/kvnet/internal/podnetworks"
)

// holder is one pod attachment of a network.
type holder struct {
	pod    *corev1.Pod
	nadKey string
	node   string
	a      podnetworks.Attachment
	mac    net.HardwareAddr
	active bool // where the MAC lives now (see activeHolders)
	// migrating: one of the two holders of a VM's MAC in live migration;
	// both ports are attached, and the bridges follow the guest's frames.
	migrating bool
}

// holders is phase 3 of Desired: by network name, every attachment to a
// known network of a pod that may be running on a node with a VTEP (or on
// this node).
func (p *planner) holders(nets map[string]*network) map[string][]*holder {
	holders := map[string][]*holder{}
	parsed := map[types.UID]parsedAnnotation{}
	for i := range p.in.Pods {
		pod := &p.in.Pods[i]
		value, ok := pod.Annotations[podnetworks.Annotation]
		if !ok || pod.Spec.NodeName == "" || podnetworks.Completed(pod) {
			continue
		}
		if _, hasVTEP := p.vteps[pod.Spec.NodeName]; !hasVTEP && pod.Spec.NodeName != p.in.Node {
			continue
		}
		attachments, err := p.in.Annotations.parse(pod, value, parsed)
		if err != nil {
			p.problem("pod %s/%s: %v", pod.Namespace, pod.Name, err)
			continue
		}
		for _, nadKey := range slices.Sorted(maps.Keys(attachments)) {
			a := attachments[nadKey]
			if nets[a.Network] == nil {
				continue // not a kvnet-cni network (kvnet-ipam), or unknown
			}
			holders[a.Network] = append(holders[a.Network], &holder{pod: pod, nadKey: nadKey, node: pod.Spec.NodeName, a: a, mac: a.MAC()})
		}
	}
	if p.in.Annotations != nil {
		p.in.Annotations.m = parsed // drops pods that are gone
	}
	return holders
}

// activeHolders marks, for each MAC, the one holder that has it now. A MAC
// held twice is a VM in live migration (two launcher pods share the
// claim's MAC): the holder on the VMI's status.nodeName wins, which
// KubeVirt switches when the migration completes; without a VMI, a pod not
// being deleted wins over one that is, then the newest pod.
func activeHolders(hs []*holder, vmiNodes map[types.NamespacedName]string) {
	byMAC := map[string][]*holder{}
	for _, h := range hs {
		if h.mac != nil {
			byMAC[h.mac.String()] = append(byMAC[h.mac.String()], h)
		}
	}
	for _, group := range byMAC {
		best := slices.MaxFunc(group, func(a, b *holder) int {
			return cmp.Or(
				cmpBool(onVMINode(a, vmiNodes), onVMINode(b, vmiNodes)),
				cmpBool(a.pod.DeletionTimestamp == nil, b.pod.DeletionTimestamp == nil),
				a.pod.CreationTimestamp.Compare(b.pod.CreationTimestamp.Time),
				cmp.Compare(a.pod.Name, b.pod.Name),
			)
		})
		best.active = true
	}
}

// markMigrating marks both holders of each MAC held twice by the launcher
// pods of a VMI in live migration.
func markMigrating(hs []*holder, migrating map[types.NamespacedName]bool) {
	byMAC := map[string][]*holder{}
	for _, h := range hs {
		if h.mac != nil {
			byMAC[h.mac.String()] = append(byMAC[h.mac.String()], h)
		}
	}
	for _, group := range byMAC {
		if len(group) != 2 {
			continue
		}
		vmi := group[0].pod.Annotations[kubevirtv1.DomainAnnotation]
		key := types.NamespacedName{Namespace: group[0].pod.Namespace, Name: vmi}
		if vmi == "" || !migrating[key] || group[1].pod.Namespace != key.Namespace ||
			group[1].pod.Annotations[kubevirtv1.DomainAnnotation] != vmi || group[0].node == group[1].node {
			continue
		}
		group[0].migrating, group[1].migrating = true, true
	}
}

func onVMINode(h *holder, vmiNodes map[types.NamespacedName]string) bool {
	vmi := h.pod.Annotations[kubevirtv1.DomainAnnotation]
	if vmi == "" {
		return false
	}
	node, ok := vmiNodes[types.NamespacedName{Namespace: h.pod.Namespace, Name: vmi}]
	return ok && node == h.node
}

func cmpBool(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return 1
	default:
		return -1
	}
}
