// Command kvnet-cni is the CNI plugin for kvnet networks (and, installed
// as kvnet-ipam, their IPAM-only mode).
package main

import "kvnet.io/kvnet/internal/k8s/podsource"

func main() { podsource.PluginMain() }
