package audit_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nadv1 "kvnet.io/kvnet/api/k8scni/v1"
	kubevirtv1 "kvnet.io/kvnet/api/kubevirt/v1"
	"kvnet.io/kvnet/internal/audit"
	cliaudit "kvnet.io/kvnet/internal/cli/audit"
	"kvnet.io/kvnet/internal/inventory/invtest"
	"kvnet.io/kvnet/internal/testenv"
	"kvnet.io/kvnet/internal/testenv/golden"
)

var (
	c          client.Client
	kubeconfig string
)

func TestMain(m *testing.M) {
	os.Exit(testenv.MainAPI(m, testenv.Options{NoControllerManager: true}, func(e *testenv.Env) error {
		c = e.Client
		dir, err := os.MkdirTemp("", "kvnet-audit-")
		if err != nil {
			return err
		}
		kubeconfig = filepath.Join(dir, "kubeconfig")
		if err := os.WriteFile(kubeconfig, e.CP.Kubeconfig, 0o600); err != nil {
			return err
		}
		return invtest.Seed(context.Background(), e.Client, invtest.World())
	}))
}

func kvnetAudit(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	cmd := cliaudit.NewCommand()
	var out, errb bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&errb)
	cmd.SetArgs(append(args, "--kubeconfig", kubeconfig))
	err = cmd.ExecuteContext(context.Background())
	return out.String(), errb.String(), err
}

func clean(t *testing.T) {
	t.Helper()
	out, stderr, err := kvnetAudit(t)
	if err != nil || stderr != "" {
		t.Fatalf("kvnet audit on a consistent cluster: %v, stderr %q\n%s", err, stderr, out)
	}
	if want := "no findings (checked 5 pods, 2 claims, 10 allocations, 5 networks, 2 VMs)\n"; out != want {
		t.Fatalf("stdout %q, want %q", out, want)
	}
	r, err := audit.Run(context.Background(), c)
	if err != nil || len(r.Findings) != 0 || r.Checked.Claims != 2 {
		t.Fatalf("audit.Run: %v %+v", err, r)
	}
}

