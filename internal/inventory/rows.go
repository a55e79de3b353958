package inventory

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"

	"kvnet.io/kvnet/internal/migration"
	"kvnet.io/kvnet/internal/netconf"
	"kvnet.io/kvnet/internal/udn"
	"kvnet.io/kvnet/internal/vmclaims"
)

// Filter selects rows: Namespace "" means every namespace; a nil Selector
// matches everything. Each row kind says which object's namespace and
// labels count.
type Filter struct {
	Namespace string
	Selector  labels.Selector
}

func (f Filter) labels(l map[string]string) bool {
	return f.Selector == nil || f.Selector.Matches(labels.Set(l))
}

func (f Filter) namespace(ns string) bool { return f.Namespace == "" || f.Namespace == ns }

// Kinds of network rows.
const (
	KindUDN  = "UDN"
	KindCUDN = "CUDN"
	KindNAD  = "NAD"
)

// PoolUse is a network's pool use in a row.
type PoolUse struct {
	Used int `json:"used"`
	Size int `json:"size"`
}

// NetworkRow is a network of "kvnet get networks": a UDN, a CUDN, or a NAD
// kvnet serves that no UDN or CUDN owns (type kvnet-cni, or another plugin
// with ipam type kvnet-ipam).
type NetworkRow struct {
	// Namespace is empty for a CUDN.
	Namespace string `json:"namespace,omitempty"`
	Name      string `json:"name"`
	// Kind is UDN, CUDN or NAD.
	Kind string `json:"kind"`
	// Network is the network name (CNI "name", IPAMClaims' spec.network).
	Network string `json:"network"`
	// Topology is Layer2, Layer3 or Localnet; for a kvnet-ipam NAD,
	// "<plugin>+kvnet-ipam"; "Invalid" for a configuration kvnet rejects.
	Topology string `json:"topology"`
	// Role is Primary or Secondary.
	Role    string   `json:"role,omitempty"`
	Subnets []string `json:"subnets,omitempty"`
	// Pool is the automatic pool's use, as kvnet-controller counts it; nil
	// for networks without subnets or without a NAD.
	Pool *PoolUse `json:"pool,omitempty"`
	// NetworkCreated is the status of the UDN/CUDN's NetworkCreated
	// condition ("" when it has none, and for NADs); Reason its reason.
	NetworkCreated string `json:"networkCreated,omitempty"`
	Reason         string `json:"reason,omitempty"`
	// NADs are the keys of the network's NADs that exist.
	NADs []string `json:"nads"`
	// NetworkID is the k8s.ovn.org/network-id of its NADs.
	NetworkID     string `json:"networkID,omitempty"`
	PersistentIPs bool   `json:"persistentIPs"`
}

func specTopology(s udn.Spec) (topology, role string, subnets []string) {
	topology = string(s.Topology)
	switch {
	case s.Layer2 != nil:
		role = string(s.Layer2.Role)
		for _, c := range s.Layer2.Subnets {
			subnets = append(subnets, string(c))
		}
	case s.Layer3 != nil:
		role = string(s.Layer3.Role)
		for _, c := range s.Layer3.Subnets {
			v := string(c.CIDR)
			if c.HostSubnet > 0 {
				v += fmt.Sprintf("/%d", c.HostSubnet)
			}
			subnets = append(subnets, v)
		}
	case s.Localnet != nil:
		role = string(s.Localnet.Role)
		for _, c := range s.Localnet.Subnets {
			subnets = append(subnets, string(c))
		}
	}
	return topology, role, subnets
}

func persistent(s udn.Spec) bool {
	switch {
	case s.Layer2 != nil:
		return s.Layer2.IPAM != nil && s.Layer2.IPAM.Lifecycle == "Persistent" && len(s.Layer2.Subnets) > 0
	case s.Localnet != nil:
		return s.Localnet.IPAM != nil && s.Localnet.IPAM.Lifecycle == "Persistent" && len(s.Localnet.Subnets) > 0
	}
	return false
}

func splitList(s string) []string {
	var out []string
	for _, v := range strings.Split(s, ",") {
		if v = strings.TrimSpace(v); v != "" {
			out = append(out, v)
		}
	}
	return out
}

