package v1alpha1_test

import (
	"encoding/json"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	upstream "github.com/k8snetworkplumbingwg/ipamclaims/pkg/crd/ipamclaims/v1alpha1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"

	"kvnet.io/kvnet/api/k8scni/v1alpha1"
	"kvnet.io/kvnet/config"
)

// The IPAMClaims project (github.com/k8snetworkplumbingwg/ipamclaims)
// publishes the IPAMClaim CRD (artifacts/k8s.cni.cncf.io_ipamclaims.yaml)
// and Go types; kvnet's copy must agree with them. The module is a test
// dependency only, at the version go.mod requires (docs/architecture.md
// says why kvnet keeps its own types).
const upstreamModule = "github.com/k8snetworkplumbingwg/ipamclaims"

// knownRequiredDifferences are where kvnet's CRD requires otherwise than
// upstream's, and why that is kept.
var knownRequiredDifferences = map[string]string{
	// Claims are created by kvnet-controller (as ipam-extensions creates
	// them) naming only the network; upstream's Go type always sends
	// interface, "" included, which its schema then accepts. kvnet's type
	// omits an empty one.
	"spec.interface": "optional in kvnet",
	// Written by the IPAM with the first allocation; a claim not yet
	// allocated has none.
	"status.ips": "optional in kvnet",
	// kvnet always names the owner pod; upstream's omits an empty name.
	"status.ownerPod.name": "required in kvnet",
}

// upstreamCRD reads the IPAMClaims project's CRD from its module, at the
// version go.mod requires (the Go module cache, found by go list).
func upstreamCRD(t *testing.T) apiextensionsv1.CustomResourceDefinition {
	t.Helper()
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", upstreamModule).Output()
	if err != nil {
		t.Fatalf("go list -m %s: %v", upstreamModule, err)
	}
	dir := strings.TrimSpace(string(out))
	if dir == "" {
		t.Fatalf("go list -m %s: module not downloaded (go mod download)", upstreamModule)
	}
	return readCRD(t, filepath.Join(dir, "artifacts", "k8s.cni.cncf.io_ipamclaims.yaml"))
}

func readCRD(t *testing.T, path string) apiextensionsv1.CustomResourceDefinition {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var crd apiextensionsv1.CustomResourceDefinition
	if err := yaml.Unmarshal(b, &crd); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return crd
}

// schemaOf flattens a CRD's only version's spec and status: each
// property's path and type, and which are required.
func schemaOf(t *testing.T, crd apiextensionsv1.CustomResourceDefinition) (types map[string]string, required map[string]bool) {
	t.Helper()
	if len(crd.Spec.Versions) != 1 || crd.Spec.Versions[0].Schema == nil {
		t.Fatalf("CRD %s: versions %+v, want one with a schema", crd.Name, crd.Spec.Versions)
	}
	types, required = map[string]string{}, map[string]bool{}
	root := crd.Spec.Versions[0].Schema.OpenAPIV3Schema
	for _, top := range []string{"spec", "status"} {
		p, ok := root.Properties[top]
		if !ok {
			t.Fatalf("CRD %s: schema has no %s", crd.Name, top)
		}
		flatten(top, p, types, required)
	}
	return types, required
}

