package ipam

import (
	"errors"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kvnet.io/kvnet/internal/multus"
	"kvnet.io/kvnet/internal/netconf"
	"kvnet.io/kvnet/internal/podnetworks"
)

// testLookup serves ns/primary and ns/kv (kvnet-cni), ns/mig (kvnet-ipam)
// and ns/foreign (another plugin); other NADs do not exist.
func testLookup(key string) (*netconf.Served, bool, error) {
	switch key {
	case "ns/primary":
		return &netconf.Served{Name: "ns_primary", Conf: &netconf.NetConf{Name: "ns_primary", Topology: netconf.TopologyLayer2, Role: netconf.RolePrimary, Subnets: "10.0.0.0/24"}}, true, nil
	case "ns/kv":
		return &netconf.Served{Name: "ns_kv", Conf: &netconf.NetConf{Name: "ns_kv", Topology: netconf.TopologyLayer2, Subnets: "10.1.0.0/24"}}, true, nil
	case "ns/mig":
		return &netconf.Served{Name: "mig", IPAM: &netconf.IPAMConf{Type: netconf.IPAMType, Subnets: "10.2.0.0/24"}, Plugin: "bridge"}, true, nil
	case "ns/foreign":
		return nil, true, nil
	}
	return nil, false, nil
}

func TestPodAttachments(t *testing.T) {
	pod := func(ann map[string]string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", Annotations: ann}}
	}
	got, err := PodAttachments(pod(map[string]string{
		multus.NetworksAnnotation:       `[{"name":"kv","ips":["10.1.0.5/24"],"mac":"02:00:00:00:00:05"},{"name":"foreign"},{"name":"mig","ipam-claim-reference":"vm1.mig"}]`,
		multus.DefaultNetworkAnnotation: `[{"name":"default","namespace":"ovn-kubernetes","ipam-claim-reference":"vm1.pod","ips":["10.0.0.7"]}]`,
	}), true, "ns/primary", testLookup)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || got[0].NADKey != "ns/primary" || got[0].ClaimRef != "vm1.pod" || got[0].IPs[0].String() != "10.0.0.7" ||
		got[1].NADKey != "ns/kv" || got[1].MAC.String() != "02:00:00:00:00:05" || got[2].ClaimRef != "vm1.mig" {
		t.Fatalf("attachments %+v", got)
	}
	// Multus mode: the primary network is an element of the networks
	// annotation (ovn-udn1), carrying a VM's claim, MAC and IPs; it is the
	// primary attachment, not a secondary one.
	got, err = PodAttachments(pod(map[string]string{
		multus.NetworksAnnotation: `[{"name":"primary","interface":"ovn-udn1","ipam-claim-reference":"vm1.pod","ips":["10.0.0.9"],"mac":"02:00:00:00:00:09"},{"name":"kv"}]`,
	}), true, "ns/primary", testLookup)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Role != podnetworks.RolePrimary || got[0].ClaimRef != "vm1.pod" || got[0].IPs[0].String() != "10.0.0.9" ||
		got[0].MAC.String() != "02:00:00:00:00:09" || got[1].NADKey != "ns/kv" {
		t.Fatalf("multus-mode attachments %+v", got)
	}
	// A plain pod's element (no claim) leaves the primary request empty.
	got, err = PodAttachments(pod(map[string]string{multus.NetworksAnnotation: `primary@ovn-udn1`}), true, "ns/primary", testLookup)
	if err != nil || len(got) != 1 || got[0].ClaimRef != "" || got[0].Role != podnetworks.RolePrimary {
		t.Fatalf("plain multus-mode pod: %+v, %v", got, err)
	}
	for _, tt := range []struct {
		ann  map[string]string
		want error
		msg  string
	}{
		{map[string]string{multus.NetworksAnnotation: "primary@net1"}, ErrInvalidRequest, `attached as ovn-udn1, not "net1"`},
		{map[string]string{multus.NetworksAnnotation: "primary@ovn-udn1,primary@ovn-udn1"}, ErrInvalidRequest, "primary network is selected twice"},
		{map[string]string{multus.NetworksAnnotation: "kv,kv"}, ErrInvalidRequest, "NAD ns/kv is selected twice"},
		{map[string]string{multus.NetworksAnnotation: "nope"}, ErrMissingNAD, "ns/nope (annotation k8s.v1.cni.cncf.io/networks element 0)"},
		{map[string]string{multus.NetworksAnnotation: `[{"name":"kv","mac":"02:00:00:00:00:00:00:01"}]`}, ErrInvalidRequest, `mac "02:00:00:00:00:00:00:01"`},
		{map[string]string{multus.NetworksAnnotation: `[{"name":"kv","ips":["10.1.0.5"],"ipam-claim-reference":"c"}]`}, ErrInvalidRequest, "ips and ipam-claim-reference"},
		{map[string]string{multus.DefaultNetworkAnnotation: `[{"name":"a"},{"name":"b"}]`}, ErrInvalidRequest, "want exactly one element, got 2"},
	} {
		_, err := PodAttachments(pod(tt.ann), true, "ns/primary", testLookup)
		if !errors.Is(err, tt.want) || !strings.Contains(err.Error(), tt.msg) {
			t.Errorf("%v: err = %v, want %v containing %q", tt.ann, err, tt.want, tt.msg)
		}
	}
}

