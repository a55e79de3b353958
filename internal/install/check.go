package install

import (
	"cmp"
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/version"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"kvnet.io/kvnet/internal/podnetworks"
)

// Status of a Finding.
type Status string

const (
	OK      Status = "ok"
	Missing Status = "missing" // kvnet cannot work without it
	Warning Status = "warning" // some features will not work
)

// Finding is one result of Check.
type Finding struct {
	Status Status
	What   string
	Detail string
	// Fix tells the user what to do, when Status is not OK.
	Fix string
}

func (f Finding) String() string {
	s := fmt.Sprintf("%-8s %s: %s", f.Status, f.What, f.Detail)
	if f.Fix != "" {
		s += "\n         fix: " + f.Fix
	}
	return s
}

// CheckOptions say where kvnet runs.
type CheckOptions struct {
	// Namespace of kvnet-controller and kvnet-node (default kvnet-system).
	Namespace string
	// Prerequisites only: skip the checks of kvnet itself (before
	// installing).
	Prerequisites bool
	// KubernetesVersion is the API server's version (its /version
	// gitVersion, e.g. v1.36.3), for the KubeVirt version check; empty
	// skips that check.
	KubernetesVersion string
}

var (
	crdGVK       = schema.GroupVersionKind{Group: "apiextensions.k8s.io", Version: "v1", Kind: "CustomResourceDefinition"}
	kubevirtGVK  = schema.GroupVersionKind{Group: "kubevirt.io", Version: "v1", Kind: "KubeVirtList"}
	dsListGVK    = schema.GroupVersionKind{Group: "apps", Version: "v1", Kind: "DaemonSetList"}
	deployGVK    = schema.GroupVersionKind{Group: "apps", Version: "v1", Kind: "Deployment"}
	daemonSetGVK = schema.GroupVersionKind{Group: "apps", Version: "v1", Kind: "DaemonSet"}
	mwcGVK       = schema.GroupVersionKind{Group: "admissionregistration.k8s.io", Version: "v1", Kind: "MutatingWebhookConfiguration"}
)

// Check reports what kvnet needs from the cluster and, unless
// Prerequisites, whether kvnet itself runs. Errors are only for a cluster
// that cannot be read at all.
func Check(ctx context.Context, c client.Client, o CheckOptions) ([]Finding, error) {
	if o.Namespace == "" {
		o.Namespace = "kvnet-system"
	}
	var out []Finding
	crd := func(name, what, fix string, status Status) error {
		u := &unstructured.Unstructured{}
		u.SetGroupVersionKind(crdGVK)
		err := c.Get(ctx, client.ObjectKey{Name: name}, u)
		switch {
		case err == nil:
			out = append(out, Finding{Status: OK, What: what, Detail: "CRD " + name + " is installed"})
		case apierrors.IsNotFound(err):
			out = append(out, Finding{Status: status, What: what, Detail: "CRD " + name + " is not installed", Fix: fix})
		default:
			return fmt.Errorf("read CRD %s: %w", name, err)
		}
		return nil
	}
	if err := crd("network-attachment-definitions.k8s.cni.cncf.io", "Multus",
		"install Multus (thin or thick), which brings the NetworkAttachmentDefinition CRD", Missing); err != nil {
		return nil, err
	}
	multus, err := findMultus(ctx, c)
	if err != nil {
		return nil, err
	}
	out = append(out, multus...)
	if err := crd("virtualmachines.kubevirt.io", "KubeVirt",
		"install KubeVirt (virt-operator and a KubeVirt CR); without it kvnet still serves pods", Warning); err != nil {
		return nil, err
	}
	if out[len(out)-1].Status == OK {
		f, err := checkBinding(ctx, c)
		if err != nil {
			return nil, err
		}
		out = append(out, f)
		v, err := checkKubeVirtVersion(ctx, c, o.KubernetesVersion)
		if err != nil {
			return nil, err
		}
		out = append(out, v...)
	}
	if o.Prerequisites {
		f, err := checkDefaultNetworkSubnets(ctx, c, nil)
		return append(out, f), err
	}
	for _, name := range []string{"ipamclaims.k8s.cni.cncf.io", "userdefinednetworks.k8s.ovn.org", "clusteruserdefinednetworks.k8s.ovn.org"} {
		if err := crd(name, "kvnet CRDs", "kvnet install", Missing); err != nil {
			return nil, err
		}
	}
	var nodeDS *unstructured.Unstructured // kvnet-node's DaemonSet, if found
	for _, w := range []struct {
		gvk  schema.GroupVersionKind
		key  client.ObjectKey
		what string
	}{
		{deployGVK, client.ObjectKey{Namespace: o.Namespace, Name: "kvnet-controller"}, "kvnet-controller"},
		{daemonSetGVK, client.ObjectKey{Namespace: o.Namespace, Name: "kvnet-node"}, "kvnet-node"},
		{mwcGVK, client.ObjectKey{Name: "kvnet-mutator"}, "kvnet webhooks"},
	} {
		u := &unstructured.Unstructured{}
		u.SetGroupVersionKind(w.gvk)
		if err := c.Get(ctx, w.key, u); err != nil {
			if apierrors.IsNotFound(err) {
				out = append(out, Finding{Status: Missing, What: w.what, Detail: fmt.Sprintf("%s %s not found", w.gvk.Kind, w.key), Fix: "kvnet install"})
				continue
			}
			return nil, fmt.Errorf("read %s %s: %w", w.gvk.Kind, w.key, err)
		}
		out = append(out, workloadReady(w.what, u))
		if w.what == "kvnet-node" {
			nodeDS = u
		}
	}
	f, err := checkDefaultNetworkSubnets(ctx, c, nodeDS)
	if err != nil {
		return nil, err
	}
	out = append(out, f)
	f, err = checkPodNetworkLabels(ctx, c, nodeDS)
	return append(out, f), err
}

