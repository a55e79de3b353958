package ipam

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	ipamclaimv1alpha1 "kvnet.io/kvnet/api/k8scni/v1alpha1"
	"kvnet.io/kvnet/internal/hostsubnet"
	"kvnet.io/kvnet/internal/ipam"
	"kvnet.io/kvnet/internal/ipam/allocator"
	"kvnet.io/kvnet/internal/k8s/nads"
	"kvnet.io/kvnet/internal/netconf"
	"kvnet.io/kvnet/internal/podnetworks"
)

// IPAMClaim condition vocabulary shared with OVN-Kubernetes.
const (
	ConditionIPsAllocated   = "IPsAllocated"
	ReasonSuccess           = "SuccessfulAllocation"
	messageSuccess          = "IP addresses successfully allocated"
	reasonMissingClaim      = "MissingIPAMClaim"
	retryMissing            = 2 * time.Second
	retryExhausted          = 30 * time.Second
	eventAllocationFailed   = "IPAllocationFailed"
	eventInvalidNetworkReq  = "InvalidNetworkRequest"
	eventClaimNotHonoured   = "IPAMClaimIgnored"
	eventClaimMissing       = "IPAMClaimNotFound"
	eventPrimaryNetworkMiss = "InvalidPrimaryNetwork"
)

// podReconciler allocates for pods.
type podReconciler struct {
	client    client.Client
	apiReader client.Reader
	recorder  events.EventRecorder
	st        *state
	ready     <-chan struct{}
	// window is closed while new pods may be served from the restart
	// reserve before the rebuild (nil: never); reserve serves them.
	window  <-chan struct{}
	reserve *reserveSet
}

