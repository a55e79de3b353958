// Package invtest builds, for tests, a small consistent cluster as the API
// would hold it: a tenant namespace with a persistent primary UDN, a CUDN
// over two namespaces, a hand-written kvnet-cni NAD, a macvlan NAD with
// kvnet-ipam, a primary Layer3 UDN with a host subnet on each of three
// nodes (the nodes' kvnet.io/node-subnets) and two pods on it, pods, a
// running VM (with its launcher pod, VMI and claim; its guest hostname
// differs from its name, as KubeVirt writes it into the launcher pod's
// vm.kubevirt.io/name) and a stopped one (its claim only), and the MAC
// range ConfigMap. World returns the objects (for inventory.Build); Seed
// writes them into an API server, status included.
package invtest

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nadv1 "kvnet.io/kvnet/api/k8scni/v1"
	ipamclaimv1alpha1 "kvnet.io/kvnet/api/k8scni/v1alpha1"
	kubevirtv1 "kvnet.io/kvnet/api/kubevirt/v1"
	udnv1 "kvnet.io/kvnet/api/udn/v1"
	"kvnet.io/kvnet/internal/hostsubnet"
	"kvnet.io/kvnet/internal/inventory"
	"kvnet.io/kvnet/internal/podnetworks"
	"kvnet.io/kvnet/internal/udn"
)

// Names in the world.
const (
	Tenant = "tenant" // labelled for a primary network, selected by the CUDN
	Other  = "other"  // selected by the CUDN
	L3     = "l3"     // labelled for a primary network: the Layer3 UDN
	System = "kvnet-system"

	PrimaryNetwork   = "tenant_primary"     // UDN tenant/primary
	SharedNetwork    = "cluster_udn_shared" // CUDN shared
	LegacyNetwork    = "legacy"             // hand-written NAD tenant/legacy
	MigrationNetwork = "migration"          // macvlan + kvnet-ipam NAD other/migration
	Layer3Network    = "l3_l3-net"          // UDN l3/l3-net, Layer3, host subnets /24

	// HostnameA is VM vm-a's spec.template.spec.hostname: what KubeVirt
	// puts in its launcher pod's vm.kubevirt.io/name label.
	HostnameA = "guest-a"

	LauncherA = "virt-launcher-vm-a-x7k2p"
)

// Attachment is a shorthand for one kvnet.io/pod-networks entry.
type Attachment struct {
	NAD, Network, Role, MAC, Claim string
	IPs                            []string
}

// Annotation renders attachments as a kvnet.io/pod-networks value.
func Annotation(atts ...Attachment) string {
	n := podnetworks.Networks{}
	for _, a := range atts {
		n[a.NAD] = podnetworks.Attachment{IPAddresses: a.IPs, MACAddress: a.MAC, Role: a.Role, Network: a.Network, IPAMClaim: a.Claim}
	}
	s, err := n.Marshal()
	if err != nil {
		panic(err)
	}
	return s
}

// Pod returns a pod on node with the attachments, in phase Running.
func Pod(ns, name, node string, atts ...Attachment) corev1.Pod {
	p := corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{"app": name}, Annotations: map[string]string{}},
		Spec:       corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "busybox"}}},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning},
	}
	if len(atts) > 0 {
		p.Annotations[podnetworks.Annotation] = Annotation(atts...)
	}
	return p
}

// Claim returns an IPAMClaim with status IPs and an owner pod.
func Claim(ns, name, network, vm, ownerPod string, ips ...string) ipamclaimv1alpha1.IPAMClaim {
	c := ipamclaimv1alpha1.IPAMClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       ipamclaimv1alpha1.IPAMClaimSpec{Network: network},
		Status: ipamclaimv1alpha1.IPAMClaimStatus{IPs: ips, Conditions: []metav1.Condition{{
			Type: "IPsAllocated", Status: metav1.ConditionTrue, Reason: "SuccessfulAllocation", Message: "IPs allocated",
			LastTransitionTime: metav1.NewTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)),
		}}},
	}
	if vm != "" {
		c.Labels = map[string]string{kubevirtv1.VirtualMachineLabel: vm}
	}
	if ownerPod != "" {
		c.Status.OwnerPod = &ipamclaimv1alpha1.OwnerPod{Name: ownerPod}
	}
	return c
}

