package why

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nadv1 "kvnet.io/kvnet/api/k8scni/v1"
	kubevirtv1 "kvnet.io/kvnet/api/kubevirt/v1"
	udnv1 "kvnet.io/kvnet/api/udn/v1"
	"kvnet.io/kvnet/internal/ipam"
	"kvnet.io/kvnet/internal/k8s/manager"
	"kvnet.io/kvnet/internal/multus"
	"kvnet.io/kvnet/internal/podnetworks"
	"kvnet.io/kvnet/internal/testenv"
)

// The integration tests seed each fault directly into a real API server
// (etcd + kube-apiserver, no kube-controller-manager) and run the
// command as a user does, with --kubeconfig. kvnet-controller runs only
// where the chain needs it (the healthy pod, pool exhaustion).

var (
	env        *testenv.Env
	c          client.Client
	kubeconfig string
	// seededPKI signs the webhook certificate the tests seed.
	seededPKI testPKI
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "kvnet-why-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := testenv.MainAPI(m, testenv.Options{NoControllerManager: true}, func(e *testenv.Env) error {
		env, c = e, e.Client
		kubeconfig = filepath.Join(dir, "kubeconfig")
		if err := os.WriteFile(kubeconfig, e.CP.Kubeconfig, 0o600); err != nil {
			return err
		}
		return seedCluster(context.Background())
	})
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// seedCluster installs what every chain shares: kvnet's namespace, its
// webhook configuration with a caBundle that verifies the Secret's
// certificate (calling a closed port with failurePolicy Ignore, so that
// seeded VMs and launcher pods are admitted without a webhook server), and
// a KubeVirt CR registering l2bridge.
func seedCluster(ctx context.Context) error {
	for _, ns := range []string{"kvnet-system", "kubevirt"} {
		if err := c.Create(ctx, namespace(ns, false)); err != nil {
			return err
		}
	}
	seededPKI = newPKI(testingT{}, time.Now().Add(24*time.Hour), []net.IP{net.IPv4(127, 0, 0, 1)})
	if err := c.Create(ctx, seededPKI.secret("kvnet-system")); err != nil {
		return err
	}
	if err := c.Create(ctx, seededWebhook()); err != nil {
		return err
	}
	return c.Create(ctx, kubeVirtCR("l2bridge"))
}

func seededWebhook() *admissionregistrationv1.MutatingWebhookConfiguration {
	return webhookConfig("https://127.0.0.1:1", seededPKI.caPEM, admissionregistrationv1.Ignore)
}

// testingT lets newPKI run in TestMain.
type testingT struct{ testing.TB }

func (testingT) Helper()                   {}
func (testingT) Fatal(args ...any)         { panic(fmt.Sprint(args...)) }
func (testingT) Fatalf(f string, a ...any) { panic(fmt.Sprintf(f, a...)) }

var seq atomic.Int32

// uniq returns a fresh DNS-1123 name.
func uniq(prefix string) string { return fmt.Sprintf("%s-%d", prefix, seq.Add(1)) }

func create(t testing.TB, objs ...client.Object) {
	t.Helper()
	for _, o := range objs {
		testenv.Create(t, c, o)
	}
}

// createWithStatus creates o and then writes its status as given.
func createWithStatus(t testing.TB, o client.Object) {
	t.Helper()
	want := o.DeepCopyObject().(client.Object)
	create(t, o)
	want.SetResourceVersion(o.GetResourceVersion())
	want.SetUID(o.GetUID())
	want.SetCreationTimestamp(o.GetCreationTimestamp())
	if err := c.Status().Update(context.Background(), want); err != nil {
		t.Fatalf("update status of %T %s: %v", o, o.GetName(), err)
	}
}

// mkNode creates a Node with a Ready kvnet-node pod (ready=true) or a
// not-Ready one.
func mkNode(t testing.TB, ready bool) string {
	t.Helper()
	name := uniq("node")
	create(t, node(name, ""))
	a := agentPod("kvnet-system", name)
	setReady(a, ready)
	createWithStatus(t, a)
	return name
}

