package node

import (
	"reflect"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	nadv1 "kvnet.io/kvnet/api/k8scni/v1"
	mnpv1beta1 "kvnet.io/kvnet/api/k8scni/v1beta1"
	"kvnet.io/kvnet/internal/netconf"
	"kvnet.io/kvnet/internal/physnet"
	"kvnet.io/kvnet/internal/reserved"
)

// inputObjects are the cluster's objects of an Input: what the Agent
// lists from its informers' caches without copying them.
type inputObjects struct {
	NADs            []nadv1.NetworkAttachmentDefinition
	Pods            []corev1.Pod
	Nodes           []corev1.Node
	Services        []corev1.Service
	EndpointSlices  []discoveryv1.EndpointSlice
	NetworkPolicies []networkingv1.NetworkPolicy
	Namespaces      []corev1.Namespace
	MNPs            []mnpv1beta1.MultiNetworkPolicy
}

func objectsOf(in Input) inputObjects {
	return inputObjects{in.NADs, in.Pods, in.Nodes, in.Services, in.EndpointSlices, in.NetworkPolicies, in.Namespaces, in.MultiNetworkPolicies}
}

// deepCopies returns deep copies of the objects of each list.
func (o inputObjects) deepCopies() inputObjects {
	return inputObjects{
		NADs: copyAll(o.NADs), Pods: copyAll(o.Pods), Nodes: copyAll(o.Nodes), Services: copyAll(o.Services),
		EndpointSlices: copyAll(o.EndpointSlices), NetworkPolicies: copyAll(o.NetworkPolicies), Namespaces: copyAll(o.Namespaces),
		MNPs: copyAll(o.MNPs),
	}
}

// copyAll deep-copies each item of list into a new slice.
func copyAll[T any, P interface {
	*T
	DeepCopyObject() runtime.Object
}](list []T) []T {
	if list == nil {
		return nil
	}
	out := make([]T, len(list))
	for i := range list {
		out[i] = *P(&list[i]).DeepCopyObject().(P)
	}
	return out
}

// TestDesiredLeavesItsInputUnchanged: the Agent hands Desired the objects
// of its informers' caches without a copy (client.UnsafeDisableDeepCopy),
// so Desired must not write to them, nor to anything they share (maps,
// slices): a write would change the cache under the informer and every
// later plan. After plans of inputs with every kind of object (policies,
// Services with node ports on Layer2 and Layer3 networks, cluster
// Services, localnet), every object deep-equals its copy from before.
func TestDesiredLeavesItsInputUnchanged(t *testing.T) {
	services := servicesBenchInput(t, servicesBenchParams{nodes: 20, networks: 10, pods: 400, services: 20, endpoints: 3, nodePorts: true,
		topology: func(i int) string {
			if i%2 == 1 {
				return netconf.TopologyLayer3
			}
			return netconf.TopologyLayer2
		}})
	// The cluster DNS Service, which primary networks reach through the
	// node by its EndpointSlice.
	dnsPort, udp, num := "dns", corev1.ProtocolUDP, int32(5353)
	services.Services = append(services.Services, corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "kube-dns"},
		Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.10", ClusterIPs: []string{"10.96.0.10"}, Ports: []corev1.ServicePort{{Name: dnsPort, Port: 53, Protocol: udp}}}})
	services.EndpointSlices = []discoveryv1.EndpointSlice{{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "kube-system", Name: "kube-dns-x", Labels: map[string]string{discoveryv1.LabelServiceName: "kube-dns"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"10.244.0.9"}}, {Addresses: []string{"10.244.0.5"}}},
		Ports:       []discoveryv1.EndpointPort{{Name: &dnsPort, Protocol: &udp, Port: &num}},
	}}
	mapped := kvnode("n1", "192.168.100.1")
	mapped.Annotations[physnet.BridgeMappingsAnnotation] = "physnet:br-phys"
	localnet := Input{Node: "n1",
		NADs:  []nadv1.NetworkAttachmentDefinition{localnetNAD("a", 0), localnetNAD("b", 0)},
		Pods:  []corev1.Pod{localnetPod("a", "p1", "n1", "192.168.50.11", "0a:58:c0:a8:32:0b"), localnetPod("b", "p2", "n2", "192.168.50.12", "0a:58:c0:a8:32:0c")},
		Nodes: []corev1.Node{mapped, kvnode("n2", "192.168.100.2")},
		Links: map[string]string{"kvnet:a/p1:a/ln": "kvp1"},
		// A MultiNetworkPolicy for a/ln isolating p1 but from p2's app.
		MultiNetworkPolicies: []mnpv1beta1.MultiNetworkPolicy{{
			ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "mnp", Annotations: map[string]string{mnpv1beta1.PolicyForAnnotation: "ln"}},
			Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{},
				Ingress:     []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "192.168.50.0/24", Except: []string{"192.168.50.12/32"}}}}}},
				PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}},
		}},
	}
	for name, in := range map[string]Input{"policies": policyBenchInput(), "services": services, "localnet": localnet} {
		t.Run(name, func(t *testing.T) {
			before := objectsOf(in).deepCopies()
			in.Annotations, in.NetConfs = &AnnotationCache{}, &NetConfCache{}
			for range 2 { // the second plan from the memos
				plan := Desired(in)
				if len(plan.State.Networks) == 0 || len(plan.State.Policies) == 0 && (len(in.NetworkPolicies) > 0 || len(in.MultiNetworkPolicies) > 0) {
					t.Fatalf("plan with %d networks and %d isolated ports (problems %q): the input does not exercise Desired", len(plan.State.Networks), len(plan.State.Policies), plan.Problems)
				}
			}
			after := objectsOf(in)
			bv, av := reflect.ValueOf(before), reflect.ValueOf(after)
			for i := range bv.NumField() {
				if !reflect.DeepEqual(bv.Field(i).Interface(), av.Field(i).Interface()) {
					t.Errorf("Desired changed its input's %s", bv.Type().Field(i).Name)
				}
			}
		})
	}
}

