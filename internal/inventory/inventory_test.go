package inventory_test

import (
	"encoding/json"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	nadv1 "kvnet.io/kvnet/api/k8scni/v1"
	"kvnet.io/kvnet/internal/hostsubnet"
	"kvnet.io/kvnet/internal/inventory"
	"kvnet.io/kvnet/internal/inventory/invtest"
)

func asJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestPools(t *testing.T) {
	inv := inventory.Build(invtest.World())
	want := map[string]inventory.Pool{
		// /24 less network, broadcast, gateway .1 and management .2; web-1
		// and both claims (job-1 has completed).
		invtest.PrimaryNetwork: {Used: 3, Size: 252},
		invtest.SharedNetwork:  {Used: 3, Size: 254},
		invtest.LegacyNetwork:  {Used: 1, Size: 254},
		// gatewayIPs are excluded.
		invtest.MigrationNetwork: {Used: 1, Size: 253},
		// Three nodes' /24s, each less network, broadcast, router .1 and
		// management .2; app-1 and app-2.
		invtest.Layer3Network: {Used: 2, Size: 3 * 252},
	}
	got := inv.Pools()
	if len(got) != len(want) {
		t.Fatalf("pools %v, want %v", got, want)
	}
	for n, p := range want {
		if got[n] != p {
			t.Errorf("pool of %s: %+v, want %+v", n, got[n], p)
		}
	}
}

func TestNetworkRows(t *testing.T) {
	inv := inventory.Build(invtest.World())
	rows := inv.NetworkRows(inventory.Filter{})
	want := `[` +
		`{"name":"shared","kind":"CUDN","network":"cluster_udn_shared","topology":"Layer2","role":"Secondary","subnets":["10.20.0.0/24"],"pool":{"used":3,"size":254},"networkCreated":"True","reason":"NetworkAttachmentDefinitionCreated","nads":["other/shared","tenant/shared"],"networkID":"2","persistentIPs":false},` +
		`{"namespace":"l3","name":"l3-net","kind":"UDN","network":"l3_l3-net","topology":"Layer3","role":"Primary","subnets":["10.100.0.0/16/24"],"pool":{"used":2,"size":756},"networkCreated":"True","reason":"NetworkAttachmentDefinitionCreated","nads":["l3/l3-net"],"networkID":"3","persistentIPs":false},` +
		`{"namespace":"other","name":"migration","kind":"NAD","network":"migration","topology":"macvlan+kvnet-ipam","role":"Secondary","subnets":["10.200.0.0/24"],"pool":{"used":1,"size":253},"nads":["other/migration"],"persistentIPs":false},` +
		`{"namespace":"tenant","name":"legacy","kind":"NAD","network":"legacy","topology":"Layer2","role":"Secondary","subnets":["10.30.0.0/24"],"pool":{"used":1,"size":254},"nads":["tenant/legacy"],"persistentIPs":false},` +
		`{"namespace":"tenant","name":"primary","kind":"UDN","network":"tenant_primary","topology":"Layer2","role":"Primary","subnets":["10.10.0.0/24"],"pool":{"used":3,"size":252},"networkCreated":"True","reason":"NetworkAttachmentDefinitionCreated","nads":["tenant/primary"],"networkID":"1","persistentIPs":true}]`
	if got := asJSON(t, rows); got != want {
		t.Errorf("rows:\n%s\nwant:\n%s", got, want)
	}
	// A namespace keeps its UDNs and NADs and the CUDNs that select it.
	if got := inv.NetworkRows(inventory.Filter{Namespace: invtest.Other}); len(got) != 2 || got[0].Kind != "CUDN" || got[1].Name != "migration" {
		t.Errorf("rows in %s: %+v", invtest.Other, got)
	}
	sel, _ := labels.Parse("tier=prod")
	if got := inv.NetworkRows(inventory.Filter{Selector: sel}); len(got) != 1 || got[0].Name != "primary" {
		t.Errorf("rows with tier=prod: %+v", got)
	}
}

