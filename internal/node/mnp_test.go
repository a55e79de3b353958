package node

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	mnpv1beta1 "kvnet.io/kvnet/api/k8scni/v1beta1"
)

func TestPolicyFor(t *testing.T) {
	nads := map[string]bool{"a/sec": true, "b/sec": true}
	for _, tc := range []struct {
		ns, policyFor string
		want          bool
	}{
		{"a", "sec", true},             // a name is in the policy's namespace
		{"c", "sec", false},            // c/sec: another network's NAD
		{"c", "a/sec", true},           // namespace/name
		{"b", "a/sec", true},           // another namespace of the network
		{"a", " other , b/sec ", true}, // a list, white space around entries
		{"a", "x/y, ,a/sec,", true},    // empty entries are skipped
		{"a", "other,a/other", false},  // none of the network's
		{"a", "", false},               // no annotation: for no network
		{"a", "A/SEC", false},          // names are case-sensitive
		{"a", "secondary", false},      // a longer name
		{"a", "a/sec/", false},         // not a NAD name
		{"a", "a/ sec", false},         // white space inside
	} {
		mnp := &mnpv1beta1.MultiNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: tc.ns, Name: "p",
			Annotations: map[string]string{mnpv1beta1.PolicyForAnnotation: tc.policyFor}}}
		if got := policyFor(mnp, nads); got != tc.want {
			t.Errorf("policy in %s for %q: %v, want %v", tc.ns, tc.policyFor, got, tc.want)
		}
	}
}
