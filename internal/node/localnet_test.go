package node

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	nadv1 "kvnet.io/kvnet/api/k8scni/v1"
	"kvnet.io/kvnet/internal/datapath"
	"kvnet.io/kvnet/internal/physnet"
	"kvnet.io/kvnet/internal/podnetworks"
	"kvnet.io/kvnet/internal/udn"
)

// localnetNAD is a CUDN's localnet NAD in namespace ns.
func localnetNAD(ns string, vlan int) nadv1.NetworkAttachmentDefinition {
	v := ""
	if vlan != 0 {
		v = fmt.Sprintf(`,"vlanID":%d`, vlan)
	}
	return nad(ns, "ln", fmt.Sprintf(`{"cniVersion":"1.1.0","type":"kvnet-cni","name":"cluster_udn_ln","netAttachDefName":"%s/ln","topology":"localnet","role":"secondary","subnets":"192.168.50.0/24","mtu":1500,"physicalNetworkName":"physnet"%s}`, ns, v), "30")
}

// localnetPod is a pod on node with one attachment to <ns>/ln.
func localnetPod(ns, name, node, ip, mac string) corev1.Pod {
	p := pod(ns, name, node, ip, mac, time.Hour)
	p.Annotations[podnetworks.Annotation] = fmt.Sprintf(`{"%s/ln":{"ip_addresses":["%s/24"],"mac_address":"%s","role":"secondary","network":"cluster_udn_ln"}}`, ns, ip, mac)
	return p
}

