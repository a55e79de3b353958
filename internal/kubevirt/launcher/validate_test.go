package launcher

import (
	"errors"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"

	kubevirtv1 "kvnet.io/kvnet/api/kubevirt/v1"
	"kvnet.io/kvnet/internal/multus"
)

func sriov(name string) kubevirtv1.Interface {
	return kubevirtv1.Interface{Name: name, SRIOV: &kubevirtv1.InterfaceSRIOV{}}
}

func passt(name string) kubevirtv1.Interface {
	return kubevirtv1.Interface{Name: name, PasstBinding: &kubevirtv1.InterfacePasstBinding{}}
}

func TestValidate(t *testing.T) {
	nets := func(n ...kubevirtv1.Network) []kubevirtv1.Network { return n }
	tests := []struct {
		name string
		vmi  *kubevirtv1.VirtualMachineInstance
		// wantErr lists substrings the error must contain; empty means valid.
		wantErr []string
	}{
		// Valid specs.
		{name: "valid pod masquerade", vmi: vmi(nets(podNet("default")), masquerade("default"))},
		{name: "valid pod bridge and secondaries", vmi: vmi(nets(podNet("default"), multusNet("red", "red"), multusNet("blue", "ns/blue")),
			bridge("default"), bridge("red"), sriov("blue"))},
		{name: "valid multus default", vmi: vmi(nets(multusDefaultNet("default", "nad"), multusNet("red", "red")), bridge("default"), bridge("red"))},
		{name: "valid absent bridge on secondary", vmi: vmi(nets(podNet("default"), multusNet("red", "red")), masquerade("default"), absent(bridge("red")))},
		{name: "valid binding plugin", vmi: vmi(nets(podNet("default")), plugin("default", "l2bridge"))},
		{name: "valid passt binding", vmi: vmi(nets(podNet("default")), passt("default"))},
		{name: "valid name characters", vmi: vmi(nets(multusNet("Net_1-a", "nad")), bridge("Net_1-a"))},
		{name: "valid MAC", vmi: vmi(nets(podNet("default")), withMAC(masquerade("default"), "02:00:00:00:00:01"))},
		{name: "valid no networks", vmi: vmi(nil)},

		// Interface to network.
		{name: "interface without network", vmi: vmi(nets(podNet("default")), masquerade("default"), bridge("red")),
			wantErr: []string{"spec.domain.devices.interfaces[1].name", `"red"`, "no network"}},

		// Interface name characters.
		{name: "name with dot", vmi: vmi(nets(multusNet("red.1", "nad")), bridge("red.1")),
			wantErr: []string{"spec.domain.devices.interfaces[0].name", `"red.1"`}},
		{name: "name with space", vmi: vmi(nets(multusNet("red 1", "nad")), bridge("red 1")),
			wantErr: []string{"spec.domain.devices.interfaces[0].name", `"red 1"`}},
		{name: "empty name", vmi: vmi(nets(multusNet("", "nad")), bridge("")),
			wantErr: []string{"spec.domain.devices.interfaces[0].name", `""`}},

		// Pod and default networks.
		{name: "two pod networks", vmi: vmi(nets(podNet("a"), podNet("b")), masquerade("a"), bridge("b")),
			wantErr: []string{"spec.networks[1]", `"b"`, "more than one pod network"}},
		{name: "two multus defaults", vmi: vmi(nets(multusDefaultNet("a", "x"), multusDefaultNet("b", "y")), bridge("a"), bridge("b")),
			wantErr: []string{"spec.networks[1].multus.default", `"b"`, "more than one multus default"}},
		{name: "pod and multus default", vmi: vmi(nets(podNet("a"), multusDefaultNet("b", "y")), masquerade("a"), bridge("b")),
			wantErr: []string{"spec.networks[0]", "spec.networks[1]", "cannot both be set"}},

		// Masquerade.
		{name: "masquerade on multus", vmi: vmi(nets(podNet("default"), multusNet("red", "red")), masquerade("default"), masquerade("red")),
			wantErr: []string{"spec.domain.devices.interfaces[1].masquerade", `"red"`}},
		{name: "masquerade on multus default", vmi: vmi(nets(multusDefaultNet("default", "nad")), masquerade("default")),
			wantErr: []string{"spec.domain.devices.interfaces[0].masquerade"}},

		// Absent.
		{name: "absent sriov", vmi: vmi(nets(podNet("default"), multusNet("red", "red")), masquerade("default"), absent(sriov("red"))),
			wantErr: []string{"spec.domain.devices.interfaces[1].state", `"absent"`, "bridge binding"}},
		{name: "absent binding plugin", vmi: vmi(nets(podNet("default"), multusNet("red", "red")), masquerade("default"), absent(plugin("red", "x"))),
			wantErr: []string{"spec.domain.devices.interfaces[1].state", "bridge binding"}},
		{name: "absent on pod network", vmi: vmi(nets(podNet("default")), absent(bridge("default"))),
			wantErr: []string{"spec.domain.devices.interfaces[0].state", "default (pod or multus default) network"}},
		{name: "absent on multus default", vmi: vmi(nets(multusDefaultNet("default", "nad")), absent(bridge("default"))),
			wantErr: []string{"spec.domain.devices.interfaces[0].state", "default (pod or multus default) network"}},

		// MAC.
		{name: "reserved MAC", vmi: vmi(nets(podNet("default")), withMAC(masquerade("default"), "02:00:00:00:00:00")),
			wantErr: []string{"spec.domain.devices.interfaces[0].macAddress", `"02:00:00:00:00:00"`, "reserved"}},
		{name: "reserved MAC other spelling", vmi: vmi(nets(multusNet("red", "red")), withMAC(bridge("red"), "02-00-00-00-00-00")),
			wantErr: []string{"spec.domain.devices.interfaces[0].macAddress", `"02-00-00-00-00-00"`, "reserved"}},
		{name: "malformed MAC", vmi: vmi(nets(multusNet("red", "red")), withMAC(bridge("red"), "zz:00")),
			wantErr: []string{"spec.domain.devices.interfaces[0].macAddress", `"zz:00"`, "malformed"}},
		{name: "EUI-64 MAC", vmi: vmi(nets(multusNet("red", "red")), withMAC(bridge("red"), "02:00:00:00:00:00:00:01")),
			wantErr: []string{"spec.domain.devices.interfaces[0].macAddress", "6-byte"}},

		// Binding methods.
		{name: "removed macvtap binding", vmi: vmi(nets(multusNet("red", "red")), kubevirtv1.Interface{Name: "red", DeprecatedMacvtap: &kubevirtv1.DeprecatedInterfaceMacvtap{}}),
			wantErr: []string{"spec.domain.devices.interfaces[0].macvtap", `"red"`, "removed in KubeVirt v1.3"}},
		{name: "no binding method", vmi: vmi(nets(multusNet("red", "red")), kubevirtv1.Interface{Name: "red"}),
			wantErr: []string{"spec.domain.devices.interfaces[0]", `"red"`, "no binding method"}},
		{name: "bridge and masquerade", vmi: vmi(nets(podNet("default")), kubevirtv1.Interface{Name: "default",
			Bridge: &kubevirtv1.InterfaceBridge{}, Masquerade: &kubevirtv1.InterfaceMasquerade{}}),
			wantErr: []string{"spec.domain.devices.interfaces[0]", "[bridge masquerade]", "mutually exclusive"}},
		{name: "binding and sriov", vmi: vmi(nets(multusNet("red", "red")), kubevirtv1.Interface{Name: "red",
			SRIOV: &kubevirtv1.InterfaceSRIOV{}, Binding: &kubevirtv1.PluginBinding{Name: "x"}}),
			wantErr: []string{"[sriov binding]"}},
		{name: "binding without name", vmi: vmi(nets(podNet("default")), plugin("default", "")),
			wantErr: []string{"spec.domain.devices.interfaces[0].binding.name"}},

		// Several violations are all reported.
		{name: "all violations joined", vmi: vmi(nets(podNet("a"), podNet("b")), masquerade("a"), bridge("c")),
			wantErr: []string{"spec.networks[1]", "spec.domain.devices.interfaces[1].name"}},
		{name: "nil vmi", vmi: nil, wantErr: []string{"vmi is nil"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := Validate(tt.vmi)
			if len(tt.wantErr) == 0 {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("no error")
			}
			if !errors.Is(err, ErrInvalidNetworkSpec) {
				t.Fatalf("error %v does not wrap ErrInvalidNetworkSpec", err)
			}
			for _, s := range tt.wantErr {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not mention %s", err, s)
				}
			}
		})
	}
}

