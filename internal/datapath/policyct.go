package datapath

import (
	"fmt"
	"reflect"
	"slices"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"kvnet.io/kvnet/internal/nl"
)

// This file holds what Apply does for policies besides rules: bridged
// frames reach the inet hooks (enablePolicyHooks), and connections a
// changed policy no longer allows are cut (cutDenied).

// enablePolicyHooks makes the bridge pass IPv4 and IPv6 frames through
// the node namespace's inet hooks (br_netfilter), where policies are
// enforced with connection tracking, and makes conntrack pick up TCP
// connections mid-stream (nf_conntrack_tcp_loose, the kernel's default),
// which a live-migrated VM's connections need on the target node
// (policymigrate.go).
func (d *Datapath) enablePolicyHooks() error {
	for _, k := range []string{"net/bridge/bridge-nf-call-iptables", "net/bridge/bridge-nf-call-ip6tables"} {
		if err := nl.SetSysctl(d.nsPath, k, "1"); err != nil {
			return fmt.Errorf("network policies need br_netfilter: %w", err)
		}
	}
	if err := nl.SetSysctl(d.nsPath, "net/netfilter/nf_conntrack_tcp_loose", "1"); err != nil {
		return fmt.Errorf("network policies need conntrack: %w", err)
	}
	return nil
}

// policyKey returns what of s decides which connections policies allow:
// the policies and the addresses and networks of their ports.
func policyKey(s State) []PortPolicy {
	pols := slices.Clone(s.Policies)
	slices.SortFunc(pols, func(a, b PortPolicy) int { return strings.Compare(a.Port, b.Port) })
	return pols
}

// cutDenied cuts, when the policies or their ports changed since the
// last Apply, the tracked connections of networks with policies that the
// policies no longer allow: established connections are cut as soon as a
// policy stops allowing them, and the rest survive. A cut TCP connection
// stays tracked, marked cut, so that the policy chain drops it rather
// than pick it up mid-stream (policymigrate.go); others are deleted.
func (d *Datapath) cutDenied(s State) error {
	key := struct {
		pols  []PortPolicy
		ports []Port
		nets  map[string]int
	}{pols: policyKey(s), nets: map[string]int{}}
	for _, pp := range key.pols {
		if i := slices.IndexFunc(s.Ports, func(p Port) bool { return p.HostIfName == pp.Port }); i >= 0 {
			key.ports = append(key.ports, s.Ports[i])
		}
	}
	for _, n := range s.Networks {
		key.nets[n.Name] = n.ID
	}
	if d.lastPolicies != nil && reflect.DeepEqual(d.lastPolicies, key) {
		return nil
	}
	zones := policyZones(s)
	if len(zones) > 0 {
		f := ctPolicyFilter{zones: zones}
		for _, fam := range []netlink.InetFamily{unix.AF_INET, unix.AF_INET6} {
			if err := d.tombstone(fam, f); err != nil {
				return fmt.Errorf("cut connections policies no longer allow: %w", err)
			}
			if _, err := d.h.ConntrackDeleteFilters(netlink.ConntrackTable, fam, f); err != nil {
				return fmt.Errorf("cut connections policies no longer allow: %w", err)
			}
		}
	}
	d.lastPolicies = key
	return nil
}

// ctPolicyFilter matches tracked connections of networks with policies
// to delete (ctPolicyFilter.action): those the policies do not allow,
// but TCP ones, which are marked cut instead (tombstone), and cut ones
// the policies allow again.
type ctPolicyFilter struct{ zones map[uint16]*policyVerdicts }

func (f ctPolicyFilter) MatchConntrackFlow(flow *netlink.ConntrackFlow) bool {
	return f.action(flow) == ctDelete
}
