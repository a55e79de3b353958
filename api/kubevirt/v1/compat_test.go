package v1_test

import (
	"reflect"
	"strings"
	"testing"

	upstream "kubevirt.io/api/core/v1"

	v1 "kvnet.io/kvnet/api/kubevirt/v1"
)

// TestFieldsMatchUpstream checks kvnet's subset of the kubevirt.io/v1
// types against KubeVirt's own (kubevirt.io/api v1.7.0, a test-only
// dependency: see docs/architecture.md): every JSON field kvnet declares,
// at any depth, exists in KubeVirt's type at the same place with the same
// kind of value (string, bool, number, list, map, object), so kvnet reads
// what KubeVirt writes where KubeVirt writes it; the fields newer
// KubeVirt releases added, which kvnet declares to recognise them, are
// listed in newerThanV170. Fields kvnet does not declare are kept by
// UnknownFields (TestUnknownFieldsKept).
func TestFieldsMatchUpstream(t *testing.T) {
	for _, tc := range []struct {
		name         string
		ours, theirs reflect.Type
	}{
		{"VirtualMachine", reflect.TypeFor[v1.VirtualMachine](), reflect.TypeFor[upstream.VirtualMachine]()},
		{"VirtualMachineInstance", reflect.TypeFor[v1.VirtualMachineInstance](), reflect.TypeFor[upstream.VirtualMachineInstance]()},
		{"VirtualMachineInstanceMigration", reflect.TypeFor[v1.VirtualMachineInstanceMigration](), reflect.TypeFor[upstream.VirtualMachineInstanceMigration]()},
		{"KubeVirt", reflect.TypeFor[v1.KubeVirt](), reflect.TypeFor[upstream.KubeVirt]()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var mismatches []string
			compareFields(tc.name, tc.ours, tc.theirs, &mismatches, map[[2]reflect.Type]bool{})
			for _, m := range mismatches {
				t.Error(m)
			}
		})
	}
}

// TestConstantsMatchUpstream: the label and annotation names kvnet reads
// and writes are KubeVirt's.
func TestConstantsMatchUpstream(t *testing.T) {
	for _, c := range [][2]string{
		{v1.VirtualMachineLabel, upstream.VirtualMachineLabel},
		{v1.AppLabel, upstream.AppLabel},
		{v1.DomainAnnotation, upstream.DomainAnnotation},
		{v1.VMNameLabel, upstream.DeprecatedVirtualMachineNameLabel},
		{v1.VMIIDLabel, upstream.VirtualMachineInstanceIDLabel},
		{v1.MigrationTargetReadyAnnotation, upstream.MigrationTargetReadyTimestamp},
		{v1.AllowPodBridgeNetworkLiveMigrationAnnotation, upstream.AllowPodBridgeNetworkLiveMigrationAnnotation},
		{v1.PlacePCIDevicesOnRootComplexAnnotation, upstream.PlacePCIDevicesOnRootComplex},
		{string(v1.InterfaceStateAbsent), string(upstream.InterfaceStateAbsent)},
	} {
		if c[0] != c[1] {
			t.Errorf("kvnet %q, KubeVirt %q", c[0], c[1])
		}
	}
}

// newerThanV170 are the fields kvnet declares that kubevirt.io/api v1.7.0
// lacks, by "<KubeVirt type>.<JSON field>", with the release that added
// them (read from kubevirt.io/api v1.8.0 and v1.9.0).
var newerThanV170 = map[string]string{
	"Interface.passtBinding": "v1.8.0 (the passt core binding)",
	"Interface.portRanges":   "v1.9.0 (feature gate PortRangesSpec)",
	"Network.resourceClaim":  "v1.9.0 (feature gate NetworkDevicesWithDRA)",
}

// compareFields walks ours' JSON fields and finds each in theirs.
func compareFields(path string, ours, theirs reflect.Type, out *[]string, seen map[[2]reflect.Type]bool) {
	ours, theirs = deref(ours), deref(theirs)
	if seen[[2]reflect.Type{ours, theirs}] {
		return
	}
	seen[[2]reflect.Type{ours, theirs}] = true
	if k, kt := kind(ours), kind(theirs); k != kt {
		*out = append(*out, path+": kvnet "+k+", KubeVirt "+kt)
		return
	}
	switch ours.Kind() {
	case reflect.Slice, reflect.Array, reflect.Map:
		compareFields(path+"[]", ours.Elem(), theirs.Elem(), out, seen)
	case reflect.Struct:
		if ours.PkgPath() != reflect.TypeFor[v1.VirtualMachine]().PkgPath() {
			// metav1, corev1, resource types: shared, not copied.
			if ours != theirs {
				*out = append(*out, path+": kvnet "+ours.String()+", KubeVirt "+theirs.String())
			}
			return
		}
		theirFields := jsonFields(theirs)
		for name, f := range jsonFields(ours) {
			tf, ok := theirFields[name]
			if _, newer := newerThanV170[theirs.Name()+"."+name]; newer {
				if ok {
					*out = append(*out, path+"."+name+": listed in newerThanV170 but in KubeVirt's "+theirs.Name())
				}
				continue
			}
			if !ok {
				*out = append(*out, path+"."+name+": not in KubeVirt's "+theirs.Name())
				continue
			}
			compareFields(path+"."+name, f.Type, tf.Type, out, seen)
		}
	}
}

// jsonFields indexes a struct's fields by JSON name, inlined (embedded or
// ",inline") structs' fields included; "-" fields are not JSON.
func jsonFields(t reflect.Type) map[string]reflect.StructField {
	out := map[string]reflect.StructField{}
	for f := range t.Fields() {
		name, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch {
		case name == "-" || !f.IsExported():
		case (f.Anonymous && name == "") || opts == "inline":
			for n, g := range jsonFields(deref(f.Type)) {
				out[n] = g
			}
		case name == "":
			out[f.Name] = f
		default:
			out[name] = f
		}
	}
	return out
}

func deref(t reflect.Type) reflect.Type {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t
}

// kind is the JSON kind of a Go type.
func kind(t reflect.Type) string {
	switch t.Kind() {
	case reflect.String:
		return "string"
	case reflect.Bool:
		return "bool"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Float32, reflect.Float64:
		return "number"
	case reflect.Slice, reflect.Array:
		return "list"
	case reflect.Map:
		return "map"
	case reflect.Struct:
		return "object"
	}
	return t.Kind().String()
}