func TestDesiredLocalnet(t *testing.T) {
	p1 := localnetPod("a", "p1", "n1", "192.168.50.11", "0a:58:c0:a8:32:0b")
	p2 := localnetPod("b", "p2", "n2", "192.168.50.12", "0a:58:c0:a8:32:0c")
	mapped := func(name string, missing string) corev1.Node {
		n := kvnode(name, "192.168.100.1")
		n.Annotations[physnet.BridgeMappingsAnnotation] = "physnet:br-phys"
		if missing != "" {
			n.Annotations[physnet.MissingKernelFeaturesAnnotation] = missing
		}
		return n
	}
	in := func(vlan int, self corev1.Node) Input {
		return Input{
			Node:  "n1",
			NADs:  []nadv1.NetworkAttachmentDefinition{localnetNAD("a", vlan), localnetNAD("b", vlan)},
			Pods:  []corev1.Pod{p1, p2},
			Nodes: []corev1.Node{self, kvnode("n2", "192.168.100.2")},
			Links: map[string]string{"kvnet:a/p1:a/ln": "kvp1"},
		}
	}

	plan := Desired(in(0, mapped("n1", "")))
	if len(plan.Problems) != 0 || len(plan.Unserved) != 0 {
		t.Fatalf("problems %v, unserved %v", plan.Problems, plan.Unserved)
	}
	if len(plan.State.Networks) != 1 {
		t.Fatalf("networks %+v", plan.State.Networks)
	}
	n := plan.State.Networks[0]
	if n.Name != "cluster_udn_ln" || n.ID != 30 || n.Physical != "br-phys" || n.VLAN != 0 || n.MTU != 1500 || n.Primary || len(n.Remotes) != 0 {
		t.Errorf("network %+v: want localnet 30 on br-phys, MTU 1500, no remotes", n)
	}
	if len(plan.State.Ports) != 1 || plan.State.Ports[0].HostIfName != "kvp1" || fmt.Sprint(plan.State.Ports[0].IPs) != "[192.168.50.11/24]" {
		t.Errorf("ports %+v", plan.State.Ports)
	}
	if len(plan.State.RemoteMACs) != 0 || len(plan.DHCP) != 0 {
		t.Errorf("remote MACs %+v, DHCP %+v: the physical network learns MACs and serves its own DHCP", plan.State.RemoteMACs, plan.DHCP)
	}
	if err := datapath.Validate(plan.State); err != nil {
		t.Error(err)
	}

	// VLAN on a node with 8021q: tagged.
	plan = Desired(in(100, mapped("n1", "")))
	if len(plan.State.Networks) != 1 || plan.State.Networks[0].VLAN != 100 || len(plan.Unserved) != 0 {
		t.Errorf("vlan 100: networks %+v, unserved %v", plan.State.Networks, plan.Unserved)
	}

	// Not attachable here: no network, no port, and a reason for kvnet-cni.
	for _, tc := range []struct {
		name string
		in   Input
		want string
	}{
		{"no mapping", in(0, kvnode("n1", "192.168.100.1")), `node n1 has no bridge for physical network "physnet": add "physnet:<bridge>" to its annotation kvnet.io/bridge-mappings`},
		{"no 8021q", in(100, mapped("n1", "8021q")), "vlan.access.id 100 needs 802.1Q VLAN links (the Linux kernel module 8021q), which node n1 lacks"},
	} {
		plan := Desired(tc.in)
		if !strings.Contains(plan.Unserved["cluster_udn_ln"], tc.want) || len(plan.Unserved) != 1 {
			t.Errorf("%s: unserved %v, want %q", tc.name, plan.Unserved, tc.want)
		}
		if len(plan.State.Networks) != 0 || len(plan.State.Ports) != 0 || len(plan.Problems) != 0 {
			t.Errorf("%s: state %+v, problems %v", tc.name, plan.State, plan.Problems)
		}
	}

	// A bad mappings annotation is a problem naming it, and the reason
	// kvnet-cni gives.
	bad := mapped("n1", "")
	bad.Annotations[physnet.BridgeMappingsAnnotation] = "physnet"
	plan = Desired(in(0, bad))
	if len(plan.Problems) != 1 || !strings.Contains(plan.Problems[0], "node n1: annotation kvnet.io/bridge-mappings") ||
		!strings.Contains(plan.Unserved["cluster_udn_ln"], `its annotation kvnet.io/bridge-mappings is invalid: invalid bridge mappings: entry 0 "physnet"`) {
		t.Errorf("problems %v, unserved %v", plan.Problems, plan.Unserved)
	}

	// The mapped bridge must exist on the node (as a bridge).
	noBridge := in(0, mapped("n1", ""))
	noBridge.Bridges = map[string]bool{"br-other": true}
	plan = Desired(noBridge)
	if want := `node n1 maps physical network "physnet" to "br-phys", which is not a Linux bridge there`; !strings.Contains(plan.Unserved["cluster_udn_ln"], want) || len(plan.State.Networks) != 0 {
		t.Errorf("unserved %v, networks %+v; want %q", plan.Unserved, plan.State.Networks, want)
	}
	withBridge := in(0, mapped("n1", ""))
	withBridge.Bridges = map[string]bool{"br-phys": true}
	if plan = Desired(withBridge); len(plan.State.Networks) != 1 || len(plan.Unserved) != 0 {
		t.Errorf("with br-phys present: networks %+v, unserved %v", plan.State.Networks, plan.Unserved)
	}
}

