// Package multus reads and writes the pod annotations of the Kubernetes
// Network Plumbing Working Group multi-network specification (v1.3) that
// kvnet uses: the k8s.v1.cni.cncf.io/networks selection list and the
// v1.multus-cni.io/default-network override.
//
// Both are user input, so parsing never panics and every error names the
// annotation and the bad element.
package multus

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// Annotation keys.
const (
	NetworksAnnotation       = "k8s.v1.cni.cncf.io/networks"
	DefaultNetworkAnnotation = "v1.multus-cni.io/default-network"
)

// ErrInvalidSelection marks an unparsable selection annotation.
var ErrInvalidSelection = errors.New("invalid network selection")

// NetworkSelectionElement is one element of a networks annotation.
type NetworkSelectionElement struct {
	Name               string         `json:"name"`
	Namespace          string         `json:"namespace,omitempty"`
	IPRequest          []string       `json:"ips,omitempty"`
	MacRequest         string         `json:"mac,omitempty"`
	InterfaceRequest   string         `json:"interface,omitempty"`
	IPAMClaimReference string         `json:"ipam-claim-reference,omitempty"`
	CNIArgs            map[string]any `json:"cni-args,omitempty"`
	GatewayRequest     []string       `json:"default-route,omitempty"`
}

// Key returns "<namespace>/<name>" of the NAD the element selects.
func (e NetworkSelectionElement) Key() string { return e.Namespace + "/" + e.Name }

// ParseSelection parses a networks (or default-network) annotation value:
// either a JSON list of elements, or the short form "a, ns/b, c@eth1".
// Elements without a namespace get defaultNamespace.
func ParseSelection(annotation, value, defaultNamespace string) ([]NetworkSelectionElement, error) {
	value = strings.TrimSpace(value)
	if value == "" {
		return nil, nil
	}
	var elems []NetworkSelectionElement
	if strings.HasPrefix(value, "[") || strings.HasPrefix(value, "{") {
		if strings.HasPrefix(value, "{") {
			value = "[" + value + "]"
		}
		if err := json.Unmarshal([]byte(value), &elems); err != nil {
			return nil, fmt.Errorf("%w: annotation %s: %v", ErrInvalidSelection, annotation, err)
		}
	} else {
		for item := range strings.SplitSeq(value, ",") {
			item = strings.TrimSpace(item)
			var e NetworkSelectionElement
			if at := strings.LastIndex(item, "@"); at >= 0 {
				e.InterfaceRequest = item[at+1:]
				item = item[:at]
			}
			if slash := strings.Index(item, "/"); slash >= 0 {
				e.Namespace, e.Name = item[:slash], item[slash+1:]
			} else {
				e.Name = item
			}
			elems = append(elems, e)
		}
	}
	for i := range elems {
		e := &elems[i]
		if e.Namespace == "" {
			e.Namespace = defaultNamespace
		}
		if errs := validation.IsDNS1123Subdomain(e.Name); len(errs) > 0 {
			return nil, fmt.Errorf("%w: annotation %s element %d: name %q: %s", ErrInvalidSelection, annotation, i, e.Name, strings.Join(errs, "; "))
		}
		if errs := validation.IsDNS1123Label(e.Namespace); len(errs) > 0 {
			return nil, fmt.Errorf("%w: annotation %s element %d: namespace %q: %s", ErrInvalidSelection, annotation, i, e.Namespace, strings.Join(errs, "; "))
		}
	}
	return elems, nil
}

// MarshalSelection renders elements as the JSON form of the annotation.
func MarshalSelection(elems []NetworkSelectionElement) (string, error) {
	b, err := json.Marshal(elems)
	if err != nil {
		return "", fmt.Errorf("marshal network selection: %w", err)
	}
	return string(b), nil
}

// PrimaryInterface is the pod interface of a primary user-defined network,
// as OVN-Kubernetes names it.
const PrimaryInterface = "ovn-udn1"

