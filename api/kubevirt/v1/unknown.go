package v1

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"sync"

	utiljson "k8s.io/apimachinery/pkg/util/json"
)

// UnknownFields holds, as a JSON object, the members of an object that its
// Go type does not declare.
//
// The types of this package declare only what kvnet reads; the rest of a
// KubeVirt object (disks, CPU, volumes, most of its status) is kept by the
// API server (x-kubernetes-preserve-unknown-fields here, KubeVirt's full
// schemas in a cluster). A type that declares part of an object carries an
// UnknownFields, filled when it is decoded and written back when it is
// encoded, so that a typed Update, or a patch computed from two typed
// objects, does not drop what kvnet did not type. (Replacing such a struct
// with a new value does drop them.)
//
// It is a string, not a map, so that the types stay comparable with == and
// are deep-copied by assignment; it is canonical (members sorted, values
// compact), so equal members give equal strings. "" means none.
type UnknownFields string

// decodeKeeping decodes data into known, a pointer to a struct type without
// JSON methods of its own (so that this does not recurse), and keeps in
// unknown the members known does not declare. Member names are matched
// case-sensitively, as the API machinery decodes.
func decodeKeeping(data []byte, known any, unknown *UnknownFields) error {
	if err := utiljson.Unmarshal(data, known); err != nil {
		return err
	}
	var all map[string]json.RawMessage
	if err := json.Unmarshal(data, &all); err != nil {
		return err
	}
	for name := range declaredNames(reflect.TypeOf(known).Elem()) {
		delete(all, name)
	}
	*unknown = ""
	if len(all) == 0 {
		return nil
	}
	b, err := json.Marshal(all) // sorts the members and compacts the values
	*unknown = UnknownFields(b)
	return err
}

// encodeKeeping encodes known, a pointer to a struct type without JSON
// methods of its own, adding the members of unknown it does not declare.
func encodeKeeping(known any, unknown UnknownFields) ([]byte, error) {
	data, err := json.Marshal(known)
	if err != nil || unknown == "" {
		return data, err
	}
	var all, extra map[string]json.RawMessage
	if err := json.Unmarshal(data, &all); err != nil {
		return nil, err
	}
	if err := json.Unmarshal([]byte(unknown), &extra); err != nil {
		return nil, fmt.Errorf("unknown members: %w", err)
	}
	declared := declaredNames(reflect.TypeOf(known).Elem())
	for k, v := range extra {
		if _, ok := declared[k]; !ok {
			all[k] = v
		}
	}
	return json.Marshal(all)
}

var declaredCache sync.Map // reflect.Type -> map[string]struct{}

// declaredNames returns the JSON member names struct type t declares,
// including those of its inlined embedded structs.
func declaredNames(t reflect.Type) map[string]struct{} {
	if names, ok := declaredCache.Load(t); ok {
		return names.(map[string]struct{})
	}
	names := map[string]struct{}{}
	for f := range t.Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch {
		case !f.IsExported() || name == "-":
		case name == "" && f.Anonymous:
			ft := f.Type
			if ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			for n := range declaredNames(ft) {
				names[n] = struct{}{}
			}
		case name == "":
			names[f.Name] = struct{}{}
		default:
			names[name] = struct{}{}
		}
	}
	declaredCache.Store(t, names)
	return names
}

// The JSON methods of the types that keep unknown members. Each converts to
// a local type with the same fields and no methods, which the helpers
// encode and decode with encoding/json's rules (MarshalJSON has a value
// receiver, so map values and non-addressable fields use it too).

func (s VirtualMachineSpec) MarshalJSON() ([]byte, error) {
	type plain VirtualMachineSpec
	return encodeKeeping((*plain)(&s), s.Unknown)
}

func (s *VirtualMachineSpec) UnmarshalJSON(data []byte) error {
	type plain VirtualMachineSpec
	return decodeKeeping(data, (*plain)(s), &s.Unknown)
}

func (s VirtualMachineStatus) MarshalJSON() ([]byte, error) {
	type plain VirtualMachineStatus
	return encodeKeeping((*plain)(&s), s.Unknown)
}

func (s *VirtualMachineStatus) UnmarshalJSON(data []byte) error {
	type plain VirtualMachineStatus
	return decodeKeeping(data, (*plain)(s), &s.Unknown)
}

func (s VirtualMachineInstanceSpec) MarshalJSON() ([]byte, error) {
	type plain VirtualMachineInstanceSpec
	return encodeKeeping((*plain)(&s), s.Unknown)
}

func (s *VirtualMachineInstanceSpec) UnmarshalJSON(data []byte) error {
	type plain VirtualMachineInstanceSpec
	return decodeKeeping(data, (*plain)(s), &s.Unknown)
}

func (s DomainSpec) MarshalJSON() ([]byte, error) {
	type plain DomainSpec
	return encodeKeeping((*plain)(&s), s.Unknown)
}

func (s *DomainSpec) UnmarshalJSON(data []byte) error {
	type plain DomainSpec
	return decodeKeeping(data, (*plain)(s), &s.Unknown)
}

func (s Devices) MarshalJSON() ([]byte, error) {
	type plain Devices
	return encodeKeeping((*plain)(&s), s.Unknown)
}

