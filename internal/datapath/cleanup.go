package datapath

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"

	"kvnet.io/kvnet/internal/nl"
	"kvnet.io/kvnet/internal/portalias"
)

// This file removes kvnet from a node's network namespace for good (kvnet
// uninstall, through kvnet-node --cleanup): unlike Apply of an empty
// State, it needs no underlay and also removes what kvnet-cni made (the
// host ends of pod veths) and the nftables tables themselves.

// podHostIfPrefix starts the host end of every pod veth kvnet-cni makes:
// "kvp" + 10 lowercase hex digits (internal/cni's hostIfPrefix; a test
// of package cni checks that its names are recognised here).
const podHostIfPrefix = "kvp"

// probeLinks are the throwaway links of ProbeVLAN, left only if kvnet-node
// died while probing.
var probeLinks = []string{"kvprobe0", "kvprobe1", "kvprobe0.1"}

// IsPodHostIf reports whether name has the shape of the host end of a pod
// veth made by kvnet-cni: "kvp" followed by exactly 10 lowercase hex
// digits.
func IsPodHostIf(name string) bool {
	rest, ok := strings.CutPrefix(name, podHostIfPrefix)
	if !ok || len(rest) != 10 {
		return false
	}
	for _, c := range rest {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// Cleanup removes from the node described by cfg (cfg.NetNS; the router
// namespaces named after cfg, see RouterNSName) everything kvnet made
// there: the host ends of pod veths (by kvnet-cni's name shape or kvnet's
// port alias; their pod ends go with them), every kvnet-owned link
// (bridges, VXLAN devices, router, transit, service and localnet veths),
// the router namespaces, and the nftables tables named "kvnet". It touches
// nothing else: a link, namespace or table whose name is not exactly one
// of kvnet's shapes stays. It returns what it removed, one entry per
// object ("link kvbr7", "netns kvnet-r7", "nftables table inet kvnet"),
// and tries every object even when one fails. Running it again removes
// nothing and succeeds.
//
// Pods still attached to a kvnet network lose that interface.
func Cleanup(cfg NodeConfig) ([]string, error) { return sweep(cfg, true) }

// Leftovers lists what Cleanup would remove, in its format, without
// removing anything: the empty list means kvnet left nothing in the
// node's network namespace.
func Leftovers(cfg NodeConfig) ([]string, error) { return sweep(cfg, false) }

func sweep(cfg NodeConfig, remove bool) ([]string, error) {
	var found []string
	var errs []error
	// Pod ports first, then the bridges they are on: a port never outlives
	// its bridge as a plain, up interface.
	links, err := kvnetLinks(cfg.NetNS)
	if err != nil {
		return nil, fmt.Errorf("clean up node %q: %w", cfg.Name, err)
	}
	if len(links) > 0 {
		h, err := nl.NewHandle(cfg.NetNS)
		if err != nil {
			return nil, fmt.Errorf("clean up node %q: %w", cfg.Name, err)
		}
		defer h.Close()
		for _, name := range links {
			if remove {
				// A deleted veth takes its peer with it, which may be
				// later in the list: gone already is fine.
				if err := h.LinkDelByName(name); err != nil && !nl.IsNotFound(err) {
					errs = append(errs, fmt.Errorf("delete link %q: %w", name, err))
					continue
				}
			}
			found = append(found, "link "+name)
		}
	}
	prefix := routerNSPrefix(cfg)
	names, err := nl.ListNamedNS(prefix)
	if err != nil {
		errs = append(errs, err)
	}
	for _, name := range names {
		if _, ok := parseID(strings.TrimPrefix(name, prefix)); !ok {
			continue
		}
		if remove {
			if err := nl.DeleteNamedNS(name); err != nil {
				errs = append(errs, err)
				continue
			}
		}
		found = append(found, "netns "+name)
	}
	tables, err := nftTables(cfg.NetNS, remove)
	if err != nil {
		errs = append(errs, err)
	}
	found = append(found, tables...)
	if err := errors.Join(errs...); err != nil {
		return found, fmt.Errorf("clean up node %q: %w", cfg.Name, err)
	}
	return found, nil
}

// kvnetLinks returns the names of kvnet's links in the namespace at nsPath,
// pod ports first, then bridges last: pod host ends, probe links,
// kvnet-owned links.
func kvnetLinks(nsPath string) ([]string, error) {
	h, err := nl.NewHandle(nsPath)
	if err != nil {
		return nil, err
	}
	defer h.Close()
	links, err := h.LinkList()
	if err != nil {
		return nil, fmt.Errorf("list links: %w", err)
	}
	var ports, owned, bridges []string
	for _, l := range links {
		a := l.Attrs()
		_, isVeth := l.(*netlink.Veth)
		prefix, _, ok := parseOwnedLink(a.Name)
		switch {
		case IsPodHostIf(a.Name), isVeth && portalias.Has(a.Alias), slices.Contains(probeLinks, a.Name):
			ports = append(ports, a.Name)
		case ok && prefix == bridgePrefix:
			bridges = append(bridges, a.Name)
		case ok:
			owned = append(owned, a.Name)
		}
	}
	return slices.Concat(ports, owned, bridges), nil
}

// nftTables lists (and with remove, deletes) the tables named "kvnet" of
// the namespace at nsPath, in every family kvnet uses or used.
func nftTables(nsPath string, remove bool) ([]string, error) {
	ns, err := nl.OpenNS(nsPath)
	if err != nil {
		return nil, err
	}
	defer ns.Close()
	conn, err := nftConn(int(ns))
	if err != nil {
		return nil, err
	}
	tables, err := conn.ListTables()
	if err != nil {
		return nil, fmt.Errorf("list nftables tables: %w", err)
	}
	var found []string
	for _, t := range tables {
		if t.Name != tableName || !slices.Contains(managedFamilies, t.Family) {
			continue
		}
		if remove {
			conn.DelTable(&nftables.Table{Family: t.Family, Name: t.Name})
		}
		found = append(found, "nftables table "+familyNames[t.Family]+" "+t.Name)
	}
	if remove && len(found) > 0 {
		if err := conn.Flush(); err != nil {
			return nil, fmt.Errorf("delete nftables tables %q: %w", tableName, err)
		}
	}
	return found, nil
}