func (inv *Inventory) pool(network string) *PoolUse {
	if p, ok := inv.Pools()[network]; ok {
		return &PoolUse{Used: p.Used, Size: p.Size}
	}
	return nil
}

func (inv *Inventory) ownedNADs(kind, namespace, name string) (keys []string, id string) {
	for _, n := range inv.NADs {
		if n.OwnerKind == kind && n.OwnerName == name && (namespace == "" || n.Namespace == namespace) {
			keys = append(keys, n.Key())
			if id == "" {
				id = n.NetworkID
			}
		}
	}
	return keys, id
}

// NetworkRows returns the rows of "kvnet get networks", sorted by
// namespace (CUDNs first), name and kind. The filter's namespace selects
// UDNs and NADs in it and CUDNs that select it or have a NAD there; its
// selector applies to the UDN's, CUDN's or NAD's labels.
func (inv *Inventory) NetworkRows(f Filter) []NetworkRow {
	var out []NetworkRow
	for _, u := range inv.UDNs {
		if !f.namespace(u.Namespace) || !f.labels(u.Labels) {
			continue
		}
		r := NetworkRow{Namespace: u.Namespace, Name: u.Name, Kind: KindUDN, Network: u.Network(), PersistentIPs: persistent(u.Spec)}
		r.Topology, r.Role, r.Subnets = specTopology(u.Spec)
		r.NADs, r.NetworkID = inv.ownedNADs("UserDefinedNetwork", u.Namespace, u.Name)
		if len(r.NADs) > 0 {
			r.Pool = inv.pool(r.Network)
		}
		if u.Created != nil {
			r.NetworkCreated, r.Reason = u.Created.Status, u.Created.Reason
		}
		out = append(out, r)
	}
	for _, c := range inv.CUDNs {
		r := NetworkRow{Name: c.Name, Kind: KindCUDN, Network: c.Network(), PersistentIPs: persistent(c.Spec)}
		r.NADs, r.NetworkID = inv.ownedNADs("ClusterUserDefinedNetwork", "", c.Name)
		if f.Namespace != "" && !slices.Contains(c.Namespaces, f.Namespace) &&
			!slices.ContainsFunc(r.NADs, func(k string) bool { return strings.HasPrefix(k, f.Namespace+"/") }) {
			continue
		}
		if !f.labels(c.Labels) {
			continue
		}
		r.Topology, r.Role, r.Subnets = specTopology(c.Spec)
		if len(r.NADs) > 0 {
			r.Pool = inv.pool(r.Network)
		}
		if c.Created != nil {
			r.NetworkCreated, r.Reason = c.Created.Status, c.Created.Reason
		}
		out = append(out, r)
	}
	for _, n := range inv.NADs {
		if n.OwnerKind != "" || (n.Served == nil && n.ConfigError == "") || !f.namespace(n.Namespace) || !f.labels(n.Labels) {
			continue
		}
		r := NetworkRow{Namespace: n.Namespace, Name: n.Name, Kind: KindNAD, NADs: []string{n.Key()}, NetworkID: n.NetworkID}
		switch s := n.Served; {
		case s == nil:
			r.Topology, r.Reason = "Invalid", n.ConfigError
		case s.Conf != nil:
			r.Network = s.Name
			r.Topology = map[string]string{netconf.TopologyLayer2: "Layer2", netconf.TopologyLayer3: "Layer3", netconf.TopologyLocalnet: "Localnet"}[s.Conf.Topology]
			if r.Topology == "" {
				r.Topology = s.Conf.Topology
			}
			r.Role = "Secondary"
			if s.IsPrimary() {
				r.Role = "Primary"
			}
			r.Subnets = splitList(s.Conf.Subnets)
			r.PersistentIPs = s.AllowsPersistentIPs()
			r.Pool = inv.pool(s.Name)
		default:
			r.Network = s.Name
			r.Topology = s.Plugin + "+kvnet-ipam"
			r.Role = "Secondary"
			r.Subnets = splitList(s.IPAM.Subnets)
			r.PersistentIPs = s.AllowsPersistentIPs()
			r.Pool = inv.pool(s.Name)
		}
		out = append(out, r)
	}
	slices.SortStableFunc(out, func(a, b NetworkRow) int {
		return cmp.Or(strings.Compare(a.Namespace, b.Namespace), strings.Compare(a.Name, b.Name), strings.Compare(a.Kind, b.Kind))
	})
	return out
}

