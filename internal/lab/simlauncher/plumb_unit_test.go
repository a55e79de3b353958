package simlauncher

import (
	"errors"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	kubevirtv1 "kvnet.io/kvnet/api/kubevirt/v1"
	"kvnet.io/kvnet/internal/lab/guest"
)

func TestValidate(t *testing.T) {
	ok := Iface{Name: "default", PodIface: "eth0", Binding: BindingMasquerade, Ports: []Port{{Port: 80}}}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	for want, ifc := range map[string]Iface{
		`podIface ""`:                 {Name: "a", Binding: BindingBridge},
		`binding "passt"`:             {Name: "a", PodIface: "eth0", Binding: "passt"},
		`macAddress "zz"`:             {Name: "a", PodIface: "eth0", Binding: BindingBridge, MAC: "zz"},
		`port 70000`:                  {Name: "a", PodIface: "eth0", Binding: BindingMasquerade, Ports: []Port{{Port: 70000}}},
		`protocol "SCTP"`:             {Name: "a", PodIface: "eth0", Binding: BindingMasquerade, Ports: []Port{{Port: 1, Protocol: "SCTP"}}},
		`only a masquerade`:           {Name: "a", PodIface: "eth0", Binding: BindingBridge, Ports: []Port{{Port: 80}}},
		`podIface "a-very-long-name"`: {Name: "a", PodIface: "a-very-long-name", Binding: BindingBridge},
	} {
		err := ifc.Validate()
		if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), `interface "a"`) {
			t.Errorf("%+v: error %v, want it to name the interface and %s", ifc, err, want)
		}
	}
}

func TestLinkNames(t *testing.T) {
	for _, c := range []struct {
		ifc          Iface
		br, nic, tap string
	}{
		{Iface{PodIface: "eth0"}, "k6t-eth0", "eth0-nic", "tap0"},
		{Iface{PodIface: "ovn-udn1"}, "k6t-ovn-udn1", "ovn-udn1-nic", "tap0"},
		{Iface{PodIface: "pod16477688c0e", Index: 1}, "k6t-pod16477688", "pod16477688-nic", "tap16477688c0e"},
	} {
		if br, nic, tap := bridgeName(c.ifc), nicName(c.ifc), tapName(c.ifc); br != c.br || nic != c.nic || tap != c.tap {
			t.Errorf("%s: %s %s %s, want %s %s %s", c.ifc.PodIface, br, nic, tap, c.br, c.nic, c.tap)
		}
	}
}

// Without QEMU the launcher does not start, and says what to install.
func TestNewWithoutQEMU(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	_, err := New(Config{RESTConfig: &rest.Config{Host: "https://127.0.0.1:1"}, StateDir: t.TempDir(), Image: guest.Image{Kernel: "k", Initrd: "i"}})
	if !errors.Is(err, guest.ErrQEMUNotFound) || !strings.Contains(err.Error(), "qemu-system-x86") {
		t.Fatalf("err = %v, want ErrQEMUNotFound naming the package", err)
	}
}

func TestIfaces(t *testing.T) {
	vmi := &kubevirtv1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "vm"}}
	vmi.Spec.Domain.Devices.Interfaces = []kubevirtv1.Interface{
		{Name: "podnet", Binding: &kubevirtv1.PluginBinding{Name: "l2bridge"}},
		{Name: "sec", Bridge: &kubevirtv1.InterfaceBridge{}, MacAddress: "02:00:00:00:00:07"},
	}
	vmi.Spec.Networks = []kubevirtv1.Network{
		{Name: "podnet", Pod: &kubevirtv1.PodNetwork{}},
		{Name: "sec", Multus: &kubevirtv1.MultusNetwork{NetworkName: "blue"}},
	}
	got, err := Ifaces(vmi, &corev1.Pod{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Binding != BindingManagedTap || got[0].Index != 0 ||
		got[1].Binding != BindingBridge || got[1].Index != 1 || got[1].MAC != "02:00:00:00:00:07" || !strings.HasPrefix(got[1].PodIface, "pod") {
		t.Fatalf("ifaces %+v", got)
	}
	vmi.Spec.Domain.Devices.Interfaces[1] = kubevirtv1.Interface{Name: "sec", PasstBinding: &kubevirtv1.InterfacePasstBinding{}}
	if _, err := Ifaces(vmi, &corev1.Pod{}, nil); !errors.Is(err, ErrNoGuest) || !strings.Contains(err.Error(), `interface "sec"`) {
		t.Fatalf("passt: err = %v, want ErrNoGuest naming the interface", err)
	}
}