func condition(msg string) []metav1.Condition {
	return []metav1.Condition{{Type: "NetworkCreated", Status: metav1.ConditionTrue, Reason: "NetworkAttachmentDefinitionCreated",
		Message: msg, LastTransitionTime: metav1.NewTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))}}
}

func rendered(ns, name, netName string, spec udn.Spec, id, ownerKind, owner string) nadv1.NetworkAttachmentDefinition {
	conf, err := udn.Render(spec, netName, ns+"/"+name)
	if err != nil {
		panic(err)
	}
	s, err := conf.Marshal()
	if err != nil {
		panic(err)
	}
	yes := true
	return nadv1.NetworkAttachmentDefinition{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name,
			Labels:          map[string]string{udn.NADLabel: ""},
			Annotations:     map[string]string{udn.NetworkIDAnnotation: id, udn.NetworkNameAnnotation: netName},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: udnv1.GroupVersion.String(), Kind: ownerKind, Name: owner, UID: "to-be-set", Controller: &yes, BlockOwnerDeletion: &yes}}},
		Spec: nadv1.NetworkAttachmentDefinitionSpec{Config: s},
	}
}

func nad(ns, name, config string) nadv1.NetworkAttachmentDefinition {
	return nadv1.NetworkAttachmentDefinition{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: nadv1.NetworkAttachmentDefinitionSpec{Config: config}}
}

