package node

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	nadv1 "kvnet.io/kvnet/api/k8scni/v1"
	"kvnet.io/kvnet/internal/datapath"
	"kvnet.io/kvnet/internal/nodeid"
)

func TestServiceAddrs(t *testing.T) {
	for _, tt := range []struct {
		transit string
		id      int
		want    string
		mac     string
		err     string
	}{
		{"", 5, "[100.88.0.5/16 fd97::5/64]", "0a:58:64:58:00:05", ""},
		{"100.90.0.0/16", 300, "[100.90.1.44/16]", "0a:58:64:5a:01:2c", ""},
		{"10.200.0.0/24,fd99::/120", 7, "[10.200.0.7/24 fd99::7/120]", "0a:58:0a:c8:00:07", ""},
		{"10.200.0.0/24", 255, "", "", "has no address for node ID 255"},
		{"not-a-prefix", 1, "", "", `"transitSubnet" "not-a-prefix"`},
	} {
		addrs, mac, err := serviceAddrs(tt.transit, tt.id)
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("serviceAddrs(%q, %d) = %v, %v; want error %q", tt.transit, tt.id, addrs, err, tt.err)
			}
			continue
		}
		if err != nil || fmt.Sprint(addrs) != tt.want || mac.String() != tt.mac {
			t.Errorf("serviceAddrs(%q, %d) = %v %s, %v; want %s %s", tt.transit, tt.id, addrs, mac, err, tt.want, tt.mac)
		}
	}
}

