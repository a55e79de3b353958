package why

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	ipamclaimv1alpha1 "kvnet.io/kvnet/api/k8scni/v1alpha1"
	kubevirtv1 "kvnet.io/kvnet/api/kubevirt/v1"
	"kvnet.io/kvnet/internal/ipam"
	"kvnet.io/kvnet/internal/ipam/allocator"
	ipamcontroller "kvnet.io/kvnet/internal/k8s/controllers/ipam"
	"kvnet.io/kvnet/internal/multus"
	"kvnet.io/kvnet/internal/podnetworks"
	"kvnet.io/kvnet/internal/udn"
	"kvnet.io/kvnet/internal/vmclaims"
)

// Reasons of the events kvnet-controller's allocator records on pods
// (internal/k8s/controllers/ipam, docs/ipam.md).
const (
	eventAllocationFailed  = "IPAllocationFailed"
	eventInvalidRequest    = "InvalidNetworkRequest"
	eventClaimNotFound     = "IPAMClaimNotFound"
	eventClaimIgnored      = "IPAMClaimIgnored"
	eventInvalidPrimaryNet = "InvalidPrimaryNetwork"
)

// podFacts are the objects the chain of a pod reads.
type podFacts struct {
	netFacts
	Pod *corev1.Pod
	// Claims by name (the pod's namespace); nil: not found.
	Claims map[string]*ipamclaimv1alpha1.IPAMClaim
	// OwnerPods are the pods claims name as status.ownerPod, by name;
	// nil: gone.
	OwnerPods map[string]*corev1.Pod
	// Events are the events about the pod.
	Events     []corev1.Event
	Node       nodeFacts
	Controller controllerFacts
	// VM is the VM a launcher pod runs and VMI the instance (nil for
	// other pods).
	VM  *vmRef
	VMI *kubevirtv1.VirtualMachineInstance
	// Webhook is checked for launcher pods when set.
	Webhook *webhookFacts
}

// vmRef names the VM (or standalone VMI) that owns a launcher pod's claims.
type vmRef struct {
	Kind string // VirtualMachine or VirtualMachineInstance
	Name string
	UID  types.UID
}

func (v *vmRef) String() string { return v.Kind + " " + v.Name }

// controllerFacts say whether kvnet-controller runs.
type controllerFacts struct {
	Namespace   string // kvnet's namespace (--kvnet-namespace)
	Deployments []appsv1.Deployment
	Lease       *coordinationv1.Lease
	Now         time.Time
}

// leaseName is kvnet-controller's leader-election lease.
const leaseName = "kvnet-controller.kvnet.io"

// describe says what the API shows of kvnet-controller.
func (c controllerFacts) describe() string {
	var parts []string
	if len(c.Deployments) == 0 {
		parts = append(parts, "no Deployment labelled app.kubernetes.io/name=kvnet-controller")
	}
	for _, d := range c.Deployments {
		want := int32(1)
		if d.Spec.Replicas != nil {
			want = *d.Spec.Replicas
		}
		parts = append(parts, fmt.Sprintf("Deployment %s/%s has %d/%d ready replicas", d.Namespace, d.Name, d.Status.ReadyReplicas, want))
	}
	switch l := c.Lease; {
	case l == nil:
		parts = append(parts, fmt.Sprintf("no leader lease %s/%s", c.Namespace, leaseName))
	case l.Spec.RenewTime == nil || l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == "":
		parts = append(parts, fmt.Sprintf("leader lease %s/%s has no holder", l.Namespace, l.Name))
	default:
		age := c.Now.Sub(l.Spec.RenewTime.Time).Round(time.Second)
		dur := 15 * time.Second
		if l.Spec.LeaseDurationSeconds != nil {
			dur = time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second
		}
		state := "held by"
		if age > dur {
			state = "expired, last held by"
		}
		parts = append(parts, fmt.Sprintf("leader lease %s %s, renewed %s ago", state, *l.Spec.HolderIdentity, age))
	}
	return strings.Join(parts, "; ")
}

