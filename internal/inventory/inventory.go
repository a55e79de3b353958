// Package inventory is what the API says about kvnet's networks, addresses
// and VMs, read once: NetworkAttachmentDefinitions, UserDefinedNetworks and
// ClusterUserDefinedNetworks, pods with their kvnet.io/pod-networks
// annotation, IPAMClaims, KubeVirt VMs and VMIs, and the MAC pool's range.
//
// Load reads it through any client.Reader; Build turns the listed objects
// into a typed Inventory without a client, and the functions on Inventory
// (the rows of "kvnet get", the allocations "kvnet audit" checks) are pure,
// so they are tested on objects built in memory.
//
// Of the MAC pool, what is read here is the range ConfigMap and the MACs
// written on VMs (the pool's reservations, Leases in kvnet-system, follow
// the VMs).
package inventory

import (
	"net"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	nadv1 "kvnet.io/kvnet/api/k8scni/v1"
	ipamclaimv1alpha1 "kvnet.io/kvnet/api/k8scni/v1alpha1"
	kubevirtv1 "kvnet.io/kvnet/api/kubevirt/v1"
	udnv1 "kvnet.io/kvnet/api/udn/v1"
	"kvnet.io/kvnet/internal/hostsubnet"
	"kvnet.io/kvnet/internal/macpool"
	"kvnet.io/kvnet/internal/migration"
	"kvnet.io/kvnet/internal/multus"
	"kvnet.io/kvnet/internal/netconf"
	"kvnet.io/kvnet/internal/podnetworks"
	"kvnet.io/kvnet/internal/udn"
)

// Objects are the API objects an Inventory is built from, as listed.
type Objects struct {
	Namespaces []corev1.Namespace
	NADs       []nadv1.NetworkAttachmentDefinition
	UDNs       []udnv1.UserDefinedNetwork
	CUDNs      []udnv1.ClusterUserDefinedNetwork
	Pods       []corev1.Pod
	Claims     []ipamclaimv1alpha1.IPAMClaim
	VMs        []kubevirtv1.VirtualMachine
	VMIs       []kubevirtv1.VirtualMachineInstance
	// MACRange is the MAC pool's range ConfigMap; nil when it does not
	// exist (the pool then uses its default range).
	MACRange *corev1.ConfigMap
	// Nodes carry the host subnets of Layer3 networks (annotation
	// kvnet.io/node-subnets), which make up their pools.
	Nodes []corev1.Node
}

// Inventory is the typed model. Slices are sorted by namespace and name;
// the maps index them.
type Inventory struct {
	Namespaces map[string]*Namespace
	NADs       []*NAD
	UDNs       []*UDN
	CUDNs      []*CUDN
	Pods       []*Pod
	Claims     []*Claim
	VMs        []*VM
	VMIs       []*VMI
	MACRange   *MACRange

	nads   map[string]*NAD   // "<ns>/<name>"
	claims map[string]*Claim // "<ns>/<name>"
	pods   map[string]*Pod   // "<ns>/<name>"
	vms    map[string]*VM    // "<ns>/<name>"
	vmis   map[string]*VMI   // "<ns>/<name>"
	// claimPods maps a claim key to the live pods referencing it.
	claimPods map[string][]*Pod
	pools     map[string]Pool           // computed by Pools
	hostNets  map[string][]netip.Prefix // host subnets per Layer3 network, over all nodes
	// served maps a network name to the NAD whose configuration builds its
	// allocator (the first by namespace and name, as kvnet-controller's
	// rebuild is indifferent to which one it meets first: they must agree).
	served map[string]*NAD
}

// Namespace is a namespace and whether it asks for a primary network.
type Namespace struct {
	Name        string
	Labels      map[string]string
	Terminating bool
	// PrimaryLabelled: the namespace carries
	// k8s.ovn.org/primary-user-defined-network.
	PrimaryLabelled bool
	// PrimaryNAD is the key of its primary network's NAD, "" when none.
	PrimaryNAD string
}