// workloadReady reads a Deployment's or DaemonSet's status.
func workloadReady(what string, u *unstructured.Unstructured) Finding {
	name := u.GetKind() + " " + u.GetNamespace() + "/" + u.GetName()
	switch u.GetKind() {
	case "Deployment":
		want, _, _ := unstructured.NestedInt64(u.Object, "spec", "replicas")
		ready, _, _ := unstructured.NestedInt64(u.Object, "status", "readyReplicas")
		if ready == 0 || ready < want {
			return Finding{Status: Missing, What: what, Detail: fmt.Sprintf("%s: %d of %d replicas ready", name, ready, want),
				Fix: "kubectl -n " + u.GetNamespace() + " describe deployment " + u.GetName() + " (image pull? see its pods' events and logs)"}
		}
		return Finding{Status: OK, What: what, Detail: fmt.Sprintf("%s: %d of %d replicas ready", name, ready, want)}
	case "DaemonSet":
		want, _, _ := unstructured.NestedInt64(u.Object, "status", "desiredNumberScheduled")
		ready, _, _ := unstructured.NestedInt64(u.Object, "status", "numberReady")
		if ready < want || want == 0 {
			return Finding{Status: Missing, What: what, Detail: fmt.Sprintf("%s: %d of %d nodes ready", name, ready, want),
				Fix: "kubectl -n " + u.GetNamespace() + " describe daemonset " + u.GetName()}
		}
		return Finding{Status: OK, What: what, Detail: fmt.Sprintf("%s: %d of %d nodes ready", name, ready, want)}
	}
	return Finding{Status: OK, What: what, Detail: name + " exists"}
}

// findMultus looks for Multus's DaemonSet by name in any namespace and,
// for thick Multus, checks its daemon's resource limits.
func findMultus(ctx context.Context, c client.Client) ([]Finding, error) {
	l := &unstructured.UnstructuredList{}
	l.SetGroupVersionKind(dsListGVK)
	if err := c.List(ctx, l); err != nil {
		return nil, fmt.Errorf("list DaemonSets: %w", err)
	}
	for _, ds := range l.Items {
		if strings.Contains(ds.GetName(), "multus") {
			f := workloadReady("Multus DaemonSet", &ds)
			if f.Status != OK {
				f.Status = Warning
			}
			return []Finding{f, multusLimits(&ds)}, nil
		}
	}
	return []Finding{{Status: Warning, What: "Multus DaemonSet", Detail: "no DaemonSet named *multus* found in any namespace",
		Fix: "make sure Multus runs on every node (kvnet's interfaces are attached by Multus)"}}, nil
}

