package node

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	nadv1 "kvnet.io/kvnet/api/k8scni/v1"
	kubevirtv1 "kvnet.io/kvnet/api/kubevirt/v1"
	"kvnet.io/kvnet/internal/datapath"
	"kvnet.io/kvnet/internal/migration"
	"kvnet.io/kvnet/internal/podnetworks"
	"kvnet.io/kvnet/internal/portalias"
	"kvnet.io/kvnet/internal/udn"
)

func nad(ns, name, config string, id string) nadv1.NetworkAttachmentDefinition {
	n := nadv1.NetworkAttachmentDefinition{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: map[string]string{}}}
	n.Spec.Config = config
	if id != "" {
		n.Annotations[udn.NetworkIDAnnotation] = id
	}
	return n
}

func primaryNAD(ns string, id string) nadv1.NetworkAttachmentDefinition {
	return nad(ns, "udn", fmt.Sprintf(`{"cniVersion":"1.1.0","type":"kvnet-cni","name":"%s_udn","netAttachDefName":"%s/udn","topology":"layer2","role":"primary","subnets":"10.1.1.0/24"}`, ns, ns), id)
}

func kvnode(name, vtep string) corev1.Node {
	n := corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if vtep != "" {
		n.Annotations = map[string]string{VTEPAnnotation: vtep}
	}
	return n
}

// pod returns a pod on node holding one attachment to <ns>/udn.
func pod(ns, name, node, ip, mac string, age time.Duration) corev1.Pod {
	p := corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, CreationTimestamp: metav1.NewTime(time.Unix(1e9, 0).Add(-age)),
			Annotations: map[string]string{podnetworks.Annotation: fmt.Sprintf(
				`{"%s/udn":{"ip_addresses":["%s/24"],"mac_address":"%s","gateway_ips":["10.1.1.1"],"role":"primary","network":"%s_udn"}}`, ns, ip, mac, ns)}},
		Spec: corev1.PodSpec{NodeName: node},
	}
	return p
}

func links(pods ...corev1.Pod) map[string]string {
	out := map[string]string{}
	for i, p := range pods {
		out[portalias.Format(p.Namespace+"/"+p.Name, p.Namespace+"/udn")] = fmt.Sprintf("kvp%d", i)
	}
	return out
}

func TestDesiredTwoTenants(t *testing.T) {
	a1 := pod("a", "a1", "n1", "10.1.1.2", "0a:58:0a:01:01:02", time.Hour)
	a2 := pod("a", "a2", "n2", "10.1.1.3", "0a:58:0a:01:01:03", time.Hour)
	b1 := pod("b", "b1", "n3", "10.1.1.2", "0a:58:0a:01:01:02", time.Hour)
	done := pod("a", "done", "n2", "10.1.1.9", "0a:58:0a:01:01:09", time.Hour)
	done.Status.Phase = corev1.PodSucceeded
	in := Input{
		Node:  "n1",
		NADs:  []nadv1.NetworkAttachmentDefinition{primaryNAD("a", "7"), primaryNAD("b", "8")},
		Pods:  []corev1.Pod{a1, a2, b1, done},
		Nodes: []corev1.Node{kvnode("n1", "192.168.100.1"), kvnode("n2", "192.168.100.2"), kvnode("n3", "192.168.100.3")},
		Links: links(a1),
		MTU:   1450,
		DNS:   []netip.Addr{netip.MustParseAddr("192.0.2.53")},
	}
	plan := Desired(in)
	if len(plan.Problems) != 0 {
		t.Fatalf("problems: %v", plan.Problems)
	}
	// Only tenant a has a pod on n1: tenant b's network is not here.
	if len(plan.State.Networks) != 1 {
		t.Fatalf("networks %+v, want a_udn only", plan.State.Networks)
	}
	n := plan.State.Networks[0]
	if n.Name != "a_udn" || n.ID != 7 || !n.Primary || fmt.Sprint(n.Gateways) != "[10.1.1.1]" || fmt.Sprint(n.Remotes) != "[192.168.100.2]" {
		t.Errorf("network %+v", n)
	}
	if len(plan.State.Ports) != 1 || plan.State.Ports[0].HostIfName != "kvp0" || plan.State.Ports[0].MAC.String() != "0a:58:0a:01:01:02" ||
		fmt.Sprint(plan.State.Ports[0].IPs) != "[10.1.1.2/24]" {
		t.Errorf("ports %+v", plan.State.Ports)
	}
	if len(plan.State.RemoteMACs) != 1 || plan.State.RemoteMACs[0].MAC.String() != "0a:58:0a:01:01:03" || plan.State.RemoteMACs[0].VTEP.String() != "192.168.100.2" {
		t.Errorf("remote MACs %+v (the completed pod must not count)", plan.State.RemoteMACs)
	}
	if len(plan.DHCP) != 1 || plan.DHCP[0].ServerIP.String() != "10.1.1.1" || plan.DHCP[0].ID != 7 {
		t.Fatalf("dhcp %+v", plan.DHCP)
	}
	l, ok := plan.DHCP[0].Leases["0a:58:0a:01:01:02"]
	if !ok || l.IP.String() != "10.1.1.2/24" || l.Router.String() != "10.1.1.1" || l.MTU != 1450 || l.Hostname != "a1" || fmt.Sprint(l.DNS) != "[192.0.2.53]" {
		t.Errorf("lease %+v", l)
	}
	// The plan is valid for the datapath.
	if err := datapath.Validate(plan.State); err != nil {
		t.Error(err)
	}

	// A pod whose port kvnet-cni has not made yet waits.
	in.Links = nil
	plan = Desired(in)
	if plan.Waiting != 1 || len(plan.State.Ports) != 0 || len(plan.State.Networks) != 1 {
		t.Errorf("without links: waiting %d ports %v networks %d", plan.Waiting, plan.State.Ports, len(plan.State.Networks))
	}
}

