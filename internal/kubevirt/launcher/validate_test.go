package launcher

import (
	"errors"
	"strings"
	"testing"

	kubevirtv1 "kvnet.io/kvnet/api/kubevirt/v1"
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
