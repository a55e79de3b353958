package why

import (
	"bytes"
	"net"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	nadv1 "kvnet.io/kvnet/api/k8scni/v1"
	ipamclaimv1alpha1 "kvnet.io/kvnet/api/k8scni/v1alpha1"
	kubevirtv1 "kvnet.io/kvnet/api/kubevirt/v1"
	udnv1 "kvnet.io/kvnet/api/udn/v1"
	"kvnet.io/kvnet/internal/ipam"
	"kvnet.io/kvnet/internal/migration"
	"kvnet.io/kvnet/internal/multus"
	"kvnet.io/kvnet/internal/podnetworks"
	"kvnet.io/kvnet/internal/udn"
)

var unitNow = time.Now()

// podFactsOf sorts objects into the facts of pod's chain.
func podFactsOf(pod *corev1.Pod, objs ...any) *podFacts {
	f := &podFacts{Pod: pod, Claims: map[string]*ipamclaimv1alpha1.IPAMClaim{}, OwnerPods: map[string]*corev1.Pod{},
		Controller: controllerFacts{Namespace: "kvnet-system", Now: unitNow}}
	f.NADs = map[string]*nadv1.NetworkAttachmentDefinition{}
	for _, o := range objs {
		switch o := o.(type) {
		case *corev1.Namespace:
			f.Namespace = o
		case *nadv1.NetworkAttachmentDefinition:
			f.NADs[o.Namespace+"/"+o.Name] = o
		case *udnv1.UserDefinedNetwork:
			f.UDNs = append(f.UDNs, *o)
		case *udnv1.ClusterUserDefinedNetwork:
			f.CUDNs = append(f.CUDNs, *o)
		case *ipamclaimv1alpha1.IPAMClaim:
			f.Claims[o.Name] = o
		case *corev1.Pod:
			if o.Labels[agentLabelKey] == agentLabelValue {
				f.Node.Agents = append(f.Node.Agents, *o)
			} else {
				f.OwnerPods[o.Name] = o
			}
		case corev1.Event:
			f.Events = append(f.Events, o)
		case *corev1.Node:
			f.Node.Node = o
		case *appsv1.DaemonSet:
			f.Node.DaemonSets = append(f.Node.DaemonSets, *o)
		case *vmRef:
			f.VM = o
		case *kubevirtv1.VirtualMachineInstance:
			f.VMI = o
		case *webhookFacts:
			f.Webhook = o
		default:
			panic("podFactsOf: unknown object")
		}
	}
	if f.Namespace == nil {
		f.Namespace = namespace(pod.Namespace, false)
	}
	for _, k := range selectedKeys(pod) {
		if _, ok := f.NADs[k]; !ok {
			f.NADs[k] = nil
		}
	}
	for _, n := range claimRefs(pod) {
		if _, ok := f.Claims[n]; !ok {
			f.Claims[n] = nil
		}
	}
	return f
}

func diagnose(f *podFacts) *Report {
	r := &Report{Subject: "pod " + f.Pod.Namespace + "/" + f.Pod.Name}
	diagnosePod(r, f, nil)
	return r
}

func readyAgent(nodeName string) *corev1.Pod {
	a := agentPod("kvnet-system", nodeName)
	setReady(a, true)
	return a
}

// expect checks the report's code ("" for healthy) and that every want
// string is in the printed report.
func expect(t *testing.T, r *Report, code Code, want ...string) {
	t.Helper()
	var b bytes.Buffer
	r.Print(&b)
	got := Code("")
	if r.Problem != nil {
		got = r.Problem.Code
	}
	if got != code {
		t.Fatalf("code %q, want %q; report:\n%s", got, code, b.String())
	}
	for _, w := range want {
		if !strings.Contains(b.String(), w) {
			t.Errorf("report lacks %q:\n%s", w, b.String())
		}
	}
}

const (
	primaryNet = "t_net"
	primaryKey = "t/net"
)

// healthyPrimary returns the objects of a pod on a persistent primary
// Layer2 network with its addresses and a Ready kvnet-node.
func healthyPrimary() (*corev1.Pod, []any) {
	pod := plainPod("t", "p", "n1", map[string]string{podnetworks.Annotation: allocated(primaryKey, primaryNet, podnetworks.RolePrimary, "10.0.0.5/24", "")})
	return pod, []any{namespace("t", true), kvnetNAD("t", "net", netConf{subnets: "10.0.0.0/24", persistent: true}), node("n1", ""), readyAgent("n1")}
}

func TestPodHealthy(t *testing.T) {
	pod, objs := healthyPrimary()
	r := diagnose(podFactsOf(pod, objs...))
	expect(t, r, "", "pod t/p: healthy: 10.0.0.5/24 on t/net (primary, MAC 0a:58:0a:00:00:05), node n1", "kvnet-node pod kvnet-system/kvnet-node-n1 Ready")
}

func TestPodNotOnKvnet(t *testing.T) {
	pod := plainPod("plain", "p", "n1", nil)
	expect(t, diagnose(podFactsOf(pod)), "", "on no kvnet network")
	pod.Spec.HostNetwork = true
	expect(t, diagnose(podFactsOf(pod)), "", "host network")
}