// NAD is a NetworkAttachmentDefinition.
type NAD struct {
	Namespace, Name string
	Labels          map[string]string
	Deleting        bool
	// Served is what kvnet allocates for it; nil for another plugin's NAD.
	Served *netconf.Served
	// ConfigError is why a configuration kvnet would serve does not parse.
	ConfigError string
	// OwnerKind and OwnerName name its controller (UserDefinedNetwork,
	// ClusterUserDefinedNetwork), empty for a hand-written NAD.
	OwnerKind, OwnerName string
	// NetworkID is the k8s.ovn.org/network-id annotation.
	NetworkID string
}

// Key is "<namespace>/<name>".
func (n *NAD) Key() string { return n.Namespace + "/" + n.Name }

// Network is the network name of a NAD kvnet serves, "" otherwise.
func (n *NAD) Network() string {
	if n.Served == nil {
		return ""
	}
	return n.Served.Name
}

// Condition is the NetworkCreated condition of a UDN or CUDN.
type Condition struct {
	Status, Reason, Message string
}

// UDN is a UserDefinedNetwork.
type UDN struct {
	Namespace, Name string
	Labels          map[string]string
	Deleting        bool
	Spec            udn.Spec
	Created         *Condition // nil: no NetworkCreated condition yet
}

// Network is the UDN's network name.
func (u *UDN) Network() string { return udn.NetworkName(u.Namespace, u.Name) }

// CUDN is a ClusterUserDefinedNetwork.
type CUDN struct {
	Name     string
	Labels   map[string]string
	Deleting bool
	Spec     udn.Spec
	Created  *Condition
	// Namespaces are the existing, not terminating, namespaces its
	// selector matches, sorted.
	Namespaces []string
	// SelectorError is why the namespace selector does not parse.
	SelectorError string
}

// Network is the CUDN's network name.
func (c *CUDN) Network() string { return udn.ClusterNetworkName(c.Name) }

// Pod is a pod and its kvnet attachments.
type Pod struct {
	Namespace, Name string
	UID             string
	Labels          map[string]string
	Node            string
	Phase           corev1.PodPhase
	// Done: the pod has completed (Succeeded or Failed) and holds no
	// addresses any more.
	Done        bool
	HostNetwork bool
	// VMI names the VMI of a virt-launcher pod (its controller owner, else
	// the kubevirt.io/domain annotation), VM its VM: the VMI's controller
	// owner, else the VMI's name (KubeVirt names a VM's VMI after the VM;
	// a standalone VMI stands for itself). Both are empty for other pods.
	// vm.kubevirt.io/name is not read: it holds the guest's hostname.
	VMI, VM string
	// Attachments are the entries of kvnet.io/pod-networks, sorted by NAD.
	Attachments []Attachment
	// AnnotationError is why kvnet.io/pod-networks does not parse.
	AnnotationError string
	// Requested are the NAD keys of the k8s.v1.cni.cncf.io/networks
	// elements (the pod's secondary networks).
	Requested []string
}

// Key is "<namespace>/<name>".
func (p *Pod) Key() string { return p.Namespace + "/" + p.Name }

// Live reports whether the pod holds addresses: annotated and not done.
func (p *Pod) Live() bool { return !p.Done }

// Attachment is one entry of a pod's kvnet.io/pod-networks.
type Attachment struct {
	NAD     string // "<namespace>/<name>"
	Network string
	Role    string
	IPs     []netip.Prefix
	MAC     net.HardwareAddr
	Claim   string // IPAMClaim name in the pod's namespace, "" when none
}

// Claim is an IPAMClaim.
type Claim struct {
	Namespace, Name string
	Labels          map[string]string
	Deleting        bool
	Network         string
	Interface       string
	IPs             []netip.Prefix
	// BadIPs are status.ips entries that do not parse.
	BadIPs   []string
	OwnerPod string
	// VM is the kubevirt.io/vm label, else the name of a VirtualMachine or
	// VirtualMachineInstance owner.
	VM string
	// Allocated is the IPsAllocated condition (nil when there is none).
	Allocated *Condition
}

