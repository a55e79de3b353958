package ipam

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"kvnet.io/kvnet/internal/multus"
	"kvnet.io/kvnet/internal/netconf"
	"kvnet.io/kvnet/internal/podnetworks"
)

// LegacyPrimaryClaimAnnotation names a primary network's IPAMClaim on a pod
// (deprecated upstream in favour of the default-network element, which wins).
const LegacyPrimaryClaimAnnotation = "k8s.ovn.org/primary-udn-ipamclaim"

// PrimaryInterface is the pod interface of the primary user-defined
// network, as OVN-Kubernetes names it.
const PrimaryInterface = multus.PrimaryInterface

// ErrInvalidRequest marks a pod whose network request cannot be served as
// written; the message names the annotation and the element.
var ErrInvalidRequest = errors.New("invalid network request")

// ErrMissingNAD marks a pod that names a NAD that does not exist (yet).
var ErrMissingNAD = errors.New("network attachment definition not found")

// ErrNoPrimaryNetwork marks a pod in a namespace labelled for a primary
// network that has none.
var ErrNoPrimaryNetwork = errors.New("invalid primary network state")

// Attachment is one attachment of a pod to a network kvnet allocates for.
type Attachment struct {
	// NADKey is "<namespace>/<name>" of the NAD.
	NADKey  string
	Network *netconf.Served
	Role    string // podnetworks.RolePrimary or RoleSecondary
	// ClaimRef names an IPAMClaim in the pod's namespace, or "".
	ClaimRef string
	// IPs and MAC are static requests (nil: allocate).
	IPs []netip.Addr
	MAC net.HardwareAddr
}

// NADLookup returns the served configuration of NAD "<ns>/<name>": found is
// false when the NAD does not exist; s is nil when kvnet does not serve it.
type NADLookup func(key string) (s *netconf.Served, found bool, err error)

// PodAttachments returns the attachments of pod that kvnet allocates for:
// the primary network of a labelled namespace (primaryKey, "" when the
// namespace has none), then each element of the networks annotation that
// names a kvnet-cni NAD or a NAD using kvnet-ipam. Elements naming other
// NADs are skipped (other plugins own them).
func PodAttachments(pod *corev1.Pod, namespaceLabelled bool, primaryKey string, lookup NADLookup) ([]Attachment, error) {
	if pod.Spec.HostNetwork {
		return nil, nil
	}
	var out []Attachment
	if namespaceLabelled {
		if primaryKey == "" {
			return nil, fmt.Errorf("%w for namespace %q: a valid primary user defined network or network attachment definition custom resource, and required namespace label %q must both be present",
				ErrNoPrimaryNetwork, pod.Namespace, "k8s.ovn.org/primary-user-defined-network")
		}
		s, found, err := lookup(primaryKey)
		if err != nil {
			return nil, err
		}
		if !found || s == nil {
			return nil, fmt.Errorf("%w: %s", ErrMissingNAD, primaryKey)
		}
		a := Attachment{NADKey: primaryKey, Network: s, Role: podnetworks.RolePrimary}
		if err := primaryRequest(pod, &a); err != nil {
			return nil, err
		}
		out = append(out, a)
	}
	value, ok := pod.Annotations[multus.NetworksAnnotation]
	if !ok {
		return out, nil
	}
	elems, err := multus.ParseSelection(multus.NetworksAnnotation, value, pod.Namespace)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidRequest, err)
	}
	seen := map[string]bool{}
	for i, e := range elems {
		key := e.Key()
		if namespaceLabelled && key == primaryKey {
			// The primary network attached through Multus: kvnet's webhook
			// selects it here (interface ovn-udn1), with the claim, MAC and
			// IPs of a VM; it is the primary attachment, not a second one.
			where := fmt.Sprintf("annotation %s element %d (%s)", multus.NetworksAnnotation, i, key)
			if e.InterfaceRequest != PrimaryInterface {
				return nil, fmt.Errorf("%w: %s: the namespace's primary network is attached as %s, not %q", ErrInvalidRequest, where, PrimaryInterface, e.InterfaceRequest)
			}
			if seen[key] {
				return nil, fmt.Errorf("%w: %s: the primary network is selected twice", ErrInvalidRequest, where)
			}
			seen[key] = true
			if e.IPAMClaimReference != "" || len(e.IPRequest) > 0 || e.MacRequest != "" {
				p := &out[0]
				p.ClaimRef = e.IPAMClaimReference
				if err := request(p, e, where, true); err != nil {
					return nil, err
				}
			}
			continue
		}
		s, found, err := lookup(key)
		if err != nil {
			return nil, err
		}
		if !found {
			return nil, fmt.Errorf("%w: %s (annotation %s element %d)", ErrMissingNAD, key, multus.NetworksAnnotation, i)
		}
		if s == nil {
			continue
		}
		if seen[key] {
			// The same NAD twice needs one allocation per interface; kvnet
			// keys allocations by NAD, so refuse rather than share.
			return nil, fmt.Errorf("%w: annotation %s element %d: NAD %s is selected twice", ErrInvalidRequest, multus.NetworksAnnotation, i, key)
		}
		seen[key] = true
		a := Attachment{NADKey: key, Network: s, Role: podnetworks.RoleSecondary, ClaimRef: e.IPAMClaimReference}
		where := fmt.Sprintf("annotation %s element %d (%s)", multus.NetworksAnnotation, i, key)
		if err := request(&a, e, where, false); err != nil {
			return nil, err
		}
		out = append(out, a)
	}
	return out, nil
}