// World returns a consistent cluster: audit finds nothing in it.
func World() *inventory.Objects {
	o := &inventory.Objects{}
	o.Namespaces = []corev1.Namespace{
		{ObjectMeta: metav1.ObjectMeta{Name: Tenant, Labels: map[string]string{udn.PrimaryNamespaceLabel: "", "team": "blue"}}},
		{ObjectMeta: metav1.ObjectMeta{Name: Other, Labels: map[string]string{"team": "blue"}}},
		{ObjectMeta: metav1.ObjectMeta{Name: L3, Labels: map[string]string{udn.PrimaryNamespaceLabel: ""}}},
		{ObjectMeta: metav1.ObjectMeta{Name: System}},
	}
	primary := udnv1.UserDefinedNetwork{
		ObjectMeta: metav1.ObjectMeta{Namespace: Tenant, Name: "primary", Labels: map[string]string{"tier": "prod"}},
		Spec: udnv1.UserDefinedNetworkSpec{Topology: udnv1.NetworkTopologyLayer2, Layer2: &udnv1.Layer2Config{
			Role: udnv1.NetworkRolePrimary, Subnets: udnv1.DualStackCIDRs{"10.10.0.0/24"},
			IPAM: &udnv1.IPAMConfig{Lifecycle: udnv1.IPAMLifecyclePersistent}}},
		Status: udnv1.UserDefinedNetworkStatus{Conditions: condition("NetworkAttachmentDefinition has been created")},
	}
	shared := udnv1.ClusterUserDefinedNetwork{
		ObjectMeta: metav1.ObjectMeta{Name: "shared"},
		Spec: udnv1.ClusterUserDefinedNetworkSpec{
			NamespaceSelector: metav1.LabelSelector{MatchLabels: map[string]string{"team": "blue"}},
			Network: udnv1.NetworkSpec{Topology: udnv1.NetworkTopologyLayer2, Layer2: &udnv1.Layer2Config{
				Role: udnv1.NetworkRoleSecondary, Subnets: udnv1.DualStackCIDRs{"10.20.0.0/24"}}}},
		Status: udnv1.ClusterUserDefinedNetworkStatus{Conditions: condition("NetworkAttachmentDefinition has been created in following namespaces: [other tenant]")},
	}
	l3net := udnv1.UserDefinedNetwork{
		ObjectMeta: metav1.ObjectMeta{Namespace: L3, Name: "l3-net"},
		Spec: udnv1.UserDefinedNetworkSpec{Topology: udnv1.NetworkTopologyLayer3, Layer3: &udnv1.Layer3Config{
			Role: udnv1.NetworkRolePrimary, Subnets: []udnv1.Layer3Subnet{{CIDR: "10.100.0.0/16", HostSubnet: 24}}}},
		Status: udnv1.UserDefinedNetworkStatus{Conditions: condition("NetworkAttachmentDefinition has been created")},
	}
	o.UDNs = []udnv1.UserDefinedNetwork{primary, l3net}
	o.CUDNs = []udnv1.ClusterUserDefinedNetwork{shared}
	o.NADs = []nadv1.NetworkAttachmentDefinition{
		rendered(Tenant, "primary", PrimaryNetwork, udn.SpecOfUDN(&primary), "1", "UserDefinedNetwork", "primary"),
		rendered(Tenant, "shared", SharedNetwork, udn.SpecOfCUDN(&shared), "2", "ClusterUserDefinedNetwork", "shared"),
		rendered(Other, "shared", SharedNetwork, udn.SpecOfCUDN(&shared), "2", "ClusterUserDefinedNetwork", "shared"),
		nad(Tenant, "legacy", `{"cniVersion":"1.1.0","type":"kvnet-cni","name":"legacy","netAttachDefName":"tenant/legacy","topology":"layer2","role":"secondary","subnets":"10.30.0.0/24"}`),
		nad(Other, "migration", `{"cniVersion":"1.0.0","type":"macvlan","name":"migration","master":"eth1","ipam":{"type":"kvnet-ipam","subnets":"10.200.0.0/24","gatewayIPs":"10.200.0.254"}}`),
		nad(Other, "plain", `{"cniVersion":"1.0.0","type":"bridge","name":"plain","ipam":{"type":"host-local","subnet":"192.168.5.0/24"}}`),
		rendered(L3, "l3-net", Layer3Network, udn.SpecOfUDN(&l3net), "3", "UserDefinedNetwork", "l3-net"),
	}
	o.NADs[3].Labels = map[string]string{"tier": "dev"}

	web := Pod(Tenant, "web-1", "node-1",
		Attachment{NAD: "tenant/primary", Network: PrimaryNetwork, Role: "primary", IPs: []string{"10.10.0.3/24"}, MAC: "0a:58:0a:0a:00:03"},
		Attachment{NAD: "tenant/shared", Network: SharedNetwork, Role: "secondary", IPs: []string{"10.20.0.3/24"}, MAC: "0a:58:0a:14:00:03"},
		Attachment{NAD: "tenant/legacy", Network: LegacyNetwork, Role: "secondary", IPs: []string{"10.30.0.3/24"}, MAC: "0a:58:0a:1e:00:03"})
	web.Annotations["k8s.v1.cni.cncf.io/networks"] = "shared,legacy"
	db := Pod(Other, "db-1", "node-2",
		Attachment{NAD: "other/shared", Network: SharedNetwork, Role: "secondary", IPs: []string{"10.20.0.4/24"}, MAC: "0a:58:0a:14:00:04"},
		Attachment{NAD: "other/migration", Network: MigrationNetwork, Role: "secondary", IPs: []string{"10.200.0.5/24"}, MAC: "0a:58:0a:c8:00:05"})
	db.Annotations["k8s.v1.cni.cncf.io/networks"] = "shared,migration"
	// A completed pod held 10.10.0.3 before web-1: not a duplicate.
	job := Pod(Tenant, "job-1", "node-2",
		Attachment{NAD: "tenant/primary", Network: PrimaryNetwork, Role: "primary", IPs: []string{"10.10.0.3/24"}, MAC: "0a:58:0a:0a:00:03"})
	job.Status.Phase = corev1.PodSucceeded
	launcher := Pod(Tenant, LauncherA, "node-1",
		Attachment{NAD: "tenant/primary", Network: PrimaryNetwork, Role: "primary", IPs: []string{"10.10.0.4/24"}, MAC: "02:00:00:00:00:01", Claim: "vm-a.default"},
		Attachment{NAD: "tenant/shared", Network: SharedNetwork, Role: "secondary", IPs: []string{"10.20.0.6/24"}, MAC: "02:00:00:00:00:10"})
	// As KubeVirt's virt-controller labels a launcher pod: the VMI's
	// labels, its hostname in vm.kubevirt.io/name, the VMI's name in
	// vmi.kubevirt.io/id and the kubevirt.io/domain annotation, and the VMI
	// as controller owner.
	launcher.Labels = map[string]string{kubevirtv1.AppLabel: kubevirtv1.VirtLauncherValue, kubevirtv1.VMNameLabel: HostnameA,
		kubevirtv1.VMIIDLabel: "vm-a", "os": "debian"}
	launcher.Annotations[kubevirtv1.DomainAnnotation] = "vm-a"
	launcher.OwnerReferences = []metav1.OwnerReference{{APIVersion: kubevirtv1.GroupVersion.String(), Kind: "VirtualMachineInstance",
		Name: "vm-a", UID: "to-be-set", Controller: ptr(true), BlockOwnerDeletion: ptr(true)}}
	launcher.Annotations["k8s.v1.cni.cncf.io/networks"] = `[{"name":"shared","namespace":"tenant","interface":"pod16477688c0e"}]`
	app1 := Pod(L3, "app-1", "node-1",
		Attachment{NAD: "l3/l3-net", Network: Layer3Network, Role: "primary", IPs: []string{"10.100.0.3/24"}, MAC: "0a:58:0a:64:00:03"})
	app2 := Pod(L3, "app-2", "node-2",
		Attachment{NAD: "l3/l3-net", Network: Layer3Network, Role: "primary", IPs: []string{"10.100.1.3/24"}, MAC: "0a:58:0a:64:01:03"})
	o.Pods = []corev1.Pod{web, db, job, launcher, app1, app2}
	// Three nodes, each with its host subnet of the Layer3 network (as
	// kvnet-controller assigns them): its pool is three /24s.
	for i, n := range []string{"node-1", "node-2", "node-3"} {
		o.Nodes = append(o.Nodes, corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n,
			Annotations: map[string]string{hostsubnet.Annotation: fmt.Sprintf(`{%q:["10.100.%d.0/24"]}`, Layer3Network, i)}}})
	}

	o.Claims = []ipamclaimv1alpha1.IPAMClaim{
		Claim(Tenant, "vm-a.default", PrimaryNetwork, "vm-a", LauncherA, "10.10.0.4/24"),
		Claim(Tenant, "vm-b.default", PrimaryNetwork, "vm-b", "virt-launcher-vm-b-q9w8e", "10.10.0.5/24"),
	}
	o.Claims[0].Spec.Interface = "ovn-udn1"

	l2bridge := &kubevirtv1.PluginBinding{Name: "l2bridge"}
	specA := kubevirtv1.VirtualMachineInstanceSpec{
		Hostname: HostnameA,
		Domain: kubevirtv1.DomainSpec{Devices: kubevirtv1.Devices{Interfaces: []kubevirtv1.Interface{
			{Name: "default", Binding: l2bridge, MacAddress: "02:00:00:00:00:01"},
			{Name: "blue", Bridge: &kubevirtv1.InterfaceBridge{}, MacAddress: "02:00:00:00:00:10"},
		}}},
		Networks: []kubevirtv1.Network{
			{Name: "default", Pod: &kubevirtv1.PodNetwork{}},
			{Name: "blue", Multus: &kubevirtv1.MultusNetwork{NetworkName: "shared"}},
		},
	}
	specB := kubevirtv1.VirtualMachineInstanceSpec{
		Domain: kubevirtv1.DomainSpec{Devices: kubevirtv1.Devices{Interfaces: []kubevirtv1.Interface{
			{Name: "default", Binding: l2bridge, MacAddress: "02:00:00:00:00:02"},
		}}},
		Networks: []kubevirtv1.Network{{Name: "default", Pod: &kubevirtv1.PodNetwork{}}},
	}
	always, halted := "Always", "Halted"
	o.VMs = []kubevirtv1.VirtualMachine{
		{ObjectMeta: metav1.ObjectMeta{Namespace: Tenant, Name: "vm-a", Labels: map[string]string{"os": "debian"}},
			Spec:   kubevirtv1.VirtualMachineSpec{RunStrategy: &always, Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{Spec: specA}},
			Status: kubevirtv1.VirtualMachineStatus{PrintableStatus: "Running", Ready: true, Created: true}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: Tenant, Name: "vm-b", Labels: map[string]string{"os": "fedora"}},
			Spec:   kubevirtv1.VirtualMachineSpec{RunStrategy: &halted, Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{Spec: specB}},
			Status: kubevirtv1.VirtualMachineStatus{PrintableStatus: "Stopped"}},
	}
	yes := true
	start := metav1.NewTime(time.Date(2026, 1, 1, 0, 1, 0, 0, time.UTC))
	o.VMIs = []kubevirtv1.VirtualMachineInstance{{
		ObjectMeta: metav1.ObjectMeta{Namespace: Tenant, Name: "vm-a", Labels: map[string]string{"os": "debian"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: kubevirtv1.GroupVersion.String(), Kind: "VirtualMachine", Name: "vm-a", UID: "to-be-set", Controller: &yes}}},
		Spec: specA,
		Status: kubevirtv1.VirtualMachineInstanceStatus{Phase: "Running", NodeName: "node-1",
			Interfaces: []kubevirtv1.VirtualMachineInstanceNetworkInterface{
				{Name: "default", IP: "10.10.0.4", IPs: []string{"10.10.0.4"}, MAC: "02:00:00:00:00:01"},
				{Name: "blue", IP: "10.20.0.6", IPs: []string{"10.20.0.6"}, MAC: "02:00:00:00:00:10"},
			},
			MigrationState: &kubevirtv1.VirtualMachineInstanceMigrationState{SourceNode: "node-2", TargetNode: "node-1",
				SourcePod: "virt-launcher-vm-a-old12", TargetPod: LauncherA, Completed: true, StartTimestamp: &start, EndTimestamp: &start}},
	}}
	o.MACRange = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: System, Name: "kvnet-mac-range-config"},
		Data: map[string]string{"RANGE_START": "02:00:00:00:00:00", "RANGE_END": "02:00:00:00:ff:ff"}}
	return o
}

