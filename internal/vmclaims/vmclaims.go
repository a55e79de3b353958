// Package vmclaims decides, for a KubeVirt VM, which IPAMClaims it needs
// and how its virt-launcher pods reference them (the ipam-extensions role):
// one claim "<vm>.<network>" (composed as ipam-extensions composes it, see
// ClaimName) per VM network whose NAD allows persistent IPs, a multus
// secondary network or the pod network when the namespace's primary UDN is
// persistent.
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
	"regexp"
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

// ErrClaimName marks a VM whose networks compose IPAMClaim names that
// cannot be used: not a valid object name, or one name for two networks.
// Such a VM's claims are not created and its launcher pods are denied
// (the error also wraps ErrDeny).
var ErrClaimName = errors.New("unusable IPAMClaim name")

// claimNameRuns matches what ipam-extensions (kubevirt-ipam-controller)
// keeps of the lowercased "<vm>.<network>": DNS labels (letters, digits
// and inner hyphens), each optionally followed by more labels joined by a
// backslash and any one character. That join is what its pattern says
// (a "\\." in a raw string, meant as "\."): in practice names carry no
// backslash, so every label stands alone and dots, underscores and other
// characters only separate labels. Kept as is, so that kvnet's names
// stay the ones ipam-extensions gives the same VM.
var claimNameRuns = regexp.MustCompile(`[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*`)

// ClaimName composes the IPAMClaim name of a VM network as ipam-extensions
// does: "<vm>.<network>" lowercased, its runs of DNS labels (see
// claimNameRuns) joined with ".", cut at 253 characters. A network "my_net"
// of VM "vm1" gives "vm1.my.net". The result can be empty or end in "." or
// "-" (when cut): Claims refuses such a name, and two networks of one VM
// giving one name.
func ClaimName(vm, network string) string {
	runs := claimNameRuns.FindAllString(strings.ToLower(vm+"."+network), -1)
	name := strings.Join(runs, ".")
	if len(name) > validation.DNS1123SubdomainMaxLength {
		name = name[:validation.DNS1123SubdomainMaxLength]
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
// their claims: unplug never deletes one, so they are still listed. A claim
// name that is not a valid object name, or shared by two of the VM's
// networks, is an error wrapping ErrClaimName and ErrDeny.
func Claims(vmi *kubevirtv1.VirtualMachineInstance, vmName, primaryKey string, lookup NADLookup) ([]Claim, error) {
	out, err := claims(vmi, vmName, primaryKey, lookup)
	if err != nil {
		return nil, err
	}
	byName := map[string]string{} // claim name -> VM network
	for _, c := range out {
		if errs := validation.IsDNS1123Subdomain(c.Name); len(errs) > 0 {
			return nil, fmt.Errorf("%w: %w: VM %q network %q composes IPAMClaim name %q, which is not a valid object name (%s): rename the network",
				ErrDeny, ErrClaimName, vmName, c.LogicalNet, c.Name, strings.Join(errs, "; "))
		}
		if other, ok := byName[c.Name]; ok {
			return nil, fmt.Errorf("%w: %w: VM %q networks %q and %q both compose IPAMClaim name %q: rename one of them",
				ErrDeny, ErrClaimName, vmName, other, c.LogicalNet, c.Name)
		}
		byName[c.Name] = c.LogicalNet
	}
	return out, nil
}

func claims(vmi *kubevirtv1.VirtualMachineInstance, vmName, primaryKey string, lookup NADLookup) ([]Claim, error) {
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
	// PrimaryKey is "<ns>/<name>" of the namespace's primary NAD ("" when
	// none). With PrimaryInNetworks, a pod whose primary network has no
	// claim (no persistent IPs) still gets the network's element: KubeVirt
	// rebuilds the networks annotation on hot plug without it.
	PrimaryKey string
	// PrimaryAsDefaultNetwork: the primary network is the pod's default
	// network for Multus (multus.WithPrimaryDefaultNetwork): the claim,
	// MAC and IPs go in the default-network element, which names the
	// primary NAD (PrimaryKey) itself; DefaultNetworkNAD is unused.
	PrimaryAsDefaultNetwork bool
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
		if opts.PrimaryInNetworks && opts.PrimaryKey != "" {
			v, changed, err := multus.WithPrimaryElement(out[multus.NetworksAnnotation], pod.Namespace, opts.PrimaryKey, nil)
			if err != nil {
				return nil, fmt.Errorf("%w: %v", ErrDeny, err)
			}
			if changed {
				out[multus.NetworksAnnotation] = v
			}
		}
		return out, nil
	}
	if opts.PrimaryInNetworks || opts.PrimaryAsDefaultNetwork {
		mac, err := primaryMAC(vmi, primary.LogicalNet)
		if err != nil {
			return nil, err
		}
		ips, err := requestedIPs(vmi, primary.LogicalNet, primarySubnets)
		if err != nil {
			return nil, err
		}
		// The element that attaches the primary network carries the claim,
		// MAC and requested IPs (which go with the claim reference, as
		// below).
		key, with := multus.NetworksAnnotation, multus.WithPrimaryElement
		if opts.PrimaryAsDefaultNetwork {
			key, with = multus.DefaultNetworkAnnotation, multus.WithPrimaryDefaultNetwork
		}
		v, changed, err := with(out[key], pod.Namespace, primary.NADKey, func(e *multus.NetworkSelectionElement) {
			e.IPAMClaimReference, e.MacRequest, e.IPRequest = primary.Name, mac, ips
		})
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrDeny, err)
		}
		if changed {
			out[key] = v
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
