package node

import (
	"fmt"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	nadv1 "kvnet.io/kvnet/api/k8scni/v1"
	"kvnet.io/kvnet/internal/datapath"
	"kvnet.io/kvnet/internal/nodeid"
)

// TestDesiredDNSProxy: with the proxy on, a primary network's queries to
// the cluster DNS's port 53 (UDP and TCP, not its metrics port) go to
// the proxy at the node's transit address, whose upstreams are the
// former endpoints and whose rewrites are the network's pods' (every
// node's, not another tenant's) default-network addresses;
// withDirectDNS gives the endpoints back.
func TestDesiredDNSProxy(t *testing.T) {
	withIPs := func(p corev1.Pod, ips ...string) corev1.Pod {
		for _, ip := range ips {
			p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: ip})
		}
		return p
	}
	a1 := withIPs(pod("a", "a1", "n1", "10.1.1.2", "0a:58:0a:01:01:02", time.Hour), "10.244.0.7", "fd00:244::7")
	a2 := withIPs(pod("a", "a2", "n2", "10.1.1.3", "0a:58:0a:01:01:03", time.Hour), "10.244.1.8")
	b1 := withIPs(pod("b", "b1", "n1", "10.1.1.2", "0a:58:0a:01:01:02", time.Hour), "10.244.0.9")
	port := func(name string, proto corev1.Protocol, num int32) corev1.ServicePort {
		return corev1.ServicePort{Name: name, Port: num, Protocol: proto}
	}
	slice := func(name string, proto corev1.Protocol, num int32) discoveryv1.EndpointSlice {
		return discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "kube-dns-" + name, Labels: map[string]string{discoveryv1.LabelServiceName: "kube-dns"}},
			AddressType: discoveryv1.AddressTypeIPv4, Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"10.244.0.5"}}},
			Ports: []discoveryv1.EndpointPort{{Name: &name, Protocol: &proto, Port: &num}}}
	}
	in := Input{
		Node:  "n1",
		NADs:  []nadv1.NetworkAttachmentDefinition{primaryNAD("a", "7"), primaryNAD("b", "8")},
		Pods:  []corev1.Pod{a1, a2, b1},
		Nodes: []corev1.Node{kvnode("n1", "192.168.100.1"), kvnode("n2", "192.168.100.2")},
		Links: links(a1, b1),
		Services: []corev1.Service{{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "kube-dns"},
			Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.10", ClusterIPs: []string{"10.96.0.10"},
				Ports: []corev1.ServicePort{port("dns", corev1.ProtocolUDP, 53), port("dns-tcp", corev1.ProtocolTCP, 53), port("metrics", corev1.ProtocolTCP, 9153)}}}},
		EndpointSlices: []discoveryv1.EndpointSlice{slice("dns", corev1.ProtocolUDP, 53), slice("dns-tcp", corev1.ProtocolTCP, 53), slice("metrics", corev1.ProtocolTCP, 9153)},
		DNSProxyPort:   9466,
	}
	in.Nodes[0].Annotations[nodeid.Annotation] = "1"
	plan := Desired(in)
	if len(plan.Problems) > 0 {
		t.Fatalf("problems: %q", plan.Problems)
	}
	services := func(s datapath.State) []string {
		var out []string
		for _, sv := range s.Services {
			if sv.Network == "a_udn" {
				out = append(out, fmt.Sprintf("%s %s %v", sv.Name, sv.VIP, sv.Endpoints))
			}
		}
		return out
	}
	want := []string{
		"kube-system/kube-dns:dns 10.96.0.10:53 [169.254.0.24:9466]",
		"kube-system/kube-dns:dns-tcp 10.96.0.10:53 [169.254.0.24:9466]",
		"kube-system/kube-dns:metrics 10.96.0.10:9153 [10.244.0.5:9153]",
	}
	if got := services(plan.State); !slices.Equal(got, want) {
		t.Errorf("network a's services:\n%q\nwant\n%q", got, want)
	}
	if err := datapath.Validate(plan.State); err != nil {
		t.Error(err)
	}
	if len(plan.DNS) != 2 {
		t.Fatalf("DNS proxy networks %+v, want a's and b's", plan.DNS)
	}
	d := plan.DNS[0]
	if d.Name != "a_udn" || fmt.Sprint(d.Listen) != "[169.254.0.24:9466]" || fmt.Sprint(d.Clients) != "[169.254.0.23]" ||
		fmt.Sprint(d.UDP) != "[10.244.0.5:53]" || fmt.Sprint(d.TCP) != "[10.244.0.5:53]" {
		t.Errorf("network a's proxy %+v", d)
	}
	// a1's IPv6 default-network address has no IPv6 address on the
	// network to become; b1 is another tenant's.
	if want := "map[10.244.0.7:10.1.1.2 10.244.1.8:10.1.1.3]"; fmt.Sprint(d.Rewrite) != want {
		t.Errorf("network a's rewrites %v, want %s", d.Rewrite, want)
	}
	if b := plan.DNS[1]; b.Name != "b_udn" || fmt.Sprint(b.Rewrite) != "map[10.244.0.9:10.1.1.2]" || fmt.Sprint(b.Listen) != "[169.254.0.26:9466]" {
		t.Errorf("network b's proxy %+v", b)
	}

	// Without the proxy: network a queries the cluster DNS as before.
	direct := withDirectDNS(plan.State, plan.DNS, func(n string) bool { return n == "a_udn" })
	want[0], want[1] = "kube-system/kube-dns:dns 10.96.0.10:53 [10.244.0.5:53]", "kube-system/kube-dns:dns-tcp 10.96.0.10:53 [10.244.0.5:53]"
	if got := services(direct); !slices.Equal(got, want) {
		t.Errorf("network a direct:\n%q\nwant\n%q", got, want)
	}
	for _, sv := range direct.Services {
		if sv.Network == "b_udn" && sv.VIP.Port() == 53 && fmt.Sprint(sv.Endpoints) != "[169.254.0.26:9466]" {
			t.Errorf("network b, still served by the proxy, was changed: %+v", sv)
		}
	}
	if got := services(plan.State); got[0] != "kube-system/kube-dns:dns 10.96.0.10:53 [169.254.0.24:9466]" {
		t.Errorf("withDirectDNS changed the plan it was given: %q", got)
	}

	in.DNSProxyPort = 0
	if plan := Desired(in); len(plan.DNS) != 0 || services(plan.State)[0] != want[0] {
		t.Errorf("proxy off: DNS %+v, services %q", plan.DNS, services(plan.State))
	}
}
