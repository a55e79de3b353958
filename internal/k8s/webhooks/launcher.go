package webhooks

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	kubevirtv1 "kvnet.io/kvnet/api/kubevirt/v1"
	"kvnet.io/kvnet/internal/k8s/nads"
	"kvnet.io/kvnet/internal/netconf"
	"kvnet.io/kvnet/internal/udn"
	"kvnet.io/kvnet/internal/vmclaims"
)

// LauncherPodPath is where the launcher-pod mutator is served.
const LauncherPodPath = "/mutate-launcher-pod"

// LauncherPodMutator sets IPAMClaim references on virt-launcher pods.
type LauncherPodMutator struct {
	// Reader reads VMIs, namespaces and NADs; an uncached reader, because
	// the VMI was usually created a moment ago.
	Reader client.Reader
	// Cache, if set, is asked first for namespaces and NADs, which change
	// rarely; what it does not know is read through Reader, so a NAD or
	// namespace created a moment ago is never missed.
	Cache   client.Reader
	Decoder admission.Decoder
	// DefaultNetworkNAD is "<ns>/<name>" of the cluster default network,
	// written in the default-network element for primary networks.
	DefaultNetworkNAD string
	// PrimaryInNetworks: primary networks are attached through Multus (see
	// PrimaryPodMutator), so a VM's primary claim goes in the networks
	// element, not in a default-network element.
	PrimaryInNetworks bool
	// PrimaryAsDefaultNetwork: primary networks are the pods' default
	// network for Multus (see PrimaryPodMutator.AsDefaultNetwork), so a
	// VM's primary claim goes in that default-network element.
	PrimaryAsDefaultNetwork bool
	// VMIRetries and VMIRetryDelay bound the wait for a VMI the reader
	// does not see yet (default 4 × 500 ms, as ipam-extensions).
	VMIRetries    int
	VMIRetryDelay time.Duration
}

// Handle implements admission.Handler.
func (m *LauncherPodMutator) Handle(ctx context.Context, req admission.Request) admission.Response {
	start := time.Now()
	defer func() { admissionSeconds.WithLabelValues("launcher-pod").Observe(time.Since(start).Seconds()) }()
	var pod corev1.Pod
	if err := m.Decoder.Decode(req, &pod); err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	if pod.Namespace == "" {
		pod.Namespace = req.Namespace
	}
	vmiName := pod.Annotations[kubevirtv1.DomainAnnotation]
	if vmiName == "" {
		return admission.Allowed("not a VM pod")
	}
	if req.Operation == admissionv1.Update {
		return m.update(ctx, req, &pod, vmiName)
	}
	ann, err := m.annotations(ctx, &pod, vmiName, true)
	if err != nil {
		if errors.Is(err, vmclaims.ErrDeny) {
			return admission.Denied(err.Error())
		}
		return admission.Errored(http.StatusInternalServerError, err)
	}
	return patchAnnotations(req.Object.Raw, ann)
}

// update admits an UPDATE of a live launcher pod, always: KubeVirt patches
// its launcher pods all the time (virt-controller syncs its annotations,
// adds the migration-target-ready timestamp and the descheduler's, and on
// a hot plug or unplug rebuilds the networks annotation), and a refused
// patch would stall the VM's lifecycle for as long as the cause lasts
// (say a secondary NAD deleted while the VM runs). What is checked at
// CREATE is not checked again; kvnet's additions are kept
// (vmclaims.KeepOnUpdate), and when the update touches them the claim
// references, and in multus mode the primary network's element, are
// written again as at CREATE, as far as they can be worked out.
func (m *LauncherPodMutator) update(ctx context.Context, req admission.Request, pod *corev1.Pod, vmiName string) admission.Response {
	var old corev1.Pod
	if err := m.Decoder.DecodeRaw(req.OldObject, &old); err != nil {
		log.FromContext(ctx).Error(err, "launcher pod update: old object not decoded; admitted unchanged", "pod", pod.Namespace+"/"+pod.Name)
		return admission.Allowed("update of a launcher pod")
	}
	if !vmclaims.KvnetAnnotationsChanged(&old, pod) {
		return admission.Allowed("update leaves kvnet's annotations alone")
	}
	kept, changed, err := vmclaims.KeepOnUpdate(&old, pod)
	if err != nil {
		log.FromContext(ctx).Error(err, "launcher pod update: kvnet's elements not kept", "pod", pod.Namespace+"/"+pod.Name)
	}
	pod.Annotations = kept
	ann, err := m.annotations(ctx, pod, vmiName, false)
	if err != nil {
		// Admitted with what KeepOnUpdate kept: refusing would not bring
		// the reference back, only block KubeVirt.
		log.FromContext(ctx).Error(err, "launcher pod update: claim references not recomputed; admitted with kvnet's previous elements", "pod", pod.Namespace+"/"+pod.Name)
		if !changed {
			return admission.Allowed("update of a launcher pod")
		}
		return patchAnnotations(req.Object.Raw, kept)
	}
	return patchAnnotations(req.Object.Raw, ann)
}

