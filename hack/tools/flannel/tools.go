//go:build tools

// Package tools pins flanneld, the real-cluster lab's default network
// (VXLAN backend), built by hack/build-cluster-tools.sh and put in an
// image by internal/lab/cluster.
package tools

import (
	_ "github.com/flannel-io/flannel"
)