func (r *podReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	window := false
	select {
	case <-r.ready:
	case <-r.window:
		select {
		case <-r.ready:
		default:
			window = true
		}
	case <-ctx.Done():
		return ctrl.Result{}, ctx.Err()
	}
	// Before the rebuild only pods created since the reserve began to
	// serve are served, each read from the API server: the pod cache may
	// still be listing every pod, whose events wait for the rebuild.
	var reader client.Reader = r.client
	if window {
		if !r.st.isNew(req.NamespacedName) {
			r.st.deferUntilRebuilt(ctx, req.NamespacedName)
			return ctrl.Result{}, nil
		}
		reader = r.apiReader
	}
	var pod corev1.Pod
	if err := reader.Get(ctx, req.NamespacedName, &pod); err != nil {
		if apierrors.IsNotFound(err) {
			if window {
				// Releases wait for the rebuild, which records what the
				// pod held.
				r.st.deferUntilRebuilt(ctx, req.NamespacedName)
				return ctrl.Result{}, nil
			}
			r.st.releasePod(req.NamespacedName, "")
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, err
	}
	if podnetworks.Completed(&pod) {
		if window {
			r.st.deferUntilRebuilt(ctx, req.NamespacedName)
			return ctrl.Result{}, nil
		}
		r.st.releasePod(req.NamespacedName, pod.UID)
		return ctrl.Result{}, nil
	}
	if pod.Spec.HostNetwork {
		return ctrl.Result{}, nil
	}
	ctx = log.IntoContext(ctx, log.FromContext(ctx).WithValues("pod", req.NamespacedName.String()))

	atts, err := r.attachments(ctx, &pod)
	if err != nil {
		return r.podError(ctx, &pod, "", err)
	}
	if len(atts) == 0 {
		return ctrl.Result{}, nil
	}
	existing := podnetworks.Networks{}
	if v, ok := pod.Annotations[podnetworks.Annotation]; ok {
		if existing, err = podnetworks.Parse(v); err != nil {
			// Only kvnet writes this annotation; a broken one is not
			// overwritten, so no IP can silently move.
			r.recorder.Eventf(&pod, nil, corev1.EventTypeWarning, eventAllocationFailed, "Allocate", "%v", err)
			return ctrl.Result{}, nil
		}
	}
	var missing []ipam.Attachment
	for _, a := range atts {
		if _, done := existing[a.NADKey]; !done {
			missing = append(missing, a)
		}
	}
	if len(missing) == 0 {
		return r.labelPod(ctx, &pod, existing)
	}
	if window {
		if why := r.notFromReserve(missing); why != "" {
			log.FromContext(ctx).Info("not served from the restart reserve: waiting for the rebuild", "reason", why)
			r.st.deferUntilRebuilt(ctx, req.NamespacedName)
			return ctrl.Result{}, nil
		}
	}

	var podOwned []*network // rolled back if the attempt fails
	ok := false
	defer func() {
		if !ok {
			for _, n := range podOwned {
				n.alloc.Release(podOwner(pod.UID))
				n.updateGauges()
			}
		}
	}()
	result := podnetworks.Networks{}
	for k, v := range existing {
		result[k] = v
	}
	var ownedNets []string
	for _, a := range missing {
		entry, n, owned, err := r.allocate(ctx, &pod, a, window)
		if errors.Is(err, errReserveEmpty) {
			log.FromContext(ctx).V(1).Info("waiting for the rebuild", "reason", err.Error())
			r.st.deferUntilRebuilt(ctx, req.NamespacedName)
			return ctrl.Result{}, nil
		}
		if err != nil {
			return r.podError(ctx, &pod, a.Network.Name, err)
		}
		if owned {
			podOwned = append(podOwned, n)
			ownedNets = append(ownedNets, n.alloc.Name()) // the allocator key: per host subnet on Layer3
		}
		result[a.NADKey] = entry
	}
	value, err := result.Marshal()
	if err != nil {
		return ctrl.Result{}, err
	}
	patch := client.MergeFrom(pod.DeepCopy())
	if pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	pod.Annotations[podnetworks.Annotation] = value
	setLabels(&pod, result.Labels())
	if err := r.client.Patch(ctx, &pod, patch); err != nil {
		if apierrors.IsNotFound(err) {
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, fmt.Errorf("annotate pod: %w", err)
	}
	ok = true
	r.st.recordPod(req.NamespacedName, pod.UID, ownedNets)
	for _, a := range missing {
		allocationsTotal.WithLabelValues(a.Network.Name).Inc()
		if window {
			reserveAllocations.WithLabelValues(a.Network.Name).Inc()
		}
	}
	allocationSeconds.Observe(time.Since(pod.CreationTimestamp.Time).Seconds())
	if window {
		log.FromContext(ctx).Info("allocated from the restart reserve, before the rebuild", "attachments", len(missing), "annotation", value)
	} else {
		log.FromContext(ctx).V(1).Info("allocated", "attachments", len(missing))
	}
	return ctrl.Result{}, nil
}

// notFromReserve says why the attachments may not be served from the
// restart reserve before the rebuild; "" if they may be: automatic
// addresses, owned by the pod, on a whole network (not Layer3) whose
// reserve has a set left. A claim's addresses, a static IP or MAC may be
// held by what the rebuild has not read yet.
func (r *podReconciler) notFromReserve(atts []ipam.Attachment) string {
	for _, a := range atts {
		switch {
		case a.ClaimRef != "":
			return fmt.Sprintf("network %q: IPAMClaim %s", a.Network.Name, a.ClaimRef)
		case len(a.IPs) > 0 || a.MAC != nil:
			return fmt.Sprintf("network %q: static IP or MAC", a.Network.Name)
		case a.Network.Conf != nil && a.Network.Conf.Topology == netconf.TopologyLayer3:
			return fmt.Sprintf("network %q: Layer3", a.Network.Name)
		case !r.reserve.has(a.Network.Name):
			return fmt.Sprintf("network %q: no address set left in its restart reserve", a.Network.Name)
		}
	}
	return ""
}

// labelPod gives an allocated pod the network labels of its annotation
// (podnetworks.NetworkLabel) where it lacks them: a pod allocated by a
// kvnet before the labels, or whose labels somebody removed. kvnet-node
// finds the pods of a network by its label.
func (r *podReconciler) labelPod(ctx context.Context, pod *corev1.Pod, nets podnetworks.Networks) (ctrl.Result, error) {
	want := nets.Labels()
	if podnetworks.HasLabels(pod.Labels, want) {
		return ctrl.Result{}, nil
	}
	patch := client.MergeFrom(pod.DeepCopy())
	setLabels(pod, want)
	if err := r.client.Patch(ctx, pod, patch); err != nil {
		if apierrors.IsNotFound(err) {
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, fmt.Errorf("label pod with its networks: %w", err)
	}
	log.FromContext(ctx).V(1).Info("labelled with its networks", "labels", len(want))
	return ctrl.Result{}, nil
}

// setLabels adds labels to the pod's.
func setLabels(pod *corev1.Pod, labels map[string]string) {
	if pod.Labels == nil {
		pod.Labels = make(map[string]string, len(labels))
	}
	maps.Copy(pod.Labels, labels)
}

// attachments returns the pod's kvnet attachments, reading its namespace
// and NADs from the cache.
func (r *podReconciler) attachments(ctx context.Context, pod *corev1.Pod) ([]ipam.Attachment, error) {
	labelled, primaryKey, err := nads.Primary(ctx, r.client, pod.Namespace)
	if err != nil {
		return nil, err
	}
	lookup := func(key string) (*netconf.Served, bool, error) {
		s, found, err := nads.Lookup(ctx, r.client, key)
		if err != nil && found {
			return nil, true, fmt.Errorf("%w: NAD %s: %v", ipam.ErrInvalidRequest, key, err)
		}
		return s, found, err
	}
	return ipam.PodAttachments(pod, labelled, primaryKey, lookup)
}

// errClaimMissing is returned while a referenced IPAMClaim does not exist.
var errClaimMissing = errors.New("IPAMClaim not found")

// allocate serves one attachment. owned reports whether the pod (rather
// than a claim) owns the allocation.
//
// With window (before the rebuild, where notFromReserve allowed it), the
// addresses come from the restart reserve.
func (r *podReconciler) allocate(ctx context.Context, pod *corev1.Pod, a ipam.Attachment, window bool) (podnetworks.Attachment, *network, bool, error) {
	layer3 := a.Network.Conf != nil && a.Network.Conf.Topology == netconf.TopologyLayer3
	var (
		n   *network
		err error
	)
	if layer3 {
		n, err = r.hostNetwork(ctx, pod, a.Network)
		if err != nil {
			return podnetworks.Attachment{}, nil, false, err
		}
	} else if n, err = r.st.network(a.Network); err != nil {
		return podnetworks.Attachment{}, nil, false, fmt.Errorf("%w: %v", ipam.ErrInvalidRequest, err)
	}
	if !layer3 && n.served != a.Network && !sameAddresses(n.cfg, mustConfig(a.Network)) {
		log.FromContext(ctx).Info("NAD disagrees with the network's first definition; using the first", "network", a.Network.Name, "nad", a.NADKey)
	}
	claimRef := a.ClaimRef
	if claimRef != "" && !a.Network.AllowsPersistentIPs() {
		r.recorder.Eventf(pod, nil, corev1.EventTypeNormal, eventClaimNotHonoured, "Allocate",
			"Pod %s/%s referencing an IPAMClaim on network %q which does not honor it", pod.Namespace, pod.Name, a.Network.Name)
		claimRef = ""
	}
	var alloc allocator.Allocation
	owned := claimRef == ""
	switch {
	case owned && window:
		if alloc, err = r.reserve.take(ctx, n, podOwner(pod.UID)); err != nil {
			return podnetworks.Attachment{}, n, false, err
		}
	case owned:
		alloc, err = withEviction(ctx, r.reserve, n, a.IPs, a.MAC, func() (allocator.Allocation, error) {
			return n.alloc.Allocate(allocator.Request{Owner: podOwner(pod.UID), IPs: a.IPs, MAC: a.MAC})
		})
	default:
		alloc, err = r.allocateForClaim(ctx, pod, n, a, claimRef)
	}
	n.updateGauges()
	if err != nil {
		return podnetworks.Attachment{}, n, false, err
	}
	entry := podnetworks.Attachment{
		MACAddress: alloc.MAC.String(),
		Role:       a.Role,
		Network:    a.Network.Name,
		IPAMClaim:  claimRef,
	}
	for _, p := range alloc.IPs {
		entry.IPAddresses = append(entry.IPAddresses, p.String())
	}
	for _, g := range alloc.Gateways {
		entry.GatewayIPs = append(entry.GatewayIPs, g.String())
		switch {
		case a.Role == podnetworks.RolePrimary:
			dest := "0.0.0.0/0"
			if g.Is6() {
				dest = "::/0"
			}
			entry.Routes = append(entry.Routes, podnetworks.Route{Dest: dest, NextHop: g.String()})
		case layer3:
			// A secondary Layer3 network routes its cluster subnets
			// through the node's router.
			subs, _ := netconf.ParseLayer3Subnets(a.Network.Conf.Subnets)
			for _, cs := range subs {
				if cs.CIDR.Addr().Is4() == g.Is4() {
					entry.Routes = append(entry.Routes, podnetworks.Route{Dest: cs.CIDR.String(), NextHop: g.String()})
				}
			}
		}
	}
	return entry, n, owned, nil
}

// errNoHostSubnet is returned while the pod's node has no host subnet of
// its Layer3 network yet.
var errNoHostSubnet = errors.New("no host subnet")

// hostNetwork returns the allocator of the Layer3 network s on the pod's
// node. An unscheduled pod waits: its node decides its subnet.
func (r *podReconciler) hostNetwork(ctx context.Context, pod *corev1.Pod, s *netconf.Served) (*network, error) {
	if pod.Spec.NodeName == "" {
		return nil, errNotScheduled
	}
	var node corev1.Node
	if err := r.client.Get(ctx, client.ObjectKey{Name: pod.Spec.NodeName}, &node); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("%w of layer3 network %q: node %s not found", errNoHostSubnet, s.Name, pod.Spec.NodeName)
		}
		return nil, err
	}
	var subnets []netip.Prefix
	if v, ok := node.Annotations[hostsubnet.Annotation]; ok {
		all, err := hostsubnet.Parse(v)
		if err != nil {
			return nil, fmt.Errorf("%w of layer3 network %q on node %s: %v", errNoHostSubnet, s.Name, node.Name, err)
		}
		subnets = all[s.Name]
	}
	if len(subnets) == 0 {
		return nil, fmt.Errorf("%w of layer3 network %q on node %s yet (annotation %s)", errNoHostSubnet, s.Name, node.Name, hostsubnet.Annotation)
	}
	n, err := r.st.hostNetwork(s, subnets)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ipam.ErrInvalidRequest, err)
	}
	return n, nil
}

