// Package physnet holds what kvnet-node and kvnet-controller share about
// nodes' physical networks: the bridge mappings a localnet network is
// attached through and the kernel features a node lacks.
package physnet

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// BridgeMappingsAnnotation is the node annotation mapping physical
// network names (a localnet network's physicalNetworkName) to the node's
// Linux bridge on that network, in OVN-Kubernetes' ovn-bridge-mappings
// format: "physnet:br-phys,dc2:br-dc2". The admin (or a node network
// configuration tool) sets it; it plays the role of the bridge mappings of
// a NodeNetworkConfigurationPolicy on OpenShift.
const BridgeMappingsAnnotation = "kvnet.io/bridge-mappings"

// MissingKernelFeaturesAnnotation lists, comma-separated, the kernel
// features kvnet-node found missing on its node at start; today only
// KernelFeatureVLAN. kvnet-node writes it; kvnet-controller reports
// networks that need a missing feature in their status.
const MissingKernelFeaturesAnnotation = "kvnet.io/missing-kernel-features"

// KernelFeatureVLAN is 802.1Q VLAN links (the Linux module 8021q), which a
// localnet network with vlan.access needs.
const KernelFeatureVLAN = "8021q"

// ErrBridgeMappings marks an unusable bridge-mappings annotation.
var ErrBridgeMappings = errors.New("invalid bridge mappings")

// ParseBridgeMappings parses a BridgeMappingsAnnotation value. Blank
// entries are ignored; a physical network mapped twice, an entry without
// ":", an empty side or a bridge name that is not an interface name is an
// error naming the entry.
func ParseBridgeMappings(v string) (map[string]string, error) {
	out := map[string]string{}
	for i, entry := range strings.Split(v, ",") {
		entry = strings.TrimSpace(entry)
		if entry == "" {
			continue
		}
		phys, bridge, ok := strings.Cut(entry, ":")
		phys, bridge = strings.TrimSpace(phys), strings.TrimSpace(bridge)
		switch {
		case !ok || phys == "" || bridge == "":
			return nil, fmt.Errorf("%w: entry %d %q: want <physical network>:<bridge>", ErrBridgeMappings, i, entry)
		case len(bridge) > 15 || strings.ContainsAny(bridge, "/: \t\x00"):
			return nil, fmt.Errorf("%w: entry %d %q: bridge %q is not an interface name (1-15 characters, no '/', ':' or spaces)", ErrBridgeMappings, i, entry, bridge)
		case out[phys] != "":
			return nil, fmt.Errorf("%w: entry %d %q: physical network %q mapped twice", ErrBridgeMappings, i, entry, phys)
		}
		out[phys] = bridge
	}
	return out, nil
}

// MissingFeatures returns the features a node's
// MissingKernelFeaturesAnnotation lists.
func MissingFeatures(node *corev1.Node) []string {
	var out []string
	for f := range strings.SplitSeq(node.Annotations[MissingKernelFeaturesAnnotation], ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// LacksVLAN reports whether node's kvnet-node found no 802.1Q support.
func LacksVLAN(node *corev1.Node) bool {
	return slices.Contains(MissingFeatures(node), KernelFeatureVLAN)
}

// NoVLANReason is why a localnet network with VLAN vid cannot be attached
// on node: the message the network's status, kvnet-cni and kvnet-node
// give.
func NoVLANReason(node string, vid int) string {
	return fmt.Sprintf("vlan.access.id %d needs 802.1Q VLAN links (the Linux kernel module %s), which node %s lacks; kvnet does not attach the network untagged", vid, KernelFeatureVLAN, node)
}