func TestNamespaceNotLabelled(t *testing.T) {
	u := &udnv1.UserDefinedNetwork{ObjectMeta: metav1.ObjectMeta{Namespace: "t", Name: "net"},
		Spec: udnv1.UserDefinedNetworkSpec{Topology: udnv1.NetworkTopologyLayer2, Layer2: &udnv1.Layer2Config{Role: udnv1.NetworkRolePrimary, Subnets: udnv1.DualStackCIDRs{"10.0.0.0/24"}}},
		Status: udnv1.UserDefinedNetworkStatus{Conditions: []metav1.Condition{{Type: "NetworkCreated", Status: metav1.ConditionFalse, Reason: "SyncError",
			Message: `invalid primary network state for namespace "t": a valid primary user defined network or network attachment definition custom resource, and required namespace label "k8s.ovn.org/primary-user-defined-network" must both be present`}}}}
	t.Run("udn", func(t *testing.T) {
		r := diagnose(podFactsOf(plainPod("t", "p", "n1", nil), namespace("t", false), u))
		expect(t, r, NamespaceNotLabelled, "UserDefinedNetwork t/net is a primary network", "SyncError", "recreate namespace t with the label")
	})
	t.Run("cudn", func(t *testing.T) {
		c := &udnv1.ClusterUserDefinedNetwork{ObjectMeta: metav1.ObjectMeta{Name: "shared"},
			Spec: udnv1.ClusterUserDefinedNetworkSpec{NamespaceSelector: metav1.LabelSelector{MatchLabels: map[string]string{"team": "a"}},
				Network: udnv1.NetworkSpec{Topology: udnv1.NetworkTopologyLayer2, Layer2: &udnv1.Layer2Config{Role: udnv1.NetworkRolePrimary}}}}
		ns := namespace("t", false)
		ns.Labels = map[string]string{"team": "a"}
		expect(t, diagnose(podFactsOf(plainPod("t", "p", "n1", nil), ns, c)), NamespaceNotLabelled, "ClusterUserDefinedNetwork shared")
		ns.Labels = map[string]string{"team": "b"}
		expect(t, diagnose(podFactsOf(plainPod("t", "p", "n1", nil), ns, c)), "")
	})
	t.Run("pod asks for a primary claim", func(t *testing.T) {
		pod := plainPod("t", "p", "n1", map[string]string{ipam.LegacyPrimaryClaimAnnotation: "vm1.pod"})
		expect(t, diagnose(podFactsOf(pod, namespace("t", false))), NamespaceNotLabelled, `references IPAMClaim "vm1.pod" for its primary network`)
	})
	t.Run("fixed", func(t *testing.T) {
		// The same objects in a labelled namespace: no longer this reason.
		pod, objs := healthyPrimary()
		expect(t, diagnose(podFactsOf(pod, append(objs, u)...)), "")
	})
}

func TestNoPrimaryNetwork(t *testing.T) {
	pod := plainPod("t", "p", "n1", nil)
	expect(t, diagnose(podFactsOf(pod, namespace("t", true))), NoPrimaryNetwork, "create a UserDefinedNetwork in t")
	// A secondary NAD does not count.
	expect(t, diagnose(podFactsOf(pod, namespace("t", true), kvnetNAD("t", "sec", netConf{role: "secondary", subnets: "10.1.0.0/24"}))), NoPrimaryNetwork)
}

func TestPrimaryNetworkNotRendered(t *testing.T) {
	u := &udnv1.UserDefinedNetwork{ObjectMeta: metav1.ObjectMeta{Namespace: "t", Name: "net"},
		Spec: udnv1.UserDefinedNetworkSpec{Topology: udnv1.NetworkTopologyLayer2, Layer2: &udnv1.Layer2Config{Role: udnv1.NetworkRolePrimary}}}
	pod := plainPod("t", "p", "n1", nil)
	expect(t, diagnose(podFactsOf(pod, namespace("t", true), u)), PrimaryNetworkNotRendered, "no NetworkCreated condition", "kvnet-controller has not processed it")
	u.Status.Conditions = []metav1.Condition{{Type: "NetworkCreated", Status: metav1.ConditionFalse, Reason: "SyncError", Message: "foreign NetworkAttachmentDefinition with the desired name already exist [t/net]"}}
	expect(t, diagnose(podFactsOf(pod, namespace("t", true), u)), PrimaryNetworkNotRendered, "NetworkCreated=False (SyncError): foreign", "rename or delete it")
	deleting := kvnetNAD("t", "net", netConf{subnets: "10.0.0.0/24"})
	deleting.DeletionTimestamp = &metav1.Time{Time: unitNow}
	expect(t, diagnose(podFactsOf(pod, namespace("t", true), u, deleting)), PrimaryNetworkNotRendered, "being deleted")
}

func TestNADNotFound(t *testing.T) {
	pod := plainPod("t", "p", "n1", map[string]string{multus.NetworksAnnotation: "nope"})
	expect(t, diagnose(podFactsOf(pod)), NADNotFound, "element 0 of the pod's annotation k8s.v1.cni.cncf.io/networks names NetworkAttachmentDefinition t/nope")
	u := &udnv1.UserDefinedNetwork{ObjectMeta: metav1.ObjectMeta{Namespace: "t", Name: "nope"},
		Spec: udnv1.UserDefinedNetworkSpec{Topology: udnv1.NetworkTopologyLayer2, Layer2: &udnv1.Layer2Config{Role: udnv1.NetworkRoleSecondary}}}
	expect(t, diagnose(podFactsOf(pod, u)), NADNotFound, "UserDefinedNetwork t/nope exists but is not rendered")
}