// primaryClaimEvidence says whether the pod asks for a primary network's
// claim (which only a primary network can honour).
func primaryClaimEvidence(pod *corev1.Pod) []string {
	if v, ok := pod.Annotations[multus.DefaultNetworkAnnotation]; ok && strings.HasPrefix(strings.TrimSpace(v), "[") {
		if elems, err := multus.ParseSelection(multus.DefaultNetworkAnnotation, v, pod.Namespace); err == nil && len(elems) == 1 && elems[0].IPAMClaimReference != "" {
			return []string{fmt.Sprintf("pod %s references IPAMClaim %q for its primary network (annotation %s)", pod.Name, elems[0].IPAMClaimReference, multus.DefaultNetworkAnnotation)}
		}
	}
	// Multus mode: the claim rides on the primary network's element.
	if v, ok := pod.Annotations[multus.NetworksAnnotation]; ok {
		if elems, err := multus.ParseSelection(multus.NetworksAnnotation, v, pod.Namespace); err == nil {
			for _, e := range elems {
				if e.InterfaceRequest == multus.PrimaryInterface && e.IPAMClaimReference != "" {
					return []string{fmt.Sprintf("pod %s references IPAMClaim %q for its primary network (%s element %s as %s)", pod.Name, e.IPAMClaimReference, multus.NetworksAnnotation, e.Key(), multus.PrimaryInterface)}
				}
			}
		}
	}
	if v := pod.Annotations[ipam.LegacyPrimaryClaimAnnotation]; v != "" {
		return []string{fmt.Sprintf("pod %s references IPAMClaim %q for its primary network (annotation %s)", pod.Name, v, ipam.LegacyPrimaryClaimAnnotation)}
	}
	return nil
}

// diagnosePod walks a pod's chain: namespace, primary network, selected
// NADs, (for launcher pods) the webhook, claims, addresses, node.
func diagnosePod(r *Report, f *podFacts, evidence []string) {
	pod := f.Pod
	if pod.Spec.HostNetwork {
		r.Summary = "on the host network: kvnet does not wire it"
		return
	}
	if podnetworks.Completed(pod) {
		r.Summary = fmt.Sprintf("completed (%s): it uses no network, and addresses not held by a claim are released", pod.Status.Phase)
		return
	}
	labelled, primaryKey, stop := checkNamespace(r, &f.netFacts, append(primaryClaimEvidence(pod), evidence...))
	if stop {
		return
	}
	if v, ok := pod.Annotations[multus.NetworksAnnotation]; ok {
		elems, err := multus.ParseSelection(multus.NetworksAnnotation, v, pod.Namespace)
		if err != nil {
			r.fail("selection", multus.NetworksAnnotation+": does not parse", InvalidNetworkRequest,
				"correct the pod's annotation "+multus.NetworksAnnotation+" and recreate the pod",
				"pod %s has an annotation kvnet cannot read: %v", pod.Name, err)
			return
		}
		for i, e := range elems {
			where := fmt.Sprintf("element %d of the pod's annotation %s", i, multus.NetworksAnnotation)
			if _, stop := checkNAD(r, &f.netFacts, e.Key(), where); stop {
				return
			}
		}
	}
	diagnoseAllocation(r, f, labelled, primaryKey)
}

