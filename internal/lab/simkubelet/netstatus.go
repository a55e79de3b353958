package simkubelet

import (
	"context"
	"encoding/json"
	"fmt"

	current "github.com/containernetworking/cni/pkg/types/100"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// NetworkStatusAnnotation is where Multus reports a pod's attachments.
const NetworkStatusAnnotation = "k8s.v1.cni.cncf.io/network-status"

// networkStatus is one entry of the network-status annotation, with the
// fields Multus writes.
type networkStatus struct {
	Name      string   `json:"name"`
	Interface string   `json:"interface,omitempty"`
	IPs       []string `json:"ips,omitempty"`
	Mac       string   `json:"mac,omitempty"`
	Default   bool     `json:"default,omitempty"`
	DNS       struct{} `json:"dns"`
	Gateway   []string `json:"gateway,omitempty"`
}

// statusOf builds a's entry from its ADD result as Multus does: the
// network name (the NAD key, or the cluster default network's name), the
// sandbox interface, every IP, the default route's gateway, and default
// only for the cluster default network.
func statusOf(a *attachment, res *current.Result) networkStatus {
	st := networkStatus{Name: a.nad, Interface: a.ifName, Default: a.clusterDefault}
	for _, i := range res.Interfaces {
		if i.Sandbox != "" {
			st.Mac = i.Mac
		}
	}
	st.IPs = podIPs(res)
	for _, r := range res.Routes {
		if ones, _ := r.Dst.Mask.Size(); ones == 0 && r.GW != nil {
			st.Gateway = append(st.Gateway, r.GW.String())
		}
	}
	return st
}

// writeNetworkStatus sets the pod's network-status annotation, as Multus
// does at the end of its ADD.
func (k *kubelet) writeNetworkStatus(ctx context.Context, pod *corev1.Pod, statuses []networkStatus) error {
	b, err := json.Marshal(statuses)
	if err != nil {
		return err
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{NetworkStatusAnnotation: string(b)}}})
	if err != nil {
		return err
	}
	_, err = k.cs.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.MergePatchType, patch, metav1.PatchOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("write %s: %w", NetworkStatusAnnotation, err)
	}
	return nil
}
