// Package launcher computes the network annotations of a VMI's virt-launcher
// pod the way KubeVirt's virt-controller writes them when it templates the
// pod.
//
// kvnet does not create launcher pods, but it has to predict what
// virt-controller will ask Multus for: which NADs a pod selects, under which
// pod interface names, and which network is the pod's default. Webhooks and
// controllers that prepare IPAM claims, MAC reservations or NAD rendering
// must agree byte for byte with the annotation KubeVirt writes, so this
// package re-implements that templating (pkg/network/pod/annotations and
// pkg/network/multus upstream) without any Kubernetes client.
package launcher

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	kubevirtv1 "kvnet.io/kvnet/api/kubevirt/v1"
	"kvnet.io/kvnet/internal/multus"
)

// Annotation keys written on the launcher pod besides the Multus ones.
const (
	// IstioKubeVirtInterfacesAnnotation tells the Istio sidecar injector which
	// virtual interfaces carry VM traffic, so masqueraded traffic is not
	// captured twice.
	IstioKubeVirtInterfacesAnnotation = "traffic.sidecar.istio.io/kubevirtInterfaces"
	// IstioRerouteVirtualInterfacesAnnotation is the newer spelling of the
	// same hint, read by Istio's CNI plugin.
	IstioRerouteVirtualInterfacesAnnotation = "istio.io/reroute-virtual-interfaces"
)

const (
	// PrimaryPodInterfaceName is the pod interface of the pod network or of a
	// Multus default network.
	PrimaryPodInterfaceName = "eth0"
	// masqueradeBridgeName is the in-pod bridge masquerade binding creates on
	// the primary interface; Istio must treat it as a VM interface.
	masqueradeBridgeName = "k6t-eth0"
	// logicNetworkNameCNIArg is the CNI argument through which a binding
	// plugin's CNI learns which VM network it serves.
	logicNetworkNameCNIArg = "logicNetworkName"
	// podIfaceHashLen is 15 (IFNAMSIZ-1) minus len("-nic"): virt-handler
	// renames the pod NIC to "<hash>-nic" for bridge bindings, and that name
	// must still fit in a Linux interface name.
	podIfaceHashLen = 11
)

// ErrUnknownBindingPlugin marks an interface whose binding plugin is not
// registered in the KubeVirt CR; virt-controller refuses to template the pod.
var ErrUnknownBindingPlugin = errors.New("network binding plugin not registered")

// PodInterfaceName returns the pod interface name of a secondary VM network:
// "pod" + hex(sha256(networkName))[:11]. The hash is over the logical VM
// network name, not the NAD name, so renaming a NAD keeps the name stable
// and two networks using the same NAD still get distinct interfaces.
func PodInterfaceName(networkName string) string {
	sum := sha256.Sum256([]byte(networkName))
	return "pod" + hex.EncodeToString(sum[:])[:podIfaceHashLen]
}

// Annotations returns the pod annotations for the VMI's networks:
//
//   - k8s.v1.cni.cncf.io/networks: a JSON list with one element per
//     non-default Multus network whose interface is not absent, in
//     spec.networks order, {"name","namespace","mac"?,"interface"}; after a
//     network's element comes, when its interface uses a binding plugin
//     registered with a NAD, an element {"name","namespace","cni-args":
//     {"logicNetworkName": <network>}}. Omitted when the list is empty.
//   - v1.multus-cni.io/default-network: the networkName, verbatim, of the
//     first Multus network with default: true.
//   - the two Istio annotations set to k6t-eth0 when any interface uses
//     masquerade.
//
// bindings is KubeVirt's spec.configuration.network.binding (may be nil).
// The VMI is expected to be defaulted already (virt-api adds the default pod
// network before virt-controller ever sees the VMI).
func Annotations(vmi *kubevirtv1.VirtualMachineInstance, bindings map[string]kubevirtv1.InterfaceBindingPlugin) (map[string]string, error) {
	if vmi == nil {
		return nil, errors.New("vmi is nil")
	}
	elems, err := selectionElements(vmi, bindings)
	if err != nil {
		return nil, err
	}
	annotations := map[string]string{}
	if len(elems) > 0 {
		value, err := multus.MarshalSelection(elems)
		if err != nil {
			return nil, fmt.Errorf("vmi %s/%s: %w", vmi.Namespace, vmi.Name, err)
		}
		annotations[multus.NetworksAnnotation] = value
	}
	// Upstream looks at all networks here, absent or not: a default network
	// cannot be unplugged (Validate rejects it), so the result is the same.
	for _, network := range vmi.Spec.Networks {
		if isMultusDefault(network) {
			annotations[multus.DefaultNetworkAnnotation] = network.Multus.NetworkName
			break
		}
	}
	for _, iface := range vmi.Spec.Domain.Devices.Interfaces {
		if iface.Masquerade != nil {
			annotations[IstioKubeVirtInterfacesAnnotation] = masqueradeBridgeName
			annotations[IstioRerouteVirtualInterfacesAnnotation] = masqueradeBridgeName
			break
		}
	}
	return annotations, nil
}