// fuzzNetwork builds a VM network and its interface from fuzzed fields.
// kind: bits 0-1 network (pod, multus, multus default, none), bits 2-4
// binding (bridge, masquerade, sriov, passt, plugin, two, none), bit 5
// absent.
func fuzzNetwork(name, nad, mac string, kind uint8) (kubevirtv1.Network, kubevirtv1.Interface) {
	n := kubevirtv1.Network{Name: name}
	switch kind & 3 {
	case 0:
		n.Pod = &kubevirtv1.PodNetwork{}
	case 1:
		n.Multus = &kubevirtv1.MultusNetwork{NetworkName: nad}
	case 2:
		n.Multus = &kubevirtv1.MultusNetwork{NetworkName: nad, Default: true}
	}
	iface := kubevirtv1.Interface{Name: name, MacAddress: mac}
	switch (kind >> 2) & 7 {
	case 0:
		iface.Bridge = &kubevirtv1.InterfaceBridge{}
	case 1:
		iface.Masquerade = &kubevirtv1.InterfaceMasquerade{}
	case 2:
		iface.SRIOV = &kubevirtv1.InterfaceSRIOV{}
	case 3:
		iface.PasstBinding = &kubevirtv1.InterfacePasstBinding{}
	case 4:
		iface.Binding = &kubevirtv1.PluginBinding{Name: "l2bridge"}
	case 5:
		iface.Binding = &kubevirtv1.PluginBinding{Name: "withnad"}
	case 6:
		iface.Bridge = &kubevirtv1.InterfaceBridge{}
		iface.Masquerade = &kubevirtv1.InterfaceMasquerade{}
	}
	if kind&32 != 0 {
		iface.State = kubevirtv1.InterfaceStateAbsent
	}
	return n, iface
}

