// Package vmclaims decides, for a KubeVirt VM, which IPAMClaims it needs
// and how its virt-launcher pods reference them (the ipam-extensions role):
// one claim "<vm>.<network>" per VM network whose NAD allows persistent IPs,
// a multus secondary network or the pod network when the namespace's
// primary UDN is persistent.
//
// It holds no Kubernetes client: the claims controller and the launcher-pod
// webhook in internal/k8s feed it objects.
package vmclaims

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	kubevirtv1 "kvnet.io/kvnet/api/kubevirt/v1"
	"kvnet.io/kvnet/internal/ipam"
	"kvnet.io/kvnet/internal/multus"
	"kvnet.io/kvnet/internal/netconf"
)

// Finalizer keeps a claim (and so its IPs) until its VM is really gone.
const Finalizer = "kubevirt.io/persistent-ipam"

// ErrDeny marks a launcher pod that must not be admitted.
var ErrDeny = errors.New("launcher pod denied")

// ClaimName composes "<vm>.<network>": lowercased, only the parts that are
// valid DNS subdomains kept, at most 253 characters.
func ClaimName(vm, network string) string {
	var parts []string
	for _, p := range []string{strings.ToLower(vm), strings.ToLower(network)} {
		if len(validation.IsDNS1123Subdomain(p)) == 0 {
			parts = append(parts, p)
		}
	}
	name := strings.Join(parts, ".")
	if len(name) > validation.DNS1123SubdomainMaxLength {
		name = strings.TrimRight(name[:validation.DNS1123SubdomainMaxLength], ".-")
	}
	return name
}

// Claim is a claim a VM needs.
type Claim struct {
	Name       string // claim name
	LogicalNet string // the VM network's name
	Network    string // the CNI network name (claim spec.network)
	NADKey     string // "<ns>/<name>" of the NAD
	Primary    bool   // the pod network on a primary UDN
}

// NADLookup returns the served configuration of "<ns>/<name>" (nil, false
// when the NAD does not exist; nil, true when kvnet does not serve it).
type NADLookup func(key string) (*netconf.Served, bool, error)

// Claims returns the claims vmi needs. vmName is the VM's name (the VMI's
// name for VMs; the VMI's own for standalone ones). primaryKey is the
// namespace's primary NAD ("" when none). Interfaces with state absent keep
// their claims: unplug never deletes one, so they are still listed.
func Claims(vmi *kubevirtv1.VirtualMachineInstance, vmName, primaryKey string, lookup NADLookup) ([]Claim, error) {
	var out []Claim
	for _, n := range vmi.Spec.Networks {
		switch {
		case n.Pod != nil:
			if primaryKey == "" {
				continue
			}
			s, found, err := lookup(primaryKey)
			if err != nil {
				return nil, err
			}
			if found && s != nil && s.IsPrimary() && s.AllowsPersistentIPs() {
				out = append(out, Claim{Name: ClaimName(vmName, n.Name), LogicalNet: n.Name, Network: s.Name, NADKey: primaryKey, Primary: true})
			}
		case n.Multus != nil && !n.Multus.Default:
			key := nadKey(vmi.Namespace, n.Multus.NetworkName)
			s, found, err := lookup(key)
			if err != nil {
				return nil, err
			}
			if found && s != nil && s.AllowsPersistentIPs() {
				out = append(out, Claim{Name: ClaimName(vmName, n.Name), LogicalNet: n.Name, Network: s.Name, NADKey: key})
			}
		}
	}
	return out, nil
}

func nadKey(defaultNS, ref string) string {
	if ns, name, ok := strings.Cut(ref, "/"); ok {
		return ns + "/" + name
	}
	return defaultNS + "/" + ref
}

// PodOptions configures MutatePod.
type PodOptions struct {
	// DefaultNetworkNAD is "<ns>/<name>" written in the default-network
	// element for primary networks (the cluster's default network NAD).
	DefaultNetworkNAD string
	// Create is true for CREATE requests (a pre-set default-network
	// annotation is denied then).
	Create bool
	// PrimaryInNetworks: the primary network is attached by Multus as an
	// element of the networks annotation (interface ovn-udn1), so the
	// claim, MAC and IPs go in that element; DefaultNetworkNAD is unused
	// and the cluster default network stays the pod's eth0.
	PrimaryInNetworks bool
}

