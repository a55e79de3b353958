package ipam

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/types"

	"kvnet.io/kvnet/internal/ipam/allocator"
	"kvnet.io/kvnet/internal/netconf"
)

// fill takes every free address of n.
func fill(t testing.TB, n *network, owner string) {
	t.Helper()
	for i := 0; ; i++ {
		if size, used := n.alloc.Stats(); used >= size {
			return
		}
		if _, err := n.alloc.Allocate(allocator.Request{Owner: fmt.Sprintf("%s-%d", owner, i)}); err != nil {
			t.Fatalf("allocate in %s: %v", n.alloc.Name(), err)
		}
	}
}

// layer3 is a Layer3 network's configuration, as the rebuild and the pods
// controller serve it.
func layer3(name string) *netconf.Served {
	return &netconf.Served{Name: name, Conf: &netconf.NetConf{Name: name, Topology: netconf.TopologyLayer3}}
}

// The exhaustion marker's count: a whole network whose pool is full, or
// where pods wait for an address, is exhausted; a full per-node host
// subnet of a Layer3 network is not counted (it marks no NAD, and there
// are thousands of them).
func TestExhaustedNetworksCountsWholeNetworks(t *testing.T) {
	st := newState()
	full, err := st.network(&netconf.Served{Name: "ns_full", IPAM: &netconf.IPAMConf{Subnets: "10.0.0.0/29"}})
	if err != nil {
		t.Fatal(err)
	}
	fill(t, full, "pod")
	if _, err := st.network(&netconf.Served{Name: "ns_free", IPAM: &netconf.IPAMConf{Subnets: "10.0.1.0/24"}}); err != nil {
		t.Fatal(err)
	}
	host, err := st.hostNetwork(layer3("ns_l3"), []netip.Prefix{netip.MustParsePrefix("10.128.0.0/29")})
	if err != nil {
		t.Fatal(err)
	}
	fill(t, host, "pod")
	if size, used := host.alloc.Stats(); size == 0 || used < size {
		t.Fatalf("host subnet pool %d/%d, want full", used, size)
	}
	st.waitFor("ns_waiting", types.NamespacedName{Namespace: "ns", Name: "p"})

	got := slices.Sorted(maps.Keys(st.exhaustedNetworks()))
	if want := []string{"ns_full", "ns_waiting"}; !slices.Equal(got, want) {
		t.Errorf("exhausted %q, want %q", got, want)
	}
}

// BenchmarkExhaustedNetworks: the exhaustion marker's count, run every
// second, with 1,000 whole networks and 50 Layer3 networks' host subnets
// on 1,000 nodes (50,000 per-node allocators), as at 1,000 nodes and
// 100,000 pods.
func BenchmarkExhaustedNetworks(b *testing.B) {
	st := newState()
	for i := range 1000 {
		if _, err := st.network(&netconf.Served{Name: fmt.Sprintf("ns%d_net", i), IPAM: &netconf.IPAMConf{Subnets: "10.0.0.0/16"}}); err != nil {
			b.Fatal(err)
		}
	}
	for i := range 50 {
		s := layer3(fmt.Sprintf("ns%d_l3", i))
		for node := range 1000 {
			p := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(128 + node/256), byte(node % 256), 0}), 24)
			if _, err := st.hostNetwork(s, []netip.Prefix{p}); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportAllocs()
	for b.Loop() {
		if len(st.exhaustedNetworks()) != 0 {
			b.Fatal("a network is exhausted")
		}
	}
}
