package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"kvnet.io/kvnet/internal/multus"
	"kvnet.io/kvnet/internal/podnetworks"
)

// NetworkStatusAnnotation is Multus's report of a pod's attachments.
const NetworkStatusAnnotation = "k8s.v1.cni.cncf.io/network-status"

// errNetworkStatus marks an unreadable network-status annotation.
var errNetworkStatus = errors.New("invalid network-status annotation")

// primaryDefault returns the network-status value with the primary
// user-defined network's entry (interface ovn-udn1, name primaryNAD) as
// the pod's default network and every other entry not default.
//
// Stock Multus marks the cluster default network (eth0) default, because
// it attached eth0 as its "master" plugin; but for a pod on a primary UDN
// the primary network is ovn-udn1, and KubeVirt binds a VM's pod network
// to the interface marked default. OVN-Kubernetes, which attaches both
// itself, reports ovn-udn1 as the default one; this makes a Multus
// attachment report the same. Entries keep every field they have; changed
// is false when there is nothing to do (no such entry, or already so).
func primaryDefault(value, primaryNAD string) (out string, changed bool, err error) {
	var entries []map[string]any
	if err := json.Unmarshal([]byte(value), &entries); err != nil {
		return "", false, fmt.Errorf("%w: %v", errNetworkStatus, err)
	}
	idx := -1
	for i, e := range entries {
		if e == nil {
			return "", false, fmt.Errorf("%w: entry %d is null", errNetworkStatus, i)
		}
		name, _ := e["name"].(string)
		iface, _ := e["interface"].(string)
		if name == primaryNAD && iface == multus.PrimaryInterface {
			idx = i
		}
	}
	if idx < 0 {
		return value, false, nil
	}
	for i, e := range entries {
		want := i == idx
		if d, _ := e["default"].(bool); d != want {
			changed = true
		}
		if want {
			e["default"] = true
		} else {
			delete(e, "default") // omitted means false, as Multus writes it
		}
	}
	if !changed {
		return value, false, nil
	}
	b, err := json.Marshal(entries)
	if err != nil {
		return "", false, err
	}
	return string(b), true, nil
}

// markPrimaryDefault fixes network-status (see primaryDefault) on this
// node's pods that have a primary attachment. A failure is logged and
// retried on the next reconcile; it never blocks the datapath.
func (a *Agent) markPrimaryDefault(ctx context.Context, pods []corev1.Pod) {
	for i := range pods {
		pod := &pods[i]
		if pod.Spec.NodeName != a.cfg.NodeName || pod.DeletionTimestamp != nil {
			continue
		}
		status, ok := pod.Annotations[NetworkStatusAnnotation]
		if !ok {
			continue
		}
		primary := primaryNADOf(pod)
		if primary == "" {
			continue
		}
		fixed, changed, err := primaryDefault(status, primary)
		if err != nil {
			log.FromContext(ctx).Error(err, "pod's network-status unreadable; not marking its primary network default", "pod", client.ObjectKeyFromObject(pod))
			continue
		}
		if !changed {
			continue
		}
		patch := map[string]any{"metadata": map[string]any{
			"resourceVersion": pod.ResourceVersion,
			"annotations":     map[string]string{NetworkStatusAnnotation: fixed},
		}}
		b, err := json.Marshal(patch)
		if err != nil {
			continue
		}
		p := &corev1.Pod{}
		p.Namespace, p.Name = pod.Namespace, pod.Name
		if err := a.mgr.GetClient().Patch(ctx, p, client.RawPatch("application/merge-patch+json", b)); err != nil {
			// A conflict means Multus (or anyone) wrote since: the update
			// event brings the pod back here.
			log.FromContext(ctx).V(1).Info("mark primary network default in network-status", "pod", client.ObjectKeyFromObject(pod), "error", err.Error())
			continue
		}
		log.FromContext(ctx).Info("marked the primary network default in network-status", "pod", client.ObjectKeyFromObject(pod), "nad", primary)
	}
}

// primaryNADOf returns the NAD key of the pod's primary attachment, from
// its kvnet.io/pod-networks annotation, or "".
func primaryNADOf(pod *corev1.Pod) string {
	v, ok := pod.Annotations[podnetworks.Annotation]
	if !ok {
		return ""
	}
	n, err := podnetworks.Parse(v)
	if err != nil {
		return ""
	}
	for key, att := range n {
		if att.Role == podnetworks.RolePrimary {
			return key
		}
	}
	return ""
}
