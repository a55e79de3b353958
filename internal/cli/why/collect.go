package why

import (
	"context"
	"fmt"
	"strings"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nadv1 "kvnet.io/kvnet/api/k8scni/v1"
	ipamclaimv1alpha1 "kvnet.io/kvnet/api/k8scni/v1alpha1"
	kubevirtv1 "kvnet.io/kvnet/api/kubevirt/v1"
	udnv1 "kvnet.io/kvnet/api/udn/v1"
	"kvnet.io/kvnet/internal/ipam"
	"kvnet.io/kvnet/internal/migration"
	"kvnet.io/kvnet/internal/multus"
)

// collector reads the objects of a chain. Reads are plain GETs and LISTs;
// kvnet why never writes.
type collector struct {
	c       client.Client
	kvnetNS string
	now     time.Time
}

// notFound turns a NotFound error into ok=false.
func notFound(err error) (found bool, _ error) {
	switch {
	case err == nil:
		return true, nil
	case apierrors.IsNotFound(err):
		return false, nil
	}
	return false, err
}

// listOptional lists objects of an API that may not be installed (UDNs,
// KubeVirt): a missing kind is an empty list.
func (k *collector) listOptional(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	err := k.c.List(ctx, list, opts...)
	if err != nil && (meta.IsNoMatchError(err) || apierrors.IsNotFound(err)) {
		return nil
	}
	return err
}

func (k *collector) netFacts(ctx context.Context, namespace string) (netFacts, error) {
	f := netFacts{NADs: map[string]*nadv1.NetworkAttachmentDefinition{}}
	var ns corev1.Namespace
	if err := k.c.Get(ctx, client.ObjectKey{Name: namespace}, &ns); err != nil {
		return f, fmt.Errorf("get namespace %q: %w", namespace, err)
	}
	f.Namespace = &ns
	var nads nadv1.NetworkAttachmentDefinitionList
	if err := k.listOptional(ctx, &nads, client.InNamespace(namespace)); err != nil {
		return f, fmt.Errorf("list NetworkAttachmentDefinitions in %q: %w", namespace, err)
	}
	for i := range nads.Items {
		f.NADs[namespace+"/"+nads.Items[i].Name] = &nads.Items[i]
	}
	var udns udnv1.UserDefinedNetworkList
	if err := k.listOptional(ctx, &udns, client.InNamespace(namespace)); err != nil {
		return f, fmt.Errorf("list UserDefinedNetworks in %q: %w", namespace, err)
	}
	f.UDNs = udns.Items
	var cudns udnv1.ClusterUserDefinedNetworkList
	if err := k.listOptional(ctx, &cudns); err != nil {
		return f, fmt.Errorf("list ClusterUserDefinedNetworks: %w", err)
	}
	f.CUDNs = cudns.Items
	return f, nil
}

// addNADs reads the NADs of keys not read yet (other namespaces).
func (k *collector) addNADs(ctx context.Context, f *netFacts, keys []string) error {
	for _, key := range keys {
		if _, done := f.NADs[key]; done {
			continue
		}
		ns, name, _ := strings.Cut(key, "/")
		if ns == f.Namespace.Name {
			f.NADs[key] = nil // the namespace's NADs were listed
			continue
		}
		var nad nadv1.NetworkAttachmentDefinition
		found, err := notFound(k.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &nad))
		if err != nil && !meta.IsNoMatchError(err) {
			return fmt.Errorf("get NetworkAttachmentDefinition %s: %w", key, err)
		}
		if found {
			f.NADs[key] = &nad
		} else {
			f.NADs[key] = nil
		}
	}
	return nil
}

// selectedKeys returns the NAD keys of a pod's networks annotation.
func selectedKeys(pod *corev1.Pod) []string {
	elems, _ := multus.ParseSelection(multus.NetworksAnnotation, pod.Annotations[multus.NetworksAnnotation], pod.Namespace)
	keys := make([]string, 0, len(elems))
	for _, e := range elems {
		keys = append(keys, e.Key())
	}
	return keys
}