// Seed creates the objects in the API, then writes their status; owner
// references get the UIDs of the created owners (UDN, CUDN, VM).
func Seed(ctx context.Context, c client.Client, o *inventory.Objects) error {
	uids := map[string]string{} // kind/namespace/name -> UID
	create := func(obj client.Object, kind string) error {
		status := statusOf(obj)
		if err := c.Create(ctx, obj); err != nil {
			return fmt.Errorf("create %s %s/%s: %w", kind, obj.GetNamespace(), obj.GetName(), err)
		}
		uids[kind+"/"+obj.GetNamespace()+"/"+obj.GetName()] = string(obj.GetUID())
		if status != nil {
			status(obj)
			if err := c.Status().Update(ctx, obj); err != nil {
				return fmt.Errorf("update status of %s %s/%s: %w", kind, obj.GetNamespace(), obj.GetName(), err)
			}
		}
		return nil
	}
	own := func(obj client.Object) {
		refs := obj.GetOwnerReferences()
		for i := range refs {
			ns := obj.GetNamespace()
			if refs[i].Kind == "ClusterUserDefinedNetwork" {
				ns = ""
			}
			if uid, ok := uids[refs[i].Kind+"/"+ns+"/"+refs[i].Name]; ok {
				refs[i].UID = types.UID(uid)
			}
		}
		obj.SetOwnerReferences(refs)
	}
	for i := range o.Nodes {
		if err := create(o.Nodes[i].DeepCopy(), "Node"); err != nil {
			return err
		}
	}
	for i := range o.Namespaces {
		ns := o.Namespaces[i].DeepCopy()
		if err := c.Get(ctx, client.ObjectKeyFromObject(ns), &corev1.Namespace{}); err == nil {
			continue // kvnet-system, made by the control plane
		}
		if err := create(ns, "Namespace"); err != nil {
			return err
		}
	}
	for i := range o.UDNs {
		if err := create(o.UDNs[i].DeepCopy(), "UserDefinedNetwork"); err != nil {
			return err
		}
	}
	for i := range o.CUDNs {
		if err := create(o.CUDNs[i].DeepCopy(), "ClusterUserDefinedNetwork"); err != nil {
			return err
		}
	}
	for i := range o.NADs {
		n := o.NADs[i].DeepCopy()
		own(n)
		if err := create(n, "NetworkAttachmentDefinition"); err != nil {
			return err
		}
	}
	var launchers []*corev1.Pod
	for i := range o.Pods {
		p := o.Pods[i].DeepCopy()
		if ref := metav1.GetControllerOf(p); ref != nil && ref.Kind == "VirtualMachineInstance" {
			launchers = append(launchers, p)
			continue
		}
		if err := create(p, "Pod"); err != nil {
			return err
		}
	}
	for i := range o.Claims {
		if err := create(o.Claims[i].DeepCopy(), "IPAMClaim"); err != nil {
			return err
		}
	}
	for i := range o.VMs {
		if err := create(o.VMs[i].DeepCopy(), "VirtualMachine"); err != nil {
			return err
		}
	}
	for i := range o.VMIs {
		v := o.VMIs[i].DeepCopy()
		own(v)
		if err := create(v, "VirtualMachineInstance"); err != nil {
			return err
		}
	}
	// Launcher pods are owned by their VMI: created after them.
	for _, p := range launchers {
		own(p)
		if err := create(p, "Pod"); err != nil {
			return err
		}
	}
	if o.MACRange != nil {
		if err := create(o.MACRange.DeepCopy(), "ConfigMap"); err != nil {
			return err
		}
	}
	return nil
}