func TestDesiredMigration(t *testing.T) {
	const mac = "0a:58:0a:01:01:05"
	launcher := func(name, node string, age time.Duration) corev1.Pod {
		p := pod("a", name, node, "10.1.1.5", mac, age)
		p.Labels = map[string]string{"kubevirt.io": "virt-launcher"}
		p.Annotations[kubevirtv1.DomainAnnotation] = "vm1"
		return p
	}
	src, dst := launcher("virt-launcher-vm1-src", "n1", time.Hour), launcher("virt-launcher-vm1-dst", "n2", time.Minute)
	peer := pod("a", "peer", "n3", "10.1.1.9", "0a:58:0a:01:01:09", time.Hour)
	in := Input{
		NADs:     []nadv1.NetworkAttachmentDefinition{primaryNAD("a", "7")},
		Pods:     []corev1.Pod{src, dst, peer},
		Nodes:    []corev1.Node{kvnode("n1", "192.168.100.1"), kvnode("n2", "192.168.100.2"), kvnode("n3", "192.168.100.3")},
		Links:    links(src, dst, peer),
		VMINodes: map[types.NamespacedName]string{{Namespace: "a", Name: "vm1"}: "n1"},
	}
	remoteVTEP := func(plan Plan) string {
		for _, m := range plan.State.RemoteMACs {
			if m.MAC.String() == mac {
				return m.VTEP.String()
			}
		}
		return "none"
	}
	hasPort := func(plan Plan) bool {
		for _, p := range plan.State.Ports {
			if p.MAC.String() == mac {
				return true
			}
		}
		return false
	}
	for _, tc := range []struct {
		vmiNode         string
		wantN3          string // where n3 sends the MAC
		srcPort, dstPor bool
	}{
		{"n1", "192.168.100.1", true, false}, // before the switch-over: the source runs the VM
		{"n2", "192.168.100.2", false, true}, // after: the target does
		{"", "192.168.100.2", false, true},   // no VMI: the newest pod
	} {
		in.VMINodes[types.NamespacedName{Namespace: "a", Name: "vm1"}] = tc.vmiNode
		if tc.vmiNode == "" {
			in.VMINodes = nil
		}
		in.Node = "n3"
		if got := remoteVTEP(Desired(in)); got != tc.wantN3 {
			t.Errorf("VMI on %q: n3 sends the VM's MAC to %s, want %s", tc.vmiNode, got, tc.wantN3)
		}
		in.Node = "n1"
		p1 := Desired(in)
		in.Node = "n2"
		p2 := Desired(in)
		if hasPort(p1) != tc.srcPort || hasPort(p2) != tc.dstPor {
			t.Errorf("VMI on %q: port on n1 %v, on n2 %v", tc.vmiNode, hasPort(p1), hasPort(p2))
		}
		// Never both a local port and a remote entry for one MAC.
		for _, p := range []Plan{p1, p2} {
			if hasPort(p) && remoteVTEP(p) != "none" {
				t.Errorf("VMI on %q: MAC both local and remote", tc.vmiNode)
			}
			if err := datapath.Validate(p.State); err != nil {
				t.Error(err)
			}
		}
	}
}