// errNotScheduled is returned for a pod on a Layer3 network without a
// node: its update with the node retriggers it.
var errNotScheduled = errors.New("pod not scheduled yet")

func mustConfig(s *netconf.Served) allocator.Config {
	cfg, _ := ipam.NetworkConfig(s)
	return cfg
}

// allocateForClaim reuses the claim's IPs or allocates new ones and writes
// them to the claim's status before the pod is annotated.
func (r *podReconciler) allocateForClaim(ctx context.Context, pod *corev1.Pod, n *network, a ipam.Attachment, claimName string) (allocator.Allocation, error) {
	var claim ipamclaimv1alpha1.IPAMClaim
	key := types.NamespacedName{Namespace: pod.Namespace, Name: claimName}
	// Read uncached: claims are only cached as metadata (see Setup).
	if err := r.apiReader.Get(ctx, key, &claim); err != nil {
		if apierrors.IsNotFound(err) {
			return allocator.Allocation{}, fmt.Errorf("%w: %s (referenced for network %q)", errClaimMissing, key, a.Network.Name)
		}
		return allocator.Allocation{}, err
	}
	if claim.Spec.Network != a.Network.Name {
		return allocator.Allocation{}, fmt.Errorf("%w: IPAMClaim %s is for network %q, not %q", ipam.ErrInvalidRequest, key, claim.Spec.Network, a.Network.Name)
	}
	owner := claimOwner(key.Namespace, key.Name)
	r.st.recordClaim(key, a.Network.Name)
	var alloc allocator.Allocation
	var err error
	if len(claim.Status.IPs) > 0 {
		ips := make([]netip.Addr, 0, len(claim.Status.IPs))
		for _, s := range claim.Status.IPs {
			p, perr := netip.ParsePrefix(s)
			if perr != nil {
				return allocator.Allocation{}, fmt.Errorf("%w: IPAMClaim %s status.ips value %q: %v", ipam.ErrInvalidRequest, key, s, perr)
			}
			ips = append(ips, p.Addr())
		}
		if len(a.IPs) > 0 && !subset(a.IPs, ips) {
			err := fmt.Errorf("%w: requested IPs %v are not the IPs %v that IPAMClaim %s holds", allocator.ErrAllocated, a.IPs, claim.Status.IPs, key)
			return allocator.Allocation{}, err
		}
		if got, held := n.alloc.Get(owner); held {
			alloc = got
		} else {
			mac := a.MAC
			if mac == nil && len(ips) > 0 {
				mac = allocator.DeriveMAC(ips[0])
			}
			alloc, err = withEviction(ctx, r.reserve, n, ips, mac, func() (allocator.Allocation, error) {
				return n.alloc.Reserve(owner, ips, mac)
			})
		}
	} else {
		alloc, err = withEviction(ctx, r.reserve, n, a.IPs, a.MAC, func() (allocator.Allocation, error) {
			return n.alloc.Allocate(allocator.Request{Owner: owner, IPs: a.IPs, MAC: a.MAC})
		})
	}
	if serr := r.writeClaimStatus(ctx, &claim, pod, alloc, err); serr != nil {
		if err == nil && len(claim.Status.IPs) == 0 {
			n.alloc.Release(owner)
		}
		return allocator.Allocation{}, serr
	}
	return alloc, err
}

