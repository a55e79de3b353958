package v1_test

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	upstream "github.com/k8snetworkplumbingwg/network-attachment-definition-client/pkg/apis/k8s.cni.cncf.io/v1"

	v1 "kvnet.io/kvnet/api/k8scni/v1"
)

// nadJSON is a NetworkAttachmentDefinition as kvnet renders one.
const nadJSON = `{
 "apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
 "metadata": {"name": "udn", "namespace": "ns", "labels": {"k8s.ovn.org/user-defined-network": ""}},
 "spec": {"config": "{\"cniVersion\":\"1.1.0\",\"type\":\"kvnet-cni\",\"name\":\"ns_udn\"}"}
}`

// TestJSONCompatible decodes the same NetworkAttachmentDefinition with
// kvnet's type and the Network Plumbing Working Group client's
// (github.com/k8snetworkplumbingwg/network-attachment-definition-client
// v1.7.7, test-only: see docs/architecture.md), and checks that each
// encodes it back to the same JSON, and that the two types declare the
// same fields.
func TestJSONCompatible(t *testing.T) {
	var ours v1.NetworkAttachmentDefinition
	var theirs upstream.NetworkAttachmentDefinition
	for _, v := range []any{&ours, &theirs} {
		if err := json.Unmarshal([]byte(nadJSON), v); err != nil {
			t.Fatal(err)
		}
	}
	var ma, mb, want map[string]any
	for _, x := range []struct {
		v any
		m *map[string]any
	}{{&ours, &ma}, {&theirs, &mb}} {
		b, err := json.Marshal(x.v)
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(b, x.m); err != nil {
			t.Fatal(err)
		}
		delete((*x.m)["metadata"].(map[string]any), "creationTimestamp")
	}
	if err := json.Unmarshal([]byte(nadJSON), &want); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(ma, mb) || !reflect.DeepEqual(ma, want) {
		t.Errorf("encodings differ:\nkvnet    %v\nupstream %v\ninput    %v", ma, mb, want)
	}
	if a, b := jsonFields(reflect.TypeFor[v1.NetworkAttachmentDefinitionSpec]()), jsonFields(reflect.TypeFor[upstream.NetworkAttachmentDefinitionSpec]()); !reflect.DeepEqual(a, b) {
		t.Errorf("spec fields: kvnet %v, upstream %v", a, b)
	}
}

// jsonFields lists the JSON names of a struct type's fields.
func jsonFields(t reflect.Type) []string {
	var out []string
	for f := range t.Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		out = append(out, name)
	}
	return out
}