// TestDesiredServices: the services of a primary network's namespace
// become datapath services with the ready endpoints the selector picks,
// target ports resolved (number, container port name, unset); headless,
// selector-less services are left out, each namespace's go to its own
// network; the node's
// service address comes from its ID, and the other node's service MAC is
// pinned to its VTEP. Without a node ID the services wait, as a problem.
func TestDesiredServices(t *testing.T) {
	ready := func(p corev1.Pod, app string) corev1.Pod {
		p.Labels = map[string]string{"app": app}
		p.Status.Phase = corev1.PodRunning
		p.Spec.Containers = []corev1.Container{{Name: "c", Ports: []corev1.ContainerPort{{Name: "web", ContainerPort: 8080}}}}
		return p
	}
	e1 := ready(pod("a", "e1", "n1", "10.1.1.2", "0a:58:0a:01:01:02", time.Hour), "web")
	e2 := ready(pod("a", "e2", "n2", "10.1.1.3", "0a:58:0a:01:01:03", time.Hour), "web")
	notReady := ready(pod("a", "e3", "n2", "10.1.1.4", "0a:58:0a:01:01:04", time.Hour), "web")
	notReady.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionFalse}}
	other := ready(pod("b", "b1", "n1", "10.1.1.2", "0a:58:0a:01:01:02", time.Hour), "web")
	svc := func(ns, name, ip string, sel map[string]string, ports ...corev1.ServicePort) corev1.Service {
		return corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: corev1.ServiceSpec{ClusterIP: ip, ClusterIPs: []string{ip}, Selector: sel, Ports: ports}}
	}
	web := map[string]string{"app": "web"}
	withID := func(n corev1.Node, id string) corev1.Node {
		n.Annotations[nodeid.Annotation] = id
		return n
	}
	in := Input{
		Node:  "n1",
		NADs:  []nadv1.NetworkAttachmentDefinition{primaryNAD("a", "7"), primaryNAD("b", "8")},
		Pods:  []corev1.Pod{e1, e2, notReady, other},
		Nodes: []corev1.Node{withID(kvnode("n1", "192.168.100.1"), "1"), withID(kvnode("n2", "192.168.100.2"), "2")},
		Links: links(e1),
		Services: []corev1.Service{
			svc("a", "num", "10.96.0.1", web, corev1.ServicePort{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080)}),
			svc("a", "named", "10.96.0.2", web, corev1.ServicePort{Port: 81, TargetPort: intstr.FromString("web")}, corev1.ServicePort{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP}),
			svc("a", "headless", "None", web, corev1.ServicePort{Port: 80}),
			svc("a", "manual", "10.96.0.3", nil, corev1.ServicePort{Port: 80}),
			svc("b", "elsewhere", "10.96.0.4", web, corev1.ServicePort{Port: 80}),
			svc("a", "overlap", "10.1.1.200", web, corev1.ServicePort{Port: 80}),
		},
	}
	plan := Desired(in)
	if want := "Service a/overlap: cluster IP 10.1.1.200 is inside network a_udn's subnet 10.1.1.0/24: the cluster's service CIDR must not overlap UDN subnets"; len(plan.Problems) != 1 || plan.Problems[0] != want {
		t.Fatalf("problems: %v, want only %q", plan.Problems, want)
	}
	var got []string
	for _, s := range plan.State.Services {
		got = append(got, fmt.Sprintf("%s %s %s %s %v", s.Network, s.Name, s.Protocol, s.VIP, s.Endpoints))
	}
	want := []string{
		"a_udn a/num:http TCP 10.96.0.1:80 [10.1.1.2:8080 10.1.1.3:8080]",
		"a_udn a/named:81 TCP 10.96.0.2:81 [10.1.1.2:8080 10.1.1.3:8080]",
		"a_udn a/named:dns UDP 10.96.0.2:53 [10.1.1.2:53 10.1.1.3:53]",
		// Tenant b's pod with the same address answers b's service only.
		"b_udn b/elsewhere:80 TCP 10.96.0.4:80 [10.1.1.2:80]",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("services:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	n := plan.State.Networks[0]
	if fmt.Sprint(n.ServiceAddrs) != "[100.88.0.1/16 fd97::1/64]" || n.ServiceMAC.String() != "0a:58:64:58:00:01" {
		t.Errorf("service address %v MAC %s, want node 1's", n.ServiceAddrs, n.ServiceMAC)
	}
	pinned := false
	for _, m := range plan.State.RemoteMACs {
		if m.MAC.String() == "0a:58:64:58:00:02" && m.VTEP == netip.MustParseAddr("192.168.100.2") {
			pinned = true
		}
	}
	if !pinned {
		t.Errorf("remote MACs %v lack node 2's service MAC at its VTEP", plan.State.RemoteMACs)
	}
	if err := datapath.Validate(plan.State); err != nil {
		t.Error(err)
	}

	in.Services = in.Services[:len(in.Services)-1]
	in.Nodes[0] = kvnode("n1", "192.168.100.1")
	plan = Desired(in)
	if len(plan.State.Services) != 0 || len(plan.State.Networks[0].ServiceAddrs) != 0 ||
		len(plan.Problems) != 2 || !strings.Contains(plan.Problems[0], "network a_udn: this node has no node ID yet (annotation k8s.ovn.org/node-id") {
		t.Errorf("without a node ID: services %v, problems %v", plan.State.Services, plan.Problems)
	}
}

// TestClientAffinity: sessionAffinity ClientIP keeps a client for its
// timeoutSeconds, Kubernetes' 3 hours when not set; None keeps none; a
// timeout out of Kubernetes' bounds is a problem naming the field and
// value, and the default.
func TestClientAffinity(t *testing.T) {
	for _, tt := range []struct {
		name     string
		affinity corev1.ServiceAffinity
		timeout  *int32
		want     time.Duration
		problem  string
	}{
		{"none", corev1.ServiceAffinityNone, nil, 0, ""},
		{"unset", "", ptr.To[int32](60), 0, ""},
		{"default timeout", corev1.ServiceAffinityClientIP, nil, 3 * time.Hour, ""},
		{"timeout", corev1.ServiceAffinityClientIP, ptr.To[int32](60), time.Minute, ""},
		{"longest", corev1.ServiceAffinityClientIP, ptr.To[int32](86400), 24 * time.Hour, ""},
		{"zero", corev1.ServiceAffinityClientIP, ptr.To[int32](0), 3 * time.Hour, "sessionAffinityConfig.clientIP.timeoutSeconds 0: must be from 1 to 86400"},
		{"too long", corev1.ServiceAffinityClientIP, ptr.To[int32](86401), 3 * time.Hour, "Service a/web: sessionAffinityConfig.clientIP.timeoutSeconds 86401"},
	} {
		svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "web"}, Spec: corev1.ServiceSpec{SessionAffinity: tt.affinity}}
		if tt.timeout != nil {
			svc.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: tt.timeout}}
		}
		var problems []string
		got := clientAffinity(svc, func(f string, a ...any) { problems = append(problems, fmt.Sprintf(f, a...)) })
		if got != tt.want {
			t.Errorf("%s: affinity %s, want %s", tt.name, got, tt.want)
		}
		if tt.problem == "" && len(problems) > 0 || tt.problem != "" && (len(problems) != 1 || !strings.Contains(problems[0], tt.problem)) {
			t.Errorf("%s: problems %q, want one containing %q", tt.name, problems, tt.problem)
		}
	}
}

