package policy

import "strings"

// PolicyFor returns the NADs ("namespace/name") that the value of a
// MultiNetworkPolicy's k8s.v1.cni.cncf.io/policy-for annotation names:
// comma-separated entries, each "namespace/name" or "name" in the
// policy's namespace; empty entries are skipped.
func PolicyFor(namespace, value string) []string {
	var out []string
	for _, e := range strings.Split(value, ",") {
		e = strings.TrimSpace(e)
		if e == "" {
			continue
		}
		if !strings.Contains(e, "/") {
			e = namespace + "/" + e
		}
		out = append(out, e)
	}
	return out
}
