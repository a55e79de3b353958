package udn

import (
	"fmt"
	"strings"
)

// DefaultGlobalNamespaces are the cluster's global namespaces a UDN or
// CUDN may not serve unless kvnet-controller is told otherwise
// (--global-namespaces): Kubernetes' own system namespaces. Together with
// the default namespace and openshift-* (always refused), they stay on the
// cluster default network, as the OpenShift documentation of user-defined
// networks requires.
var DefaultGlobalNamespaces = []string{"kube-system", "kube-public", "kube-node-lease"}

// NamespaceRule says which namespaces a UDN or CUDN may serve: any but
// default, an openshift-* namespace, or one of Global (names, or prefixes
// ending in "*"). The zero value refuses default and openshift-* only.
type NamespaceRule struct {
	Global []string
}

// ParseGlobalNamespaces parses the comma-separated --global-namespaces
// value: namespace names or prefixes ending in "*". An empty string is an
// empty list.
func ParseGlobalNamespaces(list string) ([]string, error) {
	var out []string
	for s := range strings.SplitSeq(list, ",") {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		name := strings.TrimSuffix(s, "*")
		if strings.Contains(name, "*") || (name == "" && s != "*") || strings.ContainsAny(name, " /") {
			return nil, fmt.Errorf("--global-namespaces value %q: want a namespace name or a prefix ending in \"*\"", s)
		}
		out = append(out, s)
	}
	return out, nil
}

// Refuses returns, for a namespace the rule refuses, what it matched
// ("the default namespace", "openshift-*", "global namespace kube-system"),
// and "" for one it allows.
func (r NamespaceRule) Refuses(namespace string) string {
	switch {
	case namespace == "default":
		return "the default namespace"
	case strings.HasPrefix(namespace, "openshift-"):
		return "an openshift-* namespace"
	}
	for _, g := range r.Global {
		if g == namespace || (strings.HasSuffix(g, "*") && strings.HasPrefix(namespace, strings.TrimSuffix(g, "*"))) {
			return fmt.Sprintf("one of the cluster's global namespaces (%s)", strings.Join(r.Global, ", "))
		}
	}
	return ""
}

// Check returns an error naming namespace and why a user-defined network
// may not serve it, or nil.
func (r NamespaceRule) Check(namespace string) error {
	what := r.Refuses(namespace)
	if what == "" {
		return nil
	}
	return fmt.Errorf("namespace %q may not be served by a user-defined network: it is %s, which stays on the cluster default network", namespace, what)
}