// TestDesiredAffinity: a Service's affinity reaches each of its ports,
// and a bad timeout is one problem for the Service, not one per port.
func TestDesiredAffinity(t *testing.T) {
	e1 := pod("a", "e1", "n1", "10.1.1.2", "0a:58:0a:01:01:02", time.Hour)
	e1.Labels, e1.Status.Phase = map[string]string{"app": "web"}, corev1.PodRunning
	svc := func(name, ip string, timeout int32) corev1.Service {
		return corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: name},
			Spec: corev1.ServiceSpec{ClusterIP: ip, ClusterIPs: []string{ip}, Selector: map[string]string{"app": "web"},
				SessionAffinity:       corev1.ServiceAffinityClientIP,
				SessionAffinityConfig: &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: &timeout}},
				Ports:                 []corev1.ServicePort{{Name: "http", Port: 80}, {Name: "https", Port: 443}}}}
	}
	in := Input{
		Node:     "n1",
		NADs:     []nadv1.NetworkAttachmentDefinition{primaryNAD("a", "7")},
		Pods:     []corev1.Pod{e1},
		Nodes:    []corev1.Node{kvnode("n1", "192.168.100.1")},
		Links:    links(e1),
		Services: []corev1.Service{svc("sticky", "10.96.0.1", 60), svc("bad", "10.96.0.2", 0)},
	}
	in.Nodes[0].Annotations[nodeid.Annotation] = "1"
	plan := Desired(in)
	var got []string
	for _, sv := range plan.State.Services {
		got = append(got, fmt.Sprintf("%s %s", sv.Name, sv.Affinity))
	}
	if want := "a/sticky:http 1m0s,a/sticky:https 1m0s,a/bad:http 3h0m0s,a/bad:https 3h0m0s"; strings.Join(got, ",") != want {
		t.Errorf("services %s, want %s", strings.Join(got, ","), want)
	}
	if len(plan.Problems) != 1 || !strings.Contains(plan.Problems[0], "Service a/bad: sessionAffinityConfig.clientIP.timeoutSeconds 0") {
		t.Errorf("problems %q, want one for Service a/bad", plan.Problems)
	}
	if err := datapath.Validate(plan.State); err != nil {
		t.Error(err)
	}
}