// inject writes inconsistent objects into the consistent world and returns
// what removes them again.
func inject(t *testing.T) (undo func()) {
	t.Helper()
	ctx := context.Background()
	primary := func(ip, mac, claim string) invtest.Attachment {
		return invtest.Attachment{NAD: "tenant/primary", Network: invtest.PrimaryNetwork, Role: "primary", IPs: []string{ip}, MAC: mac, Claim: claim}
	}
	var objs []client.Object
	add := func(o client.Object) {
		t.Helper()
		testenv.Create(t, c, o)
		objs = append(objs, o)
	}
	pod := func(p corev1.Pod) *corev1.Pod { return &p }
	// DuplicateIP: the stopped VM vm-b's claim holds 10.10.0.5.
	add(pod(invtest.Pod(invtest.Tenant, "intruder", "node-2", primary("10.10.0.5/24", "0a:58:0a:0a:00:05", ""))))
	// DuplicateIP on the Layer3 network: app-1's address, on node-1.
	add(pod(invtest.Pod(invtest.L3, "l3-intruder", "node-1", invtest.Attachment{NAD: "l3/l3-net", Network: invtest.Layer3Network,
		Role: "primary", IPs: []string{"10.100.0.3/24"}, MAC: "0a:58:0a:64:00:63"})))
	// DuplicateMAC: vm-a's MAC on the primary network.
	add(pod(invtest.Pod(invtest.Tenant, "copycat", "node-2", primary("10.10.0.9/24", "02:00:00:00:00:01", ""))))
	// LeakedClaim: no VM, VMI or pod.
	leaked := invtest.Claim(invtest.Tenant, "gone.default", invtest.PrimaryNetwork, "gone", "virt-launcher-gone-abcde", "10.10.0.77/24")
	add(&leaked)
	leaked.Status = invtest.Claim(invtest.Tenant, "gone.default", invtest.PrimaryNetwork, "gone", "virt-launcher-gone-abcde", "10.10.0.77/24").Status
	if err := c.Status().Update(ctx, &leaked); err != nil {
		t.Fatal(err)
	}
	// ClaimMismatch: vm-b starts with another IP than its claim's.
	launcherB := invtest.Pod(invtest.Tenant, "virt-launcher-vm-b-q9w8e", "node-2", primary("10.10.0.50/24", "02:00:00:00:00:02", "vm-b.default"))
	launcherB.Labels = map[string]string{kubevirtv1.AppLabel: kubevirtv1.VirtLauncherValue, kubevirtv1.VMNameLabel: "vm-b"}
	launcherB.Annotations[kubevirtv1.DomainAnnotation] = "vm-b"
	add(&launcherB)
	// MissingClaim.
	add(pod(invtest.Pod(invtest.Tenant, "orphan", "node-1", primary("10.10.0.60/24", "0a:58:0a:0a:00:3c", "nope.default"))))
	// MissingNAD: a pod asks for a NAD that is not there.
	lost := invtest.Pod(invtest.Other, "lost", "node-1")
	lost.Annotations["k8s.v1.cni.cncf.io/networks"] = "nowhere"
	add(&lost)
	// InvalidNAD.
	add(&nadv1.NetworkAttachmentDefinition{ObjectMeta: metav1.ObjectMeta{Namespace: invtest.Tenant, Name: "broken"},
		Spec: nadv1.NetworkAttachmentDefinitionSpec{Config: `{"cniVersion":"1.1.0","type":"kvnet-cni","name":"broken","topology":"layer2","subnets":"10.40.0.0/33"}`}})
	// InvalidAnnotation.
	garbled := invtest.Pod(invtest.Tenant, "garbled", "node-1")
	garbled.Annotations["kvnet.io/pod-networks"] = "{"
	add(&garbled)
	// DuplicateVMMAC: a masquerade VM with vm-a's secondary MAC.
	always := "Always"
	add(&kubevirtv1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: invtest.Tenant, Name: "vm-c"}, Spec: kubevirtv1.VirtualMachineSpec{RunStrategy: &always,
		Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{Spec: kubevirtv1.VirtualMachineInstanceSpec{
			Domain: kubevirtv1.DomainSpec{Devices: kubevirtv1.Devices{Interfaces: []kubevirtv1.Interface{
				{Name: "default", Masquerade: &kubevirtv1.InterfaceMasquerade{}, MacAddress: "02:00:00:00:00:10"}}}},
			Networks: []kubevirtv1.Network{{Name: "default", Pod: &kubevirtv1.PodNetwork{}}}}}}})
	// InvalidMACRange.
	var cm corev1.ConfigMap
	key := client.ObjectKey{Namespace: invtest.System, Name: "kvnet-mac-range-config"}
	if err := c.Get(ctx, key, &cm); err != nil {
		t.Fatal(err)
	}
	good := cm.Data["RANGE_END"]
	cm.Data["RANGE_END"] = "01:00:00:00:00:00"
	if err := c.Update(ctx, &cm); err != nil {
		t.Fatal(err)
	}
	return func() {
		for _, o := range objs {
			if err := c.Delete(ctx, o, client.GracePeriodSeconds(0)); err != nil {
				t.Errorf("delete %T %s: %v", o, o.GetName(), err)
			}
		}
		if err := c.Get(ctx, key, &cm); err != nil {
			t.Fatal(err)
		}
		cm.Data["RANGE_END"] = good
		if err := c.Update(ctx, &cm); err != nil {
			t.Fatal(err)
		}
	}
}

