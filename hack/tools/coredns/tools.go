//go:build tools

// Package tools pins CoreDNS, the real-cluster lab's cluster DNS (its
// kubernetes plugin is in the default plugin set), built by
// hack/build-cluster-tools.sh and put in an image by internal/lab/cluster.
package tools

import (
	_ "github.com/coredns/coredns"
)