// Key is "<namespace>/<name>".
func (c *Claim) Key() string { return c.Namespace + "/" + c.Name }

// VM is a VirtualMachine.
type VM struct {
	Namespace, Name string
	Labels          map[string]string
	Interfaces      []Interface
	// PoolMACs are the MACs the MAC pool holds for it: the explicit MACs of
	// interfaces it assigns (masquerade, or on a multus network), by
	// interface.
	PoolMACs map[string]string
	Status   string // printableStatus
}

// Key is "<namespace>/<name>".
func (v *VM) Key() string { return v.Namespace + "/" + v.Name }

// VMI is a VirtualMachineInstance.
type VMI struct {
	Namespace, Name string
	Labels          map[string]string
	// VM is the name of its VirtualMachine owner, "" for a standalone VMI.
	VM         string
	Phase      string
	Node       string
	Interfaces []Interface
	// Status maps an interface name to what the VMI reports for it.
	Status map[string]InterfaceStatus
	// Migration is its last live migration (nil if it never migrated).
	Migration *migration.Migration
}

// Key is "<namespace>/<name>".
func (v *VMI) Key() string { return v.Namespace + "/" + v.Name }

// Interface is a VM interface and the network it is plugged into.
type Interface struct {
	Name    string
	Binding string // bridge, masquerade, sriov, passt, or the plugin's name
	MAC     string // spec macAddress
	// Pod: on the pod network; NAD: the multus NAD key otherwise.
	Pod    bool
	NAD    string
	Absent bool // state: absent (hot-unplugged)
}

// InterfaceStatus is a VMI's reported interface state.
type InterfaceStatus struct {
	IPs []string
	MAC string
}

// MACRange is the MAC pool's range ConfigMap.
type MACRange struct {
	Namespace, Name string
	Start, End      string
}

// NAD returns the NAD with key "<ns>/<name>".
func (inv *Inventory) NAD(key string) (*NAD, bool) { n, ok := inv.nads[key]; return n, ok }

// Claim returns the claim with key "<ns>/<name>".
func (inv *Inventory) Claim(key string) (*Claim, bool) { c, ok := inv.claims[key]; return c, ok }

// Pod returns the pod with key "<ns>/<name>".
func (inv *Inventory) Pod(key string) (*Pod, bool) { p, ok := inv.pods[key]; return p, ok }

// VM returns the VM with key "<ns>/<name>".
func (inv *Inventory) VM(key string) (*VM, bool) { v, ok := inv.vms[key]; return v, ok }

// VMI returns the VMI with key "<ns>/<name>".
func (inv *Inventory) VMI(key string) (*VMI, bool) { v, ok := inv.vmis[key]; return v, ok }

// ServedNAD returns the NAD that defines network (by network name).
func (inv *Inventory) ServedNAD(network string) (*NAD, bool) {
	n, ok := inv.served[network]
	return n, ok
}