func TestNADUnservedType(t *testing.T) {
	overlay := `{"cniVersion":"1.0.0","type":"ovn-k8s-cni-overlay","name":"t_sec","topology":"layer2","role":"secondary","subnets":"10.1.0.0/24","netAttachDefName":"t/sec"}`
	pod := plainPod("t", "p", "n1", map[string]string{multus.NetworksAnnotation: "sec"})
	expect(t, diagnose(podFactsOf(pod, nadWith("t", "sec", overlay))), NADUnservedType, `change "type" to "kvnet-cni"`)
	// A primary one in a labelled namespace: the namespace has no primary
	// network kvnet knows of.
	primary := strings.ReplaceAll(strings.ReplaceAll(overlay, "secondary", "primary"), "t_sec", "t_net")
	expect(t, diagnose(podFactsOf(plainPod("t", "p", "n1", nil), namespace("t", true), nadWith("t", "net", primary))), NADUnservedType, `change "type" to "kvnet-cni"`)
	// Another plugin's NAD is its own business.
	bridge := `{"cniVersion":"1.0.0","type":"bridge","name":"br","ipam":{"type":"host-local","subnet":"10.9.0.0/24"}}`
	expect(t, diagnose(podFactsOf(pod, nadWith("t", "sec", bridge))), "", `CNI type "bridge", not kvnet's`)
}

func TestNADInvalid(t *testing.T) {
	pod := plainPod("t", "p", "n1", map[string]string{multus.NetworksAnnotation: "sec"})
	expect(t, diagnose(podFactsOf(pod, nadWith("t", "sec", `{"type":"kvnet-cni","name":"x","topology":"ring"}`))), NADInvalid, `"topology" "ring"`)
}

func TestInvalidNetworkRequest(t *testing.T) {
	el := multus.NetworkSelectionElement{Name: "sec", IPRequest: []string{"10.1.0.9"}, IPAMClaimReference: "c"}
	pod := plainPod("t", "p", "n1", map[string]string{multus.NetworksAnnotation: selection(el)})
	expect(t, diagnose(podFactsOf(pod, kvnetNAD("t", "sec", netConf{role: "secondary", subnets: "10.1.0.0/24", persistent: true}))), InvalidNetworkRequest, "ips and ipam-claim-reference cannot be used together")
	pod.Annotations[multus.NetworksAnnotation] = "[{"
	expect(t, diagnose(podFactsOf(pod)), InvalidNetworkRequest, "does not parse")
}

// secondaryWithClaim is a pod on a secondary network referencing claim c.
func secondaryWithClaim(persistent bool, annotated bool) (*corev1.Pod, []any) {
	ann := map[string]string{multus.NetworksAnnotation: selection(multus.NetworkSelectionElement{Name: "sec", IPAMClaimReference: "c"})}
	if annotated {
		ann[podnetworks.Annotation] = allocated("t/sec", "t_sec", podnetworks.RoleSecondary, "10.1.0.4/24", "c")
	}
	return plainPod("t", "p", "n1", ann), []any{kvnetNAD("t", "sec", netConf{role: "secondary", subnets: "10.1.0.0/24", persistent: persistent}), node("n1", ""), readyAgent("n1")}
}