// selectionElements builds the networks annotation list. A network takes
// part only when a non-absent interface uses it: an absent interface is
// being hot-unplugged, and a network without an interface has nothing to
// plug into.
func selectionElements(vmi *kubevirtv1.VirtualMachineInstance, bindings map[string]kubevirtv1.InterfaceBindingPlugin) ([]multus.NetworkSelectionElement, error) {
	ifaceIndex := map[string]int{}
	for i, iface := range vmi.Spec.Domain.Devices.Interfaces {
		if iface.State == kubevirtv1.InterfaceStateAbsent {
			continue
		}
		// The first interface of a name wins, like upstream's lookup.
		if _, seen := ifaceIndex[iface.Name]; !seen {
			ifaceIndex[iface.Name] = i
		}
	}

	var elems []multus.NetworkSelectionElement
	for _, network := range vmi.Spec.Networks {
		idx, ok := ifaceIndex[network.Name]
		if !ok {
			continue
		}
		iface := vmi.Spec.Domain.Devices.Interfaces[idx]
		if isSecondaryMultus(network) {
			namespace, name := splitNamespacedName(vmi.Namespace, network.Multus.NetworkName)
			elems = append(elems, multus.NetworkSelectionElement{
				Name:             name,
				Namespace:        namespace,
				MacRequest:       iface.MacAddress,
				InterfaceRequest: PodInterfaceName(network.Name),
			})
		}
		if iface.Binding == nil {
			continue
		}
		plugin, ok := bindings[iface.Binding.Name]
		if !ok {
			return nil, fmt.Errorf("%w: spec.domain.devices.interfaces[%d] %q: binding.name %q is not in the KubeVirt CR's spec.configuration.network.binding",
				ErrUnknownBindingPlugin, idx, iface.Name, iface.Binding.Name)
		}
		// Plugins without a NAD (e.g. l2bridge for primary UDNs, which
		// relies on the pod's own primary interface) need no extra CNI call.
		if plugin.NetworkAttachmentDefinition == "" {
			continue
		}
		namespace, name := splitNamespacedName(vmi.Namespace, plugin.NetworkAttachmentDefinition)
		elems = append(elems, multus.NetworkSelectionElement{
			Name:      name,
			Namespace: namespace,
			CNIArgs:   map[string]any{logicNetworkNameCNIArg: network.Name},
		})
	}
	return elems, nil
}

// splitNamespacedName splits "<ns>/<name>" at the first slash; a bare name
// lives in the VMI's namespace. The namespace is always written out so the
// annotation does not depend on Multus' own namespace defaulting.
func splitNamespacedName(defaultNamespace, ref string) (namespace, name string) {
	if ns, n, ok := strings.Cut(ref, "/"); ok {
		return ns, n
	}
	return defaultNamespace, ref
}

func isMultusDefault(n kubevirtv1.Network) bool {
	return n.Multus != nil && n.Multus.Default
}

func isSecondaryMultus(n kubevirtv1.Network) bool {
	return n.Multus != nil && !n.Multus.Default
}
