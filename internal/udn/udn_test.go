package udn

import (
	"errors"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	udnv1 "kvnet.io/kvnet/api/udn/v1"
)

func TestRenderTransitSubnetShift(t *testing.T) {
	tests := []struct {
		name    string
		subnets udnv1.DualStackCIDRs
		join    udnv1.DualStackCIDRs
		want    string
	}{
		{"default", udnv1.DualStackCIDRs{"10.0.0.0/16"}, nil, "100.88.0.0/16,fd97::/64"},
		{"subnet overlaps transit", udnv1.DualStackCIDRs{"100.88.0.0/16"}, nil, "100.89.0.0/16,fd97::/64"},
		{"wide subnet", udnv1.DualStackCIDRs{"100.80.0.0/12"}, nil, "100.96.0.0/16,fd97::/64"},
		{"ipv6 overlaps", udnv1.DualStackCIDRs{"10.0.0.0/16", "fd97::/48"}, nil, "100.88.0.0/16,fd97:0:1::/64"},
		{"join overlaps", udnv1.DualStackCIDRs{"10.0.0.0/16"}, udnv1.DualStackCIDRs{"100.88.0.0/16"}, "100.89.0.0/16,fd97::/64"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Render(Spec{Topology: udnv1.NetworkTopologyLayer2, Layer2: &udnv1.Layer2Config{
				Role: udnv1.NetworkRolePrimary, Subnets: tt.subnets, JoinSubnets: tt.join,
			}}, "ns_n", "ns/n")
			if err != nil {
				t.Fatal(err)
			}
			if c.TransitSubnet != tt.want {
				t.Fatalf("transitSubnet %q, want %q", c.TransitSubnet, tt.want)
			}
		})
	}
}

func TestRenderErrors(t *testing.T) {
	tests := []struct {
		name string
		spec Spec
		want string
	}{
		{"layer2 nil", Spec{Topology: udnv1.NetworkTopologyLayer2}, `render "ns_n": spec.layer2 is required when topology is Layer2`},
		{"primary without subnets", Spec{Topology: udnv1.NetworkTopologyLayer2, Layer2: &udnv1.Layer2Config{Role: udnv1.NetworkRolePrimary}},
			`render "ns_n": the subnet attribute must be defined for layer2 primary user defined networks`},
		{"bad topology", Spec{Topology: "Layer7"}, `render "ns_n": topology "Layer7": must be Layer2, Layer3 or Localnet`},
		{"bad cidr", Spec{Topology: udnv1.NetworkTopologyLayer2, Layer2: &udnv1.Layer2Config{Role: udnv1.NetworkRoleSecondary, Subnets: udnv1.DualStackCIDRs{"10.0.0.0/99"}}},
			`"subnets" value "10.0.0.0/99"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Render(tt.spec, "ns_n", "ns/n")
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want %q", err, tt.want)
			}
		})
	}
}

func TestIDAllocator(t *testing.T) {
	a := NewIDAllocator()
	if err := a.Reserve("restored", 2); err != nil {
		t.Fatal(err)
	}
	id1, _ := a.Allocate("a")
	id2, _ := a.Allocate("b")
	if id1 != 1 || id2 != 3 {
		t.Fatalf("got %d, %d; want 1, 3 (2 is reserved)", id1, id2)
	}
	if again, _ := a.Allocate("a"); again != id1 {
		t.Fatalf("allocate is not idempotent: %d then %d", id1, again)
	}
	if err := a.Reserve("other", 1); err == nil {
		t.Fatal("reserving a held ID succeeded")
	}
	if err := a.Reserve("x", MaxNetworkID+1); err == nil {
		t.Fatal("reserving an out-of-range ID succeeded")
	}
	a.Release("a")
	if _, ok := a.ID("a"); ok {
		t.Fatal("released network still has an ID")
	}
	// Round robin: the freed ID is not reused at once, but is reused once
	// the range wraps.
	if id, _ := a.Allocate("c"); id != 4 {
		t.Fatalf("after release got %d, want 4", id)
	}
	full := NewIDAllocator()
	for i := range MaxNetworkID {
		if _, err := full.Allocate(string(rune('A'+i%26)) + string(rune(i))); err != nil {
			t.Fatalf("allocation %d: %v", i, err)
		}
	}
	if _, err := full.Allocate("one-too-many"); !errors.Is(err, ErrNoNetworkIDs) {
		t.Fatalf("err = %v, want ErrNoNetworkIDs", err)
	}
	// The cursor has wrapped: a freed ID is the next one handed out.
	freed, _ := full.ID("B" + string(rune(1)))
	full.Release("B" + string(rune(1)))
	if id, err := full.Allocate("late"); err != nil || id != freed {
		t.Fatalf("after freeing %d got %d, %v", freed, id, err)
	}
}

func TestPodsUsing(t *testing.T) {
	mk := func(name string, ann string, phase corev1.PodPhase, hostNet bool) corev1.Pod {
		p := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name}}
		if ann != "" {
			p.Annotations = map[string]string{"k8s.v1.cni.cncf.io/networks": ann}
		}
		p.Status.Phase = phase
		p.Spec.HostNetwork = hostNet
		return p
	}
	pods := []corev1.Pod{
		mk("short", "net", "", false),
		mk("json", `[{"name":"net","namespace":"ns"}]`, "", false),
		mk("other-ns", "elsewhere/net", "", false),
		mk("iface", "ns/net@eth3", "", false),
		mk("done", "net", corev1.PodSucceeded, false),
		mk("broken", "[{", "", false),
		mk("plain", "", "", false),
		mk("host", "", "", true),
	}
	if got, want := PodsUsing("ns", "net", false, false, pods), []string{"ns/short", "ns/json", "ns/iface", "ns/broken"}; !slices.Equal(got, want) {
		t.Errorf("secondary: %v, want %v", got, want)
	}
	if got, want := PodsUsing("ns", "net", true, true, pods), []string{"ns/short", "ns/json", "ns/other-ns", "ns/iface", "ns/broken", "ns/plain"}; !slices.Equal(got, want) {
		t.Errorf("primary in labelled namespace: %v, want %v", got, want)
	}
}