// While the VMI migrates, both launcher pods' ports are attached as
// Migrating (the bridges follow the guest's frames), the third node has a
// Migrating (learned) entry at the node running the VM, and only the
// active port gets a DHCP lease.
func TestDesiredMigrationInProgress(t *testing.T) {
	const mac = "0a:58:0a:01:01:05"
	launcher := func(name, node string, age time.Duration) corev1.Pod {
		p := pod("a", name, node, "10.1.1.5", mac, age)
		p.Labels = map[string]string{"kubevirt.io": "virt-launcher"}
		p.Annotations[kubevirtv1.DomainAnnotation] = "vm1"
		return p
	}
	src, dst := launcher("virt-launcher-vm1-src", "n1", time.Hour), launcher("virt-launcher-vm1-dst", "n2", time.Minute)
	key := types.NamespacedName{Namespace: "a", Name: "vm1"}
	peer := pod("a", "peer", "n3", "10.1.1.9", "0a:58:0a:01:01:09", time.Hour)
	in := Input{
		NADs:     []nadv1.NetworkAttachmentDefinition{primaryNAD("a", "7")},
		Pods:     []corev1.Pod{src, dst, peer},
		Nodes:    []corev1.Node{kvnode("n1", "192.168.100.1"), kvnode("n2", "192.168.100.2"), kvnode("n3", "192.168.100.3")},
		Links:    links(src, dst, peer),
		VMINodes: map[types.NamespacedName]string{key: "n1"},
		Migrations: map[types.NamespacedName]*migration.Migration{key: {VMI: key, SourceNode: "n1", TargetNode: "n2",
			SourcePod: src.Name, TargetPod: dst.Name, State: migration.Running}},
	}
	port := func(p Plan) *datapath.Port {
		for i := range p.State.Ports {
			if p.State.Ports[i].MAC.String() == mac {
				return &p.State.Ports[i]
			}
		}
		return nil
	}
	leased := func(p Plan) bool {
		for _, d := range p.DHCP {
			if _, ok := d.Leases[mac]; ok {
				return true
			}
		}
		return false
	}
	for _, n := range []string{"n1", "n2"} {
		in.Node = n
		p := Desired(in)
		pt := port(p)
		if pt == nil || !pt.Migrating || pt.Standby != (n == "n2") {
			t.Errorf("%s: port %+v, want a Migrating port, on Standby on the target (n2) only", n, pt)
		}
		for _, m := range p.State.RemoteMACs {
			if m.MAC.String() == mac {
				t.Errorf("%s: remote entry %+v next to the local port", n, m)
			}
		}
		if leased(p) != (n == "n1") {
			t.Errorf("%s: DHCP lease %v, want one only where the VM runs (n1)", n, leased(p))
		}
		// The target's port is a migration target the node follows to
		// its switch-over; the source's is not.
		wantTargets := 0
		if n == "n2" {
			wantTargets = 1
		}
		if len(p.MigrationTargets) != wantTargets {
			t.Errorf("%s: migration targets %+v, want %d", n, p.MigrationTargets, wantTargets)
		} else if n == "n2" {
			if mt := p.MigrationTargets[0]; mt.VMI != key || mt.Pod != dst.Name || mt.Source != "n1" || mt.SourcePod != src.Name ||
				mt.MAC.String() != mac || mt.Network != pt.Network {
				t.Errorf("n2: migration target %+v", mt)
			}
		}
		// The source's port is a migration source, followed (and probed
		// from the gateway) until its guest leaves; the target's is not.
		if n == "n1" {
			if len(p.MigrationSources) != 1 || p.MigrationSources[0].VMI != key || p.MigrationSources[0].Pod != src.Name ||
				p.MigrationSources[0].Port.HostIfName != pt.HostIfName {
				t.Errorf("n1: migration sources %+v, want the source pod's port", p.MigrationSources)
			} else if _, ok := p.ProbeFrom[pt.Network]; !ok {
				t.Errorf("n1: no probe gateway for the source's network: %+v", p.ProbeFrom)
			}
		} else if len(p.MigrationSources) != 0 {
			t.Errorf("%s: migration sources %+v, want none", n, p.MigrationSources)
		}
		if err := datapath.Validate(p.State); err != nil {
			t.Error(err)
		}
	}
	// The target's guest announced itself: its port leaves Standby.
	in.Node, in.Announced = "n2", map[string]bool{mac: true}
	if p := Desired(in); port(p) == nil || !port(p).Migrating || port(p).Standby || len(p.MigrationTargets) != 1 {
		t.Errorf("n2 after the announce: port %+v, want Migrating, not Standby, still a migration target (%+v)", port(p), p.MigrationTargets)
	}
	// n2 marked the target pod: the guest arrived. n1 shuts the source's
	// port at once (the source pod's own stack must not answer for the
	// guest), publishes its last frames, and follows it no more.
	in.Node, in.GuestArrived = "n1", map[types.NamespacedName]bool{{Namespace: "a", Name: dst.Name}: true}
	if p := Desired(in); port(p) == nil || !port(p).Departed || len(p.MigrationSources) != 0 || !p.DepartedSources[switchKey(port(p).Network, mac)] {
		t.Errorf("n1 once the guest arrived on n2: port %+v, sources %+v, departed %v, want a Departed port, no source, departed",
			port(p), p.MigrationSources, p.DepartedSources)
	}
	in.Node, in.GuestArrived = "n2", nil
	// The API names n2: an ordinary port, no migration target.
	in.VMINodes[key] = "n2"
	if p := Desired(in); port(p) == nil || port(p).Standby || len(p.MigrationTargets) != 0 {
		t.Errorf("n2 once the VMI runs there: port %+v, migration targets %+v, want an open port and none", port(p), p.MigrationTargets)
	}
	// On n1 the source pod now holds the inactive copy (its guest left):
	// its port passes nothing and is no migration target, even with a
	// frame of the pod's own seen there.
	for _, announced := range []map[string]bool{nil, {mac: true}} {
		in.Node, in.Announced = "n1", announced
		if p := Desired(in); port(p) == nil || !port(p).Departed || port(p).Standby || len(p.MigrationTargets) != 0 || len(p.MigrationSources) != 0 ||
			!p.DepartedSources[switchKey(port(p).Network, mac)] {
			t.Errorf("n1, the departed source (announced %v): port %+v, migration targets %+v, sources %+v, departed %v, want a Departed port and none",
				announced, port(p), p.MigrationTargets, p.MigrationSources, p.DepartedSources)
		}
	}
	in.VMINodes[key] = "n1"
	in.Announced = nil
	in.Node = "n3"
	p := Desired(in)
	var got []datapath.RemoteMAC
	for _, m := range p.State.RemoteMACs {
		if m.MAC.String() == mac {
			got = append(got, m)
		}
	}
	if len(got) != 1 || got[0].VTEP.String() != "192.168.100.1" || !got[0].Migrating {
		t.Errorf("n3: remote entries %+v, want one Migrating entry at n1", got)
	}
	// A migration whose pods are others (an earlier attempt's target)
	// pairs nothing: the holders are ordinary.
	in.Migrations[key].TargetPod = "virt-launcher-vm1-other"
	in.Node = "n1"
	if pt := port(Desired(in)); pt == nil || pt.Migrating {
		t.Errorf("n1, migration to another pod: port %+v, want an ordinary one", pt)
	}
	in.Migrations[key].TargetPod = dst.Name
	// Completed, the VMI on n2: the source pod on n1 holds nothing, and
	// its guest departed.
	in.Migrations[key].State, in.VMINodes[key], in.Node = migration.Succeeded, "n2", "n1"
	if p := Desired(in); port(p) != nil || len(p.DepartedSources) != 1 || len(p.MigrationSources) != 0 {
		t.Errorf("n1 after the migration completed: port %+v, departed %v, sources %+v, want no port, one departed, no source",
			port(p), p.DepartedSources, p.MigrationSources)
	}
	in.Node = "n2"
	if p := Desired(in); len(p.DepartedSources) != 0 {
		t.Errorf("n2 after the migration completed: departed %v, want none", p.DepartedSources)
	}
	in.VMINodes[key] = "n1"
	// Once the migration is over (completed or failed), ordinary state.
	in.Migrations[key].State = migration.Failed
	in.Node = "n2"
	if pt := port(Desired(in)); pt != nil {
		t.Errorf("n2 after a failed migration: port %+v, want none", pt)
	}
	in.Node = "n1"
	if p := Desired(in); port(p) == nil || port(p).Migrating || len(p.DepartedSources) != 0 || len(p.MigrationSources) != 0 {
		t.Errorf("n1 after a failed migration: port %+v, departed %v, sources %+v, want an ordinary port, not departed, no source",
			port(p), p.DepartedSources, p.MigrationSources)
	}
}