// WithPrimaryElement returns the networks annotation value with an element
// selecting NAD primaryKey ("<ns>/<name>") as interface PrimaryInterface,
// set by fill when fill is not nil; elements that already select the NAD
// are updated (there must be at most one, naming that interface or none).
// The other elements are kept as they are. changed is false when the
// annotation already says so.
func WithPrimaryElement(value, podNamespace, primaryKey string, fill func(*NetworkSelectionElement)) (out string, changed bool, err error) {
	elems, err := ParseSelection(NetworksAnnotation, value, podNamespace)
	if err != nil {
		return "", false, err
	}
	ns, name, ok := strings.Cut(primaryKey, "/")
	if !ok {
		return "", false, fmt.Errorf("primary network %q is not <namespace>/<name>", primaryKey)
	}
	idx := -1
	for i, e := range elems {
		if e.Key() != primaryKey {
			continue
		}
		if idx >= 0 {
			return "", false, fmt.Errorf("%w: annotation %s selects the namespace's primary network %s twice", ErrInvalidSelection, NetworksAnnotation, primaryKey)
		}
		if e.InterfaceRequest != "" && e.InterfaceRequest != PrimaryInterface {
			return "", false, fmt.Errorf("%w: annotation %s element %d: the namespace's primary network %s is attached as %s, not %q", ErrInvalidSelection, NetworksAnnotation, i, primaryKey, PrimaryInterface, e.InterfaceRequest)
		}
		idx = i
	}
	if idx < 0 {
		// First, so that Multus attaches it right after the cluster
		// default network.
		elems = append([]NetworkSelectionElement{{Name: name, Namespace: ns}}, elems...)
		idx = 0
		changed = true
	}
	before := elems[idx]
	el := &elems[idx]
	el.InterfaceRequest = PrimaryInterface
	if fill != nil {
		fill(el)
	}
	if !changed && reflect.DeepEqual(before, *el) {
		return value, false, nil
	}
	out, err = MarshalSelection(elems)
	return out, true, err
}

// AttachDefaultNetworkArg is the "cni-args" key with which the
// default-network element makes kvnet-cni attach the cluster default
// network as eth0 and the primary network as ovn-udn1 in one result (see
// kvnet-cni's package doc): Multus injects it into the NAD's
// configuration as args.cni.
const AttachDefaultNetworkArg = "kvnet.io/attach-default-network"

// WithPrimaryDefaultNetwork returns the default-network annotation value
// (DefaultNetworkAnnotation; value is its current value, "" if none) that
// makes NAD primaryKey ("<ns>/<name>") the pod's default network through
// kvnet-cni: one element selecting it with AttachDefaultNetworkArg, set
// by fill when fill is not nil. An annotation that names another network,
// or more than one, is an error: in a namespace with a primary network
// kvnet owns it. changed is false when the annotation already says so.
func WithPrimaryDefaultNetwork(value, podNamespace, primaryKey string, fill func(*NetworkSelectionElement)) (out string, changed bool, err error) {
	ns, name, ok := strings.Cut(primaryKey, "/")
	if !ok {
		return "", false, fmt.Errorf("primary network %q is not <namespace>/<name>", primaryKey)
	}
	el := NetworkSelectionElement{Name: name, Namespace: ns}
	var before *NetworkSelectionElement
	if strings.TrimSpace(value) != "" {
		elems, err := ParseSelection(DefaultNetworkAnnotation, value, podNamespace)
		if err != nil {
			return "", false, err
		}
		if len(elems) != 1 || elems[0].Key() != primaryKey {
			return "", false, fmt.Errorf("%w: annotation %s is %q: in a namespace with a primary network kvnet sets it to the primary network %s", ErrInvalidSelection, DefaultNetworkAnnotation, value, primaryKey)
		}
		el = elems[0]
		b := el
		before = &b
	}
	args := map[string]any{}
	for k, v := range el.CNIArgs {
		args[k] = v
	}
	args[AttachDefaultNetworkArg] = true
	el.CNIArgs = args
	if fill != nil {
		fill(&el)
	}
	if before != nil && reflect.DeepEqual(*before, el) {
		return value, false, nil
	}
	out, err = MarshalSelection([]NetworkSelectionElement{el})
	return out, true, err
}