// claimRefs returns every claim name a pod references.
func claimRefs(pod *corev1.Pod) []string {
	var out []string
	for _, a := range []string{multus.NetworksAnnotation, multus.DefaultNetworkAnnotation} {
		v := pod.Annotations[a]
		if !strings.HasPrefix(strings.TrimSpace(v), "[") && a == multus.DefaultNetworkAnnotation {
			continue
		}
		elems, _ := multus.ParseSelection(a, v, pod.Namespace)
		for _, e := range elems {
			if e.IPAMClaimReference != "" {
				out = append(out, e.IPAMClaimReference)
			}
		}
	}
	if v := pod.Annotations[ipam.LegacyPrimaryClaimAnnotation]; v != "" {
		out = append(out, v)
	}
	return out
}

// podFacts reads what a pod's chain needs. nf is the namespace's facts
// (shared with a VM's chain), or nil to read them.
func (k *collector) podFacts(ctx context.Context, pod *corev1.Pod, nf *netFacts) (*podFacts, error) {
	f := &podFacts{Pod: pod, Claims: map[string]*ipamclaimv1alpha1.IPAMClaim{}, OwnerPods: map[string]*corev1.Pod{}}
	if nf == nil {
		n, err := k.netFacts(ctx, pod.Namespace)
		if err != nil {
			return nil, err
		}
		nf = &n
	}
	f.netFacts = *nf
	if err := k.addNADs(ctx, &f.netFacts, selectedKeys(pod)); err != nil {
		return nil, err
	}
	for _, name := range claimRefs(pod) {
		if _, done := f.Claims[name]; done {
			continue
		}
		var cl ipamclaimv1alpha1.IPAMClaim
		found, err := notFound(k.c.Get(ctx, client.ObjectKey{Namespace: pod.Namespace, Name: name}, &cl))
		if err != nil {
			return nil, fmt.Errorf("get IPAMClaim %s/%s: %w", pod.Namespace, name, err)
		}
		f.Claims[name] = nil
		if !found {
			continue
		}
		f.Claims[name] = &cl
		if op := cl.Status.OwnerPod; op != nil && op.Name != "" && op.Name != pod.Name {
			if _, done := f.OwnerPods[op.Name]; !done {
				var p corev1.Pod
				found, err := notFound(k.c.Get(ctx, client.ObjectKey{Namespace: pod.Namespace, Name: op.Name}, &p))
				if err != nil {
					return nil, fmt.Errorf("get pod %s/%s: %w", pod.Namespace, op.Name, err)
				}
				f.OwnerPods[op.Name] = nil
				if found {
					f.OwnerPods[op.Name] = &p
				}
			}
		}
	}
	var events corev1.EventList
	if err := k.c.List(ctx, &events, client.InNamespace(pod.Namespace), client.MatchingFields{"involvedObject.name": pod.Name}); err != nil {
		return nil, fmt.Errorf("list events of pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	for _, e := range events.Items {
		if e.InvolvedObject.Kind == "Pod" || e.InvolvedObject.Kind == "" {
			f.Events = append(f.Events, e)
		}
	}
	var err error
	if f.Node, err = k.nodeFacts(ctx, pod.Spec.NodeName); err != nil {
		return nil, err
	}
	if f.Controller, err = k.controllerFacts(ctx); err != nil {
		return nil, err
	}
	if vmiName := launcherVMI(pod); vmiName != "" {
		var vmi kubevirtv1.VirtualMachineInstance
		found, err := notFound(k.c.Get(ctx, client.ObjectKey{Namespace: pod.Namespace, Name: vmiName}, &vmi))
		if err != nil && !meta.IsNoMatchError(err) {
			return nil, fmt.Errorf("get VirtualMachineInstance %s/%s: %w", pod.Namespace, vmiName, err)
		}
		if found {
			f.VMI = &vmi
			f.VM = vmRefOf(&vmi)
		} else {
			// KubeVirt names a VM's VMI after the VM. vm.kubevirt.io/name
			// is no help: it holds the guest's hostname.
			f.VM = &vmRef{Kind: "VirtualMachine", Name: vmiName}
		}
	}
	return f, nil
}

// vmRefOf names the owner of a VMI's claims: its VM, or the VMI itself.
func vmRefOf(vmi *kubevirtv1.VirtualMachineInstance) *vmRef {
	if ref := metav1.GetControllerOf(vmi); ref != nil && ref.Kind == "VirtualMachine" {
		return &vmRef{Kind: ref.Kind, Name: ref.Name, UID: ref.UID}
	}
	return &vmRef{Kind: "VirtualMachineInstance", Name: vmi.Name, UID: vmi.UID}
}

func (k *collector) nodeFacts(ctx context.Context, name string) (nodeFacts, error) {
	var f nodeFacts
	if name == "" {
		return f, nil
	}
	var node corev1.Node
	found, err := notFound(k.c.Get(ctx, client.ObjectKey{Name: name}, &node))
	if err != nil {
		return f, fmt.Errorf("get node %q: %w", name, err)
	}
	if found {
		f.Node = &node
	}
	var agents corev1.PodList
	if err := k.c.List(ctx, &agents, client.MatchingLabels{agentLabelKey: agentLabelValue}, client.MatchingFields{"spec.nodeName": name}); err != nil {
		return f, fmt.Errorf("list kvnet-node pods on node %q: %w", name, err)
	}
	f.Agents = agents.Items
	var ds appsv1.DaemonSetList
	if err := k.c.List(ctx, &ds, client.MatchingLabels{agentLabelKey: agentLabelValue}); err != nil {
		return f, fmt.Errorf("list kvnet-node DaemonSets: %w", err)
	}
	f.DaemonSets = ds.Items
	return f, nil
}

func (k *collector) controllerFacts(ctx context.Context) (controllerFacts, error) {
	f := controllerFacts{Namespace: k.kvnetNS, Now: k.now}
	var deps appsv1.DeploymentList
	if err := k.c.List(ctx, &deps, client.MatchingLabels{agentLabelKey: "kvnet-controller"}); err != nil {
		return f, fmt.Errorf("list kvnet-controller Deployments: %w", err)
	}
	f.Deployments = deps.Items
	var lease coordinationv1.Lease
	found, err := notFound(k.c.Get(ctx, client.ObjectKey{Namespace: k.kvnetNS, Name: leaseName}, &lease))
	if err != nil {
		return f, fmt.Errorf("get lease %s/%s: %w", k.kvnetNS, leaseName, err)
	}
	if found {
		f.Lease = &lease
	}
	return f, nil
}

func (k *collector) webhookFacts(ctx context.Context) (webhookFacts, error) {
	f := webhookFacts{Namespace: k.kvnetNS, Now: k.now,
		Secrets: map[string]*corev1.Secret{}, Services: map[string]*corev1.Service{}, ReadyEndpoints: map[string]int{}}
	var list admissionregistrationv1.MutatingWebhookConfigurationList
	if err := k.c.List(ctx, &list); err != nil {
		return f, fmt.Errorf("list MutatingWebhookConfigurations: %w", err)
	}
	f.Configs = list.Items
	for _, name := range []string{webhookLauncher, webhookVMs} {
		_, w := f.findWebhook(name)
		if w == nil {
			continue
		}
		if key := f.secretKey(w); !has(f.Secrets, key) {
			ns, n, _ := strings.Cut(key, "/")
			var s corev1.Secret
			found, err := notFound(k.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: n}, &s))
			if err != nil {
				return f, fmt.Errorf("get Secret %s: %w", key, err)
			}
			f.Secrets[key] = nil
			if found {
				f.Secrets[key] = &s
			}
		}
		svc := w.ClientConfig.Service
		if svc == nil {
			continue
		}
		key := svc.Namespace + "/" + svc.Name
		if has(f.Services, key) {
			continue
		}
		var s corev1.Service
		found, err := notFound(k.c.Get(ctx, client.ObjectKey{Namespace: svc.Namespace, Name: svc.Name}, &s))
		if err != nil {
			return f, fmt.Errorf("get Service %s: %w", key, err)
		}
		f.Services[key] = nil
		if !found {
			continue
		}
		f.Services[key] = &s
		var slices discoveryv1.EndpointSliceList
		if err := k.c.List(ctx, &slices, client.InNamespace(svc.Namespace), client.MatchingLabels{discoveryv1.LabelServiceName: svc.Name}); err != nil {
			return f, fmt.Errorf("list EndpointSlices of Service %s: %w", key, err)
		}
		for _, sl := range slices.Items {
			for _, ep := range sl.Endpoints {
				if ep.Conditions.Ready == nil || *ep.Conditions.Ready {
					f.ReadyEndpoints[key]++
				}
			}
		}
	}
	return f, nil
}