func TestClaims(t *testing.T) {
	t.Run("healthy", func(t *testing.T) {
		pod, objs := secondaryWithClaim(true, true)
		expect(t, diagnose(podFactsOf(pod, append(objs, claim("t", "c", "t_sec", nil, "10.1.0.4/24"))...)), "", "claim", "t/c: network \"t_sec\", IPs 10.1.0.4/24")
	})
	t.Run("ignored", func(t *testing.T) {
		pod, objs := secondaryWithClaim(false, true)
		expect(t, diagnose(podFactsOf(pod, append(objs, claim("t", "c", "t_sec", nil))...)), ClaimIgnored, "does not allow persistent IPs", "lifecycle: Persistent")
	})
	t.Run("not found", func(t *testing.T) {
		pod, objs := secondaryWithClaim(true, false)
		expect(t, diagnose(podFactsOf(pod, objs...)), ClaimNotFound, "IPAMClaim t/c for network \"t_sec\", which does not exist")
	})
	t.Run("wrong network", func(t *testing.T) {
		pod, objs := secondaryWithClaim(true, false)
		expect(t, diagnose(podFactsOf(pod, append(objs, claim("t", "c", "t_other", nil))...)), ClaimWrongNetwork, `the claim is for network "t_other"`)
	})
	t.Run("owned by a VM", func(t *testing.T) {
		pod, objs := secondaryWithClaim(true, false)
		vm := &vmRef{Kind: "VirtualMachine", Name: "vm-a", UID: "uid-a"}
		expect(t, diagnose(podFactsOf(pod, append(objs, claim("t", "c", "t_sec", vm))...)), ClaimOwnedByOther, "belongs to VirtualMachine vm-a")
		// A launcher pod of that VM is fine; of another VM, or of an
		// earlier VM of the same name, is not.
		expect(t, diagnose(podFactsOf(pod, append(objs, claim("t", "c", "t_sec", vm), vm)...)), WaitingForController)
		expect(t, diagnose(podFactsOf(pod, append(objs, claim("t", "c", "t_sec", vm), &vmRef{Kind: "VirtualMachine", Name: "vm-b", UID: "uid-b"})...)), ClaimOwnedByOther, "which belongs to VirtualMachine vm-a;")
		// A launcher pod whose VMI is gone: only the name is known.
		expect(t, diagnose(podFactsOf(pod, append(objs, claim("t", "c", "t_sec", vm), &vmRef{Kind: "VirtualMachine", Name: "vm-b"})...)), ClaimOwnedByOther, "which belongs to VirtualMachine vm-a;")
		expect(t, diagnose(podFactsOf(pod, append(objs, claim("t", "c", "t_sec", vm), &vmRef{Kind: "VirtualMachine", Name: "vm-a", UID: "uid-new"})...)), ClaimOwnedByOther, "an earlier VirtualMachine vm-a")
	})
	t.Run("held by another pod", func(t *testing.T) {
		pod, objs := secondaryWithClaim(true, false)
		cl := claim("t", "c", "t_sec", nil, "10.1.0.4/24")
		cl.Status.OwnerPod = &ipamclaimv1alpha1.OwnerPod{Name: "q"}
		other := plainPod("t", "q", "n2", nil)
		expect(t, diagnose(podFactsOf(pod, append(objs, cl, other)...)), ClaimOwnedByOther, "belongs to pod q")
		// Gone, or completed: free.
		other.Status.Phase = corev1.PodSucceeded
		expect(t, diagnose(podFactsOf(pod, append(objs, cl, other)...)), WaitingForController)
		// The other launcher pod of the same VMI (a migration): fine.
		other.Status.Phase = corev1.PodRunning
		other.Labels = map[string]string{kubevirtv1.AppLabel: kubevirtv1.VirtLauncherValue}
		other.Annotations = map[string]string{kubevirtv1.DomainAnnotation: "vm1"}
		pod.Labels = other.Labels
		pod.Annotations[kubevirtv1.DomainAnnotation] = "vm1"
		expect(t, diagnose(podFactsOf(pod, append(objs, cl, other)...)), WaitingForController)
	})
}

func TestAllocationFailures(t *testing.T) {
	ev := func(reason, msg string, age time.Duration) corev1.Event {
		return corev1.Event{ObjectMeta: metav1.ObjectMeta{Name: reason, Namespace: "t", CreationTimestamp: metav1.Time{Time: unitNow.Add(-age)}},
			InvolvedObject: corev1.ObjectReference{Kind: "Pod", Namespace: "t", Name: "p", UID: "uid-p"}, Reason: reason, Message: msg, Type: corev1.EventTypeWarning}
	}
	pod, objs := secondaryWithClaim(true, false)
	delete(pod.Annotations, multus.NetworksAnnotation)
	pod.Annotations[multus.NetworksAnnotation] = "sec"
	t.Run("waiting", func(t *testing.T) {
		expect(t, diagnose(podFactsOf(pod, objs...)), WaitingForController, "no kvnet.io/pod-networks annotation for t/sec", "no leader lease kvnet-system/kvnet-controller.kvnet.io", "kubectl -n kvnet-system get deploy,pods,lease")
	})
	t.Run("exhausted event", func(t *testing.T) {
		e := ev(eventAllocationFailed, "subnet 10.1.0.0/30: subnet address pool exhausted", time.Second)
		expect(t, diagnose(podFactsOf(pod, append(objs, e)...)), PoolExhausted, `network "t_sec" (NAD t/sec) has no free address`)
		// An event of an earlier pod of the same name does not count.
		e.InvolvedObject.UID = "uid-old"
		expect(t, diagnose(podFactsOf(pod, append(objs, e)...)), WaitingForController)
	})
	t.Run("newest event wins", func(t *testing.T) {
		old := ev(eventClaimNotFound, "IPAMClaim not found: t/c", time.Minute)
		recent := ev(eventAllocationFailed, "subnet 10.1.0.0/30: subnet address pool exhausted", time.Second)
		expect(t, diagnose(podFactsOf(pod, append(objs, old, recent)...)), PoolExhausted)
	})
	t.Run("exhausted NAD", func(t *testing.T) {
		n := kvnetNAD("t", "sec", netConf{role: "secondary", subnets: "10.1.0.0/24"})
		n.Annotations = map[string]string{udn.PoolExhaustedAnnotation: "true"}
		expect(t, diagnose(podFactsOf(pod, n, node("n1", ""), readyAgent("n1"))), PoolExhausted, "carries kvnet.io/pool-exhausted")
	})
	t.Run("exhausted claim", func(t *testing.T) {
		p, objs := secondaryWithClaim(true, false)
		cl := claim("t", "c", "t_sec", nil)
		cl.Status.Conditions = []metav1.Condition{{Type: "IPsAllocated", Status: metav1.ConditionFalse, Reason: "SubnetExhausted", Message: "subnet 10.1.0.0/30: subnet address pool exhausted"}}
		expect(t, diagnose(podFactsOf(p, append(objs, cl)...)), PoolExhausted, "IPsAllocated=False (SubnetExhausted)")
		cl.Status.Conditions[0].Reason = "IPAddressConflict"
		expect(t, diagnose(podFactsOf(p, append(objs, cl)...)), AllocationFailed, "IPAddressConflict", "request another IP")
	})
	t.Run("other failure", func(t *testing.T) {
		expect(t, diagnose(podFactsOf(pod, append(objs, ev(eventAllocationFailed, "provided IP is already allocated", time.Second))...)), AllocationFailed)
		expect(t, diagnose(podFactsOf(pod, append(objs, ev(eventInvalidRequest, "invalid network request: x", time.Second))...)), InvalidNetworkRequest)
	})
	t.Run("annotation invalid", func(t *testing.T) {
		p := pod.DeepCopy()
		p.Annotations[podnetworks.Annotation] = "{"
		expect(t, diagnose(podFactsOf(p, objs...)), AnnotationInvalid)
	})
}