// runWhy runs "kvnet why" with args and the test kubeconfig, and returns its
// output, the code of the broken link ("" when healthy) and the exit status
// cmd/kvnet would give (1 when the command returns an error).
func runWhy(t testing.TB, args ...string) (string, Code, int) {
	t.Helper()
	cmd := NewCommand()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(append(args, "--kubeconfig", kubeconfig))
	err := cmd.ExecuteContext(context.Background())
	if err == nil {
		return out.String(), "", 0
	}
	var broken *BrokenError
	if !errors.As(err, &broken) {
		t.Fatalf("kvnet why %v: %v\n%s", args, err, out.String())
	}
	return out.String(), broken.Code, 1
}

// expectWhy runs kvnet why and checks the code, the exit status and that
// the output says each of want.
func expectWhy(t testing.TB, code Code, want []string, args ...string) string {
	t.Helper()
	out, got, exit := runWhy(t, args...)
	wantExit := 1
	if code == "" {
		wantExit = 0
	}
	if got != code || exit != wantExit {
		t.Fatalf("kvnet why %s: code %q exit %d, want %q exit %d; output:\n%s", strings.Join(args, " "), got, exit, code, wantExit, out)
	}
	for _, w := range want {
		if !strings.Contains(out, w) {
			t.Errorf("output lacks %q:\n%s", w, out)
		}
	}
	return out
}

func primaryNAD(ns string, persistent bool) *nadv1.NetworkAttachmentDefinition {
	return kvnetNAD(ns, "net", netConf{subnets: "10.0.0.0/24", persistent: persistent})
}

// seededPod creates a pod on node with annotations, as the tests seed it.
func seededPod(t testing.TB, ns, nodeName string, annotations map[string]string) *corev1.Pod {
	t.Helper()
	p := plainPod(ns, uniq("pod"), nodeName, annotations)
	p.UID = ""
	create(t, p)
	return p
}

// startController runs kvnet-controller for the rest of the test.
func startController(t *testing.T) {
	t.Helper()
	stop, err := env.RunController(manager.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
}

func TestWhyPodHealthy(t *testing.T) {
	startController(t)
	ns := uniq("healthy")
	create(t, namespace(ns, true), &udnv1.UserDefinedNetwork{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "udn-l2"},
		Spec: udnv1.UserDefinedNetworkSpec{Topology: udnv1.NetworkTopologyLayer2,
			Layer2: &udnv1.Layer2Config{Role: udnv1.NetworkRolePrimary, Subnets: udnv1.DualStackCIDRs{"10.30.0.0/24"}}},
	})
	nodeName := mkNode(t, true)
	var pod *corev1.Pod
	testenv.Eventually(t, 30*time.Second, "NAD rendered", func() error {
		return c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "udn-l2"}, &nadv1.NetworkAttachmentDefinition{})
	})
	pod = seededPod(t, ns, nodeName, nil)
	testenv.Eventually(t, 30*time.Second, "pod annotated", func() error {
		var p corev1.Pod
		if err := c.Get(context.Background(), client.ObjectKeyFromObject(pod), &p); err != nil {
			return err
		}
		if _, ok := p.Annotations[podnetworks.Annotation]; !ok {
			return errors.New("not annotated")
		}
		return nil
	})
	out := expectWhy(t, "", []string{
		fmt.Sprintf("pod %s/%s: healthy: 10.30.0.", ns, pod.Name), "/24 on " + ns + "/udn-l2 (primary, MAC 0a:58:0a:1e:00:",
		"UserDefinedNetwork " + ns + "/udn-l2: NetworkCreated=True", "gateway 10.30.0.1", "kvnet-node pod kvnet-system/kvnet-node-" + nodeName + " Ready",
	}, "pod", pod.Name, "-n", ns)
	t.Log("\n" + out)
}