// writeClaimStatus records the outcome on the claim: IPs (only when it had
// none), the owner pod (the newest pod using it: a migration target), and
// the IPsAllocated condition.
func (r *podReconciler) writeClaimStatus(ctx context.Context, claim *ipamclaimv1alpha1.IPAMClaim, pod *corev1.Pod, alloc allocator.Allocation, allocErr error) error {
	for attempt := 0; ; attempt++ {
		updated := claim.DeepCopy()
		cond := metav1.Condition{Type: ConditionIPsAllocated, Status: metav1.ConditionTrue, Reason: ReasonSuccess, Message: messageSuccess, ObservedGeneration: claim.Generation}
		if allocErr != nil {
			cond = metav1.Condition{Type: ConditionIPsAllocated, Status: metav1.ConditionFalse, Reason: string(allocator.ReasonOf(allocErr)), Message: allocErr.Error(), ObservedGeneration: claim.Generation}
		} else if len(updated.Status.IPs) == 0 {
			for _, p := range alloc.IPs {
				updated.Status.IPs = append(updated.Status.IPs, p.String())
			}
		}
		meta.SetStatusCondition(&updated.Status.Conditions, cond)
		if r.newerOwner(ctx, claim, pod) {
			updated.Status.OwnerPod = &ipamclaimv1alpha1.OwnerPod{Name: pod.Name}
		}
		if equalClaimStatus(claim.Status, updated.Status) {
			return nil
		}
		err := r.client.Status().Update(ctx, updated)
		if err == nil {
			*claim = *updated
			return nil
		}
		if !apierrors.IsConflict(err) || attempt >= 5 {
			return fmt.Errorf("update IPAMClaim %s/%s status: %w", claim.Namespace, claim.Name, err)
		}
		// Another writer (often the other launcher pod of the same VM):
		// re-read; never overwrite IPs it wrote.
		if err := r.apiReader.Get(ctx, client.ObjectKeyFromObject(claim), claim); err != nil {
			return err
		}
		if len(claim.Status.IPs) > 0 && allocErr == nil && !sameIPs(claim.Status.IPs, alloc.IPs) {
			return fmt.Errorf("IPAMClaim %s/%s: overwriting existing IPs %v with %v is not allowed", claim.Namespace, claim.Name, claim.Status.IPs, alloc.IPs)
		}
	}
}

