package audit_test

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kubevirtv1 "kvnet.io/kvnet/api/kubevirt/v1"
	"kvnet.io/kvnet/internal/audit"
	"kvnet.io/kvnet/internal/inventory"
	"kvnet.io/kvnet/internal/inventory/invtest"
)

func check(o *inventory.Objects) audit.Report { return audit.Check(inventory.Build(o)) }

func TestCleanWorld(t *testing.T) {
	r := check(invtest.World())
	if len(r.Findings) != 0 {
		t.Fatalf("findings in a consistent world: %+v", r.Findings)
	}
	if r.Summary() != "no findings" {
		t.Errorf("summary %q", r.Summary())
	}
	// web-1, db-1, the launcher, app-1 and app-2 (job-1 has completed);
	// both claims; 3+2+2+1+1 attachments plus vm-b's claim, which no pod
	// uses; five networks, the Layer3 one included.
	want := audit.Counts{Pods: 5, Claims: 2, Allocations: 10, Networks: 5, VMs: 2, VMIs: 1}
	if r.Checked != want {
		t.Errorf("checked %+v, want %+v", r.Checked, want)
	}
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != `{"findings":[],"checked":{"pods":5,"claims":2,"allocations":10,"networks":5,"vms":2,"vmis":1}}` {
		t.Errorf("JSON %s", b)
	}
}

// A migration's source and target launcher pods reference the same claim
// and carry its IPs and MAC: one holder, no duplicate.
func TestMigrationPodsShareTheirClaim(t *testing.T) {
	o := invtest.World()
	target := o.Pods[3].DeepCopy()
	target.Name = "virt-launcher-vm-a-target"
	target.Annotations["kvnet.io/pod-networks"] = invtest.Annotation(invtest.Attachment{NAD: "tenant/primary",
		Network: invtest.PrimaryNetwork, Role: "primary", IPs: []string{"10.10.0.4/24"}, MAC: "02:00:00:00:00:01", Claim: "vm-a.default"})
	o.Pods = append(o.Pods, *target)
	if r := check(o); len(r.Findings) != 0 {
		t.Fatalf("findings: %+v", r.Findings)
	}
}