// Build turns listed objects into an Inventory.
func Build(o *Objects) *Inventory {
	inv := &Inventory{
		Namespaces: map[string]*Namespace{},
		nads:       map[string]*NAD{},
		claims:     map[string]*Claim{},
		pods:       map[string]*Pod{},
		vms:        map[string]*VM{},
		vmis:       map[string]*VMI{},
		served:     map[string]*NAD{},
		claimPods:  map[string][]*Pod{},
	}
	for _, nd := range o.Nodes {
		subs, err := hostsubnet.Parse(nd.Annotations[hostsubnet.Annotation])
		if err != nil {
			continue
		}
		if inv.hostNets == nil {
			inv.hostNets = map[string][]netip.Prefix{}
		}
		for network, ps := range subs {
			inv.hostNets[network] = append(inv.hostNets[network], ps...)
		}
	}
	for i := range o.NADs {
		n := buildNAD(&o.NADs[i])
		inv.NADs = append(inv.NADs, n)
	}
	slices.SortFunc(inv.NADs, func(a, b *NAD) int { return strings.Compare(a.Key(), b.Key()) })
	for _, n := range inv.NADs {
		inv.nads[n.Key()] = n
		if n.Served != nil {
			if _, ok := inv.served[n.Served.Name]; !ok {
				inv.served[n.Served.Name] = n
			}
		}
	}
	for i := range o.Namespaces {
		ns := &o.Namespaces[i]
		_, labelled := ns.Labels[udn.PrimaryNamespaceLabel]
		n := &Namespace{Name: ns.Name, Labels: ns.Labels, PrimaryLabelled: labelled,
			Terminating: ns.DeletionTimestamp != nil || ns.Status.Phase == corev1.NamespaceTerminating}
		if labelled {
			for _, nad := range inv.NADs {
				if nad.Namespace == ns.Name && !nad.Deleting && nad.Served != nil && nad.Served.IsPrimary() {
					n.PrimaryNAD = nad.Key()
					break
				}
			}
		}
		inv.Namespaces[ns.Name] = n
	}
	for i := range o.UDNs {
		u := &o.UDNs[i]
		inv.UDNs = append(inv.UDNs, &UDN{Namespace: u.Namespace, Name: u.Name, Labels: u.Labels,
			Deleting: u.DeletionTimestamp != nil, Spec: udn.SpecOfUDN(u), Created: created(u.Status.Conditions)})
	}
	slices.SortFunc(inv.UDNs, func(a, b *UDN) int { return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name) })
	for i := range o.CUDNs {
		inv.CUDNs = append(inv.CUDNs, inv.buildCUDN(&o.CUDNs[i]))
	}
	slices.SortFunc(inv.CUDNs, func(a, b *CUDN) int { return strings.Compare(a.Name, b.Name) })
	for i := range o.Pods {
		p := buildPod(&o.Pods[i])
		inv.Pods = append(inv.Pods, p)
	}
	slices.SortFunc(inv.Pods, func(a, b *Pod) int { return strings.Compare(a.Key(), b.Key()) })
	for _, p := range inv.Pods {
		inv.pods[p.Key()] = p
		if !p.Live() {
			continue
		}
		var seen []string
		for _, a := range p.Attachments {
			if a.Claim != "" && !slices.Contains(seen, a.Claim) {
				seen = append(seen, a.Claim)
				k := p.Namespace + "/" + a.Claim
				inv.claimPods[k] = append(inv.claimPods[k], p)
			}
		}
	}
	for i := range o.Claims {
		c := buildClaim(&o.Claims[i])
		inv.Claims = append(inv.Claims, c)
	}
	slices.SortFunc(inv.Claims, func(a, b *Claim) int { return strings.Compare(a.Key(), b.Key()) })
	for _, c := range inv.Claims {
		inv.claims[c.Key()] = c
	}
	for i := range o.VMs {
		v := buildVM(&o.VMs[i])
		inv.VMs = append(inv.VMs, v)
	}
	slices.SortFunc(inv.VMs, func(a, b *VM) int { return strings.Compare(a.Key(), b.Key()) })
	for _, v := range inv.VMs {
		inv.vms[v.Key()] = v
	}
	for i := range o.VMIs {
		v := buildVMI(&o.VMIs[i])
		inv.VMIs = append(inv.VMIs, v)
	}
	slices.SortFunc(inv.VMIs, func(a, b *VMI) int { return strings.Compare(a.Key(), b.Key()) })
	for _, v := range inv.VMIs {
		inv.vmis[v.Key()] = v
	}
	for _, p := range inv.Pods {
		if p.VMI == "" {
			continue
		}
		p.VM = p.VMI
		if vmi, ok := inv.vmis[p.Namespace+"/"+p.VMI]; ok && vmi.VM != "" {
			p.VM = vmi.VM
		}
	}
	if cm := o.MACRange; cm != nil {
		inv.MACRange = &MACRange{Namespace: cm.Namespace, Name: cm.Name, Start: cm.Data["RANGE_START"], End: cm.Data["RANGE_END"]}
	}
	return inv
}