// FuzzPodAttachments feeds the pod annotations the allocator reads (the
// networks selection, the default-network element and the legacy claim
// annotation). Errors are one of the package's kinds and name the
// annotation; attachments are well formed.
func FuzzPodAttachments(f *testing.F) {
	for _, s := range []struct {
		networks, defaultNet, legacy string
		labelled                     bool
	}{
		{`[{"name":"kv","ips":["10.1.0.5/24"],"mac":"02:00:00:00:00:05","interface":"net1"},{"name":"foreign"},{"name":"mig","namespace":"ns","ipam-claim-reference":"vm1.mig"}]`,
			`[{"name":"default","namespace":"ovn-kubernetes","ipam-claim-reference":"vm1.pod","ips":["10.0.0.7"],"mac":"0a:58:0a:00:00:07"}]`, "", true},
		{"kv@net1, ns/mig, foreign", "", "vm1.legacy", true},
		{`{"name":"kv"}`, "ovn-kubernetes/default", "", false},
		{"kv,kv", "", "", false},
		{`[{"name":"kv","ips":["10.1.0.5"],"ipam-claim-reference":"c"}]`, "", "", false},
		{`[{"name":"kv","mac":"zz"}]`, `[{"name":"a"},{"name":"b"}]`, "", true},
		{"[{", "[", "", true},
		{"", "", "", true},
		{"Bad_Name", "", "", false},
	} {
		f.Add(s.networks, s.defaultNet, s.legacy, s.labelled)
	}
	f.Fuzz(func(t *testing.T, networks, defaultNet, legacy string, labelled bool) {
		ann := map[string]string{}
		for k, v := range map[string]string{multus.NetworksAnnotation: networks, multus.DefaultNetworkAnnotation: defaultNet, LegacyPrimaryClaimAnnotation: legacy} {
			if v != "" {
				ann[k] = v
			}
		}
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", Annotations: ann}}
		got, err := PodAttachments(pod, labelled, "ns/primary", testLookup)
		if err != nil {
			switch {
			case errors.Is(err, ErrInvalidRequest):
				if !strings.Contains(err.Error(), "annotation ") {
					t.Fatalf("invalid request without its annotation: %v", err)
				}
			case errors.Is(err, ErrMissingNAD):
			default:
				t.Fatalf("error of no known kind: %v", err)
			}
			return
		}
		seen := map[string]bool{}
		for i, a := range got {
			if seen[a.NADKey] || a.Network == nil {
				t.Fatalf("attachment %d %+v in %+v", i, a, got)
			}
			seen[a.NADKey] = true
			if primary := labelled && i == 0; primary != (a.Role == podnetworks.RolePrimary) {
				t.Fatalf("attachment %d has role %q", i, a.Role)
			}
			if a.MAC != nil && len(a.MAC) != 6 {
				t.Fatalf("mac %v", a.MAC)
			}
			for _, ip := range a.IPs {
				if !ip.IsValid() {
					t.Fatalf("invalid requested IP in %+v", a)
				}
			}
			if a.Role == podnetworks.RoleSecondary && len(a.IPs) > 0 && a.ClaimRef != "" {
				t.Fatalf("secondary attachment with both ips and a claim: %+v", a)
			}
		}
		if labelled && (len(got) == 0 || got[0].NADKey != "ns/primary") {
			t.Fatalf("labelled namespace without its primary network: %+v", got)
		}
	})
}
