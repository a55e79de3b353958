package launcher

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kubevirtv1 "kvnet.io/kvnet/api/kubevirt/v1"
	"kvnet.io/kvnet/internal/testenv/golden"
)

// vmi builds a VMI in namespace "default" from networks and interfaces.
func vmi(networks []kubevirtv1.Network, ifaces ...kubevirtv1.Interface) *kubevirtv1.VirtualMachineInstance {
	return &kubevirtv1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{Name: "testvmi", Namespace: "default"},
		Spec: kubevirtv1.VirtualMachineInstanceSpec{
			Domain:   kubevirtv1.DomainSpec{Devices: kubevirtv1.Devices{Interfaces: ifaces}},
			Networks: networks,
		},
	}
}

func podNet(name string) kubevirtv1.Network {
	return kubevirtv1.Network{Name: name, Pod: &kubevirtv1.PodNetwork{}}
}

func multusNet(name, nad string) kubevirtv1.Network {
	return kubevirtv1.Network{Name: name, Multus: &kubevirtv1.MultusNetwork{NetworkName: nad}}
}

func multusDefaultNet(name, nad string) kubevirtv1.Network {
	return kubevirtv1.Network{Name: name, Multus: &kubevirtv1.MultusNetwork{NetworkName: nad, Default: true}}
}

func bridge(name string) kubevirtv1.Interface {
	return kubevirtv1.Interface{Name: name, Bridge: &kubevirtv1.InterfaceBridge{}}
}

func masquerade(name string) kubevirtv1.Interface {
	return kubevirtv1.Interface{Name: name, Masquerade: &kubevirtv1.InterfaceMasquerade{}}
}

func plugin(name, pluginName string) kubevirtv1.Interface {
	return kubevirtv1.Interface{Name: name, Binding: &kubevirtv1.PluginBinding{Name: pluginName}}
}

func withMAC(iface kubevirtv1.Interface, mac string) kubevirtv1.Interface {
	iface.MacAddress = mac
	return iface
}

func absent(iface kubevirtv1.Interface) kubevirtv1.Interface {
	iface.State = kubevirtv1.InterfaceStateAbsent
	return iface
}

func TestPodInterfaceName(t *testing.T) {
	tests := []struct {
		network string
		want    string
	}{
		{network: "red", want: "podb1f51a511f1"},
		{network: "blue", want: "pod16477688c0e"},
		{network: "green", want: "podba4788b226a"},
		{network: "default", want: "pod37a8eec1ce1"},
		{network: "network1", want: "poda7662f44d65"},
	}
	for _, tt := range tests {
		t.Run(tt.network, func(t *testing.T) {
			got := PodInterfaceName(tt.network)
			if got != tt.want {
				t.Fatalf("PodInterfaceName(%q) = %q, want %q", tt.network, got, tt.want)
			}
			// Every name must fit IFNAMSIZ-1 even after "-nic" replaces "pod".
			if len(got) != 14 {
				t.Fatalf("len(%q) = %d, want 14", got, len(got))
			}
		})
	}
}

// TestAnnotationsGolden compares Annotations with testdata/<name>.json, the
// expected annotation map. Run with -update to rewrite the files.
func TestAnnotationsGolden(t *testing.T) {
	bindings := map[string]kubevirtv1.InterfaceBindingPlugin{
		// Primary UDN: the plugin binds to the pod's primary interface, no
		// NAD of its own.
		"l2bridge": {DomainAttachmentType: "managedTap"},
		"passt": {
			SidecarImage:                "quay.io/kubevirt/network-passt-binding:v1.6.0",
			NetworkAttachmentDefinition: "default/netbindingpasst",
		},
		// A NAD without a namespace lives in the VMI's namespace.
		"custom": {NetworkAttachmentDefinition: "custom-binding"},
	}
	tests := []struct {
		name string
		vmi  *kubevirtv1.VirtualMachineInstance
	}{
		{
			name: "secondary-red-blue",
			vmi: vmi([]kubevirtv1.Network{podNet("default"), multusNet("red", "red-nad"), multusNet("blue", "blue-nad")},
				masquerade("default"), bridge("red"), bridge("blue")),
		},
		{
			name: "secondary-only-bridges",
			vmi: vmi([]kubevirtv1.Network{multusNet("red", "red-nad"), multusNet("blue", "blue-nad")},
				bridge("red"), bridge("blue")),
		},
		{
			// The upstream unit test example.
			name: "mac-address",
			vmi:  vmi([]kubevirtv1.Network{multusNet("test1", "test1")}, withMAC(bridge("test1"), "de:ad:00:00:be:af")),
		},
		{
			name: "absent-interface-dropped",
			vmi: vmi([]kubevirtv1.Network{podNet("default"), multusNet("red", "red-nad"), multusNet("blue", "blue-nad")},
				masquerade("default"), bridge("red"), absent(bridge("blue"))),
		},
		{
			name: "all-secondaries-absent",
			vmi:  vmi([]kubevirtv1.Network{multusNet("red", "red-nad")}, absent(bridge("red"))),
		},
		{
			name: "network-without-interface-skipped",
			vmi:  vmi([]kubevirtv1.Network{multusNet("red", "red-nad"), multusNet("green", "green-nad")}, bridge("green")),
		},
		{
			name: "namespaced-network-name",
			vmi: vmi([]kubevirtv1.Network{multusNet("red", "other-ns/red-nad"), multusNet("blue", "blue-nad")},
				bridge("red"), bridge("blue")),
		},
		{
			name: "multus-default-network",
			vmi: vmi([]kubevirtv1.Network{multusDefaultNet("default", "kube-system/cluster-default"), multusNet("network1", "net1-nad")},
				bridge("default"), bridge("network1")),
		},
		{
			name: "masquerade-pod-network",
			vmi:  vmi([]kubevirtv1.Network{podNet("default")}, masquerade("default")),
		},
		{
			name: "primary-udn-l2bridge",
			vmi:  vmi([]kubevirtv1.Network{podNet("default")}, plugin("default", "l2bridge")),
		},
		{
			name: "binding-plugin-with-nad",
			vmi:  vmi([]kubevirtv1.Network{podNet("default")}, plugin("default", "passt")),
		},
		{
			// The plugin element follows its network's own element.
			name: "binding-plugin-on-secondary",
			vmi: vmi([]kubevirtv1.Network{podNet("default"), multusNet("red", "red-nad"), multusNet("blue", "blue-nad")},
				masquerade("default"), plugin("red", "custom"), bridge("blue")),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := Validate(tt.vmi); err != nil {
				t.Fatalf("test VMI is invalid: %v", err)
			}
			got, err := Annotations(tt.vmi, bindings)
			if err != nil {
				t.Fatal(err)
			}
			b, err := json.MarshalIndent(got, "", "  ")
			if err != nil {
				t.Fatal(err)
			}
			b = append(b, '\n')
			golden.Check(t, tt.name+".json", b)
		})
	}
}

