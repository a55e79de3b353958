package node

import (
	"fmt"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// BenchmarkDesired10kPods: the plan of one node in a cluster of 100 nodes
// and 10,000 pods on 50 primary networks (what every agent computes on each
// event, before the datapath apply).
func BenchmarkDesired10kPods(b *testing.B) {
	const nodes, networks, pods = 100, 50, 10000
	in := Input{Node: "n0", Links: map[string]string{}}
	for i := range networks {
		in.NADs = append(in.NADs, primaryNAD(fmt.Sprintf("t%d", i), fmt.Sprint(i+1)))
	}
	for i := range nodes {
		in.Nodes = append(in.Nodes, kvnode(fmt.Sprintf("n%d", i), fmt.Sprintf("192.168.%d.%d", i/250, i%250+1)))
	}
	for i := range pods {
		ns := fmt.Sprintf("t%d", i%networks)
		host := i / networks % 200
		p := pod(ns, fmt.Sprintf("p%d", i), fmt.Sprintf("n%d", i/networks%nodes), fmt.Sprintf("10.1.1.%d", host+2), fmt.Sprintf("0a:58:0a:01:%02x:%02x", host>>8, host&0xff), time.Hour)
		p.UID = types.UID(fmt.Sprintf("uid-%d", i))
		in.Pods = append(in.Pods, p)
		if p.Spec.NodeName == "n0" {
			for alias := range links(p) {
				in.Links[alias] = fmt.Sprintf("kvp%d", i)
			}
		}
	}
	in.Gateways = (&Agent{}).gateways
	in.Annotations = &AnnotationCache{} // as the Agent does: after the first plan, only changed pods are parsed
	b.ResetTimer()
	var plan Plan
	for b.Loop() {
		plan = Desired(in)
	}
	b.ReportMetric(float64(len(plan.State.Ports)), "ports")
	b.ReportMetric(float64(len(plan.State.RemoteMACs)), "remote-macs")
	if len(plan.Problems) > 0 {
		b.Fatal(plan.Problems)
	}
}
