package multus

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

func TestParseSelection(t *testing.T) {
	tests := []struct {
		name    string
		value   string
		want    []NetworkSelectionElement
		wantErr bool
	}{
		{name: "empty", value: ""},
		{name: "short form", value: "a, other/b, c@eth9", want: []NetworkSelectionElement{
			{Name: "a", Namespace: "ns"}, {Name: "b", Namespace: "other"}, {Name: "c", Namespace: "ns", InterfaceRequest: "eth9"},
		}},
		{name: "json", value: `[{"name":"red","namespace":"x","mac":"02:00:00:00:00:01","ips":["10.0.0.5/24"],"ipam-claim-reference":"vm.red"}]`,
			want: []NetworkSelectionElement{{Name: "red", Namespace: "x", MacRequest: "02:00:00:00:00:01", IPRequest: []string{"10.0.0.5/24"}, IPAMClaimReference: "vm.red"}}},
		{name: "single json object", value: `{"name":"blue"}`, want: []NetworkSelectionElement{{Name: "blue", Namespace: "ns"}}},
		{name: "bad json", value: `[{"name":`, wantErr: true},
		{name: "bad name", value: "Bad_Name", wantErr: true},
		{name: "empty element", value: "a,,b", wantErr: true},
		{name: "bad namespace", value: `[{"name":"a","namespace":"NS!"}]`, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseSelection(NetworksAnnotation, tt.value, "ns")
			if tt.wantErr {
				if !errors.Is(err, ErrInvalidSelection) {
					t.Fatalf("error = %v, want ErrInvalidSelection", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

func FuzzParseSelection(f *testing.F) {
	for _, s := range []string{"a,b@c", `[{"name":"x","ips":["1.2.3.4/24"]}]`, `{"name":"y"}`, "", "ns/a"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		elems, err := ParseSelection(NetworksAnnotation, v, "default")
		if err != nil {
			if !errors.Is(err, ErrInvalidSelection) {
				t.Fatalf("error without ErrInvalidSelection: %v", err)
			}
			return
		}
		for _, e := range elems {
			if e.Name == "" || e.Namespace == "" {
				t.Fatalf("accepted element without name or namespace: %+v", e)
			}
		}
		if _, err := MarshalSelection(elems); err != nil {
			t.Fatal(err)
		}
	})
}

func TestWithPrimaryElement(t *testing.T) {
	// Added first, other elements kept.
	out, changed, err := WithPrimaryElement("kv@net1", "ns", "ns/blue", nil)
	if err != nil || !changed {
		t.Fatalf("WithPrimaryElement = %v, %v", changed, err)
	}
	got, _ := ParseSelection(NetworksAnnotation, out, "ns")
	want := []NetworkSelectionElement{{Name: "blue", Namespace: "ns", InterfaceRequest: PrimaryInterface}, {Name: "kv", Namespace: "ns", InterfaceRequest: "net1"}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v, want %+v", got, want)
	}
	// Idempotent; then filled in place.
	if again, changed, err := WithPrimaryElement(out, "ns", "ns/blue", nil); changed || err != nil || again != out {
		t.Errorf("second call changed=%v err=%v", changed, err)
	}
	out2, changed, err := WithPrimaryElement(out, "ns", "ns/blue", func(e *NetworkSelectionElement) { e.IPAMClaimReference = "vm.pod" })
	if err != nil || !changed {
		t.Fatal(changed, err)
	}
	got, _ = ParseSelection(NetworksAnnotation, out2, "ns")
	if len(got) != 2 || got[0].IPAMClaimReference != "vm.pod" || got[0].InterfaceRequest != PrimaryInterface {
		t.Errorf("filled: %+v", got)
	}
	// An element without an interface is completed.
	out3, changed, _ := WithPrimaryElement(`[{"name":"blue"}]`, "ns", "ns/blue", nil)
	if got, _ := ParseSelection(NetworksAnnotation, out3, "ns"); !changed || len(got) != 1 || got[0].InterfaceRequest != PrimaryInterface {
		t.Errorf("completed: %s", out3)
	}
	for _, tc := range []struct{ value, msg string }{
		{"blue@net1", `attached as ovn-udn1, not "net1"`},
		{"blue,blue@ovn-udn1", "twice"},
		{"[{", "k8s.v1.cni.cncf.io/networks"},
	} {
		if _, _, err := WithPrimaryElement(tc.value, "ns", "ns/blue", nil); !errors.Is(err, ErrInvalidSelection) || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("WithPrimaryElement(%q) error %v, want one containing %q", tc.value, err, tc.msg)
		}
	}
}

func TestWithPrimaryDefaultNetwork(t *testing.T) {
	const ours = `[{"name":"tenant","namespace":"ns","cni-args":{"kvnet.io/attach-default-network":true}}]`
	for _, tt := range []struct {
		name, value, want, err string
		changed                bool
		fill                   func(*NetworkSelectionElement)
	}{
		{name: "none", value: "", want: ours, changed: true},
		{name: "already ours", value: ours, want: ours},
		{name: "short form of the primary", value: "ns/tenant", want: ours, changed: true},
		{name: "other cni-args kept", value: `[{"name":"tenant","namespace":"ns","cni-args":{"x":"y"}}]`,
			want: `[{"name":"tenant","namespace":"ns","cni-args":{"kvnet.io/attach-default-network":true,"x":"y"}}]`, changed: true},
		{name: "fill", value: ours, fill: func(e *NetworkSelectionElement) { e.IPAMClaimReference = "vm.net" },
			want: `[{"name":"tenant","namespace":"ns","ipam-claim-reference":"vm.net","cni-args":{"kvnet.io/attach-default-network":true}}]`, changed: true},
		{name: "another network", value: "kube-system/flannel", err: `annotation v1.multus-cni.io/default-network is "kube-system/flannel": in a namespace with a primary network kvnet sets it to the primary network ns/tenant`},
		{name: "two elements", value: "tenant, other", err: "kvnet sets it to the primary network ns/tenant"},
		{name: "unparsable", value: "[{", err: "annotation v1.multus-cni.io/default-network"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, changed, err := WithPrimaryDefaultNetwork(tt.value, "ns", "ns/tenant", tt.fill)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("got %q, %v; want an error containing %q", got, err, tt.err)
				}
				return
			}
			if err != nil || got != tt.want || changed != tt.changed {
				t.Fatalf("got %q changed=%v err=%v; want %q changed=%v", got, changed, err, tt.want, tt.changed)
			}
		})
	}
}