func buildNAD(o *nadv1.NetworkAttachmentDefinition) *NAD {
	n := &NAD{Namespace: o.Namespace, Name: o.Name, Labels: o.Labels, Deleting: o.DeletionTimestamp != nil,
		NetworkID: o.Annotations[udn.NetworkIDAnnotation]}
	s, err := netconf.ParseServed(o.Spec.Config)
	if err != nil {
		n.ConfigError = err.Error()
	} else {
		n.Served = s
	}
	if ref := metav1.GetControllerOf(o); ref != nil && (ref.Kind == "UserDefinedNetwork" || ref.Kind == "ClusterUserDefinedNetwork") {
		n.OwnerKind, n.OwnerName = ref.Kind, ref.Name
	}
	return n
}

func created(conds []metav1.Condition) *Condition {
	for _, c := range conds {
		if c.Type == "NetworkCreated" {
			return &Condition{Status: string(c.Status), Reason: c.Reason, Message: c.Message}
		}
	}
	return nil
}

func (inv *Inventory) buildCUDN(o *udnv1.ClusterUserDefinedNetwork) *CUDN {
	c := &CUDN{Name: o.Name, Labels: o.Labels, Deleting: o.DeletionTimestamp != nil, Spec: udn.SpecOfCUDN(o),
		Created: created(o.Status.Conditions)}
	sel, err := metav1.LabelSelectorAsSelector(&o.Spec.NamespaceSelector)
	if err != nil {
		c.SelectorError = err.Error()
		return c
	}
	for _, ns := range inv.Namespaces {
		if !ns.Terminating && sel.Matches(labels.Set(ns.Labels)) {
			c.Namespaces = append(c.Namespaces, ns.Name)
		}
	}
	slices.Sort(c.Namespaces)
	return c
}

func buildPod(o *corev1.Pod) *Pod {
	p := &Pod{Namespace: o.Namespace, Name: o.Name, UID: string(o.UID), Labels: o.Labels, Node: o.Spec.NodeName,
		Phase: o.Status.Phase, Done: podnetworks.Completed(o), HostNetwork: o.Spec.HostNetwork}
	if o.Labels[kubevirtv1.AppLabel] == kubevirtv1.VirtLauncherValue {
		p.VMI = o.Annotations[kubevirtv1.DomainAnnotation]
		if ref := metav1.GetControllerOf(o); ref != nil && ref.Kind == "VirtualMachineInstance" {
			p.VMI = ref.Name
		}
	}
	if v, ok := o.Annotations[podnetworks.Annotation]; ok {
		nets, err := podnetworks.Parse(v)
		if err != nil {
			p.AnnotationError = err.Error()
		}
		for key, a := range nets {
			att := Attachment{NAD: key, Network: a.Network, Role: a.Role, MAC: a.MAC(), Claim: a.IPAMClaim}
			for _, s := range a.IPAddresses {
				if pr, err := netip.ParsePrefix(s); err == nil {
					att.IPs = append(att.IPs, pr)
				}
			}
			p.Attachments = append(p.Attachments, att)
		}
		slices.SortFunc(p.Attachments, func(a, b Attachment) int { return strings.Compare(a.NAD, b.NAD) })
	}
	if v, ok := o.Annotations[multus.NetworksAnnotation]; ok {
		if elems, err := multus.ParseSelection(multus.NetworksAnnotation, v, o.Namespace); err == nil {
			for _, e := range elems {
				p.Requested = append(p.Requested, e.Key())
			}
		}
	}
	return p
}