// TestDesiredNodePorts: NodePort and LoadBalancer Services get their node
// ports; a LoadBalancer's ingress IPs (ipMode VIP, not Proxy) of the
// cluster IP's family become its external addresses, spec.externalIPs
// never (CVE-2020-8554); without a node port those are a problem and left
// out; an external address and port another Service holds already is a
// problem for the second, whose node port stays; the plan stays valid.
func TestDesiredNodePorts(t *testing.T) {
	e1 := pod("a", "e1", "n1", "10.1.1.2", "0a:58:0a:01:01:02", time.Hour)
	e1.Labels, e1.Status.Phase = map[string]string{"app": "web"}, corev1.PodRunning
	b1 := pod("b", "b1", "n1", "10.1.1.2", "0a:58:0a:01:01:02", time.Hour)
	b1.Labels, b1.Status.Phase = map[string]string{"app": "web"}, corev1.PodRunning
	proxy := corev1.LoadBalancerIPModeProxy
	svc := func(ns, name, ip string, typ corev1.ServiceType, nodePort int32, external ...string) corev1.Service {
		return corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: corev1.ServiceSpec{Type: typ, ClusterIP: ip, ClusterIPs: []string{ip}, Selector: map[string]string{"app": "web"},
				ExternalIPs: external, Ports: []corev1.ServicePort{{Port: 80, NodePort: nodePort}}}}
	}
	lb := svc("a", "lb", "10.96.0.2", corev1.ServiceTypeLoadBalancer, 30081, "198.51.100.7", "fe80::1", "garbage", "127.0.0.1")
	lb.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "203.0.113.5"}, {IP: "203.0.113.6", IPMode: &proxy}, {Hostname: "lb.example.com"}}
	steal := svc("b", "steal", "10.96.0.5", corev1.ServiceTypeLoadBalancer, 30090)
	steal.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "203.0.113.5"}}
	noNodePort := svc("a", "nonp", "10.96.0.3", corev1.ServiceTypeLoadBalancer, 0)
	noNodePort.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "203.0.113.9"}}
	in := Input{
		Node:  "n1",
		NADs:  []nadv1.NetworkAttachmentDefinition{primaryNAD("a", "7"), primaryNAD("b", "8")},
		Pods:  []corev1.Pod{e1, b1},
		Nodes: []corev1.Node{kvnode("n1", "192.168.100.1")},
		Links: links(e1, b1),
		Services: []corev1.Service{
			svc("a", "np", "10.96.0.1", corev1.ServiceTypeNodePort, 30080),
			lb, noNodePort,
			svc("a", "cip", "10.96.0.4", corev1.ServiceTypeClusterIP, 0),
			steal,
		},
	}
	in.Nodes[0].Annotations[nodeid.Annotation] = "1"
	plan := Desired(in)
	var got []string
	for _, s := range plan.State.Services {
		got = append(got, fmt.Sprintf("%s %s node port %d external %v", s.Network, s.Name, s.NodePort, s.External))
	}
	want := []string{
		"a_udn a/np:80 node port 30080 external []",
		"a_udn a/lb:80 node port 30081 external [203.0.113.5]",
		"a_udn a/nonp:80 node port 0 external []",
		"a_udn a/cip:80 node port 0 external []",
		"b_udn b/steal:80 node port 30090 external []",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("services:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	wantProblems := []string{
		"Service a/nonp port 80: external addresses [203.0.113.9] need a node port (allocateLoadBalancerNodePorts: false is not supported on user-defined networks)",
		"Service b/steal:80: external address TCP 203.0.113.5:80 is already Service a/lb:80's",
	}
	if strings.Join(plan.Problems, "\n") != strings.Join(wantProblems, "\n") {
		t.Errorf("problems:\n%s\nwant:\n%s", strings.Join(plan.Problems, "\n"), strings.Join(wantProblems, "\n"))
	}
	if err := datapath.Validate(plan.State); err != nil {
		t.Error(err)
	}

	// A node without pods of a network holds it all the same when the
	// network has node ports (they are open on every node), reaching the
	// endpoints on the other node; a network with cluster IPs only is not
	// there.
	in.Node = "n2"
	in.Nodes = append(in.Nodes, kvnode("n2", "192.168.100.2"))
	in.Nodes[1].Annotations[nodeid.Annotation] = "2"
	in.Nodes[1].Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "192.168.100.2"},
		{Type: corev1.NodeExternalIP, Address: "203.0.113.77"}, {Type: corev1.NodeHostName, Address: "n2"}}
	in.Services = []corev1.Service{in.Services[0], svc("b", "cip", "10.96.0.6", corev1.ServiceTypeClusterIP, 0)}
	in.Links = nil
	plan = Desired(in)
	if len(plan.State.Networks) != 1 || plan.State.Networks[0].Name != "a_udn" || fmt.Sprint(plan.State.Networks[0].Remotes) != "[192.168.100.1]" {
		t.Fatalf("node without pods: networks %+v, want a_udn only, with node 1 as remote", plan.State.Networks)
	}
	if len(plan.State.Services) != 1 || plan.State.Services[0].NodePort != 30080 || fmt.Sprint(plan.State.Services[0].Endpoints) != "[10.1.1.2:80]" {
		t.Errorf("node without pods: services %+v", plan.State.Services)
	}
	// Tenants are kept off node ports at every node's address.
	if got := fmt.Sprint(plan.State.NodeAddrs); got != "[192.168.100.1 192.168.100.2 203.0.113.77]" {
		t.Errorf("node addresses %s, want both VTEPs and node 2's external IP", got)
	}
	macs := map[string]string{}
	for _, m := range plan.State.RemoteMACs {
		macs[m.MAC.String()] = m.VTEP.String()
	}
	if macs["0a:58:0a:01:01:02"] != "192.168.100.1" || macs["0a:58:64:58:00:01"] != "192.168.100.1" {
		t.Errorf("node without pods: remote MACs %v lack e1's and node 1's service MAC at node 1", macs)
	}
	if err := datapath.Validate(plan.State); err != nil {
		t.Error(err)
	}

	// externalTrafficPolicy Local: each node's local endpoints, none on
	// node 2; the cluster IP keeps them all.
	in.Services[0].Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	for _, x := range []struct{ node, local string }{{"n2", "[]"}, {"n1", "[10.1.1.2:80]"}} {
		in.Node, in.Links = x.node, nil
		if x.node == "n1" {
			in.Links = links(e1)
		}
		plan = Desired(in)
		if len(plan.State.Services) == 0 {
			t.Fatalf("%s: no services (problems %v)", x.node, plan.Problems)
		}
		sv := plan.State.Services[0]
		if !sv.ExternalLocal || fmt.Sprint(sv.LocalEndpoints) != x.local || fmt.Sprint(sv.Endpoints) != "[10.1.1.2:80]" {
			t.Errorf("%s, externalTrafficPolicy Local: external local %v, local endpoints %v, endpoints %v; want true, %s, [10.1.1.2:80]",
				x.node, sv.ExternalLocal, sv.LocalEndpoints, sv.Endpoints, x.local)
		}
		if err := datapath.Validate(plan.State); err != nil {
			t.Errorf("%s: %v", x.node, err)
		}
	}
}