func TestWhyNamespaceNotLabelled(t *testing.T) {
	// A UDN in a namespace created without the label: the UDN controller
	// (as OVN-Kubernetes) reports NetworkCreated=False with this message.
	ns := uniq("unlabelled")
	create(t, namespace(ns, false))
	createWithStatus(t, &udnv1.UserDefinedNetwork{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "udn-l2"},
		Spec: udnv1.UserDefinedNetworkSpec{Topology: udnv1.NetworkTopologyLayer2,
			Layer2: &udnv1.Layer2Config{Role: udnv1.NetworkRolePrimary, Subnets: udnv1.DualStackCIDRs{"10.0.0.0/24"}}},
		Status: udnv1.UserDefinedNetworkStatus{Conditions: []metav1.Condition{{Type: "NetworkCreated", Status: metav1.ConditionFalse, Reason: "SyncError", LastTransitionTime: metav1.Now(),
			Message: fmt.Sprintf(`invalid primary network state for namespace %q: a valid primary user defined network or network attachment definition custom resource, and required namespace label "k8s.ovn.org/primary-user-defined-network" must both be present`, ns)}}},
	})
	pod := seededPod(t, ns, mkNode(t, true), nil)
	expectWhy(t, NamespaceNotLabelled, []string{"recreate namespace " + ns + " with the label", "invalid primary network state"}, "pod", pod.Name, "-n", ns)
}

func TestWhyNoPrimaryNetwork(t *testing.T) {
	ns := uniq("noprimary")
	create(t, namespace(ns, true))
	pod := seededPod(t, ns, mkNode(t, true), nil)
	expectWhy(t, NoPrimaryNetwork, []string{"create a UserDefinedNetwork in " + ns}, "pod", pod.Name, "-n", ns)
}

func TestWhyPrimaryNetworkNotRendered(t *testing.T) {
	ns := uniq("notrendered")
	create(t, namespace(ns, true))
	createWithStatus(t, &udnv1.UserDefinedNetwork{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "udn-l2"},
		Spec: udnv1.UserDefinedNetworkSpec{Topology: udnv1.NetworkTopologyLayer2,
			Layer2: &udnv1.Layer2Config{Role: udnv1.NetworkRolePrimary, Subnets: udnv1.DualStackCIDRs{"10.0.0.0/24"}}},
		Status: udnv1.UserDefinedNetworkStatus{Conditions: []metav1.Condition{{Type: "NetworkCreated", Status: metav1.ConditionFalse, Reason: "SyncError", LastTransitionTime: metav1.Now(),
			Message: fmt.Sprintf("foreign NetworkAttachmentDefinition with the desired name already exist [%s/udn-l2]", ns)}}},
	})
	pod := seededPod(t, ns, mkNode(t, true), nil)
	expectWhy(t, PrimaryNetworkNotRendered, []string{"NetworkCreated=False (SyncError): foreign NetworkAttachmentDefinition", "rename or delete it"}, "pod", pod.Name, "-n", ns)
}

func TestWhyNADNotFound(t *testing.T) {
	ns := uniq("nadmissing")
	create(t, namespace(ns, false))
	pod := seededPod(t, ns, mkNode(t, true), map[string]string{multus.NetworksAnnotation: "tenant-blue"})
	expectWhy(t, NADNotFound, []string{"names NetworkAttachmentDefinition " + ns + "/tenant-blue, which does not exist"}, "pod", pod.Name, "-n", ns)
}

func TestWhyNADUnservedType(t *testing.T) {
	ns := uniq("overlay")
	create(t, namespace(ns, false), nadWith(ns, "blue",
		fmt.Sprintf(`{"cniVersion":"1.0.0","type":"ovn-k8s-cni-overlay","name":"%s_blue","topology":"layer2","role":"secondary","subnets":"10.1.0.0/24","netAttachDefName":"%s/blue"}`, ns, ns)))
	pod := seededPod(t, ns, mkNode(t, true), map[string]string{multus.NetworksAnnotation: "blue"})
	expectWhy(t, NADUnservedType, []string{`change "type" to "kvnet-cni"`, "ovn-k8s-cni-overlay"}, "pod", pod.Name, "-n", ns)
}