// MultusLimitsCheck is the What of the finding on thick Multus's
// daemon's resource limits.
const MultusLimitsCheck = "Multus daemon limits"

// multusMinMemory: below it thick Multus's daemon risks being
// OOM-killed, losing CNI requests; it runs every delegate plugin
// (kvnet-cni, the cluster default network's) as its child, in its own
// container's cgroup. Any CPU limit throttles them all: upstream's
// manifest sets 100m, ten milliseconds of CPU per 100 ms for every ADD
// on the node together.
var multusMinMemory = resource.MustParse("200Mi")

// multusLimits checks the limits of thick Multus's daemon container (the
// one that runs multus-daemon) in DaemonSet ds. Thin Multus runs no
// daemon: its DaemonSet's limits cover only the copy of its binary.
func multusLimits(ds *unstructured.Unstructured) Finding {
	containers, _, _ := unstructured.NestedSlice(ds.Object, "spec", "template", "spec", "containers")
	name := ds.GetNamespace() + "/" + ds.GetName()
	for _, raw := range containers {
		ctr, ok := raw.(map[string]any)
		if !ok {
			continue
		}
		cmd, _, _ := unstructured.NestedStringSlice(ctr, "command")
		args, _, _ := unstructured.NestedStringSlice(ctr, "args")
		if !slices.ContainsFunc(append(cmd, args...), func(s string) bool { return strings.HasSuffix(s, "multus-daemon") }) {
			continue
		}
		ctrName, _, _ := unstructured.NestedString(ctr, "name")
		limits, _, _ := unstructured.NestedStringMap(ctr, "resources", "limits")
		var problems, fixes []string
		if v, ok := limits["cpu"]; ok {
			problems = append(problems, fmt.Sprintf("CPU is limited to %s: every CNI ADD on a node runs within it (the daemon runs each delegate plugin as its child) and is throttled; measured on kvnet's lab cluster, a pod's whole Multus ADD took 593 ms (primary UDN) and 356 ms (default network) at the median with upstream's 100m, 92 ms and 57 ms without the limit", v))
			fixes = append(fixes, fmt.Sprintf(`kubectl -n %s patch daemonset %s --type strategic -p '{"spec":{"template":{"spec":{"containers":[{"name":%q,"resources":{"limits":{"cpu":null}}}]}}}}'`, ds.GetNamespace(), ds.GetName(), ctrName))
		}
		if v, ok := limits["memory"]; ok {
			if q, err := resource.ParseQuantity(v); err == nil && q.Cmp(multusMinMemory) < 0 {
				problems = append(problems, fmt.Sprintf("memory is limited to %s: the daemon and every delegate running at once share it; when it is OOM-killed, CNI DELs it was sent are lost (their addresses leak)", v))
				fixes = append(fixes, fmt.Sprintf("kubectl -n %s set resources daemonset %s -c %s --limits=memory=%s", ds.GetNamespace(), ds.GetName(), ctrName, multusMinMemory.String()))
			}
		}
		if len(problems) == 0 {
			return Finding{Status: OK, What: MultusLimitsCheck, Detail: fmt.Sprintf("%s container %s: no CPU limit, memory limit %s", name, ctrName, cmp.Or(limits["memory"], "none"))}
		}
		return Finding{Status: Warning, What: MultusLimitsCheck, Detail: fmt.Sprintf("%s container %s: %s", name, ctrName, strings.Join(problems, "; ")), Fix: strings.Join(fixes, "; ")}
	}
	return Finding{Status: OK, What: MultusLimitsCheck, Detail: name + " runs no multus-daemon (thin Multus): delegates run under the container runtime"}
}

