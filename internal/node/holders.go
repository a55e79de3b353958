package node

import (
	"cmp"
	"maps"
	"net"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	kubevirtv1 "kvnet.io/kvnet/api/kubevirt/v1"
	"kvnet.io/kvnet/internal/migration"
	"kvnet.io/kvnet/internal/podnetworks"
)

// holder is one pod attachment of a network.
type holder struct {
	pod    *corev1.Pod
	nadKey string
	node   string
	a      podnetworks.Attachment
	mac    net.HardwareAddr
	active bool // where the MAC lives now (see switchOver)
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

// switchOver decides, for each MAC among a network's holders hs (grouped
// once), which holder has it now (active) and whether its two holders
// are a live migration's source and target pods (migrating: both ports
// are attached, and the bridges follow the guest's frames).
//
// A MAC held twice is a VM in live migration (two launcher pods share the
// claim's MAC): the holder on the VMI's status.nodeName is active, which
// KubeVirt switches when the migration completes; without a VMI, a pod not
// being deleted wins over one that is, then the newest pod.
func (p *planner) switchOver(hs []*holder) {
	byMAC := map[string][]*holder{}
	for _, h := range hs {
		if h.mac != nil {
			byMAC[h.mac.String()] = append(byMAC[h.mac.String()], h)
		}
	}
	for _, group := range byMAC {
		best := slices.MaxFunc(group, func(a, b *holder) int {
			return cmp.Or(
				cmpBool(onVMINode(a, p.in.VMINodes), onVMINode(b, p.in.VMINodes)),
				cmpBool(a.pod.DeletionTimestamp == nil, b.pod.DeletionTimestamp == nil),
				a.pod.CreationTimestamp.Compare(b.pod.CreationTimestamp.Time),
				cmp.Compare(a.pod.Name, b.pod.Name),
			)
		})
		best.active = true
		if p.migrationPair(group) {
			group[0].migrating, group[1].migrating = true, true
		}
	}
}

// migrationPair reports whether the holders of one MAC are the source and
// target launcher pods, on two nodes, of their VMI's migration in
// progress (Input.Migrations).
func (p *planner) migrationPair(group []*holder) bool {
	if len(group) != 2 || group[0].node == group[1].node {
		return false
	}
	a, b := group[0].pod, group[1].pod
	vmi := a.Annotations[kubevirtv1.DomainAnnotation]
	if vmi == "" || b.Annotations[kubevirtv1.DomainAnnotation] != vmi {
		return false
	}
	m := p.in.Migrations[types.NamespacedName{Namespace: a.Namespace, Name: vmi}]
	if !m.InProgress() {
		return false
	}
	ra, rb := m.RoleOf(a.Namespace, a.Name), m.RoleOf(b.Namespace, b.Name)
	return ra != migration.NoRole && rb != migration.NoRole && ra != rb
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