func TestDesiredSkipsBadInput(t *testing.T) {
	good := pod("a", "good", "n1", "10.1.1.2", "0a:58:0a:01:01:02", time.Hour)
	bad := good
	bad.Name = "bad"
	bad.Annotations = map[string]string{podnetworks.Annotation: `{"a/udn":{"mac_address":"zz"}}`}
	noVTEPPod := pod("a", "far", "n9", "10.1.1.3", "0a:58:0a:01:01:03", time.Hour)
	in := Input{
		Node: "n1",
		NADs: []nadv1.NetworkAttachmentDefinition{
			primaryNAD("a", "7"),
			primaryNAD("noid", ""),
			nad("x", "broken", `{"type":`, "3"),
			nad("x", "bridge", `{"type":"bridge","name":"br"}`, ""),
			nad("x", "l3", `{"cniVersion":"1.1.0","type":"kvnet-cni","name":"x_l3","topology":"layer3","role":"secondary","subnets":"10.9.0.0/16/8"}`, "4"),
			nad("x", "l3ok", `{"cniVersion":"1.1.0","type":"kvnet-cni","name":"x_l3ok","topology":"layer3","role":"secondary","subnets":"10.9.0.0/16/24"}`, "5"),
		},
		Pods:  []corev1.Pod{good, bad, noVTEPPod},
		Nodes: []corev1.Node{kvnode("n1", "192.168.100.1"), kvnode("n2", "not-an-ip"), kvnode("n9", "")},
		Links: links(good),
	}
	plan := Desired(in)
	want := []string{
		`NAD noid/udn: annotation k8s.ovn.org/network-id="" is not a network ID`,
		`NAD x/broken:`,
		`NAD x/l3: network "x_l3": subnet "10.9.0.0/16": host subnet length /8`,
		`node n2: annotation kvnet.io/vtep="not-an-ip" is not an IP address`,
		`pod a/bad:`,
	}
	all := strings.Join(plan.Problems, "\n")
	for _, w := range want {
		if !strings.Contains(all, w) {
			t.Errorf("problems lack %q:\n%s", w, all)
		}
	}
	if len(plan.Problems) != len(want) {
		t.Errorf("%d problems, want %d:\n%s", len(plan.Problems), len(want), all)
	}
	// A valid Layer3 network this node has no host subnet of yet is
	// refused to its pods with the reason.
	if why := plan.Unserved["x_l3ok"]; !strings.Contains(why, `node n1 has no host subnet of layer3 network "x_l3ok" yet`) {
		t.Errorf("unserved reason of x_l3ok: %q", why)
	}
	// The good pod is still served; the pod on a node without VTEP is
	// not a remote (it has nowhere to be sent).
	if len(plan.State.Ports) != 1 || len(plan.State.RemoteMACs) != 0 || len(plan.State.Networks[0].Remotes) != 0 {
		t.Errorf("state %+v", plan.State)
	}
}