func TestNode(t *testing.T) {
	pod, objs := healthyPrimary()
	base := objs[:2]
	t.Run("not scheduled", func(t *testing.T) {
		p := pod.DeepCopy()
		p.Spec.NodeName = ""
		expect(t, diagnose(podFactsOf(p, base...)), "", "not scheduled yet")
	})
	t.Run("node gone", func(t *testing.T) {
		expect(t, diagnose(podFactsOf(pod, base...)), NodeNotFound)
	})
	t.Run("not ready", func(t *testing.T) {
		a := agentPod("kvnet-system", "n1")
		setReady(a, false)
		a.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "node", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}}}}
		expect(t, diagnose(podFactsOf(pod, append(base, node("n1", ""), a)...)), KvnetNodeNotReady, "CrashLoopBackOff", "kubectl -n kvnet-system logs kvnet-node-n1")
	})
	t.Run("no agent, daemonset", func(t *testing.T) {
		ds := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Namespace: "kvnet-system", Name: "kvnet-node"}}
		expect(t, diagnose(podFactsOf(pod, append(base, node("n1", "192.168.1.1"), ds)...)), KvnetNodeMissing, "DaemonSet kvnet-system/kvnet-node has no kvnet-node pod on node n1")
	})
	t.Run("no agent, no daemonset", func(t *testing.T) {
		expect(t, diagnose(podFactsOf(pod, append(base, node("n1", ""))...)), KvnetNodeMissing, "no kvnet.io/vtep annotation")
		// The lab: a process, no pod; the VTEP says it started.
		expect(t, diagnose(podFactsOf(pod, append(base, node("n1", "192.168.1.1"))...)), "", "kvnet-node started here")
	})
}

func TestClaimReferenceMissing(t *testing.T) {
	vmi := &kubevirtv1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: "t", Name: "vm1"}, Spec: vmiSpec(vmIface{name: "pod", binding: "l2bridge"})}
	pod, objs := healthyPrimary()
	pod.Labels = map[string]string{kubevirtv1.AppLabel: kubevirtv1.VirtLauncherValue}
	pod.Annotations[kubevirtv1.DomainAnnotation] = "vm1"
	vm := &vmRef{Kind: "VirtualMachine", Name: "vm1", UID: "uid-vm1"}
	expect(t, diagnose(podFactsOf(pod, append(objs, vmi, vm)...)), ClaimReferenceMissing, "needs IPAMClaim vm1.pod", webhookLauncher)
	// With the reference the webhook adds, and the claim: healthy.
	pod.Annotations[ipam.LegacyPrimaryClaimAnnotation] = "vm1.pod"
	pod.Annotations[podnetworks.Annotation] = allocated(primaryKey, primaryNet, podnetworks.RolePrimary, "10.0.0.5/24", "vm1.pod")
	expect(t, diagnose(podFactsOf(pod, append(objs, vmi, vm, claim("t", "vm1.pod", primaryNet, vm, "10.0.0.5/24"))...)), "")
}

// webhookWorld is a healthy webhook setup: a configuration calling the
// Service, whose caBundle verifies the Secret's certificate.
func webhookWorld(t *testing.T) *webhookFacts {
	pki := newPKI(t, unitNow.Add(time.Hour), nil, "kvnet-webhook.kvnet-system.svc")
	return &webhookFacts{
		Configs:        []admissionregistrationv1.MutatingWebhookConfiguration{*webhookConfig("", pki.caPEM, admissionregistrationv1.Fail)},
		Namespace:      "kvnet-system",
		Secrets:        map[string]*corev1.Secret{"kvnet-system/" + certSecretName: pki.secret("kvnet-system")},
		Services:       map[string]*corev1.Service{"kvnet-system/kvnet-webhook": {}},
		ReadyEndpoints: map[string]int{"kvnet-system/kvnet-webhook": 1},
		Now:            unitNow,
	}
}

func checkWH(f *webhookFacts) *Report {
	r := &Report{Subject: "vm t/vm1"}
	checkWebhook(r, f, []string{webhookVMs, webhookLauncher})
	return r
}