// TestNetConfCacheFollowsChanges: with the Agent's memo of parsed NAD
// configurations, every plan equals the plan without it, through a NAD's
// config changing, a NAD removed and back, a bad NAD (its problem
// reported on every plan, not only the first) and the cluster's reserved
// subnets changing (a primary network's join subnet follows them).
func TestNetConfCacheFollowsChanges(t *testing.T) {
	p1 := pod("a", "p1", "n1", "10.1.1.2", "0a:58:0a:01:01:02", time.Hour)
	in := Input{Node: "n1",
		NADs:  []nadv1.NetworkAttachmentDefinition{primaryNAD("a", "7"), primaryNAD("b", "8"), nad("c", "bad", `{"type":"kvnet-cni","name":"c_bad","topology":"ring"}`, "9")},
		Pods:  []corev1.Pod{p1},
		Nodes: []corev1.Node{kvnode("n1", "192.168.100.1")},
		Links: links(p1),
	}
	memo := &NetConfCache{}
	check := func(step string) Plan {
		t.Helper()
		cached := in
		cached.NetConfs = memo
		got, want := Desired(cached), Desired(in)
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%s: plan with the memo\n%+v\nwant\n%+v", step, got, want)
		}
		return got
	}
	plan := check("first plan")
	if len(plan.Problems) != 1 || !strings.Contains(plan.Problems[0], "c/bad") {
		t.Fatalf("problems %q, want c/bad's", plan.Problems)
	}
	plan = check("same input")
	if len(plan.Problems) != 1 {
		t.Errorf("second plan's problems %q: the bad NAD's is reported every time", plan.Problems)
	}
	if len(memo.m) != 3 {
		t.Errorf("memo holds %d configurations, want 3", len(memo.m))
	}
	// The configuration the memo hands a plan, primary network a's.
	confOf := func() netconf.NetConf {
		t.Helper()
		cached := in
		cached.NetConfs = memo
		nets, _ := newPlanner(cached).networks()
		n := nets["a_udn"]
		if n == nil {
			t.Fatalf("no network a_udn in %v", nets)
		}
		return *n.conf
	}
	before := confOf()
	if before.JoinSubnet != reserved.DefaultJoin || before.TransitSubnet != reserved.DefaultTransit {
		t.Fatalf("a_udn's join and transit subnets %q and %q, want the defaults", before.JoinSubnet, before.TransitSubnet)
	}

	in.NADs[0].Spec.Config = strings.Replace(in.NADs[0].Spec.Config, "10.1.1.0/24", "10.1.0.0/16", 1)
	check("a's subnet changed")
	in.NADs = in.NADs[1:]
	check("a's NAD removed")
	if len(memo.m) != 2 {
		t.Errorf("memo holds %d configurations after a NAD went, want 2", len(memo.m))
	}
	in.NADs = append(in.NADs, primaryNAD("a", "7"))
	check("a's NAD back")

	r, err := reserved.Parse(reserved.DefaultMasquerade, "100.66.0.0/16,fd98::/64", reserved.DefaultTransit)
	if err != nil {
		t.Fatal(err)
	}
	in.Reserved = r
	check("reserved subnets changed")
	if after := confOf(); after.JoinSubnet != "100.66.0.0/16,fd98::/64" {
		t.Errorf("a_udn's join subnet %q after the reserved subnets changed, want 100.66.0.0/16,fd98::/64", after.JoinSubnet)
	}
}
