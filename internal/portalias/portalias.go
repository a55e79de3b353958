// Package portalias is the interface alias by which kvnet-node finds a
// pod's host-side veth: kvnet-cni sets it on the host end when it wires
// an attachment (Format), kvnet-node reads it from the node's links
// (Parse) and looks the attachment up by it. Both sides use this package
// only, so the two cannot drift.
//
// An alias is "kvnet:<namespace>/<pod>:<nad>", where <nad> is the key of
// the attachment in the pod's kvnet.io/pod-networks annotation
// ("<nad namespace>/<nad name>"). Kubernetes names contain no ':', so the
// parts need no escaping.
package portalias

import (
	"fmt"
	"strings"
)

// Prefix starts every kvnet port alias, and no other alias.
const Prefix = "kvnet:"

// Alias is a parsed port alias.
type Alias struct {
	Pod string // "<namespace>/<name>"
	NAD string // the attachment's key: "<nad namespace>/<nad name>"
}

// Format returns the alias of the host end of pod's (namespace/name)
// attachment nad.
func Format(pod, nad string) string { return Prefix + pod + ":" + nad }

// String returns a's alias.
func (a Alias) String() string { return Format(a.Pod, a.NAD) }

// Has reports whether alias is kvnet's (has Prefix), valid or not.
func Has(alias string) bool { return strings.HasPrefix(alias, Prefix) }

// Parse parses a port alias; the error names the part that is wrong.
func Parse(alias string) (Alias, error) {
	rest, ok := strings.CutPrefix(alias, Prefix)
	if !ok {
		return Alias{}, fmt.Errorf("port alias %q: does not start with %q", alias, Prefix)
	}
	pod, nad, ok := strings.Cut(rest, ":")
	if !ok {
		return Alias{}, fmt.Errorf("port alias %q: want %q<namespace>/<pod>:<nad>", alias, Prefix)
	}
	if ns, name, ok := strings.Cut(pod, "/"); !ok || ns == "" || name == "" || strings.Contains(name, "/") {
		return Alias{}, fmt.Errorf("port alias %q: pod %q is not <namespace>/<name>", alias, pod)
	}
	if nad == "" || strings.Contains(nad, ":") {
		return Alias{}, fmt.Errorf("port alias %q: nad %q is empty or holds a ':'", alias, nad)
	}
	return Alias{Pod: pod, NAD: nad}, nil
}
