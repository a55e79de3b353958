package vmclaims_test

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	kubevirtv1 "kvnet.io/kvnet/api/kubevirt/v1"
	"kvnet.io/kvnet/internal/ipam"
	"kvnet.io/kvnet/internal/multus"
	"kvnet.io/kvnet/internal/netconf"
	"kvnet.io/kvnet/internal/vmclaims"
)

func TestClaimName(t *testing.T) {
	long := func(c string, n int) string { return strings.Repeat(c, n) }
	for _, tc := range []struct {
		name, vm, network, want string
		valid                   bool // a usable object name
	}{
		{"vm dot network", "vm1", "blue-net", "vm1.blue-net", true},
		{"lowercased", "MyVM", "Blue", "myvm.blue", true},
		{"dotted vm name", "web.prod", "net", "web.prod.net", true},
		// As ipam-extensions: characters outside DNS labels separate
		// labels, which are joined with dots.
		{"underscore", "vm1", "my_net", "vm1.my.net", true},
		{"several invalid characters", "vm1", "a__b c", "vm1.a.b.c", true},
		{"leading and trailing hyphens dropped", "-vm-", "-net-", "vm.net", true},
		{"inner hyphens kept", "vm1", "a--b", "vm1.a--b", true},
		{"nothing of the network", "vm1", "__", "vm1", true},
		{"nothing valid", "_", "-", "", false},
		// A backslash and the character after it join two labels (what
		// ipam-extensions' pattern says): not a valid name.
		{"backslash joins", "vm1", `a\xb`, `vm1.a\xb`, false},
		{"fits exactly", long("a", 249), "net", long("a", 249) + ".net", true},
		// Cut at 253 characters, nothing trimmed: the cut can leave a dot
		// or a hyphen at the end, which Claims refuses.
		{"cut", long("a", 240), long("b", 63), long("a", 240) + "." + long("b", 12), true},
		{"cut at a dot", long("a", 252), "net", long("a", 252) + ".", false},
		{"cut at a hyphen", long("a", 250), "b-c", long("a", 250) + ".b-", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := vmclaims.ClaimName(tc.vm, tc.network)
			if got != tc.want {
				t.Fatalf("ClaimName(%q, %q) = %q, want %q", tc.vm, tc.network, got, tc.want)
			}
			if errs := validation.IsDNS1123Subdomain(got); (len(errs) == 0) != tc.valid {
				t.Errorf("%q: valid %v, want %v (%v)", got, len(errs) == 0, tc.valid, errs)
			}
		})
	}
}

// TestClaimsRefuseUnusableNames: a VM whose networks compose one claim
// name twice, or a name that is no object name, gets an error naming the
// VM, the networks and the name, wrapping ErrClaimName and ErrDeny.
func TestClaimsRefuseUnusableNames(t *testing.T) {
	served, err := netconf.ParseServed(`{"cniVersion":"1.1.0","type":"kvnet-cni","name":"ns_blue","netAttachDefName":"ns/blue","topology":"layer2","role":"secondary","subnets":"10.1.0.0/24","allowPersistentIPs":true}`)
	if err != nil {
		t.Fatal(err)
	}
	lookup := func(string) (*netconf.Served, bool, error) { return served, true, nil }
	vmi := func(networks ...string) *kubevirtv1.VirtualMachineInstance {
		v := &kubevirtv1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "vm1"}}
		for _, n := range networks {
			v.Spec.Networks = append(v.Spec.Networks, kubevirtv1.Network{Name: n, Multus: &kubevirtv1.MultusNetwork{NetworkName: "blue"}})
		}
		return v
	}
	got, err := vmclaims.Claims(vmi("my_net", "other"), "vm1", "", lookup)
	if err != nil || len(got) != 2 || got[0].Name != "vm1.my.net" || got[0].LogicalNet != "my_net" || got[1].Name != "vm1.other" {
		t.Fatalf("claims of networks my_net and other: %+v, %v", got, err)
	}
	for _, tc := range []struct {
		name     string
		networks []string
		want     string
	}{
		{"collision", []string{"my_net", "My-net", "my.net"}, `VM "vm1" networks "my_net" and "my.net" both compose IPAMClaim name "vm1.my.net": rename one of them`},
		{"case collision", []string{"Blue", "blue"}, `VM "vm1" networks "Blue" and "blue" both compose IPAMClaim name "vm1.blue"`},
		{"invalid name", []string{"ok", `a\xb`}, `VM "vm1" network "a\\xb" composes IPAMClaim name "vm1.a\\xb", which is not a valid object name`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := vmclaims.Claims(vmi(tc.networks...), "vm1", "", lookup)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, vmclaims.ErrClaimName) || !errors.Is(err, vmclaims.ErrDeny) {
				t.Fatalf("Claims(%q) = %+v, %v; want an ErrClaimName error containing %q", tc.networks, got, err, tc.want)
			}
		})
	}
}

