package webhooks

import (
	"net/http"
	"regexp"
	"strings"
	"testing"

	macpoolctl "kvnet.io/kvnet/internal/k8s/controllers/macpool"
)

// patchTouches asserts that every operation of an allowed patch response
// changes only paths matching allowed.
func patchTouches(t *testing.T, raw string, ops []string, allowed *regexp.Regexp) {
	t.Helper()
	for _, p := range ops {
		if !allowed.MatchString(p) {
			t.Fatalf("patch of %q touches %s", raw, p)
		}
	}
}

func TestPatchNotAnObject(t *testing.T) {
	for _, raw := range []string{`null`, `[]`, `{"metadata":"x"}`, `{"metadata":null,"spec":{}}`, `{`} {
		if r := patchAnnotations([]byte(raw), map[string]string{"a": "b"}); r.Allowed || r.Result.Code != http.StatusBadRequest {
			t.Errorf("patchAnnotations(%s) = %+v, want a 400", raw, r.Result)
		}
		if r := patchMACs([]byte(raw), map[int]string{0: "02:00:00:00:00:01"}); r.Allowed || r.Result.Code != http.StatusBadRequest {
			t.Errorf("patchMACs(%s) = %+v, want a 400", raw, r.Result)
		}
	}
}

// FuzzPatchAnnotations feeds the launcher-pod webhook's patcher with raw
// objects: it answers 400 for what is not an object, and otherwise patches
// the annotations and nothing else.
func FuzzPatchAnnotations(f *testing.F) {
	for _, s := range []string{
		`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"virt-launcher-vm1-x","namespace":"ns","annotations":{"kubevirt.io/domain":"vm1"}},"spec":{"containers":[{"name":"compute"}]}}`,
		`{"metadata":{"name":"p"},"spec":{"activeDeadlineSeconds":9007199254740993}}`,
		`{"kind":"Pod"}`, `{"metadata":null}`, `{"metadata":{"annotations":"x"}}`, `{"metadata":7}`,
		`null`, `[]`, `"x"`, `{`, ``,
	} {
		f.Add([]byte(s), "k8s.v1.cni.cncf.io/networks", `[{"name":"n","ipam-claim-reference":"vm1.net"}]`)
	}
	allowed := regexp.MustCompile(`^/metadata(/annotations(/.*)?)?$`)
	f.Fuzz(func(t *testing.T, raw []byte, key, value string) {
		ann := map[string]string{key: value}
		r := patchAnnotations(raw, ann)
		if !r.Allowed {
			if r.Result == nil || r.Result.Code != http.StatusBadRequest || r.Result.Message == "" {
				t.Fatalf("refusal of %q without a 400 and a message: %+v", raw, r.Result)
			}
			return
		}
		var ops []string
		for _, op := range r.Patches {
			ops = append(ops, op.Path)
		}
		patchTouches(t, string(raw), ops, allowed)
	})
}

// FuzzPatchMACs feeds the VM webhook's MAC patcher with raw objects: it
// answers 400 for what is not a VM with an interface list, and otherwise
// patches interface MACs and the transaction annotation and nothing else.
func FuzzPatchMACs(f *testing.F) {
	for _, s := range []string{
		`{"apiVersion":"kubevirt.io/v1","kind":"VirtualMachine","metadata":{"name":"vm1","namespace":"ns"},"spec":{"template":{"spec":{"domain":{"devices":{"interfaces":[{"name":"default","masquerade":{}},{"name":"net1","bridge":{},"macAddress":"02:00:00:00:00:09"}]}}}}}}`,
		`{"metadata":{"annotations":{"a":"b"}},"spec":{"template":{"spec":{"domain":{"devices":{"interfaces":[7,"x",{}]}}}}}}`,
		`{"spec":{"template":{"spec":{"domain":{"devices":{"interfaces":[{}]}}}}}}`,
		`{"metadata":null,"spec":{"template":{"spec":{"domain":{"devices":{"interfaces":[{}]}}}}}}`,
		`{"metadata":{"annotations":[]},"spec":{"template":{"spec":{"domain":{"devices":{"interfaces":[{}]}}}}}}`,
		`{"spec":{"template":{"spec":{"domain":{"devices":{}}}}}}`,
		`null`, `[]`, `{`,
	} {
		f.Add([]byte(s), uint8(1), "02:00:00:00:00:01")
	}
	allowed := regexp.MustCompile(`^(/metadata(/annotations(/.*)?)?|/spec/template/spec/domain/devices/interfaces/[0-9]+(/macAddress)?)$`)
	f.Fuzz(func(t *testing.T, raw []byte, iface uint8, mac string) {
		r := patchMACs(raw, map[int]string{int(iface % 4): mac})
		if !r.Allowed {
			if r.Result == nil || r.Result.Code != http.StatusBadRequest || r.Result.Message == "" {
				t.Fatalf("refusal of %q without a 400 and a message: %+v", raw, r.Result)
			}
			return
		}
		var ops []string
		stamped := false
		for _, op := range r.Patches {
			ops = append(ops, op.Path)
			stamped = stamped || strings.HasSuffix(op.Path, "/annotations") ||
				strings.HasSuffix(op.Path, strings.ReplaceAll(macpoolctl.TransactionAnnotation, "/", "~1")) || op.Path == "/metadata"
		}
		patchTouches(t, string(raw), ops, allowed)
		if !stamped {
			t.Fatalf("patch of %q does not stamp %s: %v", raw, macpoolctl.TransactionAnnotation, ops)
		}
	})
}
