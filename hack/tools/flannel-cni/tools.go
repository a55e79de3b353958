//go:build tools

// Package tools pins the flannel and portmap CNI plugins of the real-cluster
// lab's Flannel image.
package tools

import (
	_ "github.com/containernetworking/plugins/plugins/meta/flannel"
	_ "github.com/containernetworking/plugins/plugins/meta/portmap"
)
