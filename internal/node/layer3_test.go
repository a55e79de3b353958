package node

import (
	"fmt"
	"net/netip"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	nadv1 "kvnet.io/kvnet/api/k8scni/v1"
	"kvnet.io/kvnet/internal/hostsubnet"
	"kvnet.io/kvnet/internal/nodeid"
	"kvnet.io/kvnet/internal/podnetworks"
	"kvnet.io/kvnet/internal/portalias"
)

// l3node is a node with a VTEP, node ID id and host subnet
// 10.100.<id>.0/24 of network a_l3.
func l3node(name string, id int) corev1.Node {
	n := kvnode(name, fmt.Sprintf("192.168.100.%d", id))
	n.Annotations[nodeid.Annotation] = strconv.Itoa(id)
	n.Annotations[hostsubnet.Annotation] = fmt.Sprintf(`{"a_l3":["10.100.%d.0/24"]}`, id)
	return n
}

func l3pod(name, node, ip string) corev1.Pod {
	a := netip.MustParseAddr(ip).As4()
	return corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: name, Labels: map[string]string{"app": "web"}, CreationTimestamp: metav1.NewTime(time.Unix(1e9, 0)),
			Annotations: map[string]string{podnetworks.Annotation: fmt.Sprintf(
				`{"a/l3":{"ip_addresses":["%s/24"],"mac_address":"0a:58:%02x:%02x:%02x:%02x","gateway_ips":["10.100.%d.1"],"role":"primary","network":"a_l3"}}`,
				ip, a[0], a[1], a[2], a[3], a[2])}},
		Spec:   corev1.PodSpec{NodeName: node},
		Status: corev1.PodStatus{Phase: corev1.PodRunning},
	}
}

// TestDesiredLayer3: on a Layer3 network, the node's network holds its own
// host subnet with its router as gateway, an overlay address and MAC from
// its node ID, and a peer per other node with pods of the network (its
// VTEP, router address and MAC, host subnet); no remote MACs (nothing is
// bridged between nodes); DHCP serves from the host subnet's router; a
// Service's endpoints span nodes and its service port takes the join
// subnet (the overlay holds the transit subnet).
func TestDesiredLayer3(t *testing.T) {
	a1, a2, a3 := l3pod("a1", "n1", "10.100.1.5"), l3pod("a2", "n2", "10.100.2.5"), l3pod("a3", "n2", "10.100.2.6")
	in := Input{
		Node: "n1",
		NADs: []nadv1.NetworkAttachmentDefinition{nad("a", "l3",
			`{"cniVersion":"1.1.0","type":"kvnet-cni","name":"a_l3","netAttachDefName":"a/l3","topology":"layer3","role":"primary","subnets":"10.100.0.0/16/24","joinSubnet":"100.65.0.0/16"}`, "9")},
		Pods:  []corev1.Pod{a1, a2, a3},
		Nodes: []corev1.Node{l3node("n1", 1), l3node("n2", 2), l3node("n3", 3)},
		Links: map[string]string{},
		Services: []corev1.Service{{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "web"},
			Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.20", Selector: map[string]string{"app": "web"},
				Ports: []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080)}}}}},
		MTU: 1400,
	}
	in.Links = map[string]string{portalias.Format("a/a1", "a/l3"): "kvp0"}
	plan := Desired(in)
	if len(plan.Problems) != 0 || len(plan.Unserved) != 0 {
		t.Fatalf("problems %v unserved %v", plan.Problems, plan.Unserved)
	}
	if len(plan.State.Networks) != 1 {
		t.Fatalf("networks %+v", plan.State.Networks)
	}
	n := plan.State.Networks[0]
	if fmt.Sprint(n.Subnets) != "[10.100.1.0/24]" || fmt.Sprint(n.Gateways) != "[10.100.1.1]" || len(n.Remotes) != 0 || n.Layer3 == nil {
		t.Fatalf("network %+v", n)
	}
	l3 := n.Layer3
	if fmt.Sprint(l3.ClusterSubnets) != "[10.100.0.0/16]" || fmt.Sprint(l3.Addrs) != "[100.88.0.1/16 fd97::1/64]" || l3.MAC.String() != "0a:58:64:58:00:01" {
		t.Errorf("overlay %+v", l3)
	}
	if len(l3.Peers) != 1 {
		t.Fatalf("peers %+v, want n2 only (n3 has no pods of the network)", l3.Peers)
	}
	p := l3.Peers[0]
	if p.VTEP.String() != "192.168.100.2" || fmt.Sprint(p.Addrs) != "[100.88.0.2 fd97::2]" || p.MAC.String() != "0a:58:64:58:00:02" || fmt.Sprint(p.Subnets) != "[10.100.2.0/24]" {
		t.Errorf("peer %+v", p)
	}
	if len(plan.State.RemoteMACs) != 0 {
		t.Errorf("remote MACs on a routed network: %+v", plan.State.RemoteMACs)
	}
	if len(plan.State.Ports) != 1 || plan.State.Ports[0].HostIfName != "kvp0" {
		t.Errorf("ports %+v", plan.State.Ports)
	}
	if len(plan.DHCP) != 1 || plan.DHCP[0].ServerIP.String() != "10.100.1.1" {
		t.Errorf("DHCP %+v, want served by the host subnet's router 10.100.1.1", plan.DHCP)
	}
	if fmt.Sprint(n.ServiceAddrs) != "[100.65.0.1/16]" {
		t.Errorf("service addresses %v, want the join subnet's node address", n.ServiceAddrs)
	}
	if len(plan.State.Services) != 1 || fmt.Sprint(plan.State.Services[0].Endpoints) != "[10.100.1.5:8080 10.100.2.5:8080 10.100.2.6:8080]" {
		t.Errorf("services %+v", plan.State.Services)
	}

	// Without its host subnet yet the node refuses the network's pods with
	// the reason, and plans nothing of it.
	in.Nodes[0].Annotations[hostsubnet.Annotation] = `{}`
	plan = Desired(in)
	if len(plan.State.Networks) != 0 || plan.Unserved["a_l3"] == "" {
		t.Errorf("without a host subnet: networks %+v unserved %v", plan.State.Networks, plan.Unserved)
	}
}