// IPRow is an allocation in "kvnet get ips".
type IPRow struct {
	Network   string `json:"network"`
	Namespace string `json:"namespace"`
	// Pod holds the attachment; empty for a claim no pod uses.
	Pod string `json:"pod,omitempty"`
	// VM is the VM (or VMI) of a virt-launcher pod or of the claim.
	VM string `json:"vm,omitempty"`
	// Claim is the IPAMClaim holding the IPs, if any.
	Claim string   `json:"claim,omitempty"`
	IPs   []string `json:"ips"`
	MAC   string   `json:"mac,omitempty"`
	Node  string   `json:"node,omitempty"`
	// NAD is the attachment's NAD key, Role primary or secondary.
	NAD  string `json:"nad,omitempty"`
	Role string `json:"role,omitempty"`
}

func prefixes(ps []netip.Prefix) []string {
	out := make([]string, 0, len(ps))
	for _, p := range ps {
		out = append(out, p.String())
	}
	return out
}

// IPRows returns the rows of "kvnet get ips": every allocation (see
// Allocations), sorted by namespace, network, pod and claim. The filter applies to the pod's namespace and labels, or
// the claim's for a claim no pod uses.
func (inv *Inventory) IPRows(f Filter) []IPRow {
	var out []IPRow
	for _, a := range inv.Allocations() {
		if !f.namespace(a.Namespace) {
			continue
		}
		var l map[string]string
		if a.Pod != "" {
			if p, ok := inv.pods[a.Namespace+"/"+a.Pod]; ok {
				l = p.Labels
			}
		} else if c, ok := inv.claims[a.Namespace+"/"+a.Claim]; ok {
			l = c.Labels
		}
		if !f.labels(l) {
			continue
		}
		r := IPRow{Network: a.Network, Namespace: a.Namespace, Pod: a.Pod, VM: a.VM, Claim: a.Claim, IPs: prefixes(a.IPs),
			Node: a.Node, NAD: a.NAD, Role: a.Role}
		if a.MAC != nil {
			r.MAC = a.MAC.String()
		}
		out = append(out, r)
	}
	slices.SortStableFunc(out, func(a, b IPRow) int {
		return cmp.Or(strings.Compare(a.Namespace, b.Namespace), strings.Compare(a.Network, b.Network),
			strings.Compare(a.Pod, b.Pod), strings.Compare(a.Claim, b.Claim))
	})
	return out
}

// ClaimRow is an IPAMClaim in "kvnet get claims".
type ClaimRow struct {
	Namespace string   `json:"namespace"`
	Name      string   `json:"name"`
	Network   string   `json:"network"`
	IPs       []string `json:"ips"`
	// OwnerPod is status.ownerPod, the pod that last used the claim.
	OwnerPod string `json:"ownerPod,omitempty"`
	VM       string `json:"vm,omitempty"`
	// Condition is the IPsAllocated condition as "IPsAllocated=<status>",
	// empty when there is none; Reason its reason.
	Condition string `json:"condition,omitempty"`
	Reason    string `json:"reason,omitempty"`
	Interface string `json:"interface,omitempty"`
	// Pods are the pods (not completed) whose attachments use the claim.
	Pods []string `json:"pods"`
}

// ClaimRows returns the rows of "kvnet get claims". The filter applies to
// the claim.
func (inv *Inventory) ClaimRows(f Filter) []ClaimRow {
	out := []ClaimRow{}
	for _, c := range inv.Claims {
		if !f.namespace(c.Namespace) || !f.labels(c.Labels) {
			continue
		}
		r := ClaimRow{Namespace: c.Namespace, Name: c.Name, Network: c.Network, IPs: append(prefixes(c.IPs), c.BadIPs...),
			OwnerPod: c.OwnerPod, VM: c.VM, Interface: c.Interface, Pods: []string{}}
		if c.Allocated != nil {
			r.Condition, r.Reason = "IPsAllocated="+c.Allocated.Status, c.Allocated.Reason
		}
		for _, p := range inv.claimPods[c.Key()] {
			r.Pods = append(r.Pods, p.Name)
		}
		out = append(out, r)
	}
	return out
}