func TestWhyClaimNotFound(t *testing.T) {
	ns := uniq("claimmissing")
	create(t, namespace(ns, false), kvnetNAD(ns, "sec", netConf{role: "secondary", subnets: "10.1.0.0/24", persistent: true}))
	pod := seededPod(t, ns, mkNode(t, true), map[string]string{multus.NetworksAnnotation: selection(multus.NetworkSelectionElement{Name: "sec", IPAMClaimReference: "db.sec"})})
	expectWhy(t, ClaimNotFound, []string{"IPAMClaim " + ns + "/db.sec for network \"" + ns + "_sec\", which does not exist"}, "pod", pod.Name, "-n", ns)
}

func TestWhyClaimIgnored(t *testing.T) {
	ns := uniq("claimignored")
	create(t, namespace(ns, false), kvnetNAD(ns, "sec", netConf{role: "secondary", subnets: "10.1.0.0/24"}),
		claim(ns, "db.sec", ns+"_sec", nil))
	ann := map[string]string{
		multus.NetworksAnnotation: selection(multus.NetworkSelectionElement{Name: "sec", IPAMClaimReference: "db.sec"}),
		podnetworks.Annotation:    allocated(ns+"/sec", ns+"_sec", podnetworks.RoleSecondary, "10.1.0.4/24", ""),
	}
	pod := seededPod(t, ns, mkNode(t, true), ann)
	expectWhy(t, ClaimIgnored, []string{"does not allow persistent IPs", "lifecycle: Persistent"}, "pod", pod.Name, "-n", ns)
}

func TestWhyPoolExhausted(t *testing.T) {
	startController(t)
	ns := uniq("full")
	// A /30: network, gateway (.1), management (.2) and broadcast leave
	// no address for a pod.
	create(t, namespace(ns, true), &udnv1.UserDefinedNetwork{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "tiny"},
		Spec: udnv1.UserDefinedNetworkSpec{Topology: udnv1.NetworkTopologyLayer2,
			Layer2: &udnv1.Layer2Config{Role: udnv1.NetworkRolePrimary, Subnets: udnv1.DualStackCIDRs{"10.31.0.0/30"}}},
	})
	testenv.Eventually(t, 30*time.Second, "NAD rendered", func() error {
		return c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "tiny"}, &nadv1.NetworkAttachmentDefinition{})
	})
	pod := seededPod(t, ns, mkNode(t, true), nil)
	var out string
	testenv.Eventually(t, 30*time.Second, "kvnet why reports PoolExhausted", func() error {
		var code Code
		out, code, _ = runWhy(t, "pod", pod.Name, "-n", ns)
		if code != PoolExhausted {
			return fmt.Errorf("code %q:\n%s", code, out)
		}
		return nil
	})
	expectWhy(t, PoolExhausted, []string{`network "` + ns + `_tiny" (NAD ` + ns + `/tiny) has no free address`, "subnet address pool exhausted"}, "pod", pod.Name, "-n", ns)
}

func TestWhyKvnetNodeNotReady(t *testing.T) {
	ns := uniq("nodenotready")
	create(t, namespace(ns, true), primaryNAD(ns, false))
	nodeName := mkNode(t, false)
	pod := seededPod(t, ns, nodeName, map[string]string{podnetworks.Annotation: allocated(ns+"/net", ns+"_net", podnetworks.RolePrimary, "10.0.0.5/24", "")})
	expectWhy(t, KvnetNodeNotReady, []string{"kvnet-node on node " + nodeName + " is not Ready", "ContainersNotReady"}, "pod", pod.Name, "-n", ns)
}

func TestWhyWaitingForController(t *testing.T) {
	ns := uniq("waiting")
	create(t, namespace(ns, true), primaryNAD(ns, false))
	pod := seededPod(t, ns, mkNode(t, true), nil)
	expectWhy(t, WaitingForController, []string{"waiting for kvnet-controller", "no Deployment labelled app.kubernetes.io/name=kvnet-controller", "kubectl -n kvnet-system get deploy,pods,lease"}, "pod", pod.Name, "-n", ns)
}