// diagnoseAllocation walks the rest of a pod's chain once its networks are
// known: (for launcher pods) the webhook and claim references, claims,
// addresses, node.
func diagnoseAllocation(r *Report, f *podFacts, labelled bool, primaryKey string) {
	pod := f.Pod
	atts, err := ipam.PodAttachments(pod, labelled, primaryKey, f.lookup)
	if err != nil {
		code, fix := InvalidNetworkRequest, "correct the pod's network annotations and recreate the pod"
		if errors.Is(err, ipam.ErrMissingNAD) {
			code, fix = NADNotFound, "create the NAD or correct the reference"
		}
		r.fail("selection", "not servable", code, fix, "kvnet-controller cannot serve the pod's network request: %v", err)
		return
	}
	if len(atts) == 0 {
		r.Summary = "on no kvnet network (cluster default network only)"
		return
	}
	if f.Webhook != nil && checkWebhook(r, f.Webhook, []string{webhookLauncher}) {
		return
	}
	if checkClaimReferences(r, f, atts, primaryKey) {
		return
	}
	for _, a := range atts {
		if checkPodClaim(r, f, a) {
			return
		}
	}
	if checkAddresses(r, f, atts) {
		return
	}
	if checkNode(r, &f.Node, pod) {
		return
	}
	r.Summary = podSummary(f, atts)
}

// podSummary is the healthy line: addresses per attachment and the node.
func podSummary(f *podFacts, atts []ipam.Attachment) string {
	nets, _ := podnetworks.Parse(f.Pod.Annotations[podnetworks.Annotation])
	var parts []string
	for _, a := range atts {
		e := nets[a.NADKey]
		addrs := strings.Join(e.IPAddresses, ",")
		if addrs == "" {
			addrs = "no IPs"
		}
		parts = append(parts, fmt.Sprintf("%s on %s (%s, MAC %s)", addrs, a.NADKey, a.Role, e.MACAddress))
	}
	s := strings.Join(parts, "; ")
	if f.Pod.Spec.NodeName == "" {
		return s + ", not scheduled yet"
	}
	return s + ", node " + f.Pod.Spec.NodeName
}

// launcherVMI names the VMI a virt-launcher pod runs: its controller
// owner, else the kubevirt.io/domain annotation; "" for other pods.
func launcherVMI(pod *corev1.Pod) string {
	if pod.Labels[kubevirtv1.AppLabel] != kubevirtv1.VirtLauncherValue {
		return ""
	}
	if ref := metav1.GetControllerOf(pod); ref != nil && ref.Kind == "VirtualMachineInstance" {
		return ref.Name
	}
	return pod.Annotations[kubevirtv1.DomainAnnotation]
}

// checkPodClaim checks the claim an attachment references.
func checkPodClaim(r *Report, f *podFacts, a ipam.Attachment) bool {
	if a.ClaimRef == "" {
		return false
	}
	pod := f.Pod
	key := pod.Namespace + "/" + a.ClaimRef
	if !a.Network.AllowsPersistentIPs() {
		return r.fail("claim", key+": ignored", ClaimIgnored,
			fmt.Sprintf("give the network persistent IPs: a UserDefinedNetwork's spec is immutable, so recreate it with spec.layer2.ipam.lifecycle: Persistent; in a hand-written NAD set \"allowPersistentIPs\": true (Layer2 or Localnet with subnets, or in its kvnet-ipam section); or drop the reference from pod %s", pod.Name),
			"pod %s references IPAMClaim %s on network %q (NAD %s), which does not allow persistent IPs: kvnet ignores the reference (event %s) and the pod's IPs are not kept across restarts or migrations",
			pod.Name, key, a.Network.Name, a.NADKey, eventClaimIgnored)
	}
	claim := f.Claims[a.ClaimRef]
	if claim == nil {
		fix := fmt.Sprintf("create IPAMClaim %s with spec.network: %q, or correct the reference", key, a.Network.Name)
		if f.VM != nil {
			fix = fmt.Sprintf("kvnet-controller's VM claims controller creates %s while the VMI exists: check that kvnet-controller runs (%s)", key, f.Controller.describe())
		}
		return r.fail("claim", key+": not found", ClaimNotFound, fix,
			"pod %s references IPAMClaim %s for network %q, which does not exist; kvnet-controller waits for it (event %s) and the pod gets no address",
			pod.Name, key, a.Network.Name, eventClaimNotFound)
	}
	if claim.Spec.Network != a.Network.Name {
		return r.fail("claim", fmt.Sprintf("%s: spec.network %q", key, claim.Spec.Network), ClaimWrongNetwork,
			fmt.Sprintf("reference a claim of network %q (spec.network is immutable: create another claim) or attach the pod to network %q", a.Network.Name, claim.Spec.Network),
			"pod %s uses IPAMClaim %s for network %q (NAD %s), but the claim is for network %q", pod.Name, key, a.Network.Name, a.NADKey, claim.Spec.Network)
	}
	if other := claimHolder(claim, pod, f.VM, f.OwnerPods); other != "" {
		return r.fail("claim", key+": held by "+other, ClaimOwnedByOther,
			fmt.Sprintf("the claim's IPs belong to %s: give this workload its own claim (a VM's claims are named <vm>.<network>), or, if %s is gone for good, delete the claim so that its IPs are freed", other, other),
			"pod %s references IPAMClaim %s, which belongs to %s; two workloads on one claim share its IPs and MAC", pod.Name, key, other)
	}
	d := fmt.Sprintf("%s: network %q", key, claim.Spec.Network)
	if len(claim.Status.IPs) > 0 {
		d += ", IPs " + strings.Join(claim.Status.IPs, ",")
	}
	if ref := metav1.GetControllerOf(claim); ref != nil {
		d += ", owner " + ref.Kind + " " + ref.Name
	}
	r.ok("claim", "%s", d)
	return false
}