func (r *podReconciler) newerOwner(ctx context.Context, claim *ipamclaimv1alpha1.IPAMClaim, pod *corev1.Pod) bool {
	if claim.Status.OwnerPod == nil || claim.Status.OwnerPod.Name == "" {
		return true
	}
	if claim.Status.OwnerPod.Name == pod.Name {
		return false
	}
	var cur corev1.Pod
	if err := r.client.Get(ctx, client.ObjectKey{Namespace: pod.Namespace, Name: claim.Status.OwnerPod.Name}, &cur); err != nil {
		return true // the recorded owner is gone
	}
	return pod.CreationTimestamp.After(cur.CreationTimestamp.Time) ||
		pod.CreationTimestamp.Equal(&cur.CreationTimestamp) && pod.Name > cur.Name
}

func equalClaimStatus(a, b ipamclaimv1alpha1.IPAMClaimStatus) bool {
	if len(a.IPs) != len(b.IPs) || (a.OwnerPod == nil) != (b.OwnerPod == nil) || a.OwnerPod != nil && a.OwnerPod.Name != b.OwnerPod.Name {
		return false
	}
	for i := range a.IPs {
		if a.IPs[i] != b.IPs[i] {
			return false
		}
	}
	ca, cb := meta.FindStatusCondition(a.Conditions, ConditionIPsAllocated), meta.FindStatusCondition(b.Conditions, ConditionIPsAllocated)
	if ca == nil || cb == nil {
		return ca == cb
	}
	return ca.Status == cb.Status && ca.Reason == cb.Reason && ca.Message == cb.Message
}