// FuzzMutatePod feeds the launcher-pod mutation with the user input it
// reads: the pod's networks annotation, the VMI's requested addresses
// (network.kubevirt.io/addresses) and the primary interface's MAC. It
// denies, or writes annotations the allocator accepts as they are.
func FuzzMutatePod(f *testing.F) {
	for _, s := range []struct{ networks, addresses, mac string }{
		{`[{"name":"kv","namespace":"ns","interface":"pod1a2b"}]`, `{"default":["10.0.0.7","fd00::7"]}`, "02:00:00:00:00:07"},
		{"ns/kv@net1, other", `{"default":["10.0.0.7"],"sec":["10.1.0.5"]}`, ""},
		{"", `{"default":["10.1.0.7"]}`, ""},
		{"", `{"default":["not-an-ip"]}`, ""},
		{"", `{"default":"10.0.0.7"}`, ""},
		{"[{", "", ""},
		{"", "", "zz:zz"},
		{"", "", "02:00:00:00:00:00:00:07"},
		{"", `{"default":["10.0.0.7","10.0.0.8"]}`, "02-00-00-00-00-07"},
	} {
		f.Add(s.networks, s.addresses, s.mac, true)
	}
	primarySubnets := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/24"), netip.MustParsePrefix("fd00::/64")}
	claims := []vmclaims.Claim{
		{Name: "vm1.default", LogicalNet: "default", Network: "ns_primary", NADKey: "ns/primary", Primary: true},
		{Name: "vm1.sec", LogicalNet: "sec", Network: "ns_kv", NADKey: "ns/kv"},
	}
	lookup := func(key string) (*netconf.Served, bool, error) {
		switch key {
		case "ns/primary":
			return &netconf.Served{Name: "ns_primary", Conf: &netconf.NetConf{Name: "ns_primary", Topology: netconf.TopologyLayer2,
				Role: netconf.RolePrimary, Subnets: "10.0.0.0/24,fd00::/64", AllowPersistentIPs: true}}, true, nil
		case "ns/kv":
			return &netconf.Served{Name: "ns_kv", Conf: &netconf.NetConf{Name: "ns_kv", Topology: netconf.TopologyLayer2,
				Subnets: "10.1.0.0/24", AllowPersistentIPs: true}}, true, nil
		}
		return nil, true, nil // other plugins' NADs
	}
	f.Fuzz(func(t *testing.T, networks, addresses, mac string, create bool) {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "virt-launcher-vm1-x", Annotations: map[string]string{}}}
		if networks != "" {
			pod.Annotations[multus.NetworksAnnotation] = networks
		}
		vmi := &kubevirtv1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "vm1"}}
		if addresses != "" {
			vmi.Annotations = map[string]string{kubevirtv1.AddressesAnnotation: addresses}
		}
		vmi.Spec.Networks = []kubevirtv1.Network{
			{Name: "default", Pod: &kubevirtv1.PodNetwork{}},
			{Name: "sec", Multus: &kubevirtv1.MultusNetwork{NetworkName: "ns/kv"}},
		}
		vmi.Spec.Domain.Devices.Interfaces = []kubevirtv1.Interface{{Name: "default", MacAddress: mac}, {Name: "sec"}}

		// Both ways a primary network is attached: by the default network
		// plugin (default-network element) and by Multus (networks element).
		for _, inNetworks := range []bool{false, true} {
			checkMutatePod(t, pod, vmi, claims, primarySubnets, lookup, vmclaims.PodOptions{DefaultNetworkNAD: "ovn-kubernetes/default", Create: create, PrimaryInNetworks: inNetworks})
		}
	})
}

func checkMutatePod(t *testing.T, pod *corev1.Pod, vmi *kubevirtv1.VirtualMachineInstance, claims []vmclaims.Claim, primarySubnets []netip.Prefix, lookup ipam.NADLookup, opts vmclaims.PodOptions) {
	t.Helper()
	{
		out, err := vmclaims.MutatePod(pod, vmi, claims, primarySubnets, opts)
		if err != nil {
			if !errors.Is(err, vmclaims.ErrDeny) {
				t.Fatalf("error is no denial: %v", err)
			}
			return
		}
		if opts.PrimaryInNetworks {
			if _, ok := out[multus.DefaultNetworkAnnotation]; ok {
				t.Fatalf("multus mode wrote %s", multus.DefaultNetworkAnnotation)
			}
		} else if out[ipam.LegacyPrimaryClaimAnnotation] != "vm1.default" {
			t.Fatalf("legacy claim annotation %q", out[ipam.LegacyPrimaryClaimAnnotation])
		}
		// What the webhook writes, the allocator takes as written, unless
		// it already refused the pod's own selection (a NAD selected
		// twice, say), which the webhook passes on unchanged.
		mutated := pod.DeepCopy()
		mutated.Annotations = out
		atts, err := ipam.PodAttachments(mutated, true, "ns/primary", lookup)
		if err != nil {
			if _, before := ipam.PodAttachments(pod, true, "ns/primary", lookup); before != nil && strings.Contains(err.Error(), multus.NetworksAnnotation) {
				return
			}
			t.Fatalf("allocator refuses the mutated pod %v: %v", out, err)
		}
		if atts[0].ClaimRef != "vm1.default" {
			t.Fatalf("primary attachment %+v", atts[0])
		}
		for _, ip := range atts[0].IPs {
			if !primarySubnets[0].Contains(ip) && !primarySubnets[1].Contains(ip) {
				t.Fatalf("requested %s outside the primary subnets", ip)
			}
		}
		for _, a := range atts[1:] {
			if a.NADKey == "ns/kv" && a.ClaimRef != "vm1.sec" {
				t.Fatalf("secondary attachment %+v without its claim", a)
			}
		}
	}
}
