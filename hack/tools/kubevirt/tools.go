//go:build tools

// Package tools pins the KubeVirt components the real cluster's KubeVirt
// images carry (docs/kubevirt-images.md): built by hack/build-kubevirt.sh
// from kubevirt.io/kubevirt at the version go.mod requires. virt-handler
// and virt-launcher link libvirt with cgo (Debian's libvirt-dev).
package tools

import (
	_ "kubevirt.io/kubevirt/cmd/virt-api"
	_ "kubevirt.io/kubevirt/cmd/virt-chroot"
	_ "kubevirt.io/kubevirt/cmd/virt-controller"
	_ "kubevirt.io/kubevirt/cmd/virt-freezer"
	_ "kubevirt.io/kubevirt/cmd/virt-handler"
	_ "kubevirt.io/kubevirt/cmd/virt-launcher"
	_ "kubevirt.io/kubevirt/cmd/virt-launcher-monitor"
	_ "kubevirt.io/kubevirt/cmd/virt-operator"
	_ "kubevirt.io/kubevirt/cmd/virt-probe"
	_ "kubevirt.io/kubevirt/cmd/virt-tail"
)