// vmSeed is a running VM on a persistent primary network with l2bridge,
// seeded as KubeVirt and kvnet-controller leave it; the tests change one
// thing each before calling seed.
type vmSeed struct {
	ns, name, node string
	binding        string // the interface's binding (default l2bridge)
	secondaryNAD   string // adds a Multus interface "sec" on this NAD
	secondaryBind  string
	twice          bool   // adds a second interface "hot" on secondaryNAD
	claimOwner     *vmRef // default: the VM
	migration      *kubevirtv1.VirtualMachineInstanceMigrationState
	hostname       string // the guest's spec.hostname (default: none)
}

func newVMSeed(t testing.TB) *vmSeed {
	return &vmSeed{ns: uniq("vm"), name: "vm1", node: mkNode(t, true), binding: "l2bridge"}
}

func (s *vmSeed) seed(t testing.TB) {
	t.Helper()
	create(t, namespace(s.ns, true), primaryNAD(s.ns, true))
	ifaces := []vmIface{{name: "pod", binding: s.binding}}
	if s.secondaryNAD != "" {
		create(t, kvnetNAD(s.ns, s.secondaryNAD, netConf{role: "secondary", subnets: "10.1.0.0/24"}))
		ifaces = append(ifaces, vmIface{name: "sec", binding: s.secondaryBind, nad: s.secondaryNAD})
		if s.twice {
			ifaces = append(ifaces, vmIface{name: "hot", binding: s.secondaryBind, nad: s.secondaryNAD})
		}
	}
	spec := vmiSpec(ifaces...)
	spec.Hostname = s.hostname
	running := "Always"
	vm := &kubevirtv1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: s.ns, Name: s.name},
		Spec: kubevirtv1.VirtualMachineSpec{RunStrategy: &running, Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{Spec: spec}}}
	create(t, vm)
	t0 := true
	vmi := &kubevirtv1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: s.ns, Name: s.name,
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "kubevirt.io/v1", Kind: "VirtualMachine", Name: vm.Name, UID: vm.UID, Controller: &t0, BlockOwnerDeletion: &t0}}},
		Spec: spec}
	vmi.Status.Phase, vmi.Status.NodeName = "Running", s.node
	vmi.Status.MigrationState = s.migration
	createWithStatus(t, vmi)
	owner := s.claimOwner
	if owner == nil {
		owner = &vmRef{Kind: "VirtualMachine", Name: vm.Name, UID: vm.UID}
	}
	claimName := s.name + ".pod"
	createWithStatus(t, claim(s.ns, claimName, s.ns+"_net", owner, "10.0.0.5/24"))
	pod := plainPod(s.ns, "virt-launcher-"+s.name+"-abcde", s.node, map[string]string{
		kubevirtv1.DomainAnnotation:       s.name,
		ipam.LegacyPrimaryClaimAnnotation: claimName,
		multus.DefaultNetworkAnnotation:   selection(multus.NetworkSelectionElement{Name: "default", Namespace: "ovn-kubernetes", IPAMClaimReference: claimName}),
		podnetworks.Annotation:            allocated(s.ns+"/net", s.ns+"_net", podnetworks.RolePrimary, "10.0.0.5/24", claimName),
	})
	pod.UID = ""
	// As KubeVirt's virt-controller writes it: vm.kubevirt.io/name is the
	// guest's hostname (spec.hostname, else the VMI's name), the VMI owns
	// the pod.
	hostname := s.hostname
	if hostname == "" {
		hostname = s.name
	}
	pod.Labels = map[string]string{kubevirtv1.AppLabel: kubevirtv1.VirtLauncherValue, kubevirtv1.VMNameLabel: hostname,
		kubevirtv1.VMIIDLabel: s.name}
	pod.OwnerReferences = []metav1.OwnerReference{{APIVersion: "kubevirt.io/v1", Kind: "VirtualMachineInstance", Name: vmi.Name, UID: vmi.UID,
		Controller: &t0, BlockOwnerDeletion: &t0}}
	if s.secondaryNAD != "" {
		pod.Annotations[multus.NetworksAnnotation] = selection(multus.NetworkSelectionElement{Name: s.secondaryNAD, Namespace: s.ns})
	}
	create(t, pod)
}