// claimHolder names the other VM or pod a claim belongs to ("" when it is
// this pod's, or free).
func claimHolder(claim *ipamclaimv1alpha1.IPAMClaim, pod *corev1.Pod, vm *vmRef, pods map[string]*corev1.Pod) string {
	if ref := metav1.GetControllerOf(claim); ref != nil && (ref.Kind == "VirtualMachine" || ref.Kind == "VirtualMachineInstance") {
		switch {
		case vm == nil:
			return ref.Kind + " " + ref.Name
		case ref.Name != vm.Name:
			return ref.Kind + " " + ref.Name
		case ref.Kind == vm.Kind && vm.UID != "" && ref.UID != vm.UID:
			return fmt.Sprintf("an earlier %s %s (UID %s; this one is %s)", ref.Kind, ref.Name, ref.UID, vm.UID)
		}
	}
	if op := claim.Status.OwnerPod; op != nil && op.Name != "" && op.Name != pod.Name {
		other := pods[op.Name]
		if other != nil && other.DeletionTimestamp == nil && !podnetworks.Completed(other) {
			if d := launcherVMI(pod); d == "" || d != launcherVMI(other) {
				return "pod " + other.Name
			}
		}
	}
	return ""
}

// checkAddresses checks kvnet.io/pod-networks: every attachment must be in
// it; when some are not, the events, claims and NADs say why.
func checkAddresses(r *Report, f *podFacts, atts []ipam.Attachment) bool {
	pod := f.Pod
	nets := podnetworks.Networks{}
	if v, ok := pod.Annotations[podnetworks.Annotation]; ok {
		var err error
		if nets, err = podnetworks.Parse(v); err != nil {
			return r.fail("addresses", podnetworks.Annotation+": invalid", AnnotationInvalid,
				"kvnet never overwrites this annotation (no IP may move silently): delete the pod so that it is created again and allocated afresh",
				"pod %s carries a %s annotation kvnet cannot read: %v", pod.Name, podnetworks.Annotation, err)
		}
	}
	var missing []ipam.Attachment
	for _, a := range atts {
		e, ok := nets[a.NADKey]
		if !ok {
			missing = append(missing, a)
			continue
		}
		d := fmt.Sprintf("%s: %s, MAC %s", a.NADKey, orDefault(strings.Join(e.IPAddresses, ", "), "no IPs"), e.MACAddress)
		if len(e.GatewayIPs) > 0 {
			d += ", gateway " + strings.Join(e.GatewayIPs, ", ")
		}
		r.ok("addresses", "%s", d)
	}
	if len(missing) == 0 {
		return false
	}
	keys := make([]string, len(missing))
	for i, a := range missing {
		keys[i] = a.NADKey
	}
	detail := "none yet for " + strings.Join(keys, ", ")

	// A claim's condition is written before the pod is annotated.
	for _, a := range missing {
		claim := f.Claims[a.ClaimRef]
		if a.ClaimRef == "" || claim == nil {
			continue
		}
		c := meta.FindStatusCondition(claim.Status.Conditions, ipamcontroller.ConditionIPsAllocated)
		if c == nil || c.Status != metav1.ConditionFalse {
			continue
		}
		if c.Reason == string(allocator.ReasonSubnetExhausted) {
			return failExhausted(r, detail, a, fmt.Sprintf("IPAMClaim %s/%s: %s=False (%s): %s", claim.Namespace, claim.Name, c.Type, c.Reason, c.Message))
		}
		return r.fail("addresses", detail, AllocationFailed, allocationFix(c.Reason),
			"kvnet-controller could not allocate network %q for pod %s: IPAMClaim %s/%s reports %s=False (%s): %s", a.Network.Name, pod.Name, claim.Namespace, claim.Name, c.Type, c.Reason, c.Message)
	}
	if e := lastKvnetEvent(f.Events, pod.UID); e != nil {
		msg := e.Message
		switch {
		case e.Reason == eventAllocationFailed && strings.Contains(msg, allocator.ErrFull.Error()):
			a := missing[0]
			for _, m := range missing {
				if strings.Contains(msg, m.Network.Name) {
					a = m
				}
			}
			return failExhausted(r, detail, a, "event "+e.Reason+": "+msg)
		case e.Reason == eventAllocationFailed:
			return r.fail("addresses", detail, AllocationFailed, allocationFix(""),
				"kvnet-controller could not allocate for pod %s (event %s): %s", pod.Name, e.Reason, msg)
		case e.Reason == eventInvalidRequest:
			return r.fail("addresses", detail, InvalidNetworkRequest, "correct the pod's network annotations and recreate the pod",
				"kvnet-controller refuses the pod's network request (event %s): %s", e.Reason, msg)
		case e.Reason == eventClaimNotFound:
			return r.fail("addresses", detail, ClaimNotFound, "create the claim or correct the reference; the pod is served as soon as the claim exists",
				"kvnet-controller waits for a claim of pod %s (event %s): %s", pod.Name, e.Reason, msg)
		case e.Reason == eventInvalidPrimaryNet:
			return r.fail("addresses", detail, NoPrimaryNetwork, "give the namespace one primary network (a UserDefinedNetwork with role Primary)",
				"kvnet-controller found no primary network for pod %s (event %s): %s", pod.Name, e.Reason, msg)
		}
	}
	for _, a := range missing {
		if nad := f.NADs[a.NADKey]; nad != nil && nad.Annotations[udn.PoolExhaustedAnnotation] == "true" {
			return failExhausted(r, detail, a, fmt.Sprintf("NAD %s carries %s: \"true\"", a.NADKey, udn.PoolExhaustedAnnotation))
		}
	}
	age := ""
	if !pod.CreationTimestamp.IsZero() && !f.Controller.Now.IsZero() {
		age = fmt.Sprintf(" (created %s ago)", f.Controller.Now.Sub(pod.CreationTimestamp.Time).Round(time.Second))
	}
	return r.fail("addresses", detail, WaitingForController,
		fmt.Sprintf("check that kvnet-controller runs and leads: kubectl -n %s get deploy,pods,lease; kubectl -n %s logs deploy/kvnet-controller (it serves no pod until its start-up rebuild is done, or its restart reserve is loaded: /readyz reports ipam-serving)", f.Controller.Namespace, f.Controller.Namespace),
		"pod %s%s has no %s annotation for %s yet, and no event or condition says why: waiting for kvnet-controller. The API shows: %s",
		pod.Name, age, podnetworks.Annotation, strings.Join(keys, ", "), f.Controller.describe())
}