func TestFindings(t *testing.T) {
	primary := func(ip, mac, claim string) invtest.Attachment {
		return invtest.Attachment{NAD: "tenant/primary", Network: invtest.PrimaryNetwork, Role: "primary", IPs: []string{ip}, MAC: mac, Claim: claim}
	}
	tests := []struct {
		name   string
		mutate func(o *inventory.Objects)
		want   []audit.Finding
	}{{
		name: "duplicate IP of a pod and a stopped VM's claim",
		mutate: func(o *inventory.Objects) {
			o.Pods = append(o.Pods, invtest.Pod(invtest.Tenant, "intruder", "node-2", primary("10.10.0.5/24", "0a:58:0a:0a:00:05", "")))
		},
		want: []audit.Finding{{Kind: audit.DuplicateIP, Network: invtest.PrimaryNetwork, Object: "10.10.0.5",
			Detail: "held by ipamclaim/tenant/vm-b.default and pod/tenant/intruder"}},
	}, {
		name: "duplicate IP of two pods",
		mutate: func(o *inventory.Objects) {
			o.Pods = append(o.Pods, invtest.Pod(invtest.Other, "db-2", "node-1", invtest.Attachment{NAD: "other/shared",
				Network: invtest.SharedNetwork, Role: "secondary", IPs: []string{"10.20.0.3/24"}, MAC: "0a:58:0a:14:00:63"}))
		},
		want: []audit.Finding{{Kind: audit.DuplicateIP, Network: invtest.SharedNetwork, Object: "10.20.0.3",
			Detail: "held by pod/other/db-2 and pod/tenant/web-1"}},
	}, {
		name: "duplicate MAC",
		mutate: func(o *inventory.Objects) {
			o.Pods = append(o.Pods, invtest.Pod(invtest.Tenant, "copycat", "node-2", primary("10.10.0.9/24", "02:00:00:00:00:01", "")))
		},
		want: []audit.Finding{{Kind: audit.DuplicateMAC, Network: invtest.PrimaryNetwork, Object: "02:00:00:00:00:01",
			Detail: "held by ipamclaim/tenant/vm-a.default and pod/tenant/copycat"}},
	}, {
		name: "same MAC on two networks is fine",
		mutate: func(o *inventory.Objects) {
			o.Pods = append(o.Pods, invtest.Pod(invtest.Tenant, "elsewhere", "node-2", invtest.Attachment{NAD: "tenant/legacy",
				Network: invtest.LegacyNetwork, Role: "secondary", IPs: []string{"10.30.0.9/24"}, MAC: "02:00:00:00:00:01"}))
		},
	}, {
		name: "leaked claim",
		mutate: func(o *inventory.Objects) {
			o.Claims = append(o.Claims, invtest.Claim(invtest.Tenant, "gone.default", invtest.PrimaryNetwork, "gone", "virt-launcher-gone-abcde", "10.10.0.77/24"))
		},
		want: []audit.Finding{{Kind: audit.LeakedClaim, Network: invtest.PrimaryNetwork, Object: "ipamclaim/tenant/gone.default",
			Detail: "its VM gone has no VirtualMachine or VirtualMachineInstance, and no live pod uses it; it holds 10.10.0.77"}},
	}, {
		name: "claim and pod left in a deleted namespace",
		mutate: func(o *inventory.Objects) {
			o.Claims = append(o.Claims, invtest.Claim("gone-ns", "vm-x.default", "gone-ns_primary", "vm-x", "", "10.50.0.7/24"))
			o.Pods = append(o.Pods, invtest.Pod("gone-ns", "virt-launcher-vm-x-abcde", "node-2", invtest.Attachment{NAD: "gone-ns/primary",
				Network: "gone-ns_primary", Role: "primary", IPs: []string{"10.50.0.8/24"}, MAC: "0a:58:0a:32:00:08", Claim: "vm-y.default"}))
		},
		// Not LeakedClaim, MissingNAD or MissingClaim: the one cause.
		want: []audit.Finding{{Kind: audit.Orphaned, Network: "gone-ns_primary", Object: "ipamclaim/gone-ns/vm-x.default",
			Detail: "namespace gone-ns no longer exists, but this object is still stored (the namespace's deletion finished without it) and can no longer be changed; create namespace gone-ns again, then delete it; it holds 10.50.0.7"},
			{Kind: audit.Orphaned, Network: "gone-ns_primary", Object: "pod/gone-ns/virt-launcher-vm-x-abcde",
				Detail: "namespace gone-ns no longer exists, but this object is still stored (the namespace's deletion finished without it) and can no longer be changed; create namespace gone-ns again, then delete it"}},
	}, {
		name: "duplicate IP in a deleted namespace is still a duplicate",
		mutate: func(o *inventory.Objects) {
			o.Pods = append(o.Pods, invtest.Pod("gone-ns", "a", "node-2", invtest.Attachment{NAD: "gone-ns/sec", Network: invtest.SharedNetwork,
				Role: "secondary", IPs: []string{"10.20.0.3/24"}, MAC: "0a:58:0a:14:00:64"}))
		},
		want: []audit.Finding{{Kind: audit.DuplicateIP, Network: invtest.SharedNetwork, Object: "10.20.0.3", Detail: "held by pod/gone-ns/a and pod/tenant/web-1"},
			{Kind: audit.Orphaned, Network: invtest.SharedNetwork, Object: "pod/gone-ns/a",
				Detail: "namespace gone-ns no longer exists, but this object is still stored (the namespace's deletion finished without it) and can no longer be changed; create namespace gone-ns again, then delete it"}},
	}, {
		name: "claim of a workload whose owner pod completed",
		mutate: func(o *inventory.Objects) {
			o.Claims = append(o.Claims, invtest.Claim(invtest.Tenant, "batch", invtest.PrimaryNetwork, "", "job-1"))
		},
		want: []audit.Finding{{Kind: audit.LeakedClaim, Network: invtest.PrimaryNetwork, Object: "ipamclaim/tenant/batch",
			Detail: "no VM, VMI or live pod uses it"}},
	}, {
		name: "claim of a workload whose owner pod runs",
		mutate: func(o *inventory.Objects) {
			o.Claims = append(o.Claims, invtest.Claim(invtest.Tenant, "web", invtest.PrimaryNetwork, "", "web-1"))
		},
	}, {
		name: "claim mismatch",
		mutate: func(o *inventory.Objects) {
			o.Claims[0].Status.IPs = []string{"10.10.0.40/24"}
		},
		want: []audit.Finding{{Kind: audit.ClaimMismatch, Network: invtest.PrimaryNetwork, Object: "pod/tenant/" + invtest.LauncherA,
			Detail: "its tenant/primary attachment has 10.10.0.4, its IPAMClaim vm-a.default has 10.10.0.40"}},
	}, {
		name: "claim on another network",
		mutate: func(o *inventory.Objects) {
			o.Claims[0].Spec.Network = invtest.LegacyNetwork
		},
		want: []audit.Finding{{Kind: audit.ClaimMismatch, Network: invtest.PrimaryNetwork, Object: "pod/tenant/" + invtest.LauncherA,
			Detail: "its tenant/primary attachment is on network tenant_primary, its IPAMClaim vm-a.default on network legacy"}},
	}, {
		name: "missing claim",
		mutate: func(o *inventory.Objects) {
			o.Claims = o.Claims[1:]
		},
		want: []audit.Finding{{Kind: audit.MissingClaim, Network: invtest.PrimaryNetwork, Object: "pod/tenant/" + invtest.LauncherA,
			Detail: "its tenant/primary attachment references IPAMClaim vm-a.default, which does not exist: nothing holds 10.10.0.4 for it"}},
	}, {
		name: "missing NAD of a UDN, its pods and claims",
		mutate: func(o *inventory.Objects) {
			o.NADs = slices.Delete(o.NADs, 0, 1) // tenant/primary
		},
		want: []audit.Finding{
			{Kind: audit.MissingNAD, Network: invtest.PrimaryNetwork, Object: "ipamclaim/tenant/vm-a.default",
				Detail: `no NetworkAttachmentDefinition defines its network "tenant_primary"`},
			{Kind: audit.MissingNAD, Network: invtest.PrimaryNetwork, Object: "ipamclaim/tenant/vm-b.default",
				Detail: `no NetworkAttachmentDefinition defines its network "tenant_primary"`},
			{Kind: audit.MissingNAD, Network: invtest.PrimaryNetwork, Object: "networkattachmentdefinition/tenant/primary",
				Detail: "does not exist; referenced by pod/tenant/" + invtest.LauncherA + " (kvnet.io/pod-networks), pod/tenant/web-1 (kvnet.io/pod-networks), userdefinednetwork/tenant/primary (NetworkCreated=True)"},
		},
	}, {
		name: "missing NAD of a CUDN in one namespace, requested by pods and a VMI",
		mutate: func(o *inventory.Objects) {
			o.NADs = slices.Delete(o.NADs, 1, 2) // tenant/shared
		},
		want: []audit.Finding{{Kind: audit.MissingNAD, Network: invtest.SharedNetwork, Object: "networkattachmentdefinition/tenant/shared",
			Detail: "does not exist; referenced by clusteruserdefinednetwork/shared (NetworkCreated=True, selects namespace tenant), pod/tenant/" + invtest.LauncherA +
				" (k8s.v1.cni.cncf.io/networks), pod/tenant/" + invtest.LauncherA + " (kvnet.io/pod-networks), pod/tenant/web-1 (k8s.v1.cni.cncf.io/networks), pod/tenant/web-1 (kvnet.io/pod-networks), virtualmachineinstance/tenant/vm-a"}},
	}, {
		name: "invalid NAD",
		mutate: func(o *inventory.Objects) {
			o.NADs[3].Spec.Config = `{"cniVersion":"1.1.0","type":"kvnet-cni","name":"legacy","topology":"layer2","subnets":"10.30.0.0/33"}`
		},
		want: []audit.Finding{{Kind: audit.InvalidNAD, Object: "networkattachmentdefinition/tenant/legacy"}},
	}, {
		name: "invalid annotation",
		mutate: func(o *inventory.Objects) {
			o.Pods[0].Annotations["kvnet.io/pod-networks"] = `{"tenant/primary":{"mac_address":"nope","role":"primary","network":"tenant_primary"}}`
		},
		want: []audit.Finding{{Kind: audit.InvalidAnnotation, Object: "pod/tenant/web-1"}},
	}, {
		name: "duplicate MAC on VMs",
		mutate: func(o *inventory.Objects) {
			vm := o.VMs[1].DeepCopy()
			vm.Name = "vm-c"
			vm.Spec.Template.Spec.Domain.Devices.Interfaces[0].Masquerade = &kubevirtv1.InterfaceMasquerade{}
			vm.Spec.Template.Spec.Domain.Devices.Interfaces[0].Binding = nil
			vm.Spec.Template.Spec.Domain.Devices.Interfaces[0].MacAddress = "02:00:00:00:00:10"
			o.VMs = append(o.VMs, *vm)
		},
		want: []audit.Finding{{Kind: audit.DuplicateVMMAC, Object: "02:00:00:00:00:10",
			Detail: "set on virtualmachine/tenant/vm-a (interface blue) and virtualmachine/tenant/vm-c (interface default)"}},
	}, {
		name: "invalid MAC range",
		mutate: func(o *inventory.Objects) {
			o.MACRange.Data["RANGE_END"] = "01:00:00:00:00:00"
		},
		want: []audit.Finding{{Kind: audit.InvalidMACRange, Object: "configmap/kvnet-system/kvnet-mac-range-config"}},
	}, {
		name: "pods and claims being deleted still hold addresses",
		mutate: func(o *inventory.Objects) {
			now := metav1.Now()
			o.Claims[1].DeletionTimestamp = &now
			p := invtest.Pod(invtest.Tenant, "late", "node-2", primary("10.10.0.5/24", "0a:58:0a:0a:00:05", ""))
			p.Status.Phase = corev1.PodPending
			o.Pods = append(o.Pods, p)
		},
		want: []audit.Finding{{Kind: audit.DuplicateIP, Network: invtest.PrimaryNetwork, Object: "10.10.0.5",
			Detail: "held by ipamclaim/tenant/vm-b.default and pod/tenant/late"}},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := invtest.World()
			tt.mutate(o)
			got := check(o).Findings
			if len(got) != len(tt.want) {
				t.Fatalf("findings:\n%s\nwant:\n%s", dump(got), dump(tt.want))
			}
			for i := range got {
				w := tt.want[i]
				if got[i].Kind != w.Kind || got[i].Network != w.Network || got[i].Object != w.Object ||
					(w.Detail != "" && got[i].Detail != w.Detail) || got[i].Detail == "" {
					t.Fatalf("findings:\n%s\nwant:\n%s", dump(got), dump(tt.want))
				}
			}
		})
	}
}

func dump(fs []audit.Finding) string {
	var b strings.Builder
	for _, f := range fs {
		b.WriteString("  " + f.Kind + " | " + f.Network + " | " + f.Object + " | " + f.Detail + "\n")
	}
	return b.String()
}

func TestSummary(t *testing.T) {
	r := audit.Report{Findings: []audit.Finding{{Kind: "LeakedClaim"}, {Kind: "DuplicateIP"}, {Kind: "LeakedClaim"}}}
	if got := r.Summary(); got != "3 findings: 1 DuplicateIP, 2 LeakedClaim" {
		t.Errorf("summary %q", got)
	}
	r.Findings = r.Findings[:1]
	if got := r.Summary(); got != "1 finding: 1 LeakedClaim" {
		t.Errorf("summary %q", got)
	}
}
