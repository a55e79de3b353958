// Command kvnet-cni is the CNI plugin for kvnet networks (and, installed
// as kvnet-ipam, their IPAM-only mode).
package main

import (
	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/version"

	"kvnet.io/kvnet/internal/cni"
	"kvnet.io/kvnet/internal/k8s/podsource"
)

func main() {
	p := &cni.Plugin{NewSource: podsource.New}
	skel.PluginMainFuncs(p.Funcs(), version.All, "kvnet-cni: wires pods as kvnet-controller allocated them")
}
