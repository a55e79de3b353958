// Package audit cross-checks what the Kubernetes API says about kvnet's
// addresses and reports every inconsistency it finds: an IP or MAC held
// twice on one network, IPAMClaims nothing uses any more, pods whose
// addresses disagree with their claim, references to NADs that do not
// exist, and MAC pool state that cannot be right.
//
// It reads the API only (through internal/inventory). kvnet-node's metrics
// are per node and network (ports, FDB entries, leases), with no signal per
// allocation, so nothing here looks at the datapath.
//
// Run is the entry point for callers with a client (kvnet audit, chaos
// checks); Check is the pure part, run on an inventory built in memory.
package audit

import (
	"cmp"
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"kvnet.io/kvnet/internal/inventory"
	"kvnet.io/kvnet/internal/macpool"
)

// Kinds of findings.
const (
	// DuplicateIP: an IP held by two holders on one network. Holders are
	// IPAMClaims (their status.ips, and the attachments of pods that
	// reference them) and pod attachments without a claim.
	DuplicateIP = "DuplicateIP"
	// DuplicateMAC: a MAC held by two holders on one network.
	DuplicateMAC = "DuplicateMAC"
	// LeakedClaim: an IPAMClaim with no VM, no VMI and no pod alive using it.
	LeakedClaim = "LeakedClaim"
	// ClaimMismatch: a pod's kvnet.io/pod-networks entry names a claim
	// whose IPs (or network) differ from the entry's.
	ClaimMismatch = "ClaimMismatch"
	// MissingClaim: a pod's entry names a claim that does not exist, so
	// nothing holds the pod's IPs for it.
	MissingClaim = "MissingClaim"
	// MissingNAD: a NAD that pods, a VMI, or a UDN/CUDN reporting
	// NetworkCreated=True refer to does not exist, or no NAD defines the
	// network of an IPAMClaim.
	MissingNAD = "MissingNAD"
	// InvalidNAD: a NAD kvnet would serve (type kvnet-cni, or ipam type
	// kvnet-ipam) whose configuration kvnet rejects.
	InvalidNAD = "InvalidNAD"
	// InvalidAnnotation: a pod's kvnet.io/pod-networks does not parse.
	InvalidAnnotation = "InvalidAnnotation"
	// DuplicateVMMAC: two VMs carry one MAC the MAC pool assigns
	// (cluster-wide, whatever the network).
	DuplicateVMMAC = "DuplicateVMMAC"
	// Orphaned: an IPAMClaim or a live pod still stored in a namespace
	// that no longer exists. kube-controller-manager can finish deleting
	// a namespace without some of its objects (when the API server
	// restarts mid-way); the API server then refuses every update to
	// them, finalizer removals included, so they stay until the
	// namespace is created again and deleted. Other findings about such
	// objects (a leaked claim, a missing NAD) are left out: this is the
	// one cause. Their addresses stay held, on a network that is gone.
	Orphaned = "Orphaned"
	// InvalidMACRange: the MAC pool's range ConfigMap is not a valid range
	// (kvnet-controller keeps its previous range).
	InvalidMACRange = "InvalidMACRange"
)

// Finding is one inconsistency. Network is the network name where one
// applies. Object is what the finding is about: the address or MAC for
// duplicates, otherwise an object as "<resource>/<namespace>/<name>" (or
// "<resource>/<name>" for cluster-scoped ones). Detail says what is wrong.
type Finding struct {
	Kind    string `json:"kind"`
	Network string `json:"network,omitempty"`
	Object  string `json:"object"`
	Detail  string `json:"detail"`
}

// Counts says how much was checked.
type Counts struct {
	// Pods with a kvnet.io/pod-networks annotation that have not completed.
	Pods int `json:"pods"`
	// Claims is every IPAMClaim.
	Claims int `json:"claims"`
	// Allocations: pod attachments plus claims holding IPs no pod uses.
	Allocations int `json:"allocations"`
	// Networks kvnet serves (distinct network names of NADs).
	Networks int `json:"networks"`
	// VMs and VMIs.
	VMs  int `json:"vms"`
	VMIs int `json:"vmis"`
}

// Report is the outcome of an audit. Findings are sorted by kind, network
// and object.
type Report struct {
	Findings []Finding `json:"findings"`
	Checked  Counts    `json:"checked"`
}

// Run reads the API through c and checks it. The MAC range is read from
// inventory.DefaultMACRange.
func Run(ctx context.Context, c client.Reader) (Report, error) {
	return RunWith(ctx, c, inventory.LoadOptions{})
}