func TestWebhook(t *testing.T) {
	t.Run("healthy", func(t *testing.T) {
		expect(t, checkWH(webhookWorld(t)), "", "caBundle verifies the serving certificate")
	})
	t.Run("not registered", func(t *testing.T) {
		f := webhookWorld(t)
		f.Configs = nil
		expect(t, checkWH(f), WebhookNotRegistered, "mutatevirtualmachines.kvnet.io")
		f = webhookWorld(t)
		f.Configs[0].Webhooks = f.Configs[0].Webhooks[:1]
		expect(t, checkWH(f), WebhookNotRegistered, "mutatevirtualmachines.kvnet.io")
	})
	t.Run("other CA", func(t *testing.T) {
		f := webhookWorld(t)
		other := newPKI(t, unitNow.Add(time.Hour), nil, "kvnet-webhook.kvnet-system.svc")
		f.Configs[0].Webhooks[1].ClientConfig.CABundle = other.caPEM
		expect(t, checkWH(f), WebhookCABundleMismatch, "does not verify the certificate kvnet serves", "certificate signed by unknown authority")
	})
	t.Run("empty caBundle, no label", func(t *testing.T) {
		f := webhookWorld(t)
		f.Configs[0].Webhooks[0].ClientConfig.CABundle = nil
		f.Configs[0].Labels = nil
		expect(t, checkWH(f), WebhookCABundleMismatch, "empty caBundle", "add the label")
	})
	t.Run("expired certificate", func(t *testing.T) {
		f := webhookWorld(t)
		f.Now = unitNow.Add(2 * time.Hour)
		expect(t, checkWH(f), WebhookCABundleMismatch, "expired")
	})
	t.Run("wrong name", func(t *testing.T) {
		f := webhookWorld(t)
		pki := newPKI(t, unitNow.Add(time.Hour), []net.IP{net.IPv4(127, 0, 0, 1)})
		f.Configs[0] = *webhookConfig("", pki.caPEM, admissionregistrationv1.Fail)
		f.Secrets["kvnet-system/"+certSecretName] = pki.secret("kvnet-system")
		expect(t, checkWH(f), WebhookCABundleMismatch, `for "kvnet-webhook.kvnet-system.svc"`)
	})
	t.Run("secret missing", func(t *testing.T) {
		f := webhookWorld(t)
		f.Secrets = map[string]*corev1.Secret{}
		expect(t, checkWH(f), WebhookCertMissing)
	})
	t.Run("service", func(t *testing.T) {
		f := webhookWorld(t)
		f.ReadyEndpoints = nil
		expect(t, checkWH(f), WebhookNoEndpoints)
		f.Services = map[string]*corev1.Service{}
		expect(t, checkWH(f), WebhookServiceMissing)
	})
	t.Run("url", func(t *testing.T) {
		// The lab and tests: a URL, the Secret in kvnet's namespace.
		pki := newPKI(t, unitNow.Add(time.Hour), []net.IP{net.IPv4(127, 0, 0, 1)})
		f := &webhookFacts{Configs: []admissionregistrationv1.MutatingWebhookConfiguration{*webhookConfig("https://127.0.0.1:9443", pki.caPEM, admissionregistrationv1.Fail)},
			Namespace: "kvnet-system", Secrets: map[string]*corev1.Secret{"kvnet-system/" + certSecretName: pki.secret("kvnet-system")}, Now: unitNow}
		expect(t, checkWH(f), "")
	})
}

// vmWorld is a healthy running VM on a persistent primary UDN with
// l2bridge, and the facts of its launcher pod.
func vmWorld(t *testing.T) *vmFacts {
	vmi := &kubevirtv1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: "t", Name: "vm1"}, Spec: vmiSpec(vmIface{name: "pod", binding: "l2bridge"})}
	vmi.Status.Phase, vmi.Status.NodeName = "Running", "n1"
	vm := &vmRef{Kind: "VirtualMachine", Name: "vm1", UID: "uid-vm1"}
	pod, objs := healthyPrimary()
	pod.Name = "virt-launcher-vm1-abcde"
	pod.Labels = map[string]string{kubevirtv1.AppLabel: kubevirtv1.VirtLauncherValue}
	pod.Annotations[kubevirtv1.DomainAnnotation] = "vm1"
	pod.Annotations[ipam.LegacyPrimaryClaimAnnotation] = "vm1.pod"
	pod.Annotations[podnetworks.Annotation] = allocated(primaryKey, primaryNet, podnetworks.RolePrimary, "10.0.0.5/24", "vm1.pod")
	launcher := podFactsOf(pod, append(objs, vm, claim("t", "vm1.pod", primaryNet, vm, "10.0.0.5/24"))...)
	return &vmFacts{netFacts: launcher.netFacts, VMI: vmi, KubeVirts: []kubevirtv1.KubeVirt{*kubeVirtCR("l2bridge")}, Webhook: *webhookWorld(t), Launcher: launcher}
}

func diagnoseV(f *vmFacts) *Report {
	r := &Report{Subject: "vmi t/vm1"}
	diagnoseVM(r, f)
	return r
}