func TestIPRows(t *testing.T) {
	inv := inventory.Build(invtest.World())
	got := asJSON(t, inv.IPRows(inventory.Filter{Namespace: invtest.Tenant}))
	want := `[` +
		`{"network":"cluster_udn_shared","namespace":"tenant","pod":"virt-launcher-vm-a-x7k2p","vm":"vm-a","ips":["10.20.0.6/24"],"mac":"02:00:00:00:00:10","node":"node-1","nad":"tenant/shared","role":"secondary"},` +
		`{"network":"cluster_udn_shared","namespace":"tenant","pod":"web-1","ips":["10.20.0.3/24"],"mac":"0a:58:0a:14:00:03","node":"node-1","nad":"tenant/shared","role":"secondary"},` +
		`{"network":"legacy","namespace":"tenant","pod":"web-1","ips":["10.30.0.3/24"],"mac":"0a:58:0a:1e:00:03","node":"node-1","nad":"tenant/legacy","role":"secondary"},` +
		`{"network":"tenant_primary","namespace":"tenant","vm":"vm-b","claim":"vm-b.default","ips":["10.10.0.5/24"]},` +
		`{"network":"tenant_primary","namespace":"tenant","pod":"virt-launcher-vm-a-x7k2p","vm":"vm-a","claim":"vm-a.default","ips":["10.10.0.4/24"],"mac":"02:00:00:00:00:01","node":"node-1","nad":"tenant/primary","role":"primary"},` +
		`{"network":"tenant_primary","namespace":"tenant","pod":"web-1","ips":["10.10.0.3/24"],"mac":"0a:58:0a:0a:00:03","node":"node-1","nad":"tenant/primary","role":"primary"}]`
	if got != want {
		t.Errorf("rows:\n%s\nwant:\n%s", got, want)
	}
	sel, _ := labels.Parse("app=db-1")
	if got := inv.IPRows(inventory.Filter{Selector: sel}); len(got) != 2 || got[0].Pod != "db-1" {
		t.Errorf("rows of app=db-1: %+v", got)
	}
}

func TestClaimRows(t *testing.T) {
	inv := inventory.Build(invtest.World())
	got := asJSON(t, inv.ClaimRows(inventory.Filter{}))
	want := `[` +
		`{"namespace":"tenant","name":"vm-a.default","network":"tenant_primary","ips":["10.10.0.4/24"],"ownerPod":"virt-launcher-vm-a-x7k2p","vm":"vm-a","condition":"IPsAllocated=True","reason":"SuccessfulAllocation","interface":"ovn-udn1","pods":["virt-launcher-vm-a-x7k2p"]},` +
		`{"namespace":"tenant","name":"vm-b.default","network":"tenant_primary","ips":["10.10.0.5/24"],"ownerPod":"virt-launcher-vm-b-q9w8e","vm":"vm-b","condition":"IPsAllocated=True","reason":"SuccessfulAllocation","pods":[]}]`
	if got != want {
		t.Errorf("rows:\n%s\nwant:\n%s", got, want)
	}
	if got := inv.ClaimRows(inventory.Filter{Namespace: invtest.Other}); len(got) != 0 {
		t.Errorf("claims in %s: %+v", invtest.Other, got)
	}
}

func TestVMRows(t *testing.T) {
	inv := inventory.Build(invtest.World())
	got := asJSON(t, inv.VMRows(inventory.Filter{}))
	want := `[` +
		`{"namespace":"tenant","vm":"vm-a","interface":"default","binding":"l2bridge","network":"tenant_primary","nad":"tenant/primary","ips":["10.10.0.4/24"],"mac":"02:00:00:00:00:01","node":"node-1","claim":"vm-a.default","migration":"Succeeded","migrationSource":"node-2","migrationTarget":"node-1","pod":"virt-launcher-vm-a-x7k2p","status":"Running"},` +
		`{"namespace":"tenant","vm":"vm-a","interface":"blue","binding":"bridge","network":"cluster_udn_shared","nad":"tenant/shared","ips":["10.20.0.6/24"],"mac":"02:00:00:00:00:10","node":"node-1","migration":"Succeeded","migrationSource":"node-2","migrationTarget":"node-1","pod":"virt-launcher-vm-a-x7k2p","status":"Running"},` +
		`{"namespace":"tenant","vm":"vm-b","interface":"default","binding":"l2bridge","network":"tenant_primary","nad":"tenant/primary","ips":["10.10.0.5/24"],"mac":"02:00:00:00:00:02","claim":"vm-b.default","status":"Stopped"}]`
	if got != want {
		t.Errorf("rows:\n%s\nwant:\n%s", got, want)
	}
	sel, _ := labels.Parse("os=fedora")
	if got := inv.VMRows(inventory.Filter{Selector: sel}); len(got) != 1 || got[0].VM != "vm-b" {
		t.Errorf("rows of os=fedora: %+v", got)
	}
}

// Objects kvnet cannot read are kept, with the reason.
func TestBuildTolerates(t *testing.T) {
	o := invtest.World()
	o.Pods[0].Annotations["kvnet.io/pod-networks"] = "{"
	o.Claims[0].Status.IPs = append(o.Claims[0].Status.IPs, "10.10.0.9", "bogus")
	o.CUDNs[0].Spec.NamespaceSelector.MatchExpressions = []metav1.LabelSelectorRequirement{{Key: "x", Operator: "Bogus"}}
	inv := inventory.Build(o)
	p, _ := inv.Pod("tenant/web-1")
	if p.AnnotationError == "" || len(p.Attachments) != 0 {
		t.Errorf("pod with a bad annotation: %+v", p)
	}
	c, _ := inv.Claim("tenant/vm-a.default")
	if len(c.IPs) != 2 || c.IPs[1].String() != "10.10.0.9/32" || len(c.BadIPs) != 1 {
		t.Errorf("claim with bad IPs: %+v", c)
	}
	if cu := inv.CUDNs[0]; cu.SelectorError == "" || len(cu.Namespaces) != 0 {
		t.Errorf("CUDN with a bad selector: %+v", cu)
	}
}