func failExhausted(r *Report, detail string, a ipam.Attachment, evidence string) bool {
	return r.fail("addresses", detail, PoolExhausted,
		fmt.Sprintf("free addresses on network %q (delete pods, or IPAMClaims of VMs that are gone: a claim holds its IPs until it is deleted), or give the network a larger subnet (a new UserDefinedNetwork: the spec is immutable); the pod is served as soon as an address is free", a.Network.Name),
		"network %q (NAD %s) has no free address for the pod: %s", a.Network.Name, a.NADKey, evidence)
}

func allocationFix(reason string) string {
	switch reason {
	case string(allocator.ReasonIPConflict):
		return "a requested IP is held by another pod or claim: request another IP (ips / network.kubevirt.io/addresses) or free it"
	case string(allocator.ReasonMACConflict):
		return "the requested MAC is held by another attachment of the network: request another MAC"
	case string(allocator.ReasonInvalidRequest):
		return "correct the requested IPs or MAC (they must lie in the network's subnets, outside excluded ranges)"
	}
	return "see the message; check the requested IPs and MAC against the network's subnets, and kvnet-controller's log"
}

// lastKvnetEvent returns the newest allocation event kvnet recorded on the
// pod (of this incarnation: uid), nil when there is none.
func lastKvnetEvent(events []corev1.Event, uid types.UID) *corev1.Event {
	var last *corev1.Event
	for i := range events {
		e := &events[i]
		if uid != "" && e.InvolvedObject.UID != "" && e.InvolvedObject.UID != uid {
			continue
		}
		switch e.Reason {
		case eventAllocationFailed, eventInvalidRequest, eventClaimNotFound, eventInvalidPrimaryNet:
		default:
			continue
		}
		if last == nil || eventTime(e).After(eventTime(last)) {
			last = e
		}
	}
	return last
}

