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
	}{
		{"vm dot network", "vm1", "blue-net", "vm1.blue-net"},
		{"lowercased", "MyVM", "Blue", "myvm.blue"},
		{"dotted vm name", "web.prod", "net", "web.prod.net"},
		// Only the parts that are DNS subdomains are kept (as ipam-extensions).
		{"invalid network dropped", "vm1", "blue_net", "vm1"},
		{"invalid vm dropped", "-vm", "net", "net"},
		{"nothing valid", "a_b", "c d", ""},
		{"fits exactly", long("a", 249), "net", long("a", 249) + ".net"},
		// Truncated to 253 characters, then trailing dots and dashes trimmed
		// so the result stays a DNS subdomain.
		{"truncated", long("a", 240), long("b", 63), long("a", 240) + "." + long("b", 12)},
		{"trailing dot trimmed", long("a", 252), "net", long("a", 252)},
		{"trailing dash trimmed", long("a", 250), "b-c", long("a", 250) + ".b"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := vmclaims.ClaimName(tc.vm, tc.network)
			if got != tc.want {
				t.Fatalf("ClaimName(%q, %q) = %q, want %q", tc.vm, tc.network, got, tc.want)
			}
			if got != "" {
				if errs := validation.IsDNS1123Subdomain(got); len(errs) > 0 {
					t.Errorf("%q is no DNS subdomain: %v", got, errs)
				}
			}
			if again := vmclaims.ClaimName(tc.vm, tc.network); again != got {
				t.Errorf("not deterministic: %q then %q", got, again)
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
