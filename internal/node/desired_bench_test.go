package node

import (
	"fmt"
	"net/netip"
	"reflect"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"

	"kvnet.io/kvnet/internal/hostsubnet"
	"kvnet.io/kvnet/internal/netconf"
	"kvnet.io/kvnet/internal/nodeid"
	"kvnet.io/kvnet/internal/podnetworks"
	"kvnet.io/kvnet/internal/portalias"
)

// The cluster of the Desired benchmarks: 100 nodes, 10,000 pods on 50
// primary networks; the plan is node n0's.
const benchNodes, benchNetworks, benchPods = 100, 50, 10000

// benchPod returns the parameters of pod i of the benchmark cluster: its
// namespace, node, host index on its network's subnet and MAC.
func benchPod(i int) (ns, node string, host int, mac string) {
	host = i / benchNetworks % 200
	return fmt.Sprintf("t%d", i%benchNetworks), fmt.Sprintf("n%d", i/benchNetworks%benchNodes),
		host, fmt.Sprintf("0a:58:0a:01:%02x:%02x", host>>8, host&0xff)
}

// desiredBenchInput returns the input of the benchmark cluster, with the
// Agent's memoisation (gateways, annotation cache) in place.
func desiredBenchInput() Input {
	in := Input{Node: "n0", Links: map[string]string{}}
	for i := range benchNetworks {
		in.NADs = append(in.NADs, primaryNAD(fmt.Sprintf("t%d", i), fmt.Sprint(i+1)))
	}
	for i := range benchNodes {
		in.Nodes = append(in.Nodes, kvnode(fmt.Sprintf("n%d", i), fmt.Sprintf("192.168.%d.%d", i/250, i%250+1)))
	}
	for i := range benchPods {
		ns, node, host, mac := benchPod(i)
		p := pod(ns, fmt.Sprintf("p%d", i), node, fmt.Sprintf("10.1.1.%d", host+2), mac, time.Hour)
		p.UID = types.UID(fmt.Sprintf("uid-%d", i))
		in.Pods = append(in.Pods, p)
		if p.Spec.NodeName == in.Node {
			for alias := range links(p) {
				in.Links[alias] = fmt.Sprintf("kvp%d", i)
			}
		}
	}
	in.Gateways = (&Agent{}).gateways
	in.Annotations = &AnnotationCache{} // as the Agent does: after the first plan, only changed pods are parsed
	in.NetConfs = &NetConfCache{}       // and only changed NADs
	return in
}

// BenchmarkDesired10kPods: the plan of one node in a cluster of 100 nodes
// and 10,000 pods on 50 primary networks when nothing changed since the
// last plan: every annotation is a hit of the AnnotationCache, the best
// case. BenchmarkDesired10kPodsChurn measures plans after changes. The
// cache is filled before the timed loop, so that the cold first plan is
// not averaged in.
func BenchmarkDesired10kPods(b *testing.B) {
	benchSteadyPlans(b, desiredBenchInput())
}

// benchSteadyPlans times plans of in after a first one (which fills the
// caches), reporting the plan's ports and remote MACs; a problem fails.
func benchSteadyPlans(b *testing.B, in Input) {
	plan := Desired(in)
	for b.Loop() {
		plan = Desired(in)
	}
	b.ReportMetric(float64(len(plan.State.Ports)), "ports")
	b.ReportMetric(float64(len(plan.State.RemoteMACs)), "remote-macs")
	if len(plan.Problems) > 0 {
		b.Fatal(plan.Problems)
	}
}

// BenchmarkDesired10kPodsChurn is BenchmarkDesired10kPods with pods
// changing between plans, as an agent sees in a live cluster (what every
// agent computes on each event). Before each plan, churn% of the pods
// change, in turn: half get a new kvnet.io/pod-networks value (a changed
// allocation: same pod, new IP), half are deleted and replaced by a new
// pod (new name and UID, same node; a local one gets its host interface
// too). Changed and new pods miss the AnnotationCache, and deleted ones
// leave it, so this measures what a plan costs when the memo does not
// answer everything; churn=100% is a plan with a cold cache. The changes
// are made with the timer stopped. At the end, the last plan must equal
// one computed without the cache.
func BenchmarkDesired10kPodsChurn(b *testing.B) {
	for _, pct := range []int{1, 10, 100} {
		b.Run(fmt.Sprintf("churn=%d%%", pct), func(b *testing.B) { benchDesiredChurn(b, pct) })
	}
}