// RunWith is Run with load options.
func RunWith(ctx context.Context, c client.Reader, opts inventory.LoadOptions) (Report, error) {
	inv, err := inventory.Load(ctx, c, opts)
	if err != nil {
		return Report{}, fmt.Errorf("audit: %w", err)
	}
	return Check(inv), nil
}

// Summary is a one-line account of the findings by kind, e.g.
// "3 findings: 1 DuplicateIP, 2 LeakedClaim"; "no findings" when clean.
func (r Report) Summary() string {
	if len(r.Findings) == 0 {
		return "no findings"
	}
	byKind := map[string]int{}
	var kinds []string
	for _, f := range r.Findings {
		if byKind[f.Kind] == 0 {
			kinds = append(kinds, f.Kind)
		}
		byKind[f.Kind]++
	}
	slices.Sort(kinds)
	parts := make([]string, 0, len(kinds))
	for _, k := range kinds {
		parts = append(parts, fmt.Sprintf("%d %s", byKind[k], k))
	}
	noun := "findings"
	if len(r.Findings) == 1 {
		noun = "finding"
	}
	return fmt.Sprintf("%d %s: %s", len(r.Findings), noun, strings.Join(parts, ", "))
}

// Check audits an inventory.
func Check(inv *inventory.Inventory) Report {
	var r Report
	r.Checked = counts(inv)
	r.Findings = append(r.Findings, duplicates(inv)...)
	r.Findings = append(r.Findings, claims(inv)...)
	r.Findings = append(r.Findings, missingNADs(inv)...)
	r.Findings = append(r.Findings, invalid(inv)...)
	r.Findings = append(r.Findings, macPool(inv)...)
	r.Findings = orphans(inv, r.Findings)
	slices.SortStableFunc(r.Findings, func(a, b Finding) int {
		return cmp.Or(strings.Compare(a.Kind, b.Kind), strings.Compare(a.Network, b.Network), strings.Compare(a.Object, b.Object))
	})
	if r.Findings == nil {
		r.Findings = []Finding{}
	}
	return r
}

func counts(inv *inventory.Inventory) Counts {
	c := Counts{Claims: len(inv.Claims), Allocations: len(inv.Allocations()), VMs: len(inv.VMs), VMIs: len(inv.VMIs)}
	for _, p := range inv.Pods {
		if p.Live() && len(p.Attachments) > 0 {
			c.Pods++
		}
	}
	nets := map[string]bool{}
	for _, n := range inv.NADs {
		if n.Served != nil {
			nets[n.Served.Name] = true
		}
	}
	c.Networks = len(nets)
	return c
}

func podRef(namespace, name string) string   { return "pod/" + namespace + "/" + name }
func claimRef(namespace, name string) string { return "ipamclaim/" + namespace + "/" + name }

// holdings maps network -> address (IP or MAC) -> holders.
type holdings map[string]map[string][]string

func (h holdings) add(network, addr, holder string) {
	if h[network] == nil {
		h[network] = map[string][]string{}
	}
	if !slices.Contains(h[network][addr], holder) {
		h[network][addr] = append(h[network][addr], holder)
	}
}

func (h holdings) findings(kind string) []Finding {
	var out []Finding
	for network, byAddr := range h {
		for addr, holders := range byAddr {
			if len(holders) < 2 {
				continue
			}
			slices.Sort(holders)
			out = append(out, Finding{Kind: kind, Network: network, Object: addr,
				Detail: "held by " + strings.Join(holders, " and ")})
		}
	}
	return out
}

// duplicates finds an IP or MAC with more than one holder on a network. A
// claim is one holder with every pod that references it (the two launcher
// pods of a migrating VM share its addresses), so a pod and its claim
// holding the same IP is not a duplicate.
func duplicates(inv *inventory.Inventory) []Finding {
	ips, macs := holdings{}, holdings{}
	for _, c := range inv.Claims {
		for _, p := range c.IPs {
			ips.add(c.Network, p.Addr().String(), claimRef(c.Namespace, c.Name))
		}
	}
	for _, p := range inv.Pods {
		if !p.Live() {
			continue
		}
		for _, a := range p.Attachments {
			holder := podRef(p.Namespace, p.Name)
			if a.Claim != "" {
				holder = claimRef(p.Namespace, a.Claim)
			}
			for _, ip := range a.IPs {
				ips.add(a.Network, ip.Addr().String(), holder)
			}
			if a.MAC != nil {
				macs.add(a.Network, a.MAC.String(), holder)
			}
		}
	}
	return append(ips.findings(DuplicateIP), macs.findings(DuplicateMAC)...)
}

func addrSet(ps []netip.Prefix) []string {
	out := make([]string, 0, len(ps))
	for _, p := range ps {
		if s := p.Addr().String(); !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	slices.Sort(out)
	return out
}

func list(s []string) string {
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, ",")
}