func buildClaim(o *ipamclaimv1alpha1.IPAMClaim) *Claim {
	c := &Claim{Namespace: o.Namespace, Name: o.Name, Labels: o.Labels, Deleting: o.DeletionTimestamp != nil,
		Network: o.Spec.Network, Interface: o.Spec.Interface, VM: o.Labels[kubevirtv1.VirtualMachineLabel]}
	for _, s := range o.Status.IPs {
		if p, err := netip.ParsePrefix(s); err == nil {
			c.IPs = append(c.IPs, p)
		} else if a, err := netip.ParseAddr(s); err == nil {
			c.IPs = append(c.IPs, netip.PrefixFrom(a, a.BitLen()))
		} else {
			c.BadIPs = append(c.BadIPs, s)
		}
	}
	if o.Status.OwnerPod != nil {
		c.OwnerPod = o.Status.OwnerPod.Name
	}
	if c.VM == "" {
		for _, ref := range o.OwnerReferences {
			if ref.Kind == "VirtualMachine" || ref.Kind == "VirtualMachineInstance" {
				c.VM = ref.Name
				break
			}
		}
	}
	for _, cond := range o.Status.Conditions {
		if cond.Type == "IPsAllocated" {
			c.Allocated = &Condition{Status: string(cond.Status), Reason: cond.Reason, Message: cond.Message}
		}
	}
	return c
}

func interfaces(namespace string, spec *kubevirtv1.VirtualMachineInstanceSpec) []Interface {
	var out []Interface
	for _, i := range spec.Domain.Devices.Interfaces {
		itf := Interface{Name: i.Name, Binding: binding(i), MAC: i.MacAddress, Absent: i.State == kubevirtv1.InterfaceStateAbsent}
		for _, n := range spec.Networks {
			if n.Name != i.Name {
				continue
			}
			switch {
			case n.Pod != nil:
				itf.Pod = true
			case n.Multus != nil:
				itf.NAD = nadKey(namespace, n.Multus.NetworkName)
			}
		}
		out = append(out, itf)
	}
	return out
}

func nadKey(namespace, ref string) string {
	if strings.Contains(ref, "/") {
		return ref
	}
	return namespace + "/" + ref
}

func binding(i kubevirtv1.Interface) string {
	switch {
	case i.Bridge != nil:
		return "bridge"
	case i.Masquerade != nil:
		return "masquerade"
	case i.SRIOV != nil:
		return "sriov"
	case i.PasstBinding != nil:
		return "passtBinding"
	case i.Binding != nil:
		return i.Binding.Name
	case i.DeprecatedSlirp != nil:
		return "slirp"
	case i.DeprecatedMacvtap != nil:
		return "macvtap"
	case i.DeprecatedPasst != nil:
		return "passt"
	}
	return "bridge" // KubeVirt's default binding
}

func buildVM(o *kubevirtv1.VirtualMachine) *VM {
	v := &VM{Namespace: o.Namespace, Name: o.Name, Labels: o.Labels, Status: o.Status.PrintableStatus, PoolMACs: map[string]string{}}
	if o.Spec.Template != nil {
		v.Interfaces = interfaces(o.Namespace, &o.Spec.Template.Spec)
		for _, i := range o.Spec.Template.Spec.Domain.Devices.Interfaces {
			if i.MacAddress != "" && macpool.Considered(i, o.Spec.Template.Spec.Networks) {
				v.PoolMACs[i.Name] = i.MacAddress
			}
		}
	}
	return v
}

func buildVMI(o *kubevirtv1.VirtualMachineInstance) *VMI {
	v := &VMI{Namespace: o.Namespace, Name: o.Name, Labels: o.Labels, Phase: o.Status.Phase, Node: o.Status.NodeName,
		Interfaces: interfaces(o.Namespace, &o.Spec), Status: map[string]InterfaceStatus{}}
	if ref := metav1.GetControllerOf(o); ref != nil && ref.Kind == "VirtualMachine" {
		v.VM = ref.Name
	}
	for _, s := range o.Status.Interfaces {
		ips := s.IPs
		if len(ips) == 0 && s.IP != "" {
			ips = []string{s.IP}
		}
		v.Status[s.Name] = InterfaceStatus{IPs: ips, MAC: s.MAC}
	}
	v.Migration = migration.Of(o)
	return v
}

// ClaimUsers returns the live pods whose attachments reference the claim.
func (inv *Inventory) ClaimUsers(c *Claim) []*Pod { return inv.claimPods[c.Key()] }