func benchDesiredChurn(b *testing.B, pct int) {
	in := desiredBenchInput()
	// The two allocations each pod alternates between.
	var annA, annB []string
	for i := range benchPods {
		ns, node, host, mac := benchPod(i)
		annA = append(annA, in.Pods[i].Annotations[podnetworks.Annotation])
		annB = append(annB, pod(ns, "", node, fmt.Sprintf("10.1.2.%d", host+2), mac, 0).Annotations[podnetworks.Annotation])
	}
	gen := make([]int, benchPods) // changes made to pod i so far
	next := 0                     // the next pod to change
	perPlan := benchPods * pct / 100
	churn := func() {
		for range perPlan {
			i := next
			next = (next + 1) % benchPods
			gen[i]++
			p := &in.Pods[i]
			if (i+gen[i])%2 == 0 {
				// A changed allocation of the same pod.
				if p.Annotations[podnetworks.Annotation] == annA[i] {
					p.Annotations[podnetworks.Annotation] = annB[i]
				} else {
					p.Annotations[podnetworks.Annotation] = annA[i]
				}
				continue
			}
			// The pod is deleted and a new one takes its place.
			oldAlias := portalias.Format(p.Namespace+"/"+p.Name, p.Namespace+"/udn")
			p.Name = fmt.Sprintf("p%d-%d", i, gen[i])
			p.UID = types.UID(fmt.Sprintf("uid-%d-%d", i, gen[i]))
			if ifName, ok := in.Links[oldAlias]; ok {
				delete(in.Links, oldAlias)
				in.Links[portalias.Format(p.Namespace+"/"+p.Name, p.Namespace+"/udn")] = ifName
			}
		}
	}
	plan := Desired(in) // fill the cache: every timed plan follows churn only
	for b.Loop() {
		b.StopTimer()
		churn()
		b.StartTimer()
		plan = Desired(in)
	}
	b.ReportMetric(float64(perPlan), "changed-pods/op")
	b.ReportMetric(float64(len(plan.State.Ports)), "ports")
	if len(plan.Problems) > 0 {
		b.Fatal(plan.Problems)
	}
	// The memoised plan after all that churn is the plan of the pods as
	// they are now.
	fresh := in
	fresh.Annotations = nil
	if want := Desired(fresh); !reflect.DeepEqual(plan, want) {
		for i := range min(len(plan.State.Ports), len(want.State.Ports)) {
			if g, w := plan.State.Ports[i], want.State.Ports[i]; !reflect.DeepEqual(g, w) {
				b.Fatalf("plan with the annotation cache after churn differs from a fresh plan: port %d is %+v, want %+v", i, g, w)
			}
		}
		b.Fatalf("plan with the annotation cache after churn differs from a fresh plan:\n%+v\nwant\n%+v", plan, want)
	}
}

// servicesBenchParams describes a cluster for the Services benchmarks:
// pods are spread over the networks and nodes as in desiredBenchInput
// (pod i is on network i%networks and node i/networks%nodes; its host
// index is its position on the network), and each network has
// services/networks Services, Service s selecting the endpoints pods of
// hosts s*endpoints … s*endpoints+endpoints-1, which are on consecutive
// nodes. The other pods run but serve no Service. The plan is node n0's.
type servicesBenchParams struct {
	nodes, networks, pods int
	services              int // over all networks, as many on each
	endpoints             int // pods selected by each Service
	// topology returns network i's topology, a key of benchTopologies;
	// nil: every network is layer2.
	topology func(network int) string
	// nodePorts makes every Service a NodePort one: its network is then on
	// every node, with every node as its peer.
	nodePorts bool
}

// benchTopology is how servicesBenchInput lays out a primary network of
// one topology: the NAD config of namespace ns's network, and the
// address (with prefix length) and gateway of the pod with host index
// host on node nodeIdx, the local-th of the network there. A topology is
// benchmarked by adding its entry.
type benchTopology struct {
	conf  func(ns string) string
	podIP func(nodeIdx, host, local int) (ip, gateway string)
}