// TestDesiredLocalnetBadNADs: a localnet NAD the datapath would refuse (an
// MTU out of its range, a primary role) is a problem and left out, and the
// node's other networks are still planned; without an MTU the network
// gets localnet's 1500, not the tunnel MTU.
func TestDesiredLocalnetBadNADs(t *testing.T) {
	node := kvnode("n1", "192.168.100.1")
	node.Annotations[physnet.BridgeMappingsAnnotation] = "physnet:br-phys"
	conf := func(ns, extra string) nadv1.NetworkAttachmentDefinition {
		return nad(ns, "ln", fmt.Sprintf(`{"cniVersion":"1.1.0","type":"kvnet-cni","name":"%s_ln","netAttachDefName":"%s/ln","topology":"localnet","subnets":"192.168.50.0/24","physicalNetworkName":"physnet"%s}`, ns, ns, extra), map[string]string{"small": "31", "prim": "32", "nomtu": "33"}[ns])
	}
	lpod := func(ns, name, ip, mac string) corev1.Pod {
		p := pod(ns, name, "n1", ip, mac, time.Hour)
		p.Annotations[podnetworks.Annotation] = fmt.Sprintf(`{"%s/ln":{"ip_addresses":["%s/24"],"mac_address":"%s","role":"secondary","network":"%s_ln"}}`, ns, ip, mac, ns)
		return p
	}
	good := pod("a", "a1", "n1", "10.1.1.2", "0a:58:0a:01:01:02", time.Hour)
	pods := []corev1.Pod{good, lpod("small", "s1", "192.168.50.10", "0a:58:c0:a8:32:0a"), lpod("prim", "p1", "192.168.50.11", "0a:58:c0:a8:32:0b"), lpod("nomtu", "n1", "192.168.50.12", "0a:58:c0:a8:32:0c")}
	plan := Desired(Input{
		Node:  "n1",
		NADs:  []nadv1.NetworkAttachmentDefinition{primaryNAD("a", "7"), conf("small", `,"role":"secondary","mtu":100`), conf("prim", `,"role":"primary"`), conf("nomtu", `,"role":"secondary"`)},
		Pods:  pods,
		Nodes: []corev1.Node{node},
		Links: links(good),
	})
	all := strings.Join(plan.Problems, "\n")
	for _, want := range []string{`network small_ln: invalid datapath state: network "small_ln": mtu 100 out of range 576-65535`, `NAD prim/ln: a localnet network cannot be primary`} {
		if !strings.Contains(all, want) {
			t.Errorf("problems lack %q:\n%s", want, all)
		}
	}
	var names []string
	for _, n := range plan.State.Networks {
		names = append(names, n.Name)
		if n.Name == "nomtu_ln" && n.MTU != 1500 {
			t.Errorf("localnet network without an MTU gets %d, want 1500", n.MTU)
		}
	}
	if fmt.Sprint(names) != "[a_udn nomtu_ln]" {
		t.Errorf("networks %v, want the good ones: [a_udn nomtu_ln]", names)
	}
	if err := datapath.Validate(plan.State); err != nil {
		t.Errorf("the plan is still refused: %v", err)
	}
}

// TestDesiredLocalnetDefaultAndConflict: a hand-written localnet NAD
// without "physicalNetworkName" is attached to the physical network of
// its network name; a NAD kvnet-controller refused for disagreeing with
// the network's first NAD (kvnet.io/network-conflict) is left out, the
// first defining the network.
func TestDesiredLocalnetDefaultAndConflict(t *testing.T) {
	self := kvnode("n1", "192.168.100.1")
	self.Annotations[physnet.BridgeMappingsAnnotation] = "cluster_udn_ln:br-blue"
	noPhys := func(ns string, vlan int) nadv1.NetworkAttachmentDefinition {
		n := localnetNAD(ns, vlan)
		n.Spec.Config = strings.Replace(n.Spec.Config, `,"physicalNetworkName":"physnet"`, "", 1)
		return n
	}
	refused := noPhys("b", 7)
	refused.Annotations[udn.NetworkConflictAnnotation] = "does not match"
	p1 := localnetPod("a", "p1", "n1", "192.168.50.11", "0a:58:c0:a8:32:0b")
	for _, nads := range [][]nadv1.NetworkAttachmentDefinition{{noPhys("a", 0), refused}, {refused, noPhys("a", 0)}} {
		plan := Desired(Input{Node: "n1", NADs: nads, Pods: []corev1.Pod{p1}, Nodes: []corev1.Node{self},
			Links: map[string]string{"kvnet:a/p1:a/ln": "kvp1"}})
		if len(plan.Problems) != 0 || len(plan.Unserved) != 0 || len(plan.State.Networks) != 1 {
			t.Fatalf("problems %v, unserved %v, networks %+v", plan.Problems, plan.Unserved, plan.State.Networks)
		}
		if n := plan.State.Networks[0]; n.Physical != "br-blue" || n.VLAN != 0 {
			t.Errorf("network %+v: want br-blue (the network name's mapping), untagged (the refused NAD's VLAN ignored)", n)
		}
	}
}
