package node

import (
	"fmt"
	"reflect"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"kvnet.io/kvnet/internal/cni"
	"kvnet.io/kvnet/internal/podnetworks"
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
	return in
}

// BenchmarkDesired10kPods: the plan of one node in a cluster of 100 nodes
// and 10,000 pods on 50 primary networks when nothing changed since the
// last plan: every annotation is a hit of the AnnotationCache, the best
// case. BenchmarkDesired10kPodsChurn measures plans after changes. The
// cache is filled before the timed loop, so that the cold first plan is
// not averaged in.
func BenchmarkDesired10kPods(b *testing.B) {
	in := desiredBenchInput()
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
			oldAlias := cni.PortAlias(p.Namespace+"/"+p.Name, p.Namespace+"/udn")
			p.Name = fmt.Sprintf("p%d-%d", i, gen[i])
			p.UID = types.UID(fmt.Sprintf("uid-%d-%d", i, gen[i]))
			if ifName, ok := in.Links[oldAlias]; ok {
				delete(in.Links, oldAlias)
				in.Links[cni.PortAlias(p.Namespace+"/"+p.Name, p.Namespace+"/udn")] = ifName
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