func TestWhyVMHealthy(t *testing.T) {
	s := newVMSeed(t)
	s.seed(t)
	for _, kind := range []string{"vm", "vmi"} {
		expectWhy(t, "", []string{
			fmt.Sprintf("%s %s/vm1: healthy: 10.0.0.5/24 on %s/net (primary", kind, s.ns, s.ns), "launcher pod virt-launcher-vm1-abcde",
			"pod binding l2bridge on the pod network", "ipam-claims.kvnet.io in kvnet-mutator: caBundle verifies", "owner VirtualMachine vm1",
		}, kind, "vm1", "-n", s.ns)
	}
	// The launcher pod on its own: its chain includes the webhook.
	expectWhy(t, "", []string{"ipam-claims.kvnet.io in kvnet-mutator"}, "pod", "virt-launcher-vm1-abcde", "-n", s.ns)
}

// TestWhyGuestHostname: a VM whose guest hostname differs from its name
// (KubeVirt writes the hostname into its launcher pod's
// vm.kubevirt.io/name) is healthy, through the VM and through the pod,
// also once its VMI is gone (the pod's VM is then named after the VMI, as
// KubeVirt names a VM's VMI): its claims belong to the VM, not to a VM
// named after the hostname.
func TestWhyGuestHostname(t *testing.T) {
	s := newVMSeed(t)
	s.hostname = "guest-1"
	s.seed(t)
	expectWhy(t, "", []string{"owner VirtualMachine vm1"}, "vm", "vm1", "-n", s.ns)
	expectWhy(t, "", []string{"owner VirtualMachine vm1"}, "pod", "virt-launcher-vm1-abcde", "-n", s.ns)
	vmi := &kubevirtv1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: s.ns, Name: s.name}}
	if err := c.Delete(context.Background(), vmi); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "VMI gone", func() error {
		if err := c.Get(context.Background(), client.ObjectKeyFromObject(vmi), vmi); !apierrors.IsNotFound(err) {
			return fmt.Errorf("VMI still there: %v", err)
		}
		return nil
	})
	expectWhy(t, "", []string{"owner VirtualMachine vm1"}, "pod", "virt-launcher-vm1-abcde", "-n", s.ns)
}

func TestWhyClaimOwnedByOtherVM(t *testing.T) {
	s := newVMSeed(t)
	s.claimOwner = &vmRef{Kind: "VirtualMachine", Name: "vm-old", UID: "0b8f3c0e-1111-2222-3333-444455556666"}
	s.seed(t)
	expectWhy(t, ClaimOwnedByOther, []string{"IPAMClaim " + s.ns + "/vm1.pod, which belongs to VirtualMachine vm-old"}, "vm", "vm1", "-n", s.ns)
}

func TestWhyBindingNotRegistered(t *testing.T) {
	s := newVMSeed(t)
	s.binding = "l2bridge-v2"
	s.seed(t)
	expectWhy(t, BindingNotRegistered, []string{`binding plugin "l2bridge-v2"`, "KubeVirt kubevirt/kubevirt registers l2bridge"}, "vm", "vm1", "-n", s.ns)
}

func TestWhyBindingUnsupported(t *testing.T) {
	s := newVMSeed(t)
	s.secondaryNAD, s.secondaryBind = "blue", "masquerade"
	s.seed(t)
	expectWhy(t, BindingUnsupported, []string{`interface "sec" uses masquerade, which works on the pod network only`}, "vmi", "vm1", "-n", s.ns)
}

func TestWhyNADSelectedTwice(t *testing.T) {
	s := newVMSeed(t)
	s.secondaryNAD, s.secondaryBind, s.twice = "blue", "bridge", true
	s.seed(t)
	expectWhy(t, NADSelectedTwice, []string{`VM networks "sec" and "hot" both select NAD ` + s.ns + "/blue", "refuses a launcher pod that selects one twice"}, "vm", "vm1", "-n", s.ns)
}