func TestAudit(t *testing.T) {
	clean(t)
	undo := inject(t)

	out, stderr, err := kvnetAudit(t)
	if !errors.Is(err, cliaudit.ErrFindings) {
		t.Fatalf("kvnet audit with findings: err %v, want ErrFindings", err)
	}
	wantSummary := "audit: 11 findings: 1 ClaimMismatch, 2 DuplicateIP, 1 DuplicateMAC, 1 DuplicateVMMAC, 1 InvalidAnnotation, 1 InvalidMACRange, 1 InvalidNAD, 1 LeakedClaim, 1 MissingClaim, 1 MissingNAD" +
		" (checked 10 pods, 3 claims, 15 allocations, 5 networks, 3 VMs)\n"
	if stderr != wantSummary {
		t.Errorf("stderr:\n%q\nwant:\n%q", stderr, wantSummary)
	}
	golden.CheckString(t, "findings.golden", out)

	// -o json is the report, and audit.Run returns the same.
	out, _, err = kvnetAudit(t, "-o", "json")
	if !errors.Is(err, cliaudit.ErrFindings) {
		t.Fatalf("kvnet audit -o json with findings: err %v", err)
	}
	var fromCLI audit.Report
	if err := json.Unmarshal([]byte(out), &fromCLI); err != nil {
		t.Fatalf("-o json is not a report: %v\n%s", err, out)
	}
	r, err := audit.Run(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(r.Findings, fromCLI.Findings) || r.Checked != fromCLI.Checked {
		t.Errorf("audit.Run %+v\n-o json %+v", r, fromCLI)
	}
	kinds := map[string]string{}
	for _, f := range r.Findings {
		kinds[f.Kind] = f.Object
	}
	for kind, object := range map[string]string{
		audit.DuplicateIP:       "10.10.0.5",
		audit.DuplicateMAC:      "02:00:00:00:00:01",
		audit.LeakedClaim:       "ipamclaim/tenant/gone.default",
		audit.ClaimMismatch:     "pod/tenant/virt-launcher-vm-b-q9w8e",
		audit.MissingClaim:      "pod/tenant/orphan",
		audit.MissingNAD:        "networkattachmentdefinition/other/nowhere",
		audit.InvalidNAD:        "networkattachmentdefinition/tenant/broken",
		audit.InvalidAnnotation: "pod/tenant/garbled",
		audit.DuplicateVMMAC:    "02:00:00:00:00:10",
		audit.InvalidMACRange:   "configmap/kvnet-system/kvnet-mac-range-config",
	} {
		if kinds[kind] != object {
			t.Errorf("finding %s: object %q, want %q", kind, kinds[kind], object)
		}
	}

	undo()
	clean(t)
}

func TestBadOutput(t *testing.T) {
	if _, _, err := kvnetAudit(t, "-o", "yaml"); err == nil || errors.Is(err, cliaudit.ErrFindings) {
		t.Errorf("kvnet audit -o yaml: %v, want a usage error", err)
	}
}

// A claim left in a namespace whose deletion finished without it (here the
// namespace is finalized by hand; kube-controller-manager can do the same
// across an API server restart) is reported as Orphaned, not as a leaked
// claim with a missing NAD.
func TestAuditOrphaned(t *testing.T) {
	clean(t)
	ctx := context.Background()
	const ns = "audit-orphan"
	nsObj := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}
	testenv.Create(t, c, nsObj)
	claim := invtest.Claim(ns, "vm-x.default", ns+"_primary", "vm-x", "", "10.50.0.7/24")
	testenv.Create(t, c, &claim)
	claim.Status = invtest.Claim(ns, "vm-x.default", ns+"_primary", "vm-x", "", "10.50.0.7/24").Status
	if err := c.Status().Update(ctx, &claim); err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(ctx, nsObj); err != nil {
		t.Fatal(err)
	}
	testenv.FinalizeNamespace(t, c, ns)

	out, stderr, err := kvnetAudit(t)
	if !errors.Is(err, cliaudit.ErrFindings) {
		t.Fatalf("kvnet audit: err %v, want ErrFindings\n%s", err, out)
	}
	if want := "audit: 1 finding: 1 Orphaned (checked 5 pods, 3 claims, 11 allocations, 5 networks, 2 VMs)\n"; stderr != want {
		t.Errorf("stderr %q, want %q", stderr, want)
	}
	for _, want := range []string{"Orphaned", "ipamclaim/audit-orphan/vm-x.default", "namespace audit-orphan no longer exists", "create namespace audit-orphan again, then delete it"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	// Deleting still works in a namespace that is gone.
	if err := c.Delete(ctx, &claim); err != nil {
		t.Fatal(err)
	}
	clean(t)
}