// TestDesiredClusterServices: a primary network's router gets the cluster
// DNS and API server Services of the default network, reached through
// the node, with the ready endpoints of their EndpointSlices for the
// port's name and protocol and the cluster IP's family; an endpoint inside
// the network's subnet is a problem; other default-network Services are
// not reachable; DHCP hands out the cluster DNS with the search list.
func TestDesiredClusterServices(t *testing.T) {
	e1 := pod("a", "e1", "n1", "10.1.1.2", "0a:58:0a:01:01:02", time.Hour)
	ready := func(b bool) discoveryv1.EndpointConditions { return discoveryv1.EndpointConditions{Ready: &b} }
	slice := func(ns, svc string, fam discoveryv1.AddressType, port string, proto corev1.Protocol, num int32, eps ...discoveryv1.Endpoint) discoveryv1.EndpointSlice {
		return discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: svc + "-x", Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
			AddressType: fam, Endpoints: eps, Ports: []discoveryv1.EndpointPort{{Name: &port, Protocol: &proto, Port: &num}}}
	}
	svc := func(ns, name, ip string, ports ...corev1.ServicePort) corev1.Service {
		return corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: corev1.ServiceSpec{ClusterIP: ip, ClusterIPs: []string{ip}, Ports: ports}}
	}
	in := Input{
		Node:  "n1",
		NADs:  []nadv1.NetworkAttachmentDefinition{primaryNAD("a", "7")},
		Pods:  []corev1.Pod{e1},
		Nodes: []corev1.Node{kvnode("n1", "192.168.100.1")},
		Links: links(e1),
		DNS:   []netip.Addr{netip.MustParseAddr("192.0.2.53")},
		Services: []corev1.Service{
			svc("kube-system", "kube-dns", "10.96.0.10", corev1.ServicePort{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP},
				corev1.ServicePort{Name: "dns-tcp", Port: 53, Protocol: corev1.ProtocolTCP}),
			svc("default", "kubernetes", "10.96.0.1", corev1.ServicePort{Name: "https", Port: 443}),
			svc("kube-system", "metrics", "10.96.0.20", corev1.ServicePort{Port: 443}),
		},
		EndpointSlices: []discoveryv1.EndpointSlice{
			slice("kube-system", "kube-dns", discoveryv1.AddressTypeIPv4, "dns", corev1.ProtocolUDP, 5353,
				discoveryv1.Endpoint{Addresses: []string{"10.244.0.5"}},
				discoveryv1.Endpoint{Addresses: []string{"10.244.1.9"}, Conditions: ready(false)},
				discoveryv1.Endpoint{Addresses: []string{"10.1.1.77"}, Conditions: ready(true)}),
			slice("kube-system", "kube-dns", discoveryv1.AddressTypeIPv4, "dns-tcp", corev1.ProtocolTCP, 5353,
				discoveryv1.Endpoint{Addresses: []string{"10.244.0.5"}}),
			slice("kube-system", "kube-dns", discoveryv1.AddressTypeIPv6, "dns", corev1.ProtocolUDP, 5353,
				discoveryv1.Endpoint{Addresses: []string{"fd00:244::5"}}),
			slice("default", "kubernetes", discoveryv1.AddressTypeIPv4, "https", corev1.ProtocolTCP, 6443,
				discoveryv1.Endpoint{Addresses: []string{"192.168.100.10"}}),
			slice("kube-system", "metrics", discoveryv1.AddressTypeIPv4, "", corev1.ProtocolTCP, 4443,
				discoveryv1.Endpoint{Addresses: []string{"10.244.0.8"}}),
		},
	}
	in.Nodes[0].Annotations[nodeid.Annotation] = "1"
	// The default network's pod subnets, as the nodes' pod CIDRs say.
	in.Nodes[0].Spec.PodCIDRs = []string{"10.244.0.0/24", "fd00:244::/64"}
	in.Nodes = append(in.Nodes, corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "other"}, Spec: corev1.NodeSpec{PodCIDR: "10.244.1.0/24"}})
	// And its pools beyond them (--default-network-cidrs; one repeats a
	// node's pod CIDR).
	in.DefaultNetworkCIDRs = []netip.Prefix{netip.MustParsePrefix("192.168.0.0/16"), netip.MustParsePrefix("fd00:10::/56"), netip.MustParsePrefix("10.244.1.0/24")}
	in.ServiceCIDRs = []netip.Prefix{netip.MustParsePrefix("fd00:96::/108"), netip.MustParsePrefix("10.96.0.0/12"), netip.MustParsePrefix("10.96.0.0/12")}
	plan := Desired(in)
	if n := plan.State.Networks; len(n) != 1 || fmt.Sprint(n[0].DefaultNetworkSubnets) != "[10.244.0.0/24 10.244.1.0/24 192.168.0.0/16]" {
		t.Errorf("default network subnets of the IPv4 network: %+v, want both nodes' IPv4 pod CIDRs and the IPv4 pool, once each", n)
	}
	var got []string
	for _, s := range plan.State.Services {
		got = append(got, fmt.Sprintf("%s %s %s %s via node %v %v", s.Network, s.Name, s.Protocol, s.VIP, s.ViaNode, s.Endpoints))
	}
	// The IPv4 network keeps the IPv4 range, once.
	if n := plan.State.Networks; len(n) != 1 || fmt.Sprint(n[0].ServiceCIDRs) != "[10.96.0.0/12]" {
		t.Errorf("service CIDRs of the network: %+v", n)
	}
	want := []string{
		"a_udn kube-system/kube-dns:dns UDP 10.96.0.10:53 via node true [10.244.0.5:5353]",
		"a_udn kube-system/kube-dns:dns-tcp TCP 10.96.0.10:53 via node true [10.244.0.5:5353]",
		"a_udn default/kubernetes:https TCP 10.96.0.1:443 via node true [192.168.100.10:6443]",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("services:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if want := "Service kube-system/kube-dns:dns: endpoint 10.1.1.77:5353 is inside network a_udn's subnet 10.1.1.0/24: unreachable from it"; len(plan.Problems) != 1 || plan.Problems[0] != want {
		t.Errorf("problems %q, want only %q", plan.Problems, want)
	}
	if len(plan.State.Networks) != 1 || len(plan.State.Networks[0].ServiceAddrs) != 0 {
		t.Errorf("networks %+v: a router with only services through the node needs no service port", plan.State.Networks)
	}
	if err := datapath.Validate(plan.State); err != nil {
		t.Error(err)
	}
	var leases []string
	for _, d := range plan.DHCP {
		for _, l := range d.Leases {
			leases = append(leases, fmt.Sprintf("%v %v", l.DNS, l.Search))
		}
	}
	if want := "[10.96.0.10] [a.svc.cluster.local svc.cluster.local cluster.local]"; len(leases) != 1 || leases[0] != want {
		t.Errorf("leases %q, want %q", leases, want)
	}
	// Another cluster DNS Service configured: kube-dns is no more reached,
	// and DHCP hands out the node's DNS servers.
	in.ClusterDNS = types.NamespacedName{Namespace: "openshift-dns", Name: "dns-default"}
	plan = Desired(in)
	if len(plan.State.Services) != 1 || plan.State.Services[0].Name != "default/kubernetes:https" {
		t.Errorf("with another cluster DNS: services %+v", plan.State.Services)
	}
	for _, d := range plan.DHCP {
		for _, l := range d.Leases {
			if fmt.Sprint(l.DNS) != "[192.0.2.53]" || len(l.Search) != 0 {
				t.Errorf("with another cluster DNS: lease DNS %v search %v", l.DNS, l.Search)
			}
		}
	}
}

// TestNodeAddrClaimsUndo: claims given back (their network was refused)
// go to the next Service that makes them.
func TestNodeAddrClaimsUndo(t *testing.T) {
	lb := netip.MustParseAddr("203.0.113.5")
	mk := func(network, name string) []datapath.Service {
		return []datapath.Service{{Network: network, Name: name, Protocol: "TCP", VIP: netip.MustParseAddrPort("10.96.0.1:80"),
			NodePort: 30080, External: []netip.Addr{lb}}}
	}
	var problems []string
	problem := func(f string, a ...any) { problems = append(problems, fmt.Sprintf(f, a...)) }
	c := newNodeAddrClaims()
	undo := c.admit(mk("a", "a/lb:80"), problem)
	undo()
	b := mk("b", "b/lb:80")
	c.admit(b, problem)
	if len(problems) != 0 || b[0].NodePort != 30080 || len(b[0].External) != 1 {
		t.Errorf("after the first network's claims went back: %+v, problems %v", b[0], problems)
	}
	again := mk("a", "a/lb:80")
	c.admit(again, problem)
	if len(problems) != 1 || again[0].NodePort != 0 || again[0].External != nil {
		t.Errorf("a second claim of b's node port: %+v, problems %v", again[0], problems)
	}
}
