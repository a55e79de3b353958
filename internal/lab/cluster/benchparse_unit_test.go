package cluster

import (
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// multusLogSample is a multus-daemon log as the kubelet serves it with
// timestamps: a failed ADD of pod a (its sandbox retried), the
// successful retry with Flannel's and kvnet's delegates, and pod b's ADD
// overlapping it with one delegate; a STATUS request between them.
const multusLogSample = `2026-11-27T13:00:00.000000000Z 2026-11-27T13:00:00Z [verbose] ADD starting CNI request ContainerID:"c0" Netns:"/var/run/netns/cni-0" IfName:"eth0" Args:"IgnoreUnknown=1;K8S_POD_NAMESPACE=bench-udn;K8S_POD_NAME=a;K8S_POD_INFRA_CONTAINER_ID=c0;K8S_POD_UID=uid-a" Path:""
2026-11-27T13:00:00.500000000Z 2026-11-27T13:00:00Z [error] DelegateAdd: error invoking DelegateAdd - "kvnet-cni": error in getting result from AddNetwork: some error
2026-11-27T13:00:00.600000000Z 2026-11-27T13:00:00Z [verbose] ADD finished CNI request ContainerID:"c0" Netns:"/var/run/netns/cni-0" IfName:"eth0" Args:"IgnoreUnknown=1;K8S_POD_NAMESPACE=bench-udn;K8S_POD_NAME=a;K8S_POD_INFRA_CONTAINER_ID=c0;K8S_POD_UID=uid-a" Path:"", result: "", err: error adding container to network "bench-udn_l2": some error
2026-11-27T13:00:01.000000000Z 2026-11-27T13:00:01Z [verbose] ADD starting CNI request ContainerID:"c1" Netns:"/var/run/netns/cni-1" IfName:"eth0" Args:"IgnoreUnknown=1;K8S_POD_NAMESPACE=bench-udn;K8S_POD_NAME=a;K8S_POD_INFRA_CONTAINER_ID=c1;K8S_POD_UID=uid-a" Path:""
2026-11-27T13:00:01.010000000Z 2026-11-27T13:00:01Z [verbose] STATUS starting CNI request ContainerID:"" Netns:"" IfName:"" Args:"" Path:""
2026-11-27T13:00:01.100000000Z 2026-11-27T13:00:01Z [verbose] ADD starting CNI request ContainerID:"c2" Netns:"/var/run/netns/cni-2" IfName:"eth0" Args:"IgnoreUnknown=1;K8S_POD_NAMESPACE=bench-default;K8S_POD_NAME=b;K8S_POD_INFRA_CONTAINER_ID=c2;K8S_POD_UID=uid-b" Path:""
2026-11-27T13:00:01.200000000Z 2026-11-27T13:00:01Z [verbose] Add: bench-udn:a:uid-a:cbr0(cbr0):eth0 {"cniVersion":"0.3.1","interfaces":[{"name":"eth0","sandbox":"/var/run/netns/cni-1"}],"ips":[{"version":"4","address":"10.244.1.5/24"}]}
2026-11-27T13:00:01.300000000Z 2026-11-27T13:00:01Z [verbose] Add: bench-default:b:uid-b:cbr0(cbr0):eth0 {"cniVersion":"0.3.1","ips":[{"version":"4","address":"10.244.1.6/24"}]}
2026-11-27T13:00:01.350000000Z 2026-11-27T13:00:01Z [verbose] ADD finished CNI request ContainerID:"c2" Netns:"/var/run/netns/cni-2" IfName:"eth0" Args:"IgnoreUnknown=1;K8S_POD_NAMESPACE=bench-default;K8S_POD_NAME=b;K8S_POD_INFRA_CONTAINER_ID=c2;K8S_POD_UID=uid-b" Path:"", result: "{\"cniVersion\":\"0.3.1\"}", err: <nil>
2026-11-27T13:00:01.450000000Z 2026-11-27T13:00:01Z [verbose] Add: bench-udn:a:uid-a:bench-udn/l2(bench-udn_l2):ovn-udn1 {"cniVersion":"1.1.0","interfaces":[{"name":"kvp0123456789"},{"name":"ovn-udn1","mac":"0a:58:0a:64:00:05","sandbox":"/var/run/netns/cni-1"}],"ips":[{"address":"10.100.0.5/16","gateway":"10.100.0.1","interface":1}]}
2026-11-27T13:00:01.500000000Z 2026-11-27T13:00:01Z [verbose] ADD finished CNI request ContainerID:"c1" Netns:"/var/run/netns/cni-1" IfName:"eth0" Args:"IgnoreUnknown=1;K8S_POD_NAMESPACE=bench-udn;K8S_POD_NAME=a;K8S_POD_INFRA_CONTAINER_ID=c1;K8S_POD_UID=uid-a" Path:"", result: "{\"cniVersion\":\"0.3.1\"}", err: <nil>
`

func TestParseMultusLog(t *testing.T) {
	adds := map[types.UID][]*multusAdd{}
	if err := parseMultusLog(multusLogSample, adds); err != nil {
		t.Fatal(err)
	}
	kvnetConfs := map[string]bool{"bench-udn_l2": true}
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }

	a, err := successfulAdd(adds, "bench-udn/a", "uid-a")
	if err != nil {
		t.Fatal(err)
	}
	if len(adds["uid-a"]) != 2 || a.container != "c1" {
		t.Fatalf("pod a: %d ADDs, successful one in container %q; want 2 and c1", len(adds["uid-a"]), a.container)
	}
	if got := a.end.Sub(a.start); got != ms(500) {
		t.Errorf("pod a: ADD took %v, want 500ms", got)
	}
	if len(a.delegates) != 2 {
		t.Fatalf("pod a: delegates %+v, want Flannel's and kvnet's", a.delegates)
	}
	if got, ok := delegateTime(a, map[string]bool{"cbr0": true}); !ok || got != ms(200) {
		t.Errorf("pod a: Flannel's delegate %v (found %v), want 200ms from the request's start", got, ok)
	}
	kv, ok := delegateTime(a, kvnetConfs)
	if !ok || kv != ms(250) {
		t.Errorf("pod a: kvnet's delegate %v (found %v), want 250ms from the end of Flannel's", kv, ok)
	}
	if d := a.delegates[1]; d.network != "bench-udn/l2" || d.ifName != "ovn-udn1" {
		t.Errorf("pod a: kvnet's delegate %+v, want network bench-udn/l2 on ovn-udn1", d)
	}

	b, err := successfulAdd(adds, "bench-default/b", "uid-b")
	if err != nil {
		t.Fatal(err)
	}
	if len(b.delegates) != 1 || b.end.Sub(b.start) != ms(250) {
		t.Errorf("pod b: delegates %+v, ADD %v; want only Flannel's and 250ms", b.delegates, b.end.Sub(b.start))
	}
	if _, ok := delegateTime(b, kvnetConfs); ok {
		t.Error("pod b: kvnet's delegate found in a default-network pod's ADD")
	}

	// A pod whose ADD never finished (or whose lines are missing) is an
	// error naming the pod, not a silent zero.
	half := strings.Join(strings.Split(multusLogSample, "\n")[:4], "\n")
	adds = map[types.UID][]*multusAdd{}
	if err := parseMultusLog(half, adds); err != nil {
		t.Fatal(err)
	}
	if _, err := successfulAdd(adds, "bench-udn/a", "uid-a"); err == nil || !strings.Contains(err.Error(), "bench-udn/a") {
		t.Errorf("pod a without a finished ADD: got %v, want an error naming it", err)
	}
	if err := parseMultusLog("yesterday [verbose] ADD starting CNI request\n", adds); err == nil {
		t.Error("a line without a timestamp: no error")
	}
}

func TestPercentile(t *testing.T) {
	var xs []float64
	for i := 20; i >= 1; i-- {
		xs = append(xs, float64(i))
	}
	for _, c := range []struct{ p, want float64 }{{50, 10}, {99, 20}, {95, 19}, {1, 1}} {
		if got := percentile(xs, c.p); got != c.want {
			t.Errorf("p%v of 1..20: got %v, want %v", c.p, got, c.want)
		}
	}
	if xs[0] != 20 {
		t.Error("percentile sorted its argument in place")
	}
}
