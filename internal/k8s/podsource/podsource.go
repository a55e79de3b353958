// Package podsource reads a pod's kvnet.io/pod-networks annotation from the
// API server for kvnet-cni (internal/cni.PodSource).
package podsource

import (
	"context"
	"fmt"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/version"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"kvnet.io/kvnet/internal/cni"
	"kvnet.io/kvnet/internal/podnetworks"
)

type source struct{ cs kubernetes.Interface }

// New returns a PodSource using the kubeconfig at path.
func New(path string) (cni.PodSource, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		return nil, fmt.Errorf("load kubeconfig %q: %w", path, err)
	}
	cfg.QPS, cfg.Burst = 20, 40
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	return &source{cs: cs}, nil
}

func (s *source) PodNetworks(ctx context.Context, namespace, name string) (podnetworks.Networks, error) {
	pod, err := s.cs.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		if apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("pod %s/%s not found", namespace, name)
		}
		return nil, err
	}
	v, ok := pod.Annotations[podnetworks.Annotation]
	if !ok {
		return nil, nil
	}
	return podnetworks.Parse(v)
}

// PluginMain runs kvnet-cni (or, named kvnet-ipam, its IPAM-only mode):
// the main of cmd/kvnet-cni, and of the kvnet binary when invoked under
// one of those names (the lab installs it so).
func PluginMain() {
	p := &cni.Plugin{NewSource: New}
	skel.PluginMainFuncs(p.Funcs(), version.All, "kvnet-cni: wires pods as kvnet-controller allocated them")
}
