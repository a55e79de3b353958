// Package reserved holds the cluster's reserved subnets: the ranges kvnet
// uses for its own plumbing, which no user-defined network may overlap.
//
//   - masquerade: the node-local transit addresses between a node and the
//     router of each primary network (datapath.TransitAddrs), default
//     169.254.0.0/17 and fd69::/112;
//   - join: the default join subnets of primary networks (a UDN's
//     spec.joinSubnets overrides them), default 100.65.0.0/16 and fd99::/64;
//   - transit: the transit subnets of primary networks (a primary Layer2
//     network's is moved to the next free range when its subnets overlap
//     it), default 100.88.0.0/16 and fd97::/64.
//
// They are set per cluster with the same flags on kvnet-controller and
// kvnet-node (--masquerade-subnets, --join-subnets, --transit-subnets),
// whose defaults come from the environment variables the manifests fill
// from one ConfigMap, kvnet-reserved-subnets, so both read the same values.
package reserved

import (
	"flag"
	"fmt"
	"net/netip"
	"os"
	"strings"
)

// Subnets are the reserved subnets, one IPv4 and one IPv6 prefix of each
// kind, IPv4 first.
type Subnets struct {
	Masquerade []netip.Prefix
	Join       []netip.Prefix
	Transit    []netip.Prefix
}

// Defaults (OVN-Kubernetes' values for join and transit, so addresses seen
// in its documentation match).
const (
	DefaultMasquerade = "169.254.0.0/17,fd69::/112"
	DefaultJoin       = "100.65.0.0/16,fd99::/64"
	DefaultTransit    = "100.88.0.0/16,fd97::/64"
)

// Environment variables that set the flags' defaults.
const (
	EnvMasquerade = "KVNET_MASQUERADE_SUBNETS"
	EnvJoin       = "KVNET_JOIN_SUBNETS"
	EnvTransit    = "KVNET_TRANSIT_SUBNETS"
)

// MasqueradeMinAddrs is how many addresses a masquerade subnet must hold:
// 10 left to the cluster default network, then a pair per network ID
// (1-4095).
const MasqueradeMinAddrs = 10 + 2*4095 + 1

// Default returns the default reserved subnets.
func Default() Subnets {
	s, err := Parse(DefaultMasquerade, DefaultJoin, DefaultTransit)
	if err != nil {
		panic(err) // constants
	}
	return s
}

// Kind names a kind of reserved subnet in messages, with the flag that
// sets it.
func kindName(flagName string) string {
	return strings.TrimSuffix(flagName, "-subnets") + " subnet"
}

// Parse parses and validates the three comma-separated lists. Each must
// hold exactly one IPv4 and one IPv6 prefix (in either order), written
// as the network address; the masquerade subnets must be large enough for
// every network ID; no two reserved subnets may overlap. Errors name the
// flag and value.
func Parse(masquerade, join, transit string) (Subnets, error) {
	var s Subnets
	for _, f := range []struct {
		flag, val string
		dst       *[]netip.Prefix
	}{{"masquerade-subnets", masquerade, &s.Masquerade}, {"join-subnets", join, &s.Join}, {"transit-subnets", transit, &s.Transit}} {
		l, err := parseFamilies(f.flag, f.val)
		if err != nil {
			return Subnets{}, err
		}
		*f.dst = l
	}
	for _, p := range s.Masquerade {
		host := p.Addr().BitLen() - p.Bits()
		if host < 14 { // 2^14 = 16384 >= MasqueradeMinAddrs > 2^13
			return Subnets{}, fmt.Errorf("--masquerade-subnets value %q: too small, it must hold %d addresses (a /%d or larger)", p, MasqueradeMinAddrs, p.Addr().BitLen()-14)
		}
	}
	all := s.all()
	for i := range all {
		for j := i + 1; j < len(all); j++ {
			if all[i].p.Overlaps(all[j].p) {
				return Subnets{}, fmt.Errorf("--%s value %q overlaps --%s value %q: reserved subnets must be disjoint", all[i].flag, all[i].p, all[j].flag, all[j].p)
			}
		}
	}
	return s, nil
}