// checkBinding checks that the KubeVirt CR registers the l2bridge binding
// plugin, which VMs on a primary UDN use.
func checkBinding(ctx context.Context, c client.Client) (Finding, error) {
	const what = "KubeVirt l2bridge binding"
	fix := `kubectl patch kubevirt -n <ns> <name> --type merge -p '{"spec":{"configuration":{"network":{"binding":{"l2bridge":{"domainAttachmentType":"managedTap","migration":{}}}}}}}'`
	kv, crd, err := firstKubeVirt(ctx, c)
	switch {
	case err != nil:
		return Finding{}, err
	case !crd:
		return Finding{Status: Warning, What: what, Detail: "no KubeVirt CRD (kubevirts.kubevirt.io)", Fix: "install virt-operator"}, nil
	case kv == nil:
		return Finding{Status: Warning, What: what, Detail: "no KubeVirt CR", Fix: "create the KubeVirt CR"}, nil
	}
	b, found, _ := unstructured.NestedMap(kv.Object, "spec", "configuration", "network", "binding", "l2bridge")
	if !found {
		return Finding{Status: Warning, What: what, Detail: fmt.Sprintf("KubeVirt %s/%s registers no l2bridge binding: VMs on a primary UDN cannot start", kv.GetNamespace(), kv.GetName()), Fix: fix}, nil
	}
	if t, _ := b["domainAttachmentType"].(string); t != "managedTap" {
		return Finding{Status: Warning, What: what, Detail: fmt.Sprintf("KubeVirt %s/%s: l2bridge has domainAttachmentType %q, want managedTap", kv.GetNamespace(), kv.GetName(), t), Fix: fix}, nil
	}
	if _, ok := b["migration"]; !ok {
		return Finding{Status: Warning, What: what, Detail: fmt.Sprintf("KubeVirt %s/%s: l2bridge has no migration: {} (VMs using it cannot migrate)", kv.GetNamespace(), kv.GetName()), Fix: fix}, nil
	}
	return Finding{Status: OK, What: what, Detail: fmt.Sprintf("KubeVirt %s/%s registers l2bridge (managedTap, migration)", kv.GetNamespace(), kv.GetName())}, nil
}

// firstKubeVirt returns the cluster's first KubeVirt CR (nil when there
// is none) and whether its CRD is installed.
func firstKubeVirt(ctx context.Context, c client.Client) (kv *unstructured.Unstructured, crd bool, err error) {
	l := &unstructured.UnstructuredList{}
	l.SetGroupVersionKind(kubevirtGVK)
	if err := c.List(ctx, l); err != nil {
		if meta.IsNoMatchError(err) || apierrors.IsNotFound(err) {
			return nil, false, nil
		}
		return nil, false, fmt.Errorf("list KubeVirt: %w", err)
	}
	if len(l.Items) == 0 {
		return nil, true, nil
	}
	return &l.Items[0], true, nil
}

// KubeVirtVersionCheck is the What of the finding on the versions of
// KubeVirt and Kubernetes.
const KubeVirtVersionCheck = "KubeVirt version"

// checkKubeVirtVersion warns about the KubeVirt and Kubernetes versions
// known not to work together (KubeVirtVersionProblem), reading the
// version virt-operator reports in the first KubeVirt CR's status. No
// finding when either version is unknown.
func checkKubeVirtVersion(ctx context.Context, c client.Client, kubernetes string) ([]Finding, error) {
	if kubernetes == "" {
		return nil, nil
	}
	kv, _, err := firstKubeVirt(ctx, c)
	if err != nil || kv == nil {
		return nil, err
	}
	kubevirt, _, _ := unstructured.NestedString(kv.Object, "status", "observedKubeVirtVersion")
	if kubevirt == "" {
		return nil, nil
	}
	on := fmt.Sprintf("KubeVirt %s/%s is %s on Kubernetes %s", kv.GetNamespace(), kv.GetName(), kubevirt, kubernetes)
	for _, v := range []string{kubevirt, kubernetes} {
		if _, err := version.ParseGeneric(v); err != nil {
			return []Finding{{Status: Warning, What: KubeVirtVersionCheck,
				Detail: fmt.Sprintf("%s: version %q not understood (%v), so kvnet cannot tell whether this pair has a known problem", on, v, err),
				Fix:    "see docs/install.md, \"Tested versions\", for the pairs kvnet is tested with and the known bad one"}}, nil
		}
	}
	problem, fix := KubeVirtVersionProblem(kubevirt, kubernetes)
	if problem == "" {
		return []Finding{{Status: OK, What: KubeVirtVersionCheck, Detail: on}}, nil
	}
	return []Finding{{Status: Warning, What: KubeVirtVersionCheck, Detail: on + ": " + problem, Fix: fix}}, nil
}