// MutatePod returns the annotations a launcher pod must have so the IPAM
// uses the VM's claims: ipam-claim-reference on each persistent secondary
// element; for a persistent primary network the default-network element
// (with the VM's MAC and requested IPs) and the legacy annotation.
// It returns the pod's annotations unchanged when nothing applies.
func MutatePod(pod *corev1.Pod, vmi *kubevirtv1.VirtualMachineInstance, claims []Claim, primarySubnets []netip.Prefix, opts PodOptions) (map[string]string, error) {
	out := map[string]string{}
	for k, v := range pod.Annotations {
		out[k] = v
	}
	byNAD := map[string]Claim{}
	var primary *Claim
	for i := range claims {
		if claims[i].Primary {
			primary = &claims[i]
		} else {
			byNAD[claims[i].NADKey] = claims[i]
		}
	}
	if v, ok := pod.Annotations[multus.NetworksAnnotation]; ok && len(byNAD) > 0 {
		elems, err := multus.ParseSelection(multus.NetworksAnnotation, v, pod.Namespace)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrDeny, err)
		}
		changed := false
		for i := range elems {
			if cl, ok := byNAD[elems[i].Key()]; ok && elems[i].IPAMClaimReference != cl.Name {
				elems[i].IPAMClaimReference = cl.Name
				changed = true
			}
		}
		if changed {
			s, err := multus.MarshalSelection(elems)
			if err != nil {
				return nil, err
			}
			out[multus.NetworksAnnotation] = s
		}
	}
	if primary == nil {
		return out, nil
	}
	if opts.PrimaryInNetworks {
		mac, err := primaryMAC(vmi, primary.LogicalNet)
		if err != nil {
			return nil, err
		}
		ips, err := requestedIPs(vmi, primary.LogicalNet, primarySubnets)
		if err != nil {
			return nil, err
		}
		v, changed, err := multus.WithPrimaryElement(out[multus.NetworksAnnotation], pod.Namespace, primary.NADKey, func(e *multus.NetworkSelectionElement) {
			e.IPAMClaimReference, e.MacRequest, e.IPRequest = primary.Name, mac, ips
		})
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrDeny, err)
		}
		if changed {
			out[multus.NetworksAnnotation] = v
		}
		return out, nil
	}
	if _, ok := pod.Annotations[multus.DefaultNetworkAnnotation]; ok && opts.Create {
		return nil, fmt.Errorf("%w: pod already has annotation %s; kvnet sets it for VMs on a primary user-defined network with persistent IPs", ErrDeny, multus.DefaultNetworkAnnotation)
	}
	out[ipam.LegacyPrimaryClaimAnnotation] = primary.Name
	nsName, name, ok := strings.Cut(opts.DefaultNetworkNAD, "/")
	if !ok {
		return nil, fmt.Errorf("default network NAD %q is not <namespace>/<name>", opts.DefaultNetworkNAD)
	}
	el := multus.NetworkSelectionElement{Name: name, Namespace: nsName, IPAMClaimReference: primary.Name}
	mac, err := primaryMAC(vmi, primary.LogicalNet)
	if err != nil {
		return nil, err
	}
	el.MacRequest = mac
	ips, err := requestedIPs(vmi, primary.LogicalNet, primarySubnets)
	if err != nil {
		return nil, err
	}
	// Requested IPs go with the claim reference: the IPAM uses them for the
	// claim's first allocation and checks them against it afterwards.
	el.IPRequest = ips
	s, err := multus.MarshalSelection([]multus.NetworkSelectionElement{el})
	if err != nil {
		return nil, err
	}
	out[multus.DefaultNetworkAnnotation] = s
	return out, nil
}

// primaryMAC returns the macAddress of the VMI's interface iface ("" if
// none). The allocator takes MAC-48 only; refuse here, naming the VMI's
// field, rather than have the pod wait for an address.
func primaryMAC(vmi *kubevirtv1.VirtualMachineInstance, iface string) (string, error) {
	for _, i := range vmi.Spec.Domain.Devices.Interfaces {
		if i.Name != iface {
			continue
		}
		if hw, err := net.ParseMAC(i.MacAddress); i.MacAddress != "" && (err != nil || len(hw) != 6) {
			return "", fmt.Errorf("%w: VMI %s interface %q: macAddress %q is not a MAC-48 address", ErrDeny, vmi.Name, i.Name, i.MacAddress)
		}
		return i.MacAddress, nil
	}
	return "", nil
}

// requestedIPs reads the VMI annotation network.kubevirt.io/addresses
// ({"<iface>": ["10.0.0.5", ...]}) for iface, as CIDRs of the subnets.
func requestedIPs(vmi *kubevirtv1.VirtualMachineInstance, iface string, subnets []netip.Prefix) ([]string, error) {
	v, ok := vmi.Annotations[kubevirtv1.AddressesAnnotation]
	if !ok {
		return nil, nil
	}
	var m map[string][]string
	if err := json.Unmarshal([]byte(v), &m); err != nil {
		return nil, fmt.Errorf("%w: VMI %s annotation %s: %v", ErrDeny, vmi.Name, kubevirtv1.AddressesAnnotation, err)
	}
	var out []string
	for _, s := range m[iface] {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return nil, fmt.Errorf("%w: VMI %s annotation %s: %q is not an IP", ErrDeny, vmi.Name, kubevirtv1.AddressesAnnotation, s)
		}
		found := false
		for _, p := range subnets {
			if p.Contains(a) {
				out = append(out, netip.PrefixFrom(a, p.Bits()).String())
				found = true
			}
		}
		if !found {
			return nil, fmt.Errorf("%w: VMI %s annotation %s: %s is not in the network's subnets %v", ErrDeny, vmi.Name, kubevirtv1.AddressesAnnotation, s, subnets)
		}
	}
	return out, nil
}