var benchTopologies = map[string]benchTopology{
	netconf.TopologyLayer2: {
		conf: func(ns string) string {
			return fmt.Sprintf(`{"cniVersion":"1.1.0","type":"kvnet-cni","name":"%s_udn","netAttachDefName":"%s/udn","topology":"layer2","role":"primary","subnets":"10.1.0.0/16"}`, ns, ns)
		},
		podIP: func(_, host, _ int) (string, string) {
			return fmt.Sprintf("10.1.%d.%d/16", (host+2)>>8, (host+2)&0xff), "10.1.0.1"
		},
	},
	// Layer3: node k holds host subnet 10.128.k.0/24 of every Layer3
	// network (servicesBenchInput writes the nodes' annotations).
	netconf.TopologyLayer3: {
		conf: func(ns string) string {
			return fmt.Sprintf(`{"cniVersion":"1.1.0","type":"kvnet-cni","name":"%s_udn","netAttachDefName":"%s/udn","topology":"layer3","role":"primary","subnets":"10.128.0.0/16/24"}`, ns, ns)
		},
		podIP: func(nodeIdx, _, local int) (string, string) {
			return fmt.Sprintf("10.128.%d.%d/24", nodeIdx, local+3), fmt.Sprintf("10.128.%d.1", nodeIdx)
		},
	},
}

// servicesBenchInput returns the input of the cluster p describes, with
// the Agent's memoisation (gateways, annotation cache) in place.
func servicesBenchInput(tb testing.TB, p servicesBenchParams) Input {
	tb.Helper()
	if p.topology == nil {
		p.topology = func(int) string { return netconf.TopologyLayer2 }
	}
	perNet := p.services / p.networks
	if perNet*p.endpoints > p.pods/p.networks {
		tb.Fatalf("%d Services of %d endpoints on a network of %d pods", perNet, p.endpoints, p.pods/p.networks)
	}
	topo := make([]benchTopology, p.networks)
	in := Input{Node: "n0", Links: map[string]string{}}
	for i := range p.networks {
		t, ok := benchTopologies[p.topology(i)]
		if !ok {
			tb.Fatalf("network %d: no generator for topology %q", i, p.topology(i))
		}
		topo[i] = t
		ns := fmt.Sprintf("t%d", i)
		in.NADs = append(in.NADs, nad(ns, "udn", t.conf(ns), fmt.Sprint(i+1)))
	}
	for i := range p.nodes {
		n := kvnode(fmt.Sprintf("n%d", i), fmt.Sprintf("192.168.%d.%d", i/250, i%250+1))
		n.Annotations[nodeid.Annotation] = fmt.Sprint(i + 1)
		subnets := hostsubnet.Subnets{}
		for k := range p.networks {
			if p.topology(k) == netconf.TopologyLayer3 {
				subnets[fmt.Sprintf("t%d_udn", k)] = []netip.Prefix{netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 128, byte(i), 0}), 24)}
			}
		}
		if len(subnets) > 0 {
			n.Annotations[hostsubnet.Annotation] = hostsubnet.Format(subnets)
		}
		in.Nodes = append(in.Nodes, n)
	}
	for i := range p.pods {
		network, nodeIdx, host := i%p.networks, i/p.networks%p.nodes, i/p.networks
		ns, mac := fmt.Sprintf("t%d", network), fmt.Sprintf("0a:58:0a:01:%02x:%02x", host>>8, host&0xff)
		ip, gw := topo[network].podIP(nodeIdx, host, host/p.nodes)
		pd := corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("p%d", i), UID: types.UID(fmt.Sprintf("uid-%d", i)),
				CreationTimestamp: metav1.NewTime(time.Unix(1e9, 0).Add(-time.Hour)),
				Labels:            map[string]string{"app": "none"},
				Annotations: map[string]string{podnetworks.Annotation: fmt.Sprintf(
					`{"%s/udn":{"ip_addresses":["%s"],"mac_address":"%s","gateway_ips":["%s"],"role":"primary","network":"%s_udn"}}`, ns, ip, mac, gw, ns)}},
			Spec:   corev1.PodSpec{NodeName: fmt.Sprintf("n%d", nodeIdx)},
			Status: corev1.PodStatus{Phase: corev1.PodRunning},
		}
		if s := host / p.endpoints; s < perNet {
			pd.Labels["app"] = fmt.Sprintf("s%d", s)
		}
		in.Pods = append(in.Pods, pd)
		if pd.Spec.NodeName == in.Node {
			for alias := range links(pd) {
				in.Links[alias] = fmt.Sprintf("kvp%d", i)
			}
		}
	}
	for i := range perNet * p.networks {
		network, s := i%p.networks, i/p.networks
		svc := corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: fmt.Sprintf("t%d", network), Name: fmt.Sprintf("svc%d", s)},
			Spec: corev1.ServiceSpec{
				ClusterIP: fmt.Sprintf("10.96.%d.%d", (i+1)>>8, (i+1)&0xff), Selector: map[string]string{"app": fmt.Sprintf("s%d", s)},
				Ports: []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080)}},
			},
		}
		if p.nodePorts {
			svc.Spec.Type, svc.Spec.Ports[0].NodePort = corev1.ServiceTypeNodePort, int32(30000+i)
		}
		in.Services = append(in.Services, svc)
	}
	in.Gateways = (&Agent{}).gateways
	in.Annotations, in.NetConfs = &AnnotationCache{}, &NetConfCache{}
	return in
}