// KubeVirtVersionProblem says what goes wrong with KubeVirt version
// kubevirt on Kubernetes version kubernetes (both as their /version
// reports them, e.g. v1.7.0 and v1.36.3), and the fix; "" when kvnet
// knows of no problem (or cannot parse a version).
//
// KubeVirt before v1.8.4 on Kubernetes 1.36 or later: virt-handler
// writes a containerDisk's CRC32 to the VMI's
// status.volumeStatus[].containerDiskVolume.checksum, a uint32 its CRD
// declares as format int32, and Kubernetes 1.36 validates numeric
// formats of CRD fields, so every status update of a VMI whose disk's
// CRC32 is >= 2^31 is rejected and the VMI stays Scheduled
// (kubevirt/kubevirt#17858; fixed by #17469 in v1.8.4 and v1.9).
func KubeVirtVersionProblem(kubevirt, kubernetes string) (problem, fix string) {
	kv, err := version.ParseGeneric(kubevirt)
	if err != nil {
		return "", ""
	}
	k8s, err := version.ParseGeneric(kubernetes)
	if err != nil {
		return "", ""
	}
	if k8s.AtLeast(version.MajorMinor(1, 36)) && !kv.AtLeast(version.MustParseGeneric("1.8.4")) {
		return "VMs whose containerDisk has a CRC32 >= 2^31 hang in Scheduled: the API server rejects virt-handler's " +
				"status.volumeStatus[].containerDiskVolume.checksum, a uint32 this KubeVirt declares as int32 (kubevirt/kubevirt#17858)",
			"upgrade KubeVirt to v1.8.4 or later (kubevirt/kubevirt#17469), or run it on Kubernetes 1.35 or older"
	}
	return "", ""
}

// DefaultNetworkCIDRsFlag is kvnet-node's flag naming the default
// network's pod ranges beyond the Nodes' spec.podCIDRs, also set by the
// key DefaultNetworkCIDRsKey of the ConfigMap NodeConfigMap in kvnet's
// namespace (config/node/config.yaml).
const (
	DefaultNetworkCIDRsFlag = "--default-network-cidrs"
	DefaultNetworkCIDRsKey  = "default-network-cidrs"
	NodeConfigMap           = "kvnet-node-config"
)

