//go:build tools

// Package tools pins the node-side and scheduling Kubernetes binaries the
// real-cluster lab runs (kubelet, kube-scheduler, kube-proxy): built by
// hack/build-cluster-tools.sh at the same k8s.io/kubernetes version as the
// control plane of hack/tools/k8s.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