// BenchmarkDesiredServices: the plan of node n0 in a cluster of 100 nodes
// and 10,000 pods on 50 primary (layer2) networks with 500 Services, 10
// per network, each with one TCP port and 3 or 20 endpoints spread over
// nodes (with 20, every pod is an endpoint), when nothing changed since
// the last plan (as BenchmarkDesired10kPods, which has no Services: the
// difference is what Services cost). n0 has pods on every network, so
// its plan holds all 500 services.
func BenchmarkDesiredServices(b *testing.B) {
	mixed := func(i int) string {
		if i%2 == 1 {
			return netconf.TopologyLayer3
		}
		return netconf.TopologyLayer2
	}
	for _, bc := range []struct {
		name      string
		eps       int
		topology  func(int) string
		nodePorts bool
	}{
		{"layer2/endpoints=3", 3, nil, false},
		{"layer2/endpoints=20", 20, nil, false},
		{"mixed/endpoints=3", 3, mixed, false},
		{"mixed/endpoints=20", 20, mixed, false},
		{"mixed/nodeports/endpoints=3", 3, mixed, true},
	} {
		eps := bc.eps
		b.Run(bc.name, func(b *testing.B) {
			p := servicesBenchParams{nodes: 100, networks: 50, pods: 10000, services: 500, endpoints: eps, topology: bc.topology, nodePorts: bc.nodePorts}
			in := servicesBenchInput(b, p)
			plan := Desired(in)
			if len(plan.Problems) > 0 {
				b.Fatal(plan.Problems)
			}
			if len(plan.State.Services) != p.services {
				b.Fatalf("plan has %d services, want %d", len(plan.State.Services), p.services)
			}
			for _, s := range plan.State.Services {
				if len(s.Endpoints) != eps || (s.NodePort != 0) != bc.nodePorts {
					b.Fatalf("service %s has endpoints %v and node port %d, want %d endpoints (node ports: %v)", s.Name, s.Endpoints, s.NodePort, eps, bc.nodePorts)
				}
			}
			b.ReportAllocs()
			for b.Loop() {
				plan = Desired(in)
			}
			b.ReportMetric(float64(len(plan.State.Services)), "services")
			b.ReportMetric(float64(len(plan.State.Ports)), "ports")
			b.ReportMetric(float64(len(plan.State.RemoteMACs)), "remote-macs")
		})
	}
}

// BenchmarkDesiredScoped1000Networks: the plan of a node under
// --pod-scope=networks in the largest scale run's cluster: 1,000 nodes
// and 1,000 primary networks, of which the node's pods use 8, whose 800
// pods are all it watches. What is left of the plan's cost grows with
// the NADs and Nodes, which every node still lists.
func BenchmarkDesiredScoped1000Networks(b *testing.B) {
	const nodes, networks, used, perNetwork = 1000, 1000, 8, 100
	in := Input{Node: "n0", Links: map[string]string{}}
	for i := range networks {
		in.NADs = append(in.NADs, primaryNAD(fmt.Sprintf("t%d", i), fmt.Sprint(i+1)))
	}
	for i := range nodes {
		in.Nodes = append(in.Nodes, kvnode(fmt.Sprintf("n%d", i), fmt.Sprintf("192.168.%d.%d", i/250, i%250+1)))
	}
	for i := range used * perNetwork {
		ns, host := fmt.Sprintf("t%d", i%used), i/used+1
		node := fmt.Sprintf("n%d", i*7%nodes)
		if i < used {
			node = in.Node
		}
		p := pod(ns, fmt.Sprintf("p%d", i), node, fmt.Sprintf("10.1.1.%d", host+2), fmt.Sprintf("0a:58:0a:01:%02x:%02x", host>>8, host&0xff), time.Hour)
		p.UID = types.UID(fmt.Sprintf("uid-%d", i))
		in.Pods = append(in.Pods, p)
		if node == in.Node {
			for alias := range links(p) {
				in.Links[alias] = fmt.Sprintf("kvp%d", i)
			}
		}
	}
	in.Gateways = (&Agent{}).gateways
	in.Annotations, in.NetConfs = &AnnotationCache{}, &NetConfCache{}
	benchSteadyPlans(b, in)
}