// checkDefaultNetworkSubnets checks that every pod address of the cluster
// default network lies in a subnet kvnet-node knows as the default
// network's — the Nodes' spec.podCIDRs and kvnet-node's
// --default-network-cidrs (read from its DaemonSet ds, if any) — since a
// primary network's router refuses only those: a default-network pod
// elsewhere (a default network with IP pools of its own, as Calico's) is
// reachable from primary networks through the node's masquerade.
func checkDefaultNetworkSubnets(ctx context.Context, c client.Client, ds *unstructured.Unstructured) (Finding, error) {
	const what = "default network pod subnets"
	var known []netip.Prefix
	var nodes corev1.NodeList
	if err := c.List(ctx, &nodes); err != nil {
		return Finding{}, fmt.Errorf("list Nodes: %w", err)
	}
	for _, n := range nodes.Items {
		cidrs := n.Spec.PodCIDRs
		if len(cidrs) == 0 && n.Spec.PodCIDR != "" {
			cidrs = []string{n.Spec.PodCIDR}
		}
		for _, s := range cidrs {
			if p, err := netip.ParsePrefix(s); err == nil {
				known = append(known, p.Masked())
			}
		}
	}
	source := "the Nodes' spec.podCIDRs"
	if ds != nil {
		// The DaemonSet's args win over the ConfigMap, as in kvnet-node.
		value, err := nodeFlag(ds, DefaultNetworkCIDRsFlag)
		from, fix := "DaemonSet "+ds.GetNamespace()+"/"+ds.GetName(), "kubectl -n "+ds.GetNamespace()+" edit daemonset "+ds.GetName()
		if err != nil {
			return Finding{Status: Warning, What: what, Detail: err.Error(), Fix: fix}, nil
		}
		if value == "" {
			var cm corev1.ConfigMap
			switch err := c.Get(ctx, client.ObjectKey{Namespace: ds.GetNamespace(), Name: NodeConfigMap}, &cm); {
			case err == nil:
				value = cm.Data[DefaultNetworkCIDRsKey]
				from, fix = "ConfigMap "+ds.GetNamespace()+"/"+NodeConfigMap+", key "+DefaultNetworkCIDRsKey, "kubectl -n "+ds.GetNamespace()+" edit configmap "+NodeConfigMap
			case !apierrors.IsNotFound(err):
				return Finding{}, fmt.Errorf("read ConfigMap %s/%s: %w", ds.GetNamespace(), NodeConfigMap, err)
			}
		}
		if value != "" {
			for s := range strings.SplitSeq(value, ",") {
				p, err := netip.ParsePrefix(strings.TrimSpace(s))
				if err != nil {
					return Finding{Status: Warning, What: what, Detail: fmt.Sprintf("%s: kvnet-node %s %q: %v", from, DefaultNetworkCIDRsFlag, s, err), Fix: fix}, nil
				}
				known = append(known, p.Masked())
			}
		}
		source += " and kvnet-node's " + DefaultNetworkCIDRsFlag
	}
	var pods corev1.PodList
	if err := c.List(ctx, &pods); err != nil {
		return Finding{}, fmt.Errorf("list Pods: %w", err)
	}
	addrs, outside := 0, 0
	example := ""
	for _, pod := range pods.Items {
		if pod.Spec.HostNetwork {
			continue
		}
		for _, ip := range pod.Status.PodIPs {
			a, err := netip.ParseAddr(ip.IP)
			if err != nil {
				continue
			}
			addrs++
			if !slices.ContainsFunc(known, func(p netip.Prefix) bool { return p.Contains(a.Unmap()) }) {
				if outside++; example == "" {
					example = fmt.Sprintf("pod %s/%s has %s", pod.Namespace, pod.Name, a)
				}
			}
		}
	}
	if outside > 0 {
		return Finding{Status: Warning, What: what,
			Detail: fmt.Sprintf("%d of %d default-network pod addresses lie outside %s (%s): pods on primary user-defined networks could reach those pods through the node", outside, addrs, source, example),
			Fix:    "set " + DefaultNetworkCIDRsKey + ": <the default network's pod ranges, e.g. Calico's IP pools> in the ConfigMap " + NodeConfigMap + " of kvnet's namespace, then restart the kvnet-node DaemonSet"}, nil
	}
	return Finding{Status: OK, What: what, Detail: fmt.Sprintf("%d default-network pod addresses, all within %s", addrs, source)}, nil
}

// PodNetworkLabelsCheck is the Finding of checkPodNetworkLabels; the pod
// scope is kvnet-node's PodScopeFlag, or the key PodScopeKey of
// NodeConfigMap.
const (
	PodNetworkLabelsCheck = "pod network labels"
	PodScopeFlag          = "--pod-scope"
	PodScopeKey           = "pod-scope"
)

