package why

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	nadv1 "kvnet.io/kvnet/api/k8scni/v1"
	udnv1 "kvnet.io/kvnet/api/udn/v1"
	udncontroller "kvnet.io/kvnet/internal/k8s/controllers/udn"
	"kvnet.io/kvnet/internal/netconf"
	"kvnet.io/kvnet/internal/udn"
)

// ovnOverlayType is OVN-Kubernetes' CNI type for UDN NADs. Manifests
// written for OVN-Kubernetes carry it; kvnet serves the same networks as
// "kvnet-cni".
const ovnOverlayType = netconf.OVNOverlayType

// netFacts are the namespace-level objects the network checks read.
type netFacts struct {
	Namespace *corev1.Namespace
	// NADs by "<ns>/<name>": every NAD of the namespace, and every other
	// NAD the object names; a nil value was looked up and not found.
	NADs  map[string]*nadv1.NetworkAttachmentDefinition
	UDNs  []udnv1.UserDefinedNetwork        // of the namespace
	CUDNs []udnv1.ClusterUserDefinedNetwork // all of them
}

// namespaceNADs returns the NADs of the namespace, sorted by name.
func (f *netFacts) namespaceNADs() []*nadv1.NetworkAttachmentDefinition {
	var out []*nadv1.NetworkAttachmentDefinition
	for _, nad := range f.NADs {
		if nad != nil && nad.Namespace == f.Namespace.Name {
			out = append(out, nad)
		}
	}
	slices.SortFunc(out, func(a, b *nadv1.NetworkAttachmentDefinition) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// lookup is an ipam.NADLookup / vmclaims.NADLookup over the facts.
func (f *netFacts) lookup(key string) (*netconf.Served, bool, error) {
	nad := f.NADs[key]
	if nad == nil {
		return nil, false, nil
	}
	s, err := netconf.ParseServed(nad.Spec.Config)
	return s, true, err
}

func udnRole(u *udnv1.UserDefinedNetwork) udnv1.NetworkRole {
	switch {
	case u.Spec.Layer2 != nil:
		return u.Spec.Layer2.Role
	case u.Spec.Layer3 != nil:
		return u.Spec.Layer3.Role
	}
	return ""
}

func cudnRole(c *udnv1.ClusterUserDefinedNetwork) udnv1.NetworkRole {
	switch n := c.Spec.Network; {
	case n.Layer2 != nil:
		return n.Layer2.Role
	case n.Layer3 != nil:
		return n.Layer3.Role
	case n.Localnet != nil:
		return n.Localnet.Role
	}
	return ""
}

// selects reports whether the CUDN's namespace selector matches ns.
func selects(c *udnv1.ClusterUserDefinedNetwork, ns *corev1.Namespace) bool {
	sel, err := metav1.LabelSelectorAsSelector(&c.Spec.NamespaceSelector)
	return err == nil && sel.Matches(labels.Set(ns.Labels))
}

// primaryOwners returns the primary UDNs of the namespace and the primary
// CUDNs that select it, as "UserDefinedNetwork ns/name" with their
// NetworkCreated condition (nil when they have none).
func (f *netFacts) primaryOwners() []owner {
	var out []owner
	for i := range f.UDNs {
		u := &f.UDNs[i]
		if udnRole(u) == udnv1.NetworkRolePrimary {
			out = append(out, owner{kind: "UserDefinedNetwork", name: u.Namespace + "/" + u.Name, nadName: u.Name,
				cond: meta.FindStatusCondition(u.Status.Conditions, udncontroller.ConditionNetworkCreated)})
		}
	}
	for i := range f.CUDNs {
		c := &f.CUDNs[i]
		if cudnRole(c) == udnv1.NetworkRolePrimary && selects(c, f.Namespace) {
			out = append(out, owner{kind: "ClusterUserDefinedNetwork", name: c.Name, nadName: c.Name,
				cond: meta.FindStatusCondition(c.Status.Conditions, udncontroller.ConditionNetworkCreated)})
		}
	}
	return out
}

// owner is a UDN or CUDN.
type owner struct {
	kind, name string
	nadName    string // the NAD it renders in the namespace
	cond       *metav1.Condition
}

func (o owner) String() string { return o.kind + " " + o.name }

// state describes the owner's NetworkCreated condition.
func (o owner) state() string {
	if o.cond == nil {
		return "no NetworkCreated condition yet"
	}
	s := fmt.Sprintf("NetworkCreated=%s (%s)", o.cond.Status, o.cond.Reason)
	if o.cond.Status != metav1.ConditionTrue && o.cond.Message != "" {
		s += ": " + o.cond.Message
	}
	return s
}

// ownerOf returns the UDN or CUDN a NAD was rendered from (ok false for a
// hand-written NAD, or an owner that is gone).
func (f *netFacts) ownerOf(nad *nadv1.NetworkAttachmentDefinition) (owner, bool) {
	ref := metav1.GetControllerOf(nad)
	if ref == nil {
		return owner{}, false
	}
	switch ref.Kind {
	case "UserDefinedNetwork":
		for i := range f.UDNs {
			if u := &f.UDNs[i]; u.Name == ref.Name && u.Namespace == nad.Namespace {
				return owner{kind: ref.Kind, name: u.Namespace + "/" + u.Name, nadName: u.Name,
					cond: meta.FindStatusCondition(u.Status.Conditions, udncontroller.ConditionNetworkCreated)}, true
			}
		}
	case "ClusterUserDefinedNetwork":
		for i := range f.CUDNs {
			if c := &f.CUDNs[i]; c.Name == ref.Name {
				return owner{kind: ref.Kind, name: c.Name, nadName: c.Name,
					cond: meta.FindStatusCondition(c.Status.Conditions, udncontroller.ConditionNetworkCreated)}, true
			}
		}
	}
	return owner{}, false
}

// rawConf is what kvnet why reads of any CNI configuration.
type rawConf struct {
	Type    string `json:"type"`
	Role    string `json:"role"`
	Plugins []struct {
		Type string `json:"type"`
	} `json:"plugins"`
}

func parseRaw(config string) rawConf {
	var c rawConf
	_ = json.Unmarshal([]byte(config), &c)
	if c.Type == "" && len(c.Plugins) > 0 {
		c.Type = c.Plugins[0].Type
	}
	return c
}

// isOVNOverlay reports whether a NAD is an OVN-Kubernetes network.
func isOVNOverlay(c rawConf) bool {
	if c.Type == ovnOverlayType {
		return true
	}
	for _, p := range c.Plugins {
		if p.Type == ovnOverlayType {
			return true
		}
	}
	return false
}

const fixOverlayType = `change "type" to "kvnet-cni" in its spec.config (kvnet reads the same keys as OVN-Kubernetes); a UserDefinedNetwork renders such a NAD for you`

// describeServed is a NAD's link detail.
func describeServed(key string, s *netconf.Served) string {
	if s.Conf != nil {
		c := s.Conf
		d := fmt.Sprintf("%s: kvnet-cni %s %s, network %q", key, c.Topology, orDefault(c.Role, netconf.RoleSecondary), c.Name)
		if c.Subnets != "" {
			d += ", subnets " + c.Subnets
		} else {
			d += ", no IPAM"
		}
		if s.AllowsPersistentIPs() {
			d += ", persistent IPs"
		}
		return d
	}
	d := fmt.Sprintf("%s: %s with kvnet-ipam, network %q, subnets %s", key, s.Plugin, s.Name, s.IPAM.Subnets)
	if s.AllowsPersistentIPs() {
		d += ", persistent IPs"
	}
	return d
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// primaryEvidence lists what in the namespace expects a primary network:
// primary UDNs, CUDNs selecting it, primary kvnet NADs.
func (f *netFacts) primaryEvidence() []string {
	var out []string
	for _, o := range f.primaryOwners() {
		out = append(out, fmt.Sprintf("%s is a primary network for it (%s)", o, o.state()))
	}
	for _, nad := range f.namespaceNADs() {
		if s, err := netconf.ParseServed(nad.Spec.Config); err == nil && s != nil && s.IsPrimary() {
			if _, owned := f.ownerOf(nad); !owned {
				out = append(out, fmt.Sprintf("NAD %s/%s is a primary network", nad.Namespace, nad.Name))
			}
		}
	}
	return out
}

// checkNamespace checks the namespace link and finds the primary NAD.
// evidence lists what else (the pod, the VM) expects a primary network.
// It returns whether the namespace is labelled and its primary NAD key;
// stop is true when a link is broken.
func checkNamespace(r *Report, f *netFacts, evidence []string) (labelled bool, primaryKey string, stop bool) {
	ns := f.Namespace
	if _, labelled = ns.Labels[udn.PrimaryNamespaceLabel]; !labelled {
		evidence = append(f.primaryEvidence(), evidence...)
		if len(evidence) == 0 {
			r.ok("namespace", "%s: no primary user-defined network (not labelled %s): pods use the cluster default network", ns.Name, udn.PrimaryNamespaceLabel)
			return false, "", false
		}
		return false, "", r.fail("namespace", fmt.Sprintf("%s: not labelled %s", ns.Name, udn.PrimaryNamespaceLabel), NamespaceNotLabelled,
			fmt.Sprintf("the label can only be set when a namespace is created (admission policy user-defined-networks-namespace-label): recreate namespace %s with the label %s: \"\" and create its networks and workloads again", ns.Name, udn.PrimaryNamespaceLabel),
			"namespace %s was created without the label %s, but %s. kvnet, as OVN-Kubernetes, gives a namespace a primary network only when it carries the label from creation, so its pods stay on the cluster default network",
			ns.Name, udn.PrimaryNamespaceLabel, strings.Join(evidence, "; "))
	}
	r.ok("namespace", "%s: labelled %s", ns.Name, udn.PrimaryNamespaceLabel)

	var deleting *nadv1.NetworkAttachmentDefinition
	for _, nad := range f.namespaceNADs() {
		s, err := netconf.ParseServed(nad.Spec.Config)
		if err != nil || s == nil || !s.IsPrimary() {
			continue
		}
		if nad.DeletionTimestamp != nil {
			deleting = nad
			continue
		}
		primaryKey = nad.Namespace + "/" + nad.Name
		break
	}
	if primaryKey == "" {
		return true, "", noPrimary(r, f, deleting)
	}
	nad := f.NADs[primaryKey]
	if o, ok := f.ownerOf(nad); ok {
		r.ok("network", "%s: %s", o, o.state())
	} else {
		r.ok("network", "hand-written primary NAD %s", primaryKey)
	}
	s, _ := netconf.ParseServed(nad.Spec.Config)
	r.ok("NAD", "%s", describeServed(primaryKey, s))
	return true, primaryKey, false
}

// noPrimary explains a labelled namespace without a primary NAD.
func noPrimary(r *Report, f *netFacts, deleting *nadv1.NetworkAttachmentDefinition) bool {
	ns := f.Namespace.Name
	for _, nad := range f.namespaceNADs() {
		if c := parseRaw(nad.Spec.Config); isOVNOverlay(c) && strings.EqualFold(c.Role, "primary") {
			key := nad.Namespace + "/" + nad.Name
			return r.fail("NAD", key+": type "+ovnOverlayType, NADUnservedType, "in NAD "+key+", "+fixOverlayType,
				"the primary network NAD %s has CNI type %q, which is OVN-Kubernetes' and not served by kvnet, so namespace %s has no primary network kvnet knows of", key, ovnOverlayType, ns)
		}
	}
	owners := f.primaryOwners()
	if deleting != nil {
		key := deleting.Namespace + "/" + deleting.Name
		return r.fail("NAD", key+": being deleted", PrimaryNetworkNotRendered,
			"the NAD stays (finalizer) while pods use it; once they are gone kvnet-controller removes it and renders it again if its network still exists; see the network's NetworkCreated condition and NetworkInUse events",
			"the primary NAD %s of namespace %s is being deleted", key, ns)
	}
	if len(owners) == 0 {
		return r.fail("network", "none for namespace "+ns, NoPrimaryNetwork,
			fmt.Sprintf("create a UserDefinedNetwork in %s with spec.topology: Layer2 and spec.layer2.role: Primary (or a ClusterUserDefinedNetwork selecting the namespace)", ns),
			"namespace %s is labelled %s but has no primary network: no primary UserDefinedNetwork, no ClusterUserDefinedNetwork selecting it, no primary NAD; kvnet-controller refuses its pods (event InvalidPrimaryNetwork)", ns, udn.PrimaryNamespaceLabel)
	}
	if len(owners) > 1 {
		names := make([]string, len(owners))
		for i, o := range owners {
			names[i] = o.String()
		}
		return r.fail("network", strings.Join(names, ", "), PrimaryNetworkNotRendered,
			"keep one primary network per namespace: delete the others",
			"namespace %s has %d primary networks (%s); only one is allowed, and none has a NAD: %s", ns, len(owners), strings.Join(names, ", "), owners[0].state())
	}
	o := owners[0]
	if o.cond == nil {
		return r.fail("network", o.String()+": not rendered yet", PrimaryNetworkNotRendered,
			"kvnet-controller renders the NAD within seconds; if it does not, check that kvnet-controller runs (kubectl -n kvnet-system get pods,lease) and its log",
			"%s has no NAD %s/%s yet and no NetworkCreated condition: kvnet-controller has not processed it", o, ns, o.nadName)
	}
	fix := "fix what the condition's message says; kvnet-controller retries and renders the NAD"
	if strings.Contains(o.cond.Message, "already exist") {
		fix = "a NAD kvnet did not create has the network's name: rename or delete it"
	}
	return r.fail("network", o.String()+": "+o.state(), PrimaryNetworkNotRendered, fix,
		"%s has no NAD %s/%s: %s", o, ns, o.nadName, o.state())
}

// checkNAD checks the NAD an element (or a VM network) names. where says
// who names it. It returns the served configuration (nil for a NAD of
// another plugin) and whether a link is broken.
func checkNAD(r *Report, f *netFacts, key, where string) (*netconf.Served, bool) {
	nad, found := f.NADs[key]
	if !found || nad == nil {
		ns, name, _ := strings.Cut(key, "/")
		fix := fmt.Sprintf("create NAD %s (a secondary UserDefinedNetwork named %s in namespace %s renders it) or correct the name in %s", key, name, ns, where)
		msg := fmt.Sprintf("%s names NetworkAttachmentDefinition %s, which does not exist", where, key)
		for i := range f.UDNs {
			if u := &f.UDNs[i]; u.Namespace == ns && u.Name == name {
				o := owner{kind: "UserDefinedNetwork", name: key, cond: meta.FindStatusCondition(u.Status.Conditions, udncontroller.ConditionNetworkCreated)}
				msg += fmt.Sprintf("; %s exists but is not rendered: %s", o, o.state())
				fix = "see the UserDefinedNetwork's NetworkCreated condition; kvnet-controller renders its NAD once that is resolved"
			}
		}
		return nil, r.fail("NAD", key+": not found", NADNotFound, fix, "%s", msg)
	}
	if msg, refused := nad.Annotations[udn.NetworkConflictAnnotation]; refused {
		return nil, r.fail("NAD", key+": refused, disagrees with its network's first NAD", NADConfigMismatch,
			"make spec.config of NAD "+key+" agree with the first NAD of its network (or give it another network \"name\"); kvnet-controller then serves it",
			"%s names NAD %s, which kvnet-controller refused: %s", where, key, msg)
	}
	s, err := netconf.ParseServed(nad.Spec.Config)
	if err != nil {
		return nil, r.fail("NAD", key+": invalid", NADInvalid,
			"correct spec.config of NAD "+key+" (a rendered NAD is put back by kvnet-controller; a hand-written one must be fixed by hand)",
			"%s names NAD %s, whose configuration kvnet cannot use: %v", where, key, err)
	}
	if s == nil {
		c := parseRaw(nad.Spec.Config)
		if isOVNOverlay(c) {
			return nil, r.fail("NAD", key+": type "+ovnOverlayType, NADUnservedType, "in NAD "+key+", "+fixOverlayType,
				"%s names NAD %s of CNI type %q: that is OVN-Kubernetes' plugin, which kvnet does not serve, so nothing wires this attachment", where, key, ovnOverlayType)
		}
		r.ok("NAD", "%s: CNI type %q, not kvnet's (its own plugin and IPAM serve it)", key, c.Type)
		return nil, false
	}
	if o, ok := f.ownerOf(nad); ok && o.cond != nil && o.cond.Status != metav1.ConditionTrue {
		r.ok("network", "%s: %s", o, o.state())
	}
	r.ok("NAD", "%s", describeServed(key, s))
	return s, false
}