// VMRow is one interface of a VM in "kvnet get vms".
type VMRow struct {
	Namespace string `json:"namespace"`
	// VM is the VM's name (a standalone VMI's for those).
	VM        string `json:"vm"`
	Interface string `json:"interface"`
	// Binding is bridge, masquerade, sriov, passtBinding or a binding
	// plugin's name (l2bridge...).
	Binding string `json:"binding"`
	// Network is the kvnet network name; "pod" for the cluster's default
	// network, the NAD key for a NAD kvnet does not serve.
	Network string `json:"network"`
	// NAD is the NAD key of the interface ("" for the default network).
	NAD string `json:"nad,omitempty"`
	// IPs: kvnet's allocation (the launcher pod's, else the claim's),
	// else what the VMI reports.
	IPs []string `json:"ips"`
	// MAC: what the VMI reports, else the VM's spec, else the launcher
	// pod's attachment.
	MAC   string `json:"mac,omitempty"`
	Node  string `json:"node,omitempty"`
	Claim string `json:"claim,omitempty"`
	// Migration is the VMI's migration state: Pending, Running, Succeeded,
	// Failed, or "" when it never migrated.
	Migration string `json:"migration,omitempty"`
	// MigrationSource and MigrationTarget are the nodes of that migration.
	MigrationSource string `json:"migrationSource,omitempty"`
	MigrationTarget string `json:"migrationTarget,omitempty"`
	// Switchover is how the interface's network last switched nodes in a
	// live migration, from kvnet-node's event on the VMI: "first-frame"
	// or "api" ("" when none is known); SwitchoverNote is the event's
	// note. Set by "kvnet get vms" (SetSwitchovers).
	Switchover     string `json:"switchover,omitempty"`
	SwitchoverNote string `json:"switchoverNote,omitempty"`
	// Pod is the virt-launcher pod; Status the VM's printableStatus or
	// the standalone VMI's phase.
	Pod    string `json:"pod,omitempty"`
	Status string `json:"status,omitempty"`
}

// VMRows returns the rows of "kvnet get vms", one per interface of every
// VM and standalone VMI (a running VM's interfaces are its VMI's). The
// filter applies to the VM (the VMI for standalone ones).
func (inv *Inventory) VMRows(f Filter) []VMRow {
	type vm struct {
		namespace, name, status string
		labels                  map[string]string
		ifaces                  []Interface
		vmi                     *VMI
	}
	var vms []vm
	for _, v := range inv.VMs {
		x := vm{namespace: v.Namespace, name: v.Name, status: v.Status, labels: v.Labels, ifaces: v.Interfaces}
		if vmi, ok := inv.vmis[v.Key()]; ok {
			x.vmi, x.ifaces = vmi, vmi.Interfaces
		}
		vms = append(vms, x)
	}
	for _, v := range inv.VMIs {
		if _, ok := inv.vms[v.Key()]; !ok {
			vms = append(vms, vm{namespace: v.Namespace, name: v.Name, status: v.Phase, labels: v.Labels, ifaces: v.Interfaces, vmi: v})
		}
	}
	slices.SortFunc(vms, func(a, b vm) int {
		return cmp.Or(strings.Compare(a.namespace, b.namespace), strings.Compare(a.name, b.name))
	})
	var out []VMRow
	for _, v := range vms {
		if !f.namespace(v.namespace) || !f.labels(v.labels) {
			continue
		}
		var launcher *Pod
		if v.vmi != nil {
			for _, p := range inv.Pods {
				if p.Namespace == v.namespace && p.VMI == v.vmi.Name && p.Live() && (launcher == nil || p.Node == v.vmi.Node) {
					launcher = p
				}
			}
		}
		for _, i := range v.ifaces {
			if i.Absent {
				continue
			}
			out = append(out, inv.vmRow(v.namespace, v.name, v.status, i, v.vmi, launcher))
		}
	}
	return out
}