func TestVM(t *testing.T) {
	t.Run("healthy", func(t *testing.T) {
		expect(t, diagnoseV(vmWorld(t)), "", "vmi t/vm1: healthy: 10.0.0.5/24 on t/net (primary, MAC 0a:58:0a:00:00:05), node n1 (launcher pod virt-launcher-vm1-abcde, VMI Running)",
			"pod binding l2bridge on the pod network", "claim", "t/vm1.pod")
	})
	t.Run("binding not registered", func(t *testing.T) {
		f := vmWorld(t)
		f.KubeVirts = []kubevirtv1.KubeVirt{*kubeVirtCR("passt")}
		expect(t, diagnoseV(f), BindingNotRegistered, `binding plugin "l2bridge"`, "registers passt", "l2bridge: {domainAttachmentType: managedTap}")
		f.KubeVirts = nil
		expect(t, diagnoseV(f), BindingNotRegistered, "there is no KubeVirt CR")
	})
	t.Run("unsupported binding", func(t *testing.T) {
		f := vmWorld(t)
		f.VMI.Spec = vmiSpec(vmIface{name: "pod", binding: "l2bridge"}, vmIface{name: "sec", binding: "masquerade", nad: "sec"})
		f.NADs["t/sec"] = kvnetNAD("t", "sec", netConf{role: "secondary", subnets: "10.1.0.0/24"})
		expect(t, diagnoseV(f), BindingUnsupported, "masquerade, which works on the pod network only")
		f.VMI.Spec = vmiSpec(vmIface{name: "pod", binding: "l2bridge"}, vmIface{name: "sec", binding: "sriov", nad: "sec"})
		expect(t, diagnoseV(f), BindingUnsupported, "not an SR-IOV VF")
	})
	t.Run("NAD selected twice", func(t *testing.T) {
		f := vmWorld(t)
		f.NADs["t/sec"] = kvnetNAD("t", "sec", netConf{role: "secondary", subnets: "10.1.0.0/24"})
		f.VMI.Spec = vmiSpec(vmIface{name: "pod", binding: "l2bridge"}, vmIface{name: "sec", binding: "bridge", nad: "sec"})
		expect(t, diagnoseV(f), "")
		f.VMI.Spec = vmiSpec(vmIface{name: "pod", binding: "l2bridge"}, vmIface{name: "sec", binding: "bridge", nad: "sec"}, vmIface{name: "hot", binding: "bridge", nad: "sec"})
		expect(t, diagnoseV(f), NADSelectedTwice, `VM networks "sec" and "hot" both select NAD t/sec`, `give VM network "hot" a network of its own`)
	})
	t.Run("claim names", func(t *testing.T) {
		// my_net and my.net both compose vm1.my.net (as ipam-extensions
		// composes claim names): no claims, the launcher pod denied.
		f := vmWorld(t)
		f.NADs["t/sec"] = kvnetNAD("t", "sec", netConf{role: "secondary", subnets: "10.1.0.0/24", persistent: true})
		f.NADs["t/sec2"] = kvnetNAD("t", "sec2", netConf{role: "secondary", subnets: "10.2.0.0/24", persistent: true})
		f.VMI.Spec = vmiSpec(vmIface{name: "pod", binding: "l2bridge"}, vmIface{name: "my_net", binding: "bridge", nad: "sec"})
		expect(t, diagnoseV(f), "")
		f.VMI.Spec = vmiSpec(vmIface{name: "pod", binding: "l2bridge"}, vmIface{name: "my_net", binding: "bridge", nad: "sec"}, vmIface{name: "my.net", binding: "bridge", nad: "sec2"})
		expect(t, diagnoseV(f), ClaimNameUnusable, `VM "vm1" networks "my_net" and "my.net" both compose IPAMClaim name "vm1.my.net"`, "rename the VM network")
	})
	t.Run("l2bridge expects a primary network", func(t *testing.T) {
		f := vmWorld(t)
		f.Namespace = namespace("t", false)
		delete(f.NADs, primaryKey)
		expect(t, diagnoseV(f), NamespaceNotLabelled, `interface "pod" of the VM uses binding l2bridge`)
	})
	t.Run("webhook", func(t *testing.T) {
		f := vmWorld(t)
		f.Webhook.Configs = nil
		expect(t, diagnoseV(f), WebhookNotRegistered)
	})
	t.Run("no launcher", func(t *testing.T) {
		f := vmWorld(t)
		f.Launcher = nil
		f.VMI.Status.Phase = "Failed"
		f.VMI.Status.Unknown = `{"conditions":[{"type":"Synchronized","status":"False","reason":"FailedCreate","message":"pods \"virt-launcher-vm1\" is forbidden"}]}`
		expect(t, diagnoseV(f), LauncherPodMissing, "FailedCreate", "is forbidden")
	})
	t.Run("stopped", func(t *testing.T) {
		f := vmWorld(t)
		f.VMI, f.Launcher = nil, nil
		f.VM = &kubevirtv1.VirtualMachine{Spec: kubevirtv1.VirtualMachineSpec{Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{Spec: vmiSpec(vmIface{name: "pod", binding: "l2bridge"})}}}
		expect(t, diagnoseV(f), "", "not running")
	})
	t.Run("migration failed", func(t *testing.T) {
		f := vmWorld(t)
		f.VMI.Status.MigrationState = &kubevirtv1.VirtualMachineInstanceMigrationState{SourceNode: "n1", TargetNode: "n2", TargetPod: "virt-launcher-vm1-xyz", Failed: true, FailureReason: "target pod died"}
		expect(t, diagnoseV(f), MigrationFailed, "target pod died", "keeps running on node n1")
		f.VMI.Status.MigrationState.Failed = false
		f.VMI.Status.MigrationState.Completed = true
		expect(t, diagnoseV(f), "", "last one completed")
		// kvnet-node's switch-over events: the newest per network of the
		// newest migration; an older migration's and an API switch.
		ev := func(reason, msg string, at time.Time) corev1.Event {
			return corev1.Event{InvolvedObject: corev1.ObjectReference{Kind: "VirtualMachineInstance", Name: "vm1"}, Reason: reason,
				Message: msg, EventTime: metav1.MicroTime{Time: at}}
		}
		f.Switchovers = []corev1.Event{
			ev(migration.EventSwitchover, "network t_net switched from node n0 to node n1 at the guest's first frame there (RARP), old", unitNow.Add(-time.Hour)),
			ev(migration.EventSwitchover, "network t_net switched from node n1 to node n2 at the guest's first frame there (RARP), new", unitNow),
		}
		r := diagnoseV(f)
		expect(t, r, "", "last one completed (node n1 to n2); network t_net switched from node n1 to node n2 at the guest's first frame there (RARP), new")
		var b bytes.Buffer
		r.Print(&b)
		if strings.Contains(b.String(), ", old") || strings.Contains(b.String(), "by the API") {
			t.Errorf("report shows an older switch-over or an API one:\n%s", b.String())
		}
		f.Switchovers = append(f.Switchovers, ev(migration.EventSwitchedByAPI, "network t_sec switched from node n1 to node n2 by the API", unitNow.Add(-time.Second)))
		expect(t, diagnoseV(f), "", "network t_sec switched from node n1 to node n2 by the API", "a switch-over by the API", ", new")
	})
	t.Run("migration object failed", func(t *testing.T) {
		f := vmWorld(t)
		old := kubevirtv1.VirtualMachineInstanceMigration{ObjectMeta: metav1.ObjectMeta{Namespace: "t", Name: "m1", CreationTimestamp: metav1.Time{Time: unitNow.Add(-time.Hour)}},
			Spec: kubevirtv1.VirtualMachineInstanceMigrationSpec{VMIName: "vm1"}, Status: kubevirtv1.VirtualMachineInstanceMigrationStatus{Phase: "Failed"}}
		f.Migrations = []kubevirtv1.VirtualMachineInstanceMigration{old}
		expect(t, diagnoseV(f), MigrationFailed, "VirtualMachineInstanceMigration t/m1 of VMI vm1 is Failed")
		// A newer migration succeeded: the failure is history.
		newer := old.DeepCopy()
		newer.Name, newer.CreationTimestamp, newer.Status.Phase = "m2", metav1.Time{Time: unitNow}, "Succeeded"
		f.Migrations = append(f.Migrations, *newer)
		expect(t, diagnoseV(f), "")
	})
	t.Run("claim owned by another VM", func(t *testing.T) {
		f := vmWorld(t)
		f.Launcher.Claims["vm1.pod"] = claim("t", "vm1.pod", primaryNet, &vmRef{Kind: "VirtualMachine", Name: "vm1", UID: "uid-old"}, "10.0.0.5/24")
		expect(t, diagnoseV(f), ClaimOwnedByOther, "an earlier VirtualMachine vm1")
	})
}