func subset(want, have []netip.Addr) bool {
	for _, w := range want {
		if !slices.Contains(have, w) {
			return false
		}
	}
	return true
}

func sameIPs(status []string, ips []netip.Prefix) bool {
	if len(status) != len(ips) {
		return false
	}
	for i := range ips {
		if status[i] != ips[i].String() {
			return false
		}
	}
	return true
}

// podError reports a failed allocation on the pod and decides the retry.
func (r *podReconciler) podError(ctx context.Context, pod *corev1.Pod, networkName string, err error) (ctrl.Result, error) {
	reason := string(allocator.ReasonOf(err))
	result := ctrl.Result{}
	event := eventAllocationFailed
	switch {
	case errors.Is(err, errClaimMissing):
		reason, event, result = reasonMissingClaim, eventClaimMissing, ctrl.Result{RequeueAfter: retryMissing}
	case errors.Is(err, errNotScheduled):
		return ctrl.Result{}, nil
	case errors.Is(err, errNoHostSubnet):
		// Retried as soon as the node's host subnets change, and
		// periodically as a backstop.
		r.st.waitFor(nodeWait(pod.Spec.NodeName), client.ObjectKeyFromObject(pod))
		reason, event, result = "NoHostSubnet", eventAllocationFailed, ctrl.Result{RequeueAfter: retryMissing}
	case errors.Is(err, ipam.ErrMissingNAD):
		reason, event, result = "MissingNetworkAttachmentDefinition", eventAllocationFailed, ctrl.Result{RequeueAfter: retryMissing}
	case errors.Is(err, ipam.ErrNoPrimaryNetwork):
		reason, event, result = "InvalidPrimaryNetwork", eventPrimaryNetworkMiss, ctrl.Result{RequeueAfter: retryMissing}
	case errors.Is(err, ipam.ErrInvalidRequest):
		reason, event = "InvalidRequest", eventInvalidNetworkReq
	case errors.Is(err, allocator.ErrFull):
		// Retried as soon as the network frees an address, and
		// periodically as a backstop.
		r.st.waitFor(networkName, client.ObjectKeyFromObject(pod))
		result = ctrl.Result{RequeueAfter: retryExhausted}
	case errors.Is(err, allocator.ErrAllocated), errors.Is(err, allocator.ErrMACConflict),
		errors.Is(err, allocator.ErrNotInSubnet), errors.Is(err, allocator.ErrExcluded), errors.Is(err, allocator.ErrInvalid):
		// The request must change; the pod's update will retrigger.
	default:
		log.FromContext(ctx).Error(err, "allocation failed")
		if networkName != "" {
			failuresTotal.WithLabelValues(networkName, reason).Inc()
		}
		return ctrl.Result{}, err
	}
	if networkName != "" {
		failuresTotal.WithLabelValues(networkName, reason).Inc()
	}
	r.recorder.Eventf(pod, nil, corev1.EventTypeWarning, event, "Allocate", "%v", err)
	return result, nil
}