func has[V any](m map[string]V, k string) bool {
	_, ok := m[k]
	return ok
}

// vmFacts reads what a VM's chain needs. kind is "vm" or "vmi".
func (k *collector) vmFacts(ctx context.Context, kind, namespace, name string) (*vmFacts, error) {
	f := &vmFacts{}
	key := client.ObjectKey{Namespace: namespace, Name: name}
	if kind == "vm" {
		var vm kubevirtv1.VirtualMachine
		if err := k.c.Get(ctx, key, &vm); err != nil {
			return nil, fmt.Errorf("get VirtualMachine %s: %w", key, err)
		}
		f.VM = &vm
		var vmi kubevirtv1.VirtualMachineInstance
		found, err := notFound(k.c.Get(ctx, key, &vmi))
		if err != nil {
			return nil, fmt.Errorf("get VirtualMachineInstance %s: %w", key, err)
		}
		if found {
			f.VMI = &vmi
		}
	} else {
		var vmi kubevirtv1.VirtualMachineInstance
		if err := k.c.Get(ctx, key, &vmi); err != nil {
			return nil, fmt.Errorf("get VirtualMachineInstance %s: %w", key, err)
		}
		f.VMI = &vmi
		if ref := metav1.GetControllerOf(&vmi); ref != nil && ref.Kind == "VirtualMachine" {
			var vm kubevirtv1.VirtualMachine
			found, err := notFound(k.c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: ref.Name}, &vm))
			if err != nil {
				return nil, fmt.Errorf("get VirtualMachine %s/%s: %w", namespace, ref.Name, err)
			}
			if found {
				f.VM = &vm
			}
		}
	}
	var err error
	if f.netFacts, err = k.netFacts(ctx, namespace); err != nil {
		return nil, err
	}
	if spec := f.vmSpec(); spec != nil {
		var keys []string
		for _, n := range spec.Networks {
			if n.Multus != nil {
				keys = append(keys, nadKeyOf(namespace, n.Multus.NetworkName))
			}
		}
		if err := k.addNADs(ctx, &f.netFacts, keys); err != nil {
			return nil, err
		}
	}
	var kvs kubevirtv1.KubeVirtList
	if err := k.listOptional(ctx, &kvs); err != nil {
		return nil, fmt.Errorf("list KubeVirts: %w", err)
	}
	f.KubeVirts = kvs.Items
	if f.Webhook, err = k.webhookFacts(ctx); err != nil {
		return nil, err
	}
	if f.VMI == nil {
		return f, nil
	}
	var pods corev1.PodList
	if err := k.c.List(ctx, &pods, client.InNamespace(namespace), client.MatchingLabels{kubevirtv1.AppLabel: kubevirtv1.VirtLauncherValue}); err != nil {
		return nil, fmt.Errorf("list virt-launcher pods in %q: %w", namespace, err)
	}
	if p := chooseLauncher(f.VMI, pods.Items); p != nil {
		if f.Launcher, err = k.podFacts(ctx, p, &f.netFacts); err != nil {
			return nil, err
		}
		f.Launcher.VMI, f.Launcher.VM = f.VMI, vmRefOf(f.VMI)
		if f.VM != nil {
			f.Launcher.VM.UID = f.VM.UID
		}
	}
	var migs kubevirtv1.VirtualMachineInstanceMigrationList
	if err := k.listOptional(ctx, &migs, client.InNamespace(namespace)); err != nil {
		return nil, fmt.Errorf("list VirtualMachineInstanceMigrations in %q: %w", namespace, err)
	}
	f.Migrations = migs.Items
	var events corev1.EventList
	if err := k.c.List(ctx, &events, client.InNamespace(namespace), client.MatchingFields{"involvedObject.name": f.VMI.Name}); err != nil {
		return nil, fmt.Errorf("list events of VMI %s/%s: %w", namespace, f.VMI.Name, err)
	}
	for _, e := range events.Items {
		if e.InvolvedObject.Kind == "VirtualMachineInstance" && (e.Reason == migration.EventSwitchover || e.Reason == migration.EventSwitchedByAPI) {
			f.Switchovers = append(f.Switchovers, e)
		}
	}
	return f, nil
}