func TestPrintBroken(t *testing.T) {
	pod, objs := secondaryWithClaim(true, false)
	var b bytes.Buffer
	diagnose(podFactsOf(pod, objs...)).Print(&b)
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if !strings.HasPrefix(lines[0], "pod t/p: ClaimNotFound: ") || !strings.HasPrefix(lines[1], "  fix: ") || !strings.HasPrefix(lines[len(lines)-1], "  !! claim") {
		t.Fatalf("unexpected layout:\n%s", b.String())
	}
}

func TestPrimaryClaimEvidence(t *testing.T) {
	for _, tc := range []struct {
		ann  map[string]string
		want string
	}{
		{map[string]string{multus.DefaultNetworkAnnotation: `[{"name":"default","namespace":"ovn-kubernetes","ipam-claim-reference":"vm.a"}]`}, `IPAMClaim "vm.a"`},
		{map[string]string{multus.NetworksAnnotation: `[{"name":"net","interface":"ovn-udn1","ipam-claim-reference":"vm.b"}]`}, `IPAMClaim "vm.b" for its primary network (k8s.v1.cni.cncf.io/networks element ns/net as ovn-udn1)`},
		{map[string]string{multus.NetworksAnnotation: `[{"name":"sec","interface":"net1","ipam-claim-reference":"vm.c"}]`}, ""},
		{nil, ""},
	} {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", Annotations: tc.ann}}
		got := strings.Join(primaryClaimEvidence(pod), "; ")
		if tc.want == "" && got != "" || tc.want != "" && !strings.Contains(got, tc.want) {
			t.Errorf("%v: evidence %q, want %q", tc.ann, got, tc.want)
		}
	}
}
