package v1alpha1_test

import (
	"maps"
	"slices"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"

	"kvnet.io/kvnet/config"
)

// The IPAMClaim CRD of the IPAMClaims project
// (github.com/k8snetworkplumbingwg/ipamclaims, artifacts/
// k8s.cni.cncf.io_ipamclaims.yaml as of v0.5.1-alpha, its newest tag,
// commit d97058c3): what kvnet's copy must agree with. The Go module
// proxy does not serve the module (see docs/architecture.md), so its
// schema is written down here as facts: each property's path and type,
// and the required properties.
var (
	upstreamTypes = map[string]string{
		"spec":                                   "object",
		"spec.interface":                         "string",
		"spec.network":                           "string",
		"status":                                 "object",
		"status.conditions":                      "array",
		"status.conditions[]":                    "object",
		"status.conditions[].lastTransitionTime": "string",
		"status.conditions[].message":            "string",
		"status.conditions[].observedGeneration": "integer",
		"status.conditions[].reason":             "string",
		"status.conditions[].status":             "string",
		"status.conditions[].type":               "string",
		"status.ips":                             "array",
		"status.ips[]":                           "string",
		"status.ownerPod":                        "object",
		"status.ownerPod.name":                   "string",
	}
	upstreamRequired = []string{
		"spec.interface", "spec.network", "status.ips",
		"status.conditions[].lastTransitionTime", "status.conditions[].message", "status.conditions[].reason",
		"status.conditions[].status", "status.conditions[].type",
	}
	// knownRequiredDifferences are where kvnet's CRD requires otherwise,
	// and why that is kept.
	knownRequiredDifferences = map[string]string{
		// Claims are created by kvnet-controller (as ipam-extensions
		// creates them) naming only the network; upstream's Go type
		// always sends interface, "" included, which its schema then
		// accepts. kvnet's type omits an empty one.
		"spec.interface": "optional in kvnet",
		// Written by the IPAM with the first allocation; a claim not yet
		// allocated has none.
		"status.ips": "optional in kvnet",
		// kvnet always names the owner pod; upstream's omits an empty name.
		"status.ownerPod.name": "required in kvnet",
	}
)

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
	n := crd.Spec.Names
	if crd.Spec.Group != "k8s.cni.cncf.io" || n.Kind != "IPAMClaim" || n.ListKind != "IPAMClaimList" || n.Plural != "ipamclaims" ||
		n.Singular != "ipamclaim" || crd.Spec.Scope != apiextensionsv1.NamespaceScoped {
		t.Errorf("CRD names %+v, group %s, scope %s", n, crd.Spec.Group, crd.Spec.Scope)
	}
	if len(crd.Spec.Versions) != 1 || crd.Spec.Versions[0].Name != "v1alpha1" || crd.Spec.Versions[0].Subresources == nil ||
		crd.Spec.Versions[0].Subresources.Status == nil {
		t.Fatalf("CRD versions %+v, want v1alpha1 with the status subresource", crd.Spec.Versions)
	}
	types, required := map[string]string{}, map[string]bool{}
	root := crd.Spec.Versions[0].Schema.OpenAPIV3Schema
	for _, top := range []string{"spec", "status"} {
		p, ok := root.Properties[top]
		if !ok {
			t.Fatalf("schema has no %s", top)
		}
		flatten(top, p, types, required)
	}
	for _, path := range slices.Sorted(maps.Keys(upstreamTypes)) {
		if got := types[path]; got != upstreamTypes[path] {
			t.Errorf("%s: kvnet's type %q, upstream's %q", path, got, upstreamTypes[path])
		}
	}
	for _, path := range slices.Sorted(maps.Keys(types)) {
		if _, ok := upstreamTypes[path]; !ok {
			t.Errorf("%s: in kvnet's CRD, not in upstream's", path)
		}
	}
	for path := range upstreamTypes {
		up := slices.Contains(upstreamRequired, path)
		if _, known := knownRequiredDifferences[path]; required[path] != up && !known {
			t.Errorf("%s: required in kvnet's CRD %v, in upstream's %v", path, required[path], up)
		} else if known && required[path] == up {
			t.Errorf("%s: listed as a known difference, but both CRDs agree (required %v)", path, up)
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