// eventTime is when an event (core/v1, or events.k8s.io/v1 seen through
// core/v1) was last observed.
func eventTime(e *corev1.Event) time.Time {
	t := slices.MaxFunc([]time.Time{e.LastTimestamp.Time, e.FirstTimestamp.Time, e.EventTime.Time, e.CreationTimestamp.Time}, func(a, b time.Time) int { return a.Compare(b) })
	if e.Series != nil && e.Series.LastObservedTime.After(t) {
		t = e.Series.LastObservedTime.Time
	}
	return t
}

// checkClaimReferences checks that a launcher pod references every claim
// its VM needs: kvnet's launcher-pod webhook adds them at admission.
func checkClaimReferences(r *Report, f *podFacts, atts []ipam.Attachment, primaryKey string) bool {
	if f.VMI == nil {
		return false
	}
	claims, err := vmclaims.Claims(f.VMI, f.VMI.Name, primaryKey, f.lookup)
	if err != nil {
		return false // a NAD that does not parse: reported by the NAD links
	}
	for _, cl := range claims {
		for _, a := range atts {
			if a.NADKey != cl.NADKey || a.ClaimRef == cl.Name {
				continue
			}
			have := "no claim reference"
			if a.ClaimRef != "" {
				have = fmt.Sprintf("a reference to IPAMClaim %q", a.ClaimRef)
			}
			return r.fail("claim", fmt.Sprintf("%s/%s: not referenced by pod %s", f.Pod.Namespace, cl.Name, f.Pod.Name), ClaimReferenceMissing,
				"fix kvnet's webhook first (kvnet why shows its state), then restart the VM (virtctl restart, or stop and start it) so that a new launcher pod is admitted through the webhook",
				"launcher pod %s has %s for network %q (VM network %q), where VMI %s needs IPAMClaim %s: kvnet's launcher-pod webhook %s did not mutate it at admission (not registered or not reachable then), so the VM's IPs on this network are not kept",
				f.Pod.Name, have, cl.Network, cl.LogicalNet, f.VMI.Name, cl.Name, webhookLauncher)
		}
	}
	return false
}