// FuzzAnnotations feeds VMI network specs (names, NAD references, MACs,
// bindings) to Validate and Annotations: errors are of the package's kinds,
// and for a valid VMI whose NAD references are well formed, the networks
// annotation parses back (as Multus and kvnet read it) to one element per
// plugged secondary network, with its MAC.
func FuzzAnnotations(f *testing.F) {
	f.Add("default", "", "", uint8(4), "blue", "ns2/blue-nad", "02:00:00:00:00:0b", uint8(1), "ns/binding-nad")
	f.Add("default", "", "", uint8(16), "red", "red-nad", "", uint8(1|20), "binding-nad")
	f.Add("m", "ns/def", "", uint8(2), "x", "x", "02:00:00:00:00:00", uint8(1|32), "")
	f.Add("a", "a/b/c", "zz", uint8(1), "a", "Bad_Name", "02:00:00:00:00:00:00:01", uint8(1|24), "a/b")
	f.Add("bad name", "", "", uint8(0), "p2", "", "", uint8(0|32), "")
	f.Add("", "", "", uint8(3), "", "", "", uint8(28), "")
	bindings := func(pluginNAD string) map[string]kubevirtv1.InterfaceBindingPlugin {
		return map[string]kubevirtv1.InterfaceBindingPlugin{"l2bridge": {}, "withnad": {NetworkAttachmentDefinition: pluginNAD}}
	}
	f.Fuzz(func(t *testing.T, name1, nad1, mac1 string, kind1 uint8, name2, nad2, mac2 string, kind2 uint8, pluginNAD string) {
		n1, i1 := fuzzNetwork(name1, nad1, mac1, kind1)
		n2, i2 := fuzzNetwork(name2, nad2, mac2, kind2)
		v := vmi([]kubevirtv1.Network{n1, n2}, i1, i2)
		verr := Validate(v)
		if verr != nil && !errors.Is(verr, ErrInvalidNetworkSpec) {
			t.Fatalf("validation error of no known kind: %v", verr)
		}
		ann, err := Annotations(v, bindings(pluginNAD))
		if err != nil {
			if !errors.Is(err, ErrUnknownBindingPlugin) {
				t.Fatalf("error of no known kind: %v", err)
			}
			return
		}
		if verr != nil {
			return
		}
		var want []string // keys of plugged secondary networks and plugin NADs
		for _, p := range []struct {
			n kubevirtv1.Network
			i kubevirtv1.Interface
		}{{n1, i1}, {n2, i2}} {
			if p.i.State == kubevirtv1.InterfaceStateAbsent {
				continue
			}
			if isSecondaryMultus(p.n) {
				want = append(want, p.n.Multus.NetworkName)
			}
			if p.i.Binding != nil && p.i.Binding.Name == "withnad" && pluginNAD != "" {
				want = append(want, pluginNAD)
			}
		}
		for _, ref := range want {
			ns, name := splitNamespacedName(v.Namespace, ref)
			if len(validation.IsDNS1123Subdomain(name)) > 0 || len(validation.IsDNS1123Label(ns)) > 0 {
				return // Multus refuses the pod, naming the element
			}
		}
		elems, err := multus.ParseSelection(multus.NetworksAnnotation, ann[multus.NetworksAnnotation], v.Namespace)
		if err == nil && name1 == name2 {
			return // one interface serves both networks: counted above twice
		}
		if err != nil || len(elems) != len(want) {
			t.Fatalf("networks annotation %q: %v, %v; want %d elements", ann[multus.NetworksAnnotation], elems, err, len(want))
		}
		for _, e := range elems {
			if e.MacRequest != "" && e.MacRequest != i1.MacAddress && e.MacRequest != i2.MacAddress {
				t.Fatalf("element %+v has a MAC no interface asked for", e)
			}
		}
	})
}