func (s *Devices) UnmarshalJSON(data []byte) error {
	type plain Devices
	return decodeKeeping(data, (*plain)(s), &s.Unknown)
}

func (s Interface) MarshalJSON() ([]byte, error) {
	type plain Interface
	return encodeKeeping((*plain)(&s), s.Unknown)
}

func (s *Interface) UnmarshalJSON(data []byte) error {
	type plain Interface
	return decodeKeeping(data, (*plain)(s), &s.Unknown)
}

func (s VirtualMachineInstanceStatus) MarshalJSON() ([]byte, error) {
	type plain VirtualMachineInstanceStatus
	return encodeKeeping((*plain)(&s), s.Unknown)
}

func (s *VirtualMachineInstanceStatus) UnmarshalJSON(data []byte) error {
	type plain VirtualMachineInstanceStatus
	return decodeKeeping(data, (*plain)(s), &s.Unknown)
}

func (s VirtualMachineInstanceMigrationState) MarshalJSON() ([]byte, error) {
	type plain VirtualMachineInstanceMigrationState
	return encodeKeeping((*plain)(&s), s.Unknown)
}

func (s *VirtualMachineInstanceMigrationState) UnmarshalJSON(data []byte) error {
	type plain VirtualMachineInstanceMigrationState
	return decodeKeeping(data, (*plain)(s), &s.Unknown)
}

func (s VirtualMachineInstanceMigrationTargetState) MarshalJSON() ([]byte, error) {
	type plain VirtualMachineInstanceMigrationTargetState
	return encodeKeeping((*plain)(&s), s.Unknown)
}

func (s *VirtualMachineInstanceMigrationTargetState) UnmarshalJSON(data []byte) error {
	type plain VirtualMachineInstanceMigrationTargetState
	return decodeKeeping(data, (*plain)(s), &s.Unknown)
}

func (s VirtualMachineInstanceMigrationSpec) MarshalJSON() ([]byte, error) {
	type plain VirtualMachineInstanceMigrationSpec
	return encodeKeeping((*plain)(&s), s.Unknown)
}

func (s *VirtualMachineInstanceMigrationSpec) UnmarshalJSON(data []byte) error {
	type plain VirtualMachineInstanceMigrationSpec
	return decodeKeeping(data, (*plain)(s), &s.Unknown)
}

func (s VirtualMachineInstanceMigrationStatus) MarshalJSON() ([]byte, error) {
	type plain VirtualMachineInstanceMigrationStatus
	return encodeKeeping((*plain)(&s), s.Unknown)
}

func (s *VirtualMachineInstanceMigrationStatus) UnmarshalJSON(data []byte) error {
	type plain VirtualMachineInstanceMigrationStatus
	return decodeKeeping(data, (*plain)(s), &s.Unknown)
}

func (s KubeVirtSpec) MarshalJSON() ([]byte, error) {
	type plain KubeVirtSpec
	return encodeKeeping((*plain)(&s), s.Unknown)
}

func (s *KubeVirtSpec) UnmarshalJSON(data []byte) error {
	type plain KubeVirtSpec
	return decodeKeeping(data, (*plain)(s), &s.Unknown)
}

func (s KubeVirtStatus) MarshalJSON() ([]byte, error) {
	type plain KubeVirtStatus
	return encodeKeeping((*plain)(&s), s.Unknown)
}

func (s *KubeVirtStatus) UnmarshalJSON(data []byte) error {
	type plain KubeVirtStatus
	return decodeKeeping(data, (*plain)(s), &s.Unknown)
}

func (s KubeVirtConfiguration) MarshalJSON() ([]byte, error) {
	type plain KubeVirtConfiguration
	return encodeKeeping((*plain)(&s), s.Unknown)
}

func (s *KubeVirtConfiguration) UnmarshalJSON(data []byte) error {
	type plain KubeVirtConfiguration
	return decodeKeeping(data, (*plain)(s), &s.Unknown)
}

func (s NetworkConfiguration) MarshalJSON() ([]byte, error) {
	type plain NetworkConfiguration
	return encodeKeeping((*plain)(&s), s.Unknown)
}

func (s *NetworkConfiguration) UnmarshalJSON(data []byte) error {
	type plain NetworkConfiguration
	return decodeKeeping(data, (*plain)(s), &s.Unknown)
}

func (s InterfaceBindingPlugin) MarshalJSON() ([]byte, error) {
	type plain InterfaceBindingPlugin
	return encodeKeeping((*plain)(&s), s.Unknown)
}

func (s *InterfaceBindingPlugin) UnmarshalJSON(data []byte) error {
	type plain InterfaceBindingPlugin
	return decodeKeeping(data, (*plain)(s), &s.Unknown)
}

func (s MigrationConfiguration) MarshalJSON() ([]byte, error) {
	type plain MigrationConfiguration
	return encodeKeeping((*plain)(&s), s.Unknown)
}

func (s *MigrationConfiguration) UnmarshalJSON(data []byte) error {
	type plain MigrationConfiguration
	return decodeKeeping(data, (*plain)(s), &s.Unknown)
}