func TestWhyMigrationFailed(t *testing.T) {
	s := newVMSeed(t)
	s.migration = &kubevirtv1.VirtualMachineInstanceMigrationState{SourceNode: s.node, TargetNode: "node-x", TargetPod: "virt-launcher-vm1-fghij",
		Failed: true, FailureReason: "target virt-launcher pod failed: network not ready"}
	s.seed(t)
	expectWhy(t, MigrationFailed, []string{"target virt-launcher pod failed: network not ready", "keeps running on node " + s.node}, "vm", "vm1", "-n", s.ns)
}

func TestWhyMigrationObjectFailed(t *testing.T) {
	s := newVMSeed(t)
	s.seed(t)
	createWithStatus(t, &kubevirtv1.VirtualMachineInstanceMigration{
		ObjectMeta: metav1.ObjectMeta{Namespace: s.ns, Name: "migrate-vm1"},
		Spec:       kubevirtv1.VirtualMachineInstanceMigrationSpec{VMIName: "vm1"},
		Status:     kubevirtv1.VirtualMachineInstanceMigrationStatus{Phase: "Failed"},
	})
	expectWhy(t, MigrationFailed, []string{"VirtualMachineInstanceMigration " + s.ns + "/migrate-vm1 of VMI vm1 is Failed"}, "vmi", "vm1", "-n", s.ns)
}

// withWebhook replaces kvnet's webhook configuration for the test and
// puts the seeded one back afterwards (nil: delete it).
func withWebhook(t *testing.T, wc *admissionregistrationv1.MutatingWebhookConfiguration) {
	t.Helper()
	ctx := context.Background()
	var cur admissionregistrationv1.MutatingWebhookConfiguration
	if err := c.Get(ctx, client.ObjectKey{Name: "kvnet-mutator"}, &cur); err != nil {
		t.Fatal(err)
	}
	if wc == nil {
		if err := c.Delete(ctx, &cur); err != nil {
			t.Fatal(err)
		}
	} else {
		wc.ResourceVersion = cur.ResourceVersion
		if err := c.Update(ctx, wc); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		var now admissionregistrationv1.MutatingWebhookConfiguration
		err := c.Get(ctx, client.ObjectKey{Name: "kvnet-mutator"}, &now)
		seeded := seededWebhook()
		switch {
		case apierrors.IsNotFound(err):
			err = c.Create(ctx, seeded)
		case err == nil:
			seeded.ResourceVersion = now.ResourceVersion
			err = c.Update(ctx, seeded)
		}
		if err != nil {
			t.Errorf("restore the seeded webhook configuration: %v", err)
		}
	})
}

func TestWhyWebhookNotRegistered(t *testing.T) {
	s := newVMSeed(t)
	s.seed(t)
	withWebhook(t, nil)
	expectWhy(t, WebhookNotRegistered, []string{"no MutatingWebhookConfiguration has kvnet's webhook mutatevirtualmachines.kvnet.io", "apply kvnet's webhook configuration"}, "vm", "vm1", "-n", s.ns)
}

func TestWhyWebhookCABundleMismatch(t *testing.T) {
	s := newVMSeed(t)
	s.seed(t)
	// A caBundle from another CA (a re-issued CA whose bundle was not
	// injected, or one pasted by hand).
	other := newPKI(t, time.Now().Add(time.Hour), []net.IP{net.IPv4(127, 0, 0, 1)})
	withWebhook(t, webhookConfig("https://127.0.0.1:1", other.caPEM, admissionregistrationv1.Ignore))
	expectWhy(t, WebhookCABundleMismatch, []string{"does not verify the certificate kvnet serves", "certificate signed by unknown authority"}, "vm", "vm1", "-n", s.ns)
}

func TestWhyNotFound(t *testing.T) {
	cmd := NewCommand()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs([]string{"pod", "nope", "-n", "default", "--kubeconfig", kubeconfig})
	err := cmd.ExecuteContext(context.Background())
	var broken *BrokenError
	if err == nil || errors.As(err, &broken) || !strings.Contains(err.Error(), `pods "nope" not found`) {
		t.Fatalf("want a not-found error, got %v", err)
	}
}

