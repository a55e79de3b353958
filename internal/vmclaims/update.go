package vmclaims

import (
	"fmt"
	"maps"

	corev1 "k8s.io/api/core/v1"

	"kvnet.io/kvnet/internal/ipam"
	"kvnet.io/kvnet/internal/multus"
)

// KeepOnUpdate returns the annotations an UPDATE of a launcher pod from
// old to pod must carry so that kvnet's additions survive it: KubeVirt
// patches live launcher pods (virt-controller's SyncPodAnnotations adds
// its keys with JSON patch "add" operations, and on a hot plug or unplug
// rebuilds k8s.v1.cni.cncf.io/networks from the VMI alone), which would
// drop what kvnet's webhook wrote at CREATE:
//
//   - the default-network annotation and the legacy primary claim
//     annotation, when the update drops them;
//   - the ipam-claim-reference of an element that selects the same NAD
//     as interface as an old element with one (the rebuilt annotation has
//     none);
//   - the primary network's element (interface multus.PrimaryInterface),
//     when the update drops it: put back first, as it was.
//
// An element the update removes otherwise (an unplugged network) stays
// removed. changed is false when pod's annotations need nothing. An
// annotation that does not parse is kept as it came (Multus reports it);
// the error says why nothing was kept in it.
func KeepOnUpdate(old, pod *corev1.Pod) (ann map[string]string, changed bool, err error) {
	ann = maps.Clone(pod.Annotations)
	if ann == nil {
		ann = map[string]string{}
	}
	for _, k := range []string{multus.DefaultNetworkAnnotation, ipam.LegacyPrimaryClaimAnnotation} {
		v, had := old.Annotations[k]
		if _, has := ann[k]; had && !has {
			ann[k], changed = v, true
		}
	}
	oldV, ok := old.Annotations[multus.NetworksAnnotation]
	if !ok {
		return ann, changed, nil
	}
	oldElems, err := multus.ParseSelection(multus.NetworksAnnotation, oldV, pod.Namespace)
	if err != nil {
		return ann, changed, fmt.Errorf("old pod: %w", err)
	}
	newElems, err := multus.ParseSelection(multus.NetworksAnnotation, ann[multus.NetworksAnnotation], pod.Namespace)
	if err != nil {
		return ann, changed, err
	}
	elemsChanged := false
	selected := map[string]bool{} // keys of NADs the update selects
	for i := range newElems {
		e := &newElems[i]
		selected[e.Key()] = true
		if e.IPAMClaimReference != "" {
			continue
		}
		for _, o := range oldElems {
			if o.IPAMClaimReference != "" && o.Key() == e.Key() && o.InterfaceRequest == e.InterfaceRequest {
				e.IPAMClaimReference, elemsChanged = o.IPAMClaimReference, true
				break
			}
		}
	}
	var primary []multus.NetworkSelectionElement
	for _, o := range oldElems {
		if o.InterfaceRequest == multus.PrimaryInterface && !selected[o.Key()] {
			primary = append(primary, o)
		}
	}
	if len(primary) > 0 {
		newElems, elemsChanged = append(primary, newElems...), true
	}
	if !elemsChanged {
		return ann, changed, nil
	}
	v, err := multus.MarshalSelection(newElems)
	if err != nil {
		return ann, changed, err
	}
	ann[multus.NetworksAnnotation] = v
	return ann, true, nil
}

// KvnetAnnotationsChanged reports whether an update from old to pod
// touches an annotation kvnet's launcher-pod webhook writes (the networks
// and default-network selections, the legacy primary claim annotation):
// other updates (labels, KubeVirt's own annotations) need no look at
// them.
func KvnetAnnotationsChanged(old, pod *corev1.Pod) bool {
	for _, k := range []string{multus.NetworksAnnotation, multus.DefaultNetworkAnnotation, ipam.LegacyPrimaryClaimAnnotation} {
		a, okA := old.Annotations[k]
		b, okB := pod.Annotations[k]
		if a != b || okA != okB {
			return true
		}
	}
	return false
}