// annotations returns the annotations launcher pod pod of VMI vmiName must
// have: its claim references, and in multus mode the primary network's
// element. An error wrapping vmclaims.ErrDeny refuses a CREATE. On an
// update (create false), a NAD that does not exist (any more) is not an
// error: its network gets no claim reference.
func (m *LauncherPodMutator) annotations(ctx context.Context, pod *corev1.Pod, vmiName string, create bool) (map[string]string, error) {
	vmi, err := m.getVMI(ctx, pod.Namespace, vmiName)
	if err != nil {
		return nil, fmt.Errorf("get VMI %s/%s of launcher pod: %w", pod.Namespace, vmiName, err)
	}
	labelled, primaryKey, err := m.primary(ctx, pod.Namespace)
	if err != nil {
		return nil, err
	}
	if labelled && primaryKey == "" && create {
		// Without the NAD, the pod would get no claim reference and its
		// primary IPs, once the network exists, would not persist: refuse
		// until it does (virt-controller retries the pod).
		return nil, fmt.Errorf("%w: namespace %s is labelled %s but has no primary network yet (its UserDefinedNetwork's NetworkAttachmentDefinition does not exist): the launcher pod of VMI %s is refused until it does, so that the VM's IPs persist",
			vmclaims.ErrDeny, pod.Namespace, udn.PrimaryNamespaceLabel, vmiName)
	}
	var primaryNet *netconf.Served
	lookup := func(key string) (*netconf.Served, bool, error) {
		s, found, err := m.lookupNAD(ctx, key)
		if err != nil && found {
			return nil, true, fmt.Errorf("%w: NAD %s: %v", vmclaims.ErrDeny, key, err)
		}
		if key == primaryKey {
			primaryNet = s
		}
		if err == nil && !found && key != primaryKey && create {
			// As for the primary NAD above: admitted now, the pod would
			// get no claim reference on this network, and its IPs there
			// would not persist.
			return nil, false, fmt.Errorf("%w: NetworkAttachmentDefinition %s, named by a network of VMI %s, does not exist (yet): the launcher pod is refused until it does, so that the VM's IPs on it persist", vmclaims.ErrDeny, key, vmiName)
		}
		return s, found, err
	}
	claims, err := vmclaims.Claims(vmi, vmi.Name, primaryKey, lookup)
	if err != nil {
		return nil, err
	}
	var primarySubnets []netip.Prefix
	if slices.ContainsFunc(claims, func(c vmclaims.Claim) bool { return c.Primary }) {
		if primarySubnets, err = claimSubnets(primaryKey, primaryNet); err != nil {
			return nil, err
		}
	}
	return vmclaims.MutatePod(pod, vmi, claims, primarySubnets, vmclaims.PodOptions{
		DefaultNetworkNAD:       m.DefaultNetworkNAD,
		Create:                  create,
		PrimaryInNetworks:       m.PrimaryInNetworks,
		PrimaryKey:              primaryKey,
		PrimaryAsDefaultNetwork: m.PrimaryAsDefaultNetwork,
	})
}

// claimSubnets returns the subnets of the network a primary claim is on
// (named key), which the VM's requested IPs must lie in. Such a network
// has persistent IPs, so it is a Layer2 or localnet one, whose subnets are
// plain CIDRs.
func claimSubnets(key string, s *netconf.Served) ([]netip.Prefix, error) {
	if s == nil || s.Conf == nil {
		return nil, nil
	}
	p, err := netconf.ParsePrefixes("subnets", s.Conf.Subnets)
	if err != nil {
		return nil, fmt.Errorf("%w: NAD %s: %v", vmclaims.ErrDeny, key, err)
	}
	return p, nil
}

// primary returns whether the namespace is labelled for a primary network
// and the key of its primary NAD, from the cache when it knows one, else
// from the API server.
func (m *LauncherPodMutator) primary(ctx context.Context, namespace string) (bool, string, error) {
	if m.Cache != nil {
		if labelled, key, err := nads.Primary(ctx, m.Cache, namespace); err == nil && key != "" {
			return labelled, key, nil
		}
	}
	return nads.Primary(ctx, m.Reader, namespace)
}

// lookupNAD is nads.Lookup, from the cache when it has the NAD, else from
// the API server.
func (m *LauncherPodMutator) lookupNAD(ctx context.Context, key string) (*netconf.Served, bool, error) {
	if m.Cache != nil {
		if s, found, err := nads.Lookup(ctx, m.Cache, key); found {
			return s, found, err
		}
	}
	return nads.Lookup(ctx, m.Reader, key)
}

func (m *LauncherPodMutator) getVMI(ctx context.Context, ns, name string) (*kubevirtv1.VirtualMachineInstance, error) {
	retries, delay := m.VMIRetries, m.VMIRetryDelay
	if retries == 0 {
		retries, delay = 4, 500*time.Millisecond
	}
	var vmi kubevirtv1.VirtualMachineInstance
	for i := 0; ; i++ {
		err := m.Reader.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &vmi)
		if err == nil {
			return &vmi, nil
		}
		if !apierrors.IsNotFound(err) || i+1 >= retries {
			return nil, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(delay):
		}
	}
}

// patchAnnotations returns a response setting the object's annotations to
// ann, leaving every other field as it came.
func patchAnnotations(raw []byte, ann map[string]string) admission.Response {
	obj, md, err := decodeObject(raw)
	if err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	if len(ann) > 0 {
		md["annotations"] = ann
	}
	out, err := json.Marshal(obj)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	return admission.PatchResponseFromRaw(raw, out)
}

// decodeObject decodes a raw object for patching, keeping every field, and
// returns it with its metadata (added when absent). Anything but an object
// with an object (or absent) metadata is an error.
func decodeObject(raw []byte) (obj, md map[string]any, err error) {
	if err := json.Unmarshal(raw, &obj); err != nil {
		return nil, nil, fmt.Errorf("decode object: %w", err)
	}
	if obj == nil {
		return nil, nil, errors.New("decode object: null is not an object")
	}
	switch m := obj["metadata"].(type) {
	case map[string]any:
		md = m
	case nil:
		if _, ok := obj["metadata"]; ok {
			return nil, nil, errors.New("decode object: metadata is null")
		}
		md = map[string]any{}
		obj["metadata"] = md
	default:
		return nil, nil, fmt.Errorf("decode object: metadata is a %T, not an object", m)
	}
	return obj, md, nil
}