// TestAnnotationsExact pins a few values character for character against
// the upstream examples, independently of the golden files.
func TestAnnotationsExact(t *testing.T) {
	tests := []struct {
		name     string
		vmi      *kubevirtv1.VirtualMachineInstance
		bindings map[string]kubevirtv1.InterfaceBindingPlugin
		key      string
		want     string
	}{
		{
			name: "mac element",
			vmi:  vmi([]kubevirtv1.Network{multusNet("test1", "test1")}, withMAC(bridge("test1"), "de:ad:00:00:be:af")),
			key:  "k8s.v1.cni.cncf.io/networks",
			want: `[{"name":"test1","namespace":"default","mac":"de:ad:00:00:be:af","interface":"pod1b4f0e98519"}]`,
		},
		{
			name: "plugin cni-args element",
			vmi:  vmi([]kubevirtv1.Network{podNet("default")}, plugin("default", "passt")),
			bindings: map[string]kubevirtv1.InterfaceBindingPlugin{
				"passt": {NetworkAttachmentDefinition: "default/netbindingpasst"},
			},
			key:  "k8s.v1.cni.cncf.io/networks",
			want: `[{"name":"netbindingpasst","namespace":"default","cni-args":{"logicNetworkName":"default"}}]`,
		},
		{
			name: "default network verbatim",
			vmi:  vmi([]kubevirtv1.Network{multusDefaultNet("default", "ns1/nad1")}, bridge("default")),
			key:  "v1.multus-cni.io/default-network",
			want: "ns1/nad1",
		},
		{
			name: "istio bridge",
			vmi:  vmi([]kubevirtv1.Network{podNet("default")}, masquerade("default")),
			key:  "istio.io/reroute-virtual-interfaces",
			want: "k6t-eth0",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Annotations(tt.vmi, tt.bindings)
			if err != nil {
				t.Fatal(err)
			}
			if got[tt.key] != tt.want {
				t.Fatalf("%s = %q, want %q", tt.key, got[tt.key], tt.want)
			}
		})
	}
}

func TestAnnotationsErrors(t *testing.T) {
	tests := []struct {
		name     string
		vmi      *kubevirtv1.VirtualMachineInstance
		bindings map[string]kubevirtv1.InterfaceBindingPlugin
		wantIs   error
		wantText []string
	}{
		{
			name:     "plugin not registered",
			vmi:      vmi([]kubevirtv1.Network{podNet("default")}, plugin("default", "passt")),
			bindings: map[string]kubevirtv1.InterfaceBindingPlugin{"l2bridge": {}},
			wantIs:   ErrUnknownBindingPlugin,
			wantText: []string{`"default"`, `"passt"`, "interfaces[0]"},
		},
		{
			name:     "nil bindings",
			vmi:      vmi([]kubevirtv1.Network{podNet("default"), multusNet("red", "red-nad")}, masquerade("default"), plugin("red", "macvtap")),
			wantIs:   ErrUnknownBindingPlugin,
			wantText: []string{`"red"`, `"macvtap"`, "interfaces[1]"},
		},
		{
			name:     "nil vmi",
			wantText: []string{"vmi is nil"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Annotations(tt.vmi, tt.bindings)
			if err == nil {
				t.Fatalf("no error, annotations %v", got)
			}
			if tt.wantIs != nil && !errors.Is(err, tt.wantIs) {
				t.Fatalf("error %v does not wrap %v", err, tt.wantIs)
			}
			for _, s := range tt.wantText {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not mention %s", err, s)
				}
			}
		})
	}
}

// An absent interface with an unregistered plugin is not templated, so it
// must not fail the pod (it cannot be valid anyway, but upstream filters
// before it looks plugins up).
func TestAnnotationsAbsentPluginIgnored(t *testing.T) {
	v := vmi([]kubevirtv1.Network{multusNet("red", "red-nad")}, absent(plugin("red", "nope")))
	got, err := Annotations(v, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 0 {
		t.Fatalf("annotations = %v, want none", got)
	}
}