// TestCRDMatchesUpstream compares the IPAMClaim CRD kvnet ships (generated
// from api/k8scni/v1alpha1) with the IPAMClaims project's: the same group,
// names, scope, version and status subresource, every property at the
// same path with the same type, and the same required properties but for
// knownRequiredDifferences.
func TestCRDMatchesUpstream(t *testing.T) {
	b, err := config.CRDs.ReadFile("crd/bases/k8s.cni.cncf.io_ipamclaims.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var crd apiextensionsv1.CustomResourceDefinition
	if err := yaml.UnmarshalStrict(b, &crd); err != nil {
		t.Fatal(err)
	}
	up := upstreamCRD(t)
	if crd.Spec.Group != up.Spec.Group || !reflect.DeepEqual(crd.Spec.Names, up.Spec.Names) || crd.Spec.Scope != up.Spec.Scope {
		t.Errorf("CRD names %+v, group %s, scope %s; upstream's %+v, %s, %s", crd.Spec.Names, crd.Spec.Group, crd.Spec.Scope,
			up.Spec.Names, up.Spec.Group, up.Spec.Scope)
	}
	if len(crd.Spec.Versions) != 1 || crd.Spec.Versions[0].Name != up.Spec.Versions[0].Name || crd.Spec.Versions[0].Subresources == nil ||
		crd.Spec.Versions[0].Subresources.Status == nil || up.Spec.Versions[0].Subresources == nil || up.Spec.Versions[0].Subresources.Status == nil {
		t.Fatalf("CRD versions %+v, upstream's %+v: want one, the same, with the status subresource", crd.Spec.Versions, up.Spec.Versions)
	}
	types, required := schemaOf(t, crd)
	upTypes, upRequired := schemaOf(t, up)
	for _, path := range slices.Sorted(maps.Keys(upTypes)) {
		if got := types[path]; got != upTypes[path] {
			t.Errorf("%s: kvnet's type %q, upstream's %q", path, got, upTypes[path])
		}
	}
	for _, path := range slices.Sorted(maps.Keys(types)) {
		if _, ok := upTypes[path]; !ok {
			t.Errorf("%s: in kvnet's CRD, not in upstream's", path)
		}
	}
	for _, path := range slices.Sorted(maps.Keys(upTypes)) {
		if _, known := knownRequiredDifferences[path]; required[path] != upRequired[path] && !known {
			t.Errorf("%s: required in kvnet's CRD %v, in upstream's %v", path, required[path], upRequired[path])
		} else if known && required[path] == upRequired[path] {
			t.Errorf("%s: listed as a known difference, but both CRDs agree (required %v)", path, upRequired[path])
		}
	}
}

// TestJSONCompatible decodes a claim as kvnet-controller and the IPAM
// write it with kvnet's type and upstream's Go type: both encode it back
// as it came.
func TestJSONCompatible(t *testing.T) {
	const claimJSON = `{"apiVersion":"k8s.cni.cncf.io/v1alpha1","kind":"IPAMClaim",
"metadata":{"name":"vm-a.podnet","namespace":"tenant","labels":{"kubevirt.io/vm":"vm-a"},"finalizers":["kubevirt.io/persistent-ipam"]},
"spec":{"network":"tenant_udn-l2-net","interface":"ovn-udn1"},
"status":{"ips":["10.0.0.4/24","fd00::4/64"],"ownerPod":{"name":"virt-launcher-vm-a-x7k2p"},
"conditions":[{"type":"IPsAllocated","status":"True","reason":"SuccessfulAllocation","message":"","lastTransitionTime":"2026-11-27T10:00:00Z"}]}}`
	var ours v1alpha1.IPAMClaim
	var theirs upstream.IPAMClaim
	var want map[string]any
	if err := json.Unmarshal([]byte(claimJSON), &want); err != nil {
		t.Fatal(err)
	}
	for _, v := range []any{&ours, &theirs} {
		if err := json.Unmarshal([]byte(claimJSON), v); err != nil {
			t.Fatal(err)
		}
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		var got map[string]any
		if err := json.Unmarshal(b, &got); err != nil {
			t.Fatal(err)
		}
		delete(got["metadata"].(map[string]any), "creationTimestamp")
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%T encodes the claim as\n%v\nwant\n%v", v, got, want)
		}
	}
}

// flatten records the type of every property under path, and which are
// required.
func flatten(path string, s apiextensionsv1.JSONSchemaProps, types map[string]string, required map[string]bool) {
	types[path] = s.Type
	for _, r := range s.Required {
		required[path+"."+r] = true
	}
	for name, p := range s.Properties {
		flatten(path+"."+name, p, types, required)
	}
	if s.Items != nil && s.Items.Schema != nil {
		// A list's items are named "<list>[]".
		flatten(path+"[]", *s.Items.Schema, types, required)
	}
}