func (inv *Inventory) vmRow(namespace, name, status string, i Interface, vmi *VMI, launcher *Pod) VMRow {
	r := VMRow{Namespace: namespace, VM: name, Interface: i.Name, Binding: i.Binding, Status: status, NAD: i.NAD, IPs: []string{}}
	if i.Pod {
		r.Network = "pod"
		if ns, ok := inv.Namespaces[namespace]; ok && ns.PrimaryNAD != "" {
			r.NAD = ns.PrimaryNAD
		}
	}
	if n, ok := inv.nads[r.NAD]; ok && n.Served != nil {
		r.Network = n.Served.Name
	} else if r.NAD != "" && r.Network == "" {
		r.Network = r.NAD
	}
	var att *Attachment
	if launcher != nil {
		r.Pod = launcher.Name
		for k := range launcher.Attachments {
			a := &launcher.Attachments[k]
			if (r.NAD != "" && a.NAD == r.NAD) || (i.Pod && r.NAD == "" && a.Role == "primary") {
				att = a
				break
			}
		}
	}
	if c, ok := inv.claims[namespace+"/"+vmclaims.ClaimName(name, i.Name)]; ok {
		r.Claim = c.Name
		if att == nil {
			r.IPs = prefixes(c.IPs)
		}
	}
	if att != nil {
		r.IPs = prefixes(att.IPs)
	}
	var st InterfaceStatus
	if vmi != nil {
		st = vmi.Status[i.Name]
		r.Node = vmi.Node
		if m := vmi.Migration; m != nil {
			r.Migration, r.MigrationSource, r.MigrationTarget = string(m.State), m.SourceNode, m.TargetNode
		}
	}
	if len(r.IPs) == 0 && len(st.IPs) > 0 {
		r.IPs = st.IPs
	}
	switch {
	case st.MAC != "":
		r.MAC = st.MAC
	case i.MAC != "":
		r.MAC = i.MAC
	case att != nil && att.MAC != nil:
		r.MAC = att.MAC.String()
	}
	return r
}

// SetSwitchovers fills the Switchover fields of rows from kvnet-node's
// switch-over events on VMIs (migration.EventSwitchover and
// EventSwitchedByAPI): for each row, the newest event of its VMI (a VM's
// VMI has the VM's name) naming its network.
func SetSwitchovers(rows []VMRow, events []corev1.Event) {
	type key struct{ namespace, vmi, network string }
	newest := map[key]*corev1.Event{}
	for i := range events {
		e := &events[i]
		if e.InvolvedObject.Kind != "VirtualMachineInstance" || (e.Reason != migration.EventSwitchover && e.Reason != migration.EventSwitchedByAPI) {
			continue
		}
		network, _, _ := strings.Cut(strings.TrimPrefix(e.Message, "network "), " ")
		k := key{e.Namespace, e.InvolvedObject.Name, network}
		if old := newest[k]; old == nil || eventTime(e).After(eventTime(old)) {
			newest[k] = e
		}
	}
	for i := range rows {
		r := &rows[i]
		e := newest[key{r.Namespace, r.VM, r.Network}]
		if e == nil {
			continue
		}
		r.Switchover, r.SwitchoverNote = "first-frame", e.Message
		if e.Reason == migration.EventSwitchedByAPI {
			r.Switchover = "api"
		}
	}
}

// eventTime is when an event (core/v1, or events.k8s.io/v1 seen through
// core/v1) was last observed: its own times, else when it was stored.
func eventTime(e *corev1.Event) time.Time {
	var t time.Time
	for _, x := range []time.Time{e.EventTime.Time, e.FirstTimestamp.Time, e.LastTimestamp.Time} {
		if x.After(t) {
			t = x
		}
	}
	if e.Series != nil && e.Series.LastObservedTime.After(t) {
		t = e.Series.LastObservedTime.Time
	}
	if t.IsZero() {
		t = e.CreationTimestamp.Time
	}
	return t
}
