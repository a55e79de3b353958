// Package podnetworks is the contract between kvnet's central allocator and
// everything that wires pods: the pod annotation kvnet.io/pod-networks.
//
// The allocator writes it once per pod with every kvnet attachment of the
// pod; kvnet-cni and kvnet-node read it and wire exactly that. Its value is
// a JSON object keyed by NAD ("<namespace>/<name>"):
//
//	{"tenant/udn-l2-net": {"ip_addresses": ["10.0.0.5/24"], "mac_address": "0a:58:0a:00:00:05",
//	  "gateway_ips": ["10.0.0.1"], "routes": [{"dest": "0.0.0.0/0", "nextHop": "10.0.0.1"}],
//	  "role": "primary", "network": "tenant_udn-l2-net", "ipam_claim": "vm1.pod"}}
//
// The shape follows OVN-Kubernetes' k8s.ovn.org/pod-networks so tools that
// read one can read the other.
package podnetworks

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// Annotation is the pod annotation holding a pod's kvnet attachments.
const Annotation = "kvnet.io/pod-networks"

// Roles of an attachment.
const (
	RolePrimary   = "primary"
	RoleSecondary = "secondary"
)

// ErrInvalid marks an annotation that does not parse or holds bad values.
var ErrInvalid = errors.New("invalid kvnet.io/pod-networks annotation")

// Route is one route of an attachment.
type Route struct {
	Dest    string `json:"dest"`
	NextHop string `json:"nextHop,omitempty"`
}

// Attachment is what the allocator decided for one attachment of a pod.
type Attachment struct {
	// IPAddresses are CIDR strings (address/prefix length), IPv4 first.
	IPAddresses []string `json:"ip_addresses,omitempty"`
	MACAddress  string   `json:"mac_address"`
	GatewayIPs  []string `json:"gateway_ips,omitempty"`
	Routes      []Route  `json:"routes,omitempty"`
	Role        string   `json:"role"`
	// Network is the network name (the NAD config's "name").
	Network string `json:"network"`
	// IPAMClaim names the claim (same namespace) that holds the IPs, if any.
	IPAMClaim string `json:"ipam_claim,omitempty"`
}

// Annotation maps NAD key ("<namespace>/<name>") to attachment.
type Networks map[string]Attachment

// Parse reads the annotation value. Every error wraps ErrInvalid and names
// the NAD key and field.
func Parse(value string) (Networks, error) {
	var n Networks
	if err := json.Unmarshal([]byte(value), &n); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	for key, a := range n {
		if err := a.validate(key); err != nil {
			return nil, err
		}
	}
	return n, nil
}

// Marshal renders the annotation value.
func (n Networks) Marshal() (string, error) {
	for key, a := range n {
		if err := a.validate(key); err != nil {
			return "", err
		}
	}
	b, err := json.Marshal(n)
	if err != nil {
		return "", fmt.Errorf("marshal %s: %w", Annotation, err)
	}
	return string(b), nil
}

func (a Attachment) validate(key string) error {
	ns, name, ok := strings.Cut(key, "/")
	if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
		return fmt.Errorf("%w: key %q is not <namespace>/<name>", ErrInvalid, key)
	}
	for _, s := range a.IPAddresses {
		if _, err := netip.ParsePrefix(s); err != nil {
			return fmt.Errorf("%w: %q ip_addresses value %q: %v", ErrInvalid, key, s, err)
		}
	}
	if hw, err := net.ParseMAC(a.MACAddress); err != nil || len(hw) != 6 {
		return fmt.Errorf("%w: %q mac_address %q is not a MAC-48 address", ErrInvalid, key, a.MACAddress)
	}
	for _, s := range a.GatewayIPs {
		if _, err := netip.ParseAddr(s); err != nil {
			return fmt.Errorf("%w: %q gateway_ips value %q: %v", ErrInvalid, key, s, err)
		}
	}
	for _, r := range a.Routes {
		if _, err := netip.ParsePrefix(r.Dest); err != nil {
			return fmt.Errorf("%w: %q route dest %q: %v", ErrInvalid, key, r.Dest, err)
		}
		if r.NextHop != "" {
			if _, err := netip.ParseAddr(r.NextHop); err != nil {
				return fmt.Errorf("%w: %q route nextHop %q: %v", ErrInvalid, key, r.NextHop, err)
			}
		}
	}
	switch a.Role {
	case RolePrimary, RoleSecondary:
	default:
		return fmt.Errorf("%w: %q role %q: must be primary or secondary", ErrInvalid, key, a.Role)
	}
	if a.Network == "" {
		return fmt.Errorf("%w: %q network is empty", ErrInvalid, key)
	}
	return nil
}

// Addrs returns the attachment's IPs without prefix lengths.
func (a Attachment) Addrs() []netip.Addr {
	out := make([]netip.Addr, 0, len(a.IPAddresses))
	for _, s := range a.IPAddresses {
		if p, err := netip.ParsePrefix(s); err == nil {
			out = append(out, p.Addr())
		}
	}
	return out
}

// MAC returns the attachment's MAC (nil if it does not parse).
func (a Attachment) MAC() net.HardwareAddr {
	hw, err := net.ParseMAC(a.MACAddress)
	if err != nil {
		return nil
	}
	return hw
}

// NetworkLabelPrefix begins the key of the label kvnet-controller puts,
// with the annotation, on every pod attached to a kvnet network: one label
// per network (NetworkLabel), so that a kvnet-node can watch the pods of
// the networks it serves and no others.
const NetworkLabelPrefix = "network.kvnet.io/"

// NetworkLabel returns the key of the label of the pods attached to
// network: NetworkLabelPrefix and the first 16 hex digits of the SHA-256
// of the network's name (a name may be longer than a label's 63
// characters). Its value is empty. Two networks sharing a key would only
// make a node watch more pods than it needs.
func NetworkLabel(network string) string {
	sum := sha256.Sum256([]byte(network))
	return NetworkLabelPrefix + hex.EncodeToString(sum[:8])
}

// Labels returns the network labels (NetworkLabel, empty values) of the
// networks n attaches.
func (n Networks) Labels() map[string]string {
	out := make(map[string]string, len(n))
	for _, a := range n {
		out[NetworkLabel(a.Network)] = ""
	}
	return out
}

// HasLabels reports whether labels hold every label of want.
func HasLabels(labels, want map[string]string) bool {
	for k, v := range want {
		if have, ok := labels[k]; !ok || have != v {
			return false
		}
	}
	return true
}

// Completed reports whether a pod has finished (Succeeded or Failed): it
// uses no network any more, so its addresses may be freed and it does not
// keep a network from being deleted.
func Completed(p *corev1.Pod) bool {
	return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
}