func TestDesiredExhausted(t *testing.T) {
	n := primaryNAD("a", "7")
	n.Annotations[udn.PoolExhaustedAnnotation] = "true"
	plan := Desired(Input{Node: "n1", NADs: []nadv1.NetworkAttachmentDefinition{n, primaryNAD("b", "8")}})
	if fmt.Sprint(plan.Exhausted) != "[a_udn]" {
		t.Errorf("exhausted %v", plan.Exhausted)
	}
}

func TestDesiredAnnotationCache(t *testing.T) {
	a1 := pod("a", "a1", "n1", "10.1.1.2", "0a:58:0a:01:01:02", time.Hour)
	a2 := pod("a", "a2", "n2", "10.1.1.3", "0a:58:0a:01:01:03", time.Hour)
	a1.UID, a2.UID = "u1", "u2"
	cache := &AnnotationCache{}
	in := Input{
		Node: "n1", NADs: []nadv1.NetworkAttachmentDefinition{primaryNAD("a", "7")},
		Pods:  []corev1.Pod{a1, a2},
		Nodes: []corev1.Node{kvnode("n1", "192.168.100.1"), kvnode("n2", "192.168.100.2")},
		Links: links(a1), Annotations: cache,
	}
	remote := func() string {
		plan := Desired(in)
		if len(plan.State.RemoteMACs) != 1 {
			return fmt.Sprint(plan.State.RemoteMACs)
		}
		return plan.State.RemoteMACs[0].MAC.String()
	}
	if got := remote(); got != "0a:58:0a:01:01:03" {
		t.Fatalf("remote MAC %s", got)
	}
	// A changed annotation (same pod UID) is parsed again.
	in.Pods[1] = pod("a", "a2", "n2", "10.1.1.4", "0a:58:0a:01:01:04", time.Hour)
	in.Pods[1].UID = "u2"
	if got := remote(); got != "0a:58:0a:01:01:04" {
		t.Errorf("after the annotation changed: remote MAC %s", got)
	}
	// Pods that are gone leave the cache.
	in.Pods = in.Pods[:1]
	Desired(in)
	if len(cache.m) != 1 {
		t.Errorf("cache holds %d pods, want 1", len(cache.m))
	}
}