func ptr[T any](v T) *T { return &v }

// statusOf returns a function that puts obj's current status back on it
// (Create returns the object without it), or nil for kinds without one.
func statusOf(obj client.Object) func(client.Object) {
	switch o := obj.(type) {
	case *corev1.Pod:
		s := *o.Status.DeepCopy()
		return func(x client.Object) { x.(*corev1.Pod).Status = s }
	case *udnv1.UserDefinedNetwork:
		s := *o.Status.DeepCopy()
		return func(x client.Object) { x.(*udnv1.UserDefinedNetwork).Status = s }
	case *udnv1.ClusterUserDefinedNetwork:
		s := *o.Status.DeepCopy()
		return func(x client.Object) { x.(*udnv1.ClusterUserDefinedNetwork).Status = s }
	case *ipamclaimv1alpha1.IPAMClaim:
		s := *o.Status.DeepCopy()
		return func(x client.Object) { x.(*ipamclaimv1alpha1.IPAMClaim).Status = s }
	case *kubevirtv1.VirtualMachine:
		s := *o.Status.DeepCopy()
		return func(x client.Object) { x.(*kubevirtv1.VirtualMachine).Status = s }
	case *kubevirtv1.VirtualMachineInstance:
		s := *o.Status.DeepCopy()
		return func(x client.Object) { x.(*kubevirtv1.VirtualMachineInstance).Status = s }
	}
	return nil
}