type named struct {
	flag string
	p    netip.Prefix
}

func (s Subnets) all() []named {
	var out []named
	for _, f := range []struct {
		flag string
		l    []netip.Prefix
	}{{"masquerade-subnets", s.Masquerade}, {"join-subnets", s.Join}, {"transit-subnets", s.Transit}} {
		for _, p := range f.l {
			out = append(out, named{f.flag, p})
		}
	}
	return out
}

func parseFamilies(flagName, list string) ([]netip.Prefix, error) {
	var v4, v6 netip.Prefix
	for e := range strings.SplitSeq(list, ",") {
		e = strings.TrimSpace(e)
		p, err := netip.ParsePrefix(e)
		if err != nil {
			return nil, fmt.Errorf("--%s value %q: %v", flagName, e, err)
		}
		if p != p.Masked() {
			return nil, fmt.Errorf("--%s value %q: not a network address (want %s)", flagName, e, p.Masked())
		}
		dst := &v4
		if p.Addr().Is6() {
			dst = &v6
		}
		if dst.IsValid() {
			return nil, fmt.Errorf("--%s %q: more than one subnet of a family", flagName, list)
		}
		*dst = p
	}
	if !v4.IsValid() || !v6.IsValid() {
		return nil, fmt.Errorf("--%s %q: want one IPv4 and one IPv6 subnet", flagName, list)
	}
	return []netip.Prefix{v4, v6}, nil
}

// Join returns l comma-joined, as a NAD's joinSubnet and transitSubnet
// render it.
func Join(l []netip.Prefix) string {
	s := make([]string, len(l))
	for i, p := range l {
		s[i] = p.String()
	}
	return strings.Join(s, ",")
}

// Flags binds --masquerade-subnets, --join-subnets and --transit-subnets
// to fs, defaulting to the environment (EnvMasquerade...) and then to the
// defaults; the returned function parses them after fs.Parse.
func Flags(fs *flag.FlagSet) func() (Subnets, error) {
	env := func(k, def string) string {
		if v := os.Getenv(k); v != "" {
			return v
		}
		return def
	}
	m := fs.String("masquerade-subnets", env(EnvMasquerade, DefaultMasquerade),
		"reserved: the IPv4 and IPv6 subnets of node-local transit addresses to each primary network's router (env "+EnvMasquerade+"); must be the same on kvnet-controller and kvnet-node")
	j := fs.String("join-subnets", env(EnvJoin, DefaultJoin),
		"reserved: the default IPv4 and IPv6 join subnets of primary networks (env "+EnvJoin+"); must be the same on kvnet-controller and kvnet-node")
	t := fs.String("transit-subnets", env(EnvTransit, DefaultTransit),
		"reserved: the IPv4 and IPv6 transit subnets of primary networks (env "+EnvTransit+"); must be the same on kvnet-controller and kvnet-node")
	return func() (Subnets, error) { return Parse(*m, *j, *t) }
}

// Overlap describes the first reserved subnet of kind flagName (one of
// the flag names, e.g. "masquerade-subnets") that overlaps one of
// subnets, whose kind is what ("user defined subnet"), as
// `masquerade subnet "169.254.0.0/17" (kvnet-controller
// --masquerade-subnets) overlaps user defined subnet "169.254.3.0/24"`;
// "" when none does.
func Overlap(reservedList []netip.Prefix, flagName string, subnets []netip.Prefix, what string) string {
	for _, r := range reservedList {
		for _, p := range subnets {
			if r.Overlaps(p) {
				return fmt.Sprintf("%s %q (kvnet-controller --%s) overlaps %s %q", kindName(flagName), r, flagName, what, p)
			}
		}
	}
	return ""
}