// TestWhyVMHealthyWithController runs the VM chain as kvnet-controller
// builds it (its webhooks mutate the VM and the launcher pod, its claims
// controller creates the claim, its IPAM fills claim and pod), so the
// checks are held against the controller's real output, not only against
// seeded objects.
func TestWhyVMHealthyWithController(t *testing.T) {
	ctx := context.Background()
	t.Cleanup(func() {
		// After the controller stops (cleanups run last first): the
		// configuration it was given points at a closed port with
		// failurePolicy Fail; put the seeded one back.
		var cur admissionregistrationv1.MutatingWebhookConfiguration
		if err := c.Get(ctx, client.ObjectKey{Name: "kvnet-mutator"}, &cur); err != nil {
			t.Errorf("restore webhook configuration: %v", err)
			return
		}
		seeded := seededWebhook()
		seeded.ResourceVersion = cur.ResourceVersion
		if err := c.Update(ctx, seeded); err != nil {
			t.Errorf("restore webhook configuration: %v", err)
		}
	})
	opts, err := env.WebhookOptions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	stop, err := env.RunController(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)

	ns := uniq("vmctl")
	create(t, namespace(ns, true), &udnv1.UserDefinedNetwork{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "udn-l2"},
		Spec: udnv1.UserDefinedNetworkSpec{Topology: udnv1.NetworkTopologyLayer2, Layer2: &udnv1.Layer2Config{
			Role: udnv1.NetworkRolePrimary, Subnets: udnv1.DualStackCIDRs{"10.32.0.0/24"}, IPAM: &udnv1.IPAMConfig{Lifecycle: udnv1.IPAMLifecyclePersistent}}},
	})
	testenv.Eventually(t, 30*time.Second, "NAD rendered", func() error {
		return c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "udn-l2"}, &nadv1.NetworkAttachmentDefinition{})
	})
	nodeName := mkNode(t, true)
	spec := vmiSpec(vmIface{name: "podnet", binding: "l2bridge"})
	running := "Always"
	vm := &kubevirtv1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "vm1"},
		Spec: kubevirtv1.VirtualMachineSpec{RunStrategy: &running, Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{Spec: spec}}}
	create(t, vm) // through the MAC pool webhook
	t0 := true
	vmi := &kubevirtv1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "vm1",
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "kubevirt.io/v1", Kind: "VirtualMachine", Name: vm.Name, UID: vm.UID, Controller: &t0, BlockOwnerDeletion: &t0}}},
		Spec: vm.Spec.Template.Spec}
	vmi.Status.Phase, vmi.Status.NodeName = "Running", nodeName
	createWithStatus(t, vmi)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "virt-launcher-vm1-abcde", Annotations: map[string]string{kubevirtv1.DomainAnnotation: "vm1"},
			Labels: map[string]string{kubevirtv1.AppLabel: kubevirtv1.VirtLauncherValue, kubevirtv1.VMNameLabel: "vm1"}},
		Spec: corev1.PodSpec{NodeName: nodeName, Containers: []corev1.Container{{Name: "compute", Image: "virt-launcher"}}},
	}
	create(t, pod) // through the launcher-pod webhook
	var out string
	testenv.Eventually(t, 30*time.Second, "kvnet why vm reports healthy", func() error {
		var code Code
		out, code, _ = runWhy(t, "vm", "vm1", "-n", ns)
		if code != "" {
			return fmt.Errorf("code %q:\n%s", code, out)
		}
		return nil
	})
	expectWhy(t, "", []string{"vm " + ns + "/vm1: healthy: 10.32.0.", "on " + ns + "/udn-l2 (primary", "launcher pod virt-launcher-vm1-abcde",
		"claim      " + ns + "/vm1.podnet: network \"" + ns + "_udn-l2\", IPs 10.32.0.", "owner VirtualMachine vm1",
		"ipam-claims.kvnet.io in kvnet-mutator: caBundle verifies the serving certificate"}, "vm", "vm1", "-n", ns)
	t.Log("\n" + out)
}