// TestLayer3Pools: a Layer3 network's pool is the sum of its nodes' host
// subnets (less the network, broadcast, router and reserved addresses of
// each), with the pods of each counted in their own; a node without host
// subnets adds nothing, and without nodes the pool is empty.
func TestLayer3Pools(t *testing.T) {
	o := &inventory.Objects{
		Namespaces: []corev1.Namespace{{ObjectMeta: metav1.ObjectMeta{Name: "l3"}}},
		NADs: []nadv1.NetworkAttachmentDefinition{{ObjectMeta: metav1.ObjectMeta{Namespace: "l3", Name: "udn"},
			Spec: nadv1.NetworkAttachmentDefinitionSpec{Config: `{"cniVersion":"1.1.0","type":"kvnet-cni","name":"l3_udn","netAttachDefName":"l3/udn","topology":"layer3","role":"primary","subnets":"10.100.0.0/16/24"}`}}},
		Nodes: []corev1.Node{
			{ObjectMeta: metav1.ObjectMeta{Name: "n1", Annotations: map[string]string{hostsubnet.Annotation: `{"l3_udn":["10.100.0.0/24"]}`}}},
			{ObjectMeta: metav1.ObjectMeta{Name: "n2", Annotations: map[string]string{hostsubnet.Annotation: `{"l3_udn":["10.100.1.0/24"],"other":["10.9.0.0/24"]}`}}},
			{ObjectMeta: metav1.ObjectMeta{Name: "n3"}},
		},
		Pods: []corev1.Pod{
			invtest.Pod("l3", "a", "n1", invtest.Attachment{NAD: "l3/udn", Network: "l3_udn", Role: "primary", IPs: []string{"10.100.0.3/24"}, MAC: "0a:58:0a:64:00:03"}),
			invtest.Pod("l3", "b", "n1", invtest.Attachment{NAD: "l3/udn", Network: "l3_udn", Role: "primary", IPs: []string{"10.100.0.4/24"}, MAC: "0a:58:0a:64:00:04"}),
			invtest.Pod("l3", "c", "n2", invtest.Attachment{NAD: "l3/udn", Network: "l3_udn", Role: "primary", IPs: []string{"10.100.1.3/24"}, MAC: "0a:58:0a:64:01:03"}),
		},
	}
	if got, want := inventory.Build(o).Pools()["l3_udn"], (inventory.Pool{Used: 3, Size: 2 * 252}); got != want {
		t.Errorf("pool with two host subnets: %+v, want %+v", got, want)
	}
	o.Nodes = nil
	if got := inventory.Build(o).Pools()["l3_udn"]; got != (inventory.Pool{}) {
		t.Errorf("pool without nodes: %+v, want empty", got)
	}
}

// TestLauncherPodVM: a launcher pod's VM is its VMI's controller owner,
// whatever vm.kubevirt.io/name says (KubeVirt writes the guest's hostname
// there); without a listed VMI, the VMI's name (KubeVirt names a VM's VMI
// after the VM), as for a standalone VMI.
func TestLauncherPodVM(t *testing.T) {
	o := invtest.World()
	inv := inventory.Build(o)
	p, _ := inv.Pod(invtest.Tenant + "/" + invtest.LauncherA)
	if p.VMI != "vm-a" || p.VM != "vm-a" || p.Labels["vm.kubevirt.io/name"] != invtest.HostnameA {
		t.Errorf("launcher pod with hostname %q: VMI %q VM %q, want vm-a and vm-a", invtest.HostnameA, p.VMI, p.VM)
	}
	o.VMIs = nil
	p, _ = inventory.Build(o).Pod(invtest.Tenant + "/" + invtest.LauncherA)
	if p.VMI != "vm-a" || p.VM != "vm-a" {
		t.Errorf("launcher pod without its VMI: VMI %q VM %q, want vm-a and vm-a", p.VMI, p.VM)
	}
	o = invtest.World()
	o.VMIs[0].OwnerReferences = nil // standalone
	p, _ = inventory.Build(o).Pod(invtest.Tenant + "/" + invtest.LauncherA)
	if p.VM != "vm-a" {
		t.Errorf("launcher pod of a standalone VMI: VM %q, want the VMI's name", p.VM)
	}
	if p, _ := inv.Pod("tenant/web-1"); p.VM != "" || p.VMI != "" {
		t.Errorf("plain pod: VMI %q VM %q", p.VMI, p.VM)
	}
}