// claims finds leaked claims, and pods that disagree with their claim.
func claims(inv *inventory.Inventory) []Finding {
	var out []Finding
	for _, c := range inv.Claims {
		if len(inv.ClaimUsers(c)) > 0 {
			continue
		}
		if c.VM != "" {
			if _, ok := inv.VM(c.Namespace + "/" + c.VM); ok {
				continue
			}
			if _, ok := inv.VMI(c.Namespace + "/" + c.VM); ok {
				continue
			}
		}
		if c.OwnerPod != "" {
			if p, ok := inv.Pod(c.Namespace + "/" + c.OwnerPod); ok && p.Live() {
				continue
			}
		}
		why := "no VM, VMI or live pod uses it"
		if c.VM != "" {
			why = fmt.Sprintf("its VM %s has no VirtualMachine or VirtualMachineInstance, and no live pod uses it", c.VM)
		}
		if len(c.IPs) > 0 {
			why += "; it holds " + list(addrSet(c.IPs))
		}
		if c.Deleting {
			why += " (being deleted)"
		}
		out = append(out, Finding{Kind: LeakedClaim, Network: c.Network, Object: claimRef(c.Namespace, c.Name), Detail: why})
	}
	for _, p := range inv.Pods {
		if !p.Live() {
			continue
		}
		for _, a := range p.Attachments {
			if a.Claim == "" {
				continue
			}
			c, ok := inv.Claim(p.Namespace + "/" + a.Claim)
			if !ok {
				out = append(out, Finding{Kind: MissingClaim, Network: a.Network, Object: podRef(p.Namespace, p.Name),
					Detail: fmt.Sprintf("its %s attachment references IPAMClaim %s, which does not exist: nothing holds %s for it",
						a.NAD, a.Claim, list(addrSet(a.IPs)))})
				continue
			}
			if c.Network != a.Network {
				out = append(out, Finding{Kind: ClaimMismatch, Network: a.Network, Object: podRef(p.Namespace, p.Name),
					Detail: fmt.Sprintf("its %s attachment is on network %s, its IPAMClaim %s on network %s", a.NAD, a.Network, c.Name, c.Network)})
				continue
			}
			if got, want := addrSet(a.IPs), addrSet(c.IPs); !slices.Equal(got, want) {
				out = append(out, Finding{Kind: ClaimMismatch, Network: a.Network, Object: podRef(p.Namespace, p.Name),
					Detail: fmt.Sprintf("its %s attachment has %s, its IPAMClaim %s has %s", a.NAD, list(got), c.Name, list(want))})
			}
		}
	}
	return out
}

// orphans replaces the findings about objects in namespaces that no longer
// exist (duplicates excepted: they are wrong wherever they are) with one
// Orphaned finding per claim and live pod there.
func orphans(inv *inventory.Inventory, findings []Finding) []Finding {
	gone := func(ns string) bool { _, ok := inv.Namespaces[ns]; return !ok }
	fix := func(ns string) string {
		return fmt.Sprintf("namespace %s no longer exists, but this object is still stored (the namespace's deletion finished without it) and can no longer be changed; create namespace %s again, then delete it", ns, ns)
	}
	out := findings[:0]
	for _, f := range findings {
		if f.Kind != DuplicateIP && f.Kind != DuplicateMAC && f.Kind != DuplicateVMMAC {
			parts := strings.SplitN(f.Object, "/", 3)
			if len(parts) == 3 && gone(parts[1]) {
				continue
			}
		}
		out = append(out, f)
	}
	for _, c := range inv.Claims {
		if gone(c.Namespace) {
			d := fix(c.Namespace)
			if len(c.IPs) > 0 {
				d += "; it holds " + list(addrSet(c.IPs))
			}
			out = append(out, Finding{Kind: Orphaned, Network: c.Network, Object: claimRef(c.Namespace, c.Name), Detail: d})
		}
	}
	for _, p := range inv.Pods {
		if p.Live() && len(p.Attachments) > 0 && gone(p.Namespace) {
			out = append(out, Finding{Kind: Orphaned, Network: p.Attachments[0].Network, Object: podRef(p.Namespace, p.Name), Detail: fix(p.Namespace)})
		}
	}
	return out
}