// primaryRequest fills the claim, IPs and MAC of a primary attachment from
// the default-network element, or the legacy claim annotation.
func primaryRequest(pod *corev1.Pod, a *Attachment) error {
	if v, ok := pod.Annotations[multus.DefaultNetworkAnnotation]; ok && strings.HasPrefix(strings.TrimSpace(v), "[") {
		elems, err := multus.ParseSelection(multus.DefaultNetworkAnnotation, v, pod.Namespace)
		if err != nil {
			return fmt.Errorf("%w: %v", ErrInvalidRequest, err)
		}
		if len(elems) != 1 {
			return fmt.Errorf("%w: annotation %s: want exactly one element, got %d", ErrInvalidRequest, multus.DefaultNetworkAnnotation, len(elems))
		}
		a.ClaimRef = elems[0].IPAMClaimReference
		return request(a, elems[0], "annotation "+multus.DefaultNetworkAnnotation, true)
	}
	a.ClaimRef = pod.Annotations[LegacyPrimaryClaimAnnotation]
	return nil
}

// request fills static IPs and MAC from a selection element. The
// multi-network spec makes "ips" with "ipam-claim-reference" an error in the
// networks annotation; in the primary default-network element (where
// KubeVirt's ipam-extensions puts a VM's requested IPs next to its claim)
// they are allowed, as OVN-Kubernetes allows them: they seed the claim's
// first allocation and must match its IPs afterwards.
func request(a *Attachment, e multus.NetworkSelectionElement, where string, ipsWithClaim bool) error {
	if len(e.IPRequest) > 0 && e.IPAMClaimReference != "" && !ipsWithClaim {
		return fmt.Errorf("%w: %s: ips and ipam-claim-reference cannot be used together (the claim holds the IPs)", ErrInvalidRequest, where)
	}
	for _, s := range e.IPRequest {
		addr, err := parseIP(s)
		if err != nil {
			return fmt.Errorf("%w: %s: ips value %q: %v", ErrInvalidRequest, where, s, err)
		}
		a.IPs = append(a.IPs, addr)
	}
	if e.MacRequest != "" {
		hw, err := net.ParseMAC(e.MacRequest)
		if err != nil || len(hw) != 6 {
			return fmt.Errorf("%w: %s: mac %q is not a MAC-48 address", ErrInvalidRequest, where, e.MacRequest)
		}
		a.MAC = hw
	}
	return nil
}

// parseIP accepts "10.0.0.5" or "10.0.0.5/24" (the prefix length is the
// network's, so it is ignored).
func parseIP(s string) (netip.Addr, error) {
	if p, err := netip.ParsePrefix(s); err == nil {
		return p.Addr(), nil
	}
	return netip.ParseAddr(s)
}
