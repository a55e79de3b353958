package inventory_test

import (
	"encoding/json"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

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
