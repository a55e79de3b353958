package v1beta1_test

import (
	"encoding/json"
	"reflect"
	"testing"

	upstream "github.com/k8snetworkplumbingwg/multi-networkpolicy/pkg/apis/k8s.cni.cncf.io/v1beta1"

	"kvnet.io/kvnet/api/k8scni/v1beta1"
)

// policyJSON uses every field of the spec.
const policyJSON = `{
 "apiVersion": "k8s.cni.cncf.io/v1beta1", "kind": "MultiNetworkPolicy",
 "metadata": {"name": "p", "namespace": "ns", "annotations": {"k8s.v1.cni.cncf.io/policy-for": "ns/net1"}},
 "spec": {
  "podSelector": {"matchLabels": {"app": "db"}},
  "policyTypes": ["Ingress", "Egress"],
  "ingress": [{
   "from": [
    {"ipBlock": {"cidr": "10.0.0.0/16", "except": ["10.0.1.0/24"]}},
    {"namespaceSelector": {"matchLabels": {"team": "a"}}, "podSelector": {"matchExpressions": [{"key": "role", "operator": "In", "values": ["web"]}]}}
   ],
   "ports": [{"protocol": "TCP", "port": 5432}, {"protocol": "UDP", "port": "dns", "endPort": 60}]
  }],
  "egress": [{"to": [{"podSelector": {}}], "ports": [{"port": 80, "endPort": 90}]}]
 }
}`

// TestJSONCompatible decodes the same MultiNetworkPolicy with kvnet's
// types and the multi-networkpolicy project's, and checks that each
// encodes it back to the same JSON: kvnet reads every field the project
// defines, with the same meaning.
func TestJSONCompatible(t *testing.T) {
	var ours v1beta1.MultiNetworkPolicy
	var theirs upstream.MultiNetworkPolicy
	for _, v := range []any{&ours, &theirs} {
		if err := json.Unmarshal([]byte(policyJSON), v); err != nil {
			t.Fatal(err)
		}
	}
	a, err := json.Marshal(&ours)
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(&theirs)
	if err != nil {
		t.Fatal(err)
	}
	var ma, mb, want map[string]any
	for _, x := range []struct {
		b []byte
		m *map[string]any
	}{{a, &ma}, {b, &mb}, {[]byte(policyJSON), &want}} {
		if err := json.Unmarshal(x.b, x.m); err != nil {
			t.Fatal(err)
		}
	}
	if !reflect.DeepEqual(ma, mb) {
		t.Errorf("kvnet's encoding\n%s\ndiffers from the project's\n%s", a, b)
	}
	delete(ma["metadata"].(map[string]any), "creationTimestamp")
	if !reflect.DeepEqual(ma, want) {
		t.Errorf("kvnet's encoding\n%s\nlost fields of\n%s", a, policyJSON)
	}
}
