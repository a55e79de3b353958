//go:build tools

// Package tools records the Multus commands built by
// hack/build-cluster-tools.sh: the thick plugin's daemon and shim, the
// thin plugin and its DaemonSet's entrypoint (thin_entrypoint), and the
// installer (install_multus, with passthru) that upstream's DaemonSets run
// in their init container.
package tools

import (
	_ "gopkg.in/k8snetworkplumbingwg/multus-cni.v4/cmd/install_multus"
	_ "gopkg.in/k8snetworkplumbingwg/multus-cni.v4/cmd/multus"
	_ "gopkg.in/k8snetworkplumbingwg/multus-cni.v4/cmd/multus-daemon"
	_ "gopkg.in/k8snetworkplumbingwg/multus-cni.v4/cmd/multus-shim"
	_ "gopkg.in/k8snetworkplumbingwg/multus-cni.v4/cmd/passthru-cni"
	_ "gopkg.in/k8snetworkplumbingwg/multus-cni.v4/cmd/thin_entrypoint"
)