// missingNADs finds references to NADs that do not exist.
func missingNADs(inv *inventory.Inventory) []Finding {
	type missing struct {
		network  string
		referrer []string
	}
	byKey := map[string]*missing{}
	note := func(key, network, referrer string) {
		if _, ok := inv.NAD(key); ok {
			return
		}
		m := byKey[key]
		if m == nil {
			m = &missing{}
			byKey[key] = m
		}
		if m.network == "" {
			m.network = network
		}
		if !slices.Contains(m.referrer, referrer) {
			m.referrer = append(m.referrer, referrer)
		}
	}
	for _, p := range inv.Pods {
		if !p.Live() {
			continue
		}
		for _, a := range p.Attachments {
			note(a.NAD, a.Network, podRef(p.Namespace, p.Name)+" (kvnet.io/pod-networks)")
		}
		if !p.HostNetwork {
			for _, key := range p.Requested {
				note(key, "", podRef(p.Namespace, p.Name)+" (k8s.v1.cni.cncf.io/networks)")
			}
		}
	}
	for _, v := range inv.VMIs {
		if v.Phase == "Succeeded" || v.Phase == "Failed" {
			continue
		}
		for _, i := range v.Interfaces {
			if i.NAD != "" && !i.Absent {
				note(i.NAD, "", "virtualmachineinstance/"+v.Namespace+"/"+v.Name)
			}
		}
	}
	for _, u := range inv.UDNs {
		if !u.Deleting && u.Created != nil && u.Created.Status == "True" {
			note(u.Namespace+"/"+u.Name, u.Network(), "userdefinednetwork/"+u.Namespace+"/"+u.Name+" (NetworkCreated=True)")
		}
	}
	for _, c := range inv.CUDNs {
		if !c.Deleting && c.Created != nil && c.Created.Status == "True" {
			for _, ns := range c.Namespaces {
				note(ns+"/"+c.Name, c.Network(), "clusteruserdefinednetwork/"+c.Name+" (NetworkCreated=True, selects namespace "+ns+")")
			}
		}
	}
	var out []Finding
	for key, m := range byKey {
		slices.Sort(m.referrer)
		ns, name, _ := strings.Cut(key, "/")
		out = append(out, Finding{Kind: MissingNAD, Network: m.network,
			Object: "networkattachmentdefinition/" + ns + "/" + name,
			Detail: "does not exist; referenced by " + strings.Join(m.referrer, ", ")})
	}
	for _, c := range inv.Claims {
		if _, ok := inv.ServedNAD(c.Network); !ok {
			out = append(out, Finding{Kind: MissingNAD, Network: c.Network, Object: claimRef(c.Namespace, c.Name),
				Detail: fmt.Sprintf("no NetworkAttachmentDefinition defines its network %q", c.Network)})
		}
	}
	return out
}

// invalid finds NADs and pod annotations kvnet cannot read.
func invalid(inv *inventory.Inventory) []Finding {
	var out []Finding
	for _, n := range inv.NADs {
		if n.ConfigError != "" {
			out = append(out, Finding{Kind: InvalidNAD, Object: "networkattachmentdefinition/" + n.Namespace + "/" + n.Name, Detail: n.ConfigError})
		}
	}
	for _, p := range inv.Pods {
		if p.AnnotationError != "" && p.Live() {
			out = append(out, Finding{Kind: InvalidAnnotation, Object: podRef(p.Namespace, p.Name), Detail: p.AnnotationError})
		}
	}
	return out
}

// macPool checks what the API holds of the MAC pool: the MACs written on
// VMs, from which kvnet-controller rebuilds the pool, and its range.
func macPool(inv *inventory.Inventory) []Finding {
	var out []Finding
	holders := map[string][]string{}
	var macs []string
	for _, v := range inv.VMs {
		ifaces := make([]string, 0, len(v.PoolMACs))
		for iface := range v.PoolMACs {
			ifaces = append(ifaces, iface)
		}
		slices.Sort(ifaces)
		for _, iface := range ifaces {
			hw, err := net.ParseMAC(v.PoolMACs[iface])
			if err != nil {
				continue // the API server's validation is KubeVirt's business
			}
			mac := hw.String()
			if holders[mac] == nil {
				macs = append(macs, mac)
			}
			holders[mac] = append(holders[mac], fmt.Sprintf("virtualmachine/%s/%s (interface %s)", v.Namespace, v.Name, iface))
		}
	}
	for _, mac := range macs {
		if len(holders[mac]) > 1 {
			out = append(out, Finding{Kind: DuplicateVMMAC, Object: mac, Detail: "set on " + strings.Join(holders[mac], " and ")})
		}
	}
	if r := inv.MACRange; r != nil {
		if _, _, err := macpool.ParseRange(r.Start, r.End); err != nil {
			out = append(out, Finding{Kind: InvalidMACRange, Object: "configmap/" + r.Namespace + "/" + r.Name,
				Detail: err.Error() + "; kvnet-controller keeps its previous range"})
		}
	}
	return out
}