// checkPodNetworkLabels counts the allocated pods (kvnet.io/pod-networks)
// that lack the network labels kvnet-controller puts on them
// (podnetworks.NetworkLabel): a kvnet-node with --pod-scope=networks
// finds other nodes' pods by them. Unlabelled pods warn where kvnet-node
// runs that scope (its DaemonSet ds's args, else the ConfigMap); else
// they are only reported.
func checkPodNetworkLabels(ctx context.Context, c client.Client, ds *unstructured.Unstructured) (Finding, error) {
	scope, from := "", ""
	if ds != nil {
		v, err := nodeFlag(ds, PodScopeFlag)
		if err != nil {
			return Finding{Status: Warning, What: PodNetworkLabelsCheck, Detail: err.Error()}, nil
		}
		scope, from = v, "DaemonSet "+ds.GetNamespace()+"/"+ds.GetName()
		if scope == "" {
			var cm corev1.ConfigMap
			switch err := c.Get(ctx, client.ObjectKey{Namespace: ds.GetNamespace(), Name: NodeConfigMap}, &cm); {
			case err == nil:
				scope, from = cm.Data[PodScopeKey], "ConfigMap "+ds.GetNamespace()+"/"+NodeConfigMap+", key "+PodScopeKey
			case !apierrors.IsNotFound(err):
				return Finding{}, fmt.Errorf("read ConfigMap %s/%s: %w", ds.GetNamespace(), NodeConfigMap, err)
			}
		}
	}
	var pods corev1.PodList
	if err := c.List(ctx, &pods); err != nil {
		return Finding{}, fmt.Errorf("list Pods: %w", err)
	}
	allocated, unlabelled := 0, 0
	example := ""
	for i := range pods.Items {
		p := &pods.Items[i]
		nets, err := podnetworks.Parse(p.Annotations[podnetworks.Annotation])
		if err != nil || podnetworks.Completed(p) {
			continue
		}
		allocated++
		if !podnetworks.HasLabels(p.Labels, nets.Labels()) {
			if unlabelled++; example == "" {
				example = "pod " + p.Namespace + "/" + p.Name
			}
		}
	}
	if unlabelled == 0 {
		return Finding{Status: OK, What: PodNetworkLabelsCheck, Detail: fmt.Sprintf("all %d allocated pods carry their network labels", allocated)}, nil
	}
	detail := fmt.Sprintf("%d of %d allocated pods lack their network labels (%s)", unlabelled, allocated, example)
	fix := "restart kvnet-controller, which labels them when it starts: kubectl -n " + cmp.Or(namespaceOf(ds), "kvnet-system") + " rollout restart deployment kvnet-controller"
	if scope == "networks" {
		return Finding{Status: Warning, What: PodNetworkLabelsCheck,
			Detail: detail + ": kvnet-node runs " + PodScopeFlag + "=networks (" + from + ") and does not see them on other nodes", Fix: fix}, nil
	}
	return Finding{Status: OK, What: PodNetworkLabelsCheck, Detail: detail + "; only kvnet-node " + PodScopeFlag + "=networks needs them: " + fix + " before setting it"}, nil
}

func namespaceOf(o *unstructured.Unstructured) string {
	if o == nil {
		return ""
	}
	return o.GetNamespace()
}

// nodeFlag returns the value of flag name (as "--name=value" or "--name
// value", with one dash or two) in the container args of kvnet-node's
// DaemonSet ds; "" if not set.
func nodeFlag(ds *unstructured.Unstructured, name string) (string, error) {
	bare := strings.TrimLeft(name, "-")
	containers, _, _ := unstructured.NestedSlice(ds.Object, "spec", "template", "spec", "containers")
	for _, ct := range containers {
		m, _ := ct.(map[string]any)
		args, _ := m["args"].([]any)
		for i, a := range args {
			s, _ := a.(string)
			flag, value, hasValue := strings.Cut(strings.TrimLeft(s, "-"), "=")
			if !strings.HasPrefix(s, "-") || flag != bare {
				continue
			}
			if hasValue {
				return value, nil
			}
			if i+1 < len(args) {
				v, _ := args[i+1].(string)
				return v, nil
			}
			return "", fmt.Errorf("DaemonSet %s/%s: kvnet-node's %s has no value", ds.GetNamespace(), ds.GetName(), name)
		}
	}
	return "", nil
}
