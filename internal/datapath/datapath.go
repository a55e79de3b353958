package datapath

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netns"

	"kvnet.io/kvnet/internal/nl"
)

// ErrPortNotFound matches (errors.Is) the error Apply returns when a Port's
// host interface does not exist yet (the CNI ADD has not run, or the pod is
// gone). Everything else in the state was applied; call Apply again once
// the interface exists.
var ErrPortNotFound = errors.New("port interface not found")

// Datapath programs one node's kvnet datapath. Its methods are safe for
// concurrent use; Apply calls are serialised.
type Datapath struct {
	cfg    NodeConfig
	mtu    int            // pod MTU: bridges, VXLAN devices, router veths
	nsPath string         // path of the node namespace, usable from any thread
	nsh    netns.NsHandle // keeps the node namespace open; its fd goes to nftables
	h      *nl.Handle     // netlink in the node namespace

	mu sync.Mutex // serialises Apply, Counters and Close; Close sets h to nil

	// rulesMu serialises writes of the nftables rules (Apply's and
	// Activate's) and guards activated; taken after mu.
	rulesMu   sync.Mutex
	activated map[string]string // Standby port activated early -> its MAC
	// nodeTables are the node namespace's chains and sets as the last
	// successful rules sync left them (see knownTables); guarded by
	// rulesMu. Activate's commits change the generation, so they are
	// read again after it.
	nodeTables *tablesCache
	// lastPolicies is what of the last applied State decided which
	// connections policies allow (see cutDenied); nil before the first;
	// guarded by mu.
	lastPolicies any
	// lastRouterPolicies are the router policies of the last Apply by
	// network ID (see cutRouterDenied); guarded by mu.
	lastRouterPolicies map[int]*routerPolicy

	// learning is the bridge ports' learning flag by interface index,
	// read once per Apply (nil until then); guarded by mu.
	learning map[int]bool

	// rulesSync is how long the last Apply took to write the node's
	// nftables rules; guarded by mu.
	rulesSync time.Duration
}

// RulesSyncDuration returns how long the last Apply took to bring the
// node's nftables rules (anti-spoofing, Services, network policies) up to
// date: read, compare, and write what changed.
func (d *Datapath) RulesSyncDuration() time.Duration {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.rulesSync
}

// New opens the datapath of the node described by cfg. It changes nothing
// on the node: the first Apply does.
func New(cfg NodeConfig) (*Datapath, error) {
	if !cfg.UnderlayIP.IsValid() || cfg.UnderlayIP.IsUnspecified() {
		return nil, fmt.Errorf("new datapath for node %q: invalid underlay IP %q", cfg.Name, cfg.UnderlayIP)
	}
	if cfg.UnderlayDev == "" {
		return nil, fmt.Errorf("new datapath for node %q: no underlay device", cfg.Name)
	}
	if cfg.MTU != 0 && (cfg.MTU < 576 || cfg.MTU > 65535) {
		return nil, fmt.Errorf("new datapath for node %q: MTU %d out of range 576-65535", cfg.Name, cfg.MTU)
	}
	if cfg.VXLANPort < 0 || cfg.VXLANPort > 65535 {
		return nil, fmt.Errorf("new datapath for node %q: VXLAN port %d out of range 1-65535", cfg.Name, cfg.VXLANPort)
	}
	nsh, err := nl.OpenNS(cfg.NetNS)
	if err != nil {
		return nil, fmt.Errorf("new datapath for node %q: %w", cfg.Name, err)
	}
	d := &Datapath{cfg: cfg, nsh: nsh, nsPath: cfg.NetNS}
	if d.nsPath == "" {
		// The namespace New ran in, reachable from any thread later.
		d.nsPath = fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), int(nsh))
	}
	ok := false
	defer func() {
		if !ok {
			_ = d.Close()
		}
	}()
	if d.h, err = nl.NewHandle(d.nsPath); err != nil {
		return nil, fmt.Errorf("new datapath for node %q: %w", cfg.Name, err)
	}
	dev, err := d.h.LinkByName(cfg.UnderlayDev)
	if err != nil {
		return nil, fmt.Errorf("new datapath for node %q: underlay device: %w", cfg.Name, err)
	}
	d.mtu = cfg.MTU
	if d.mtu == 0 {
		d.mtu = podMTUFor(dev.Attrs().MTU, cfg.UnderlayIP)
	}
	ok = true
	return d, nil
}

// MTU returns the pod MTU the datapath uses.
func (d *Datapath) MTU() int { return d.mtu }

// ErrClosed is returned by Apply and Counters after Close.
var ErrClosed = errors.New("datapath closed")

// Close releases the datapath's handles; it may be called more than once.
// It leaves the node as it is: to remove kvnet from the node, Apply an
// empty State first.
func (d *Datapath) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.h.Close()
	d.h = nil
	d.rulesMu.Lock()
	defer d.rulesMu.Unlock()
	if d.nsh.IsOpen() {
		return d.nsh.Close()
	}
	return nil
}

// Apply makes the node's kvnet datapath match s: it creates and updates
// what s lists and removes every kvnet-owned link, router namespace, FDB
// entry and nftables rule that s does not list. It reads the current state
// from the kernel each time and keeps none of its own, so it also cleans
// up after an earlier process. It is idempotent.
//
// Apply validates s first (errors match ErrInvalidState) and changes
// nothing if s is invalid. Otherwise it applies as much as it can and
// returns all failures joined; ports whose interface does not exist yet
// are reported with ErrPortNotFound. It returns once ports it attached
// forward traffic (bounded by a couple of seconds), so a VM that has just
// moved here is reachable as soon as Apply has run on every node.
//
// Order matters for safety: stale ports are detached first, then the
// nftables rules are programmed, then links are made, and only then are
// ports attached; a pod is never on a bridge without its rules.
func (d *Datapath) Apply(ctx context.Context, s State) error {
	byName, err := s.validate()
	if err != nil {
		return fmt.Errorf("apply datapath state on node %q: %w", d.cfg.Name, err)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.h == nil {
		return fmt.Errorf("apply datapath state on node %q: %w", d.cfg.Name, ErrClosed)
	}

	d.learning = nil // read again by the first port this Apply checks
	nets := slices.Clone(s.Networks)
	slices.SortFunc(nets, func(a, b Network) int { return cmp.Compare(a.ID, b.ID) })
	var errs []error
	// step records err and reports whether to go on (the context is live).
	step := func(err error) bool {
		if err != nil {
			errs = append(errs, err)
		}
		if ctx.Err() != nil {
			errs = append(errs, ctx.Err())
			return false
		}
		return true
	}
	result := func() error {
		if len(errs) == 0 {
			return nil
		}
		return fmt.Errorf("apply datapath state on node %q: %w", d.cfg.Name, errors.Join(errs...))
	}

	// Removal first: leftovers may hold names or VNIs the state needs, and
	// interfaces the state dropped must be off their bridge before their
	// rules go.
	if !step(d.removeStaleLinks(nets)) || !step(d.removeStaleRouters(nets)) ||
		!step(d.isolateStrayPorts(nets, s.Ports)) {
		return result()
	}
	// Rules before links: they match by interface name, so they can exist
	// first, and no port is ever attached without its anti-spoofing rules.
	if len(s.Policies) > 0 && !step(d.enablePolicyHooks()) {
		return result()
	}
	rulesStart := time.Now()
	rulesErr := d.syncNodeRules(s)
	d.rulesSync = time.Since(rulesStart)
	if !step(rulesErr) {
		return result()
	}
	if !step(d.cutDenied(s)) {
		return result()
	}
	if slices.ContainsFunc(nets, func(n Network) bool { return n.Primary }) {
		// The node forwards tenant egress from transit veths to the underlay.
		if !step(nl.SetSysctl(d.nsPath, "net/ipv4/ip_forward", "1")) {
			return result()
		}
	}
	routerPols := routerPolicies(s)
	for _, n := range nets {
		if !step(d.ensureNetwork(n, s.RemoteMACs)) {
			return result()
		}
		if n.HasRouter() && !step(d.ensureRouter(n, servicesOf(s.Services, n.Name), routerPols[n.Name])) {
			return result()
		}
	}
	if rulesErr == nil {
		// Fail closed: without their rules, ports stay detached and down.
		step(d.attachPorts(ctx, byName, s.Ports))
	}
	return result()
}

// syncNodeRules programs the node namespace's kvnet tables. A Standby
// port that Activate already opened stays open: the state s was planned
// before the guest's first frame reached its planner.
func (d *Datapath) syncNodeRules(s State) error {
	d.rulesMu.Lock()
	defer d.rulesMu.Unlock()
	conn, err := nftConn(int(d.nsh))
	if err != nil {
		return err
	}
	still := map[string]string{}
	s.Ports = slices.Clone(s.Ports)
	for i, p := range s.Ports {
		if p.Standby && d.activated[p.HostIfName] == p.MAC.String() {
			s.Ports[i].Standby = false
			still[p.HostIfName] = p.MAC.String()
		}
	}
	d.activated = still // the planner caught up with the others
	tables := nodeRulesPort(s, d.cfg.vxlanPort())
	known := d.nodeTables.valid(int(d.nsh))
	d.nodeTables = nil
	next, nextErr := knownTablesOf(tables)
	if known != nil && nextErr == nil {
		known.wants = next.chains
	}
	if err := syncTablesKnown(conn, tables, known); err != nil {
		return err
	}
	if gen, err := nftGenID(int(d.nsh)); err == nil && nextErr == nil {
		d.nodeTables = &tablesCache{known: next, gen: gen, at: time.Now()}
	} // else the next sync reads the kernel
	return nil
}

// Activate ends the Standby of port p (a live-migration target whose guest
// has just sent its first frame there) at once: it rewrites the port's own
// anti-spoofing chain to that of an ordinary Migrating port in one
// nftables transaction, without waiting for an Apply in progress, and
// later Applies of a state still planned with p on Standby keep it open.
// p is the port as the last applied state had it; the port must exist.
func (d *Datapath) Activate(p Port) error {
	if p.HostIfName == "" || len(p.MAC) != 6 {
		return fmt.Errorf("activate port %q on node %q: %w: host interface and a 6-byte MAC are required", p.HostIfName, d.cfg.Name, ErrInvalidState)
	}
	p.Standby = false
	d.rulesMu.Lock()
	defer d.rulesMu.Unlock()
	if !d.nsh.IsOpen() {
		return fmt.Errorf("activate port %q on node %q: %w", p.HostIfName, d.cfg.Name, ErrClosed)
	}
	conn, err := nftConn(int(d.nsh))
	if err != nil {
		return err
	}
	t := &nftables.Table{Family: nftables.TableFamilyBridge, Name: tableName}
	ch := &nftables.Chain{Table: t, Name: portChainName(p.HostIfName)}
	conn.FlushChain(ch)
	for _, r := range portRules(p) {
		conn.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: r.exprs, UserData: ruleUserData(r)})
	}
	if err := conn.Flush(); err != nil {
		return fmt.Errorf("activate port %q on node %q: rewrite chain %q: %w", p.HostIfName, d.cfg.Name, ch.Name, err)
	}
	if d.activated == nil {
		d.activated = map[string]string{}
	}
	d.activated[p.HostIfName] = p.MAC.String()
	return nil
}

// removeStaleLinks deletes kvnet-owned links of networks not in nets (and
// router veths of networks that are no longer primary). A deleted veth
// takes its peer in the router namespace with it.
func (d *Datapath) removeStaleLinks(nets []Network) error {
	links, err := d.h.LinkList()
	if err != nil {
		return err
	}
	want := map[int]Network{} // network ID -> network
	for _, n := range nets {
		want[n.ID] = n
	}
	var errs []error
	for _, l := range links {
		name := l.Attrs().Name
		prefix, id, owned := parseOwnedLink(name)
		if !owned {
			continue
		}
		n, keep := want[id]
		switch prefix {
		case gwPortPrefix:
			keep = keep && n.HasRouter()
		case transitPrefix:
			keep = keep && n.Primary
		case svcPortPrefix:
			keep = keep && n.Primary && len(n.ServiceAddrs) > 0
		case vxlanPrefix:
			// A Layer3 network's VXLAN device lives in its router.
			keep = keep && n.Physical == "" && n.Layer3 == nil
		case physPortPrefix, patchPortPrefix:
			keep = keep && n.Physical != ""
		case vlanPortPrefix:
			keep = keep && n.Physical != "" && n.VLAN != 0
		}
		if keep {
			continue
		}
		if prefix == bridgePrefix {
			// Pod ports would outlive the bridge as plain, up interfaces
			// in the node namespace; isolate them first.
			errs = append(errs, d.isolatePorts(links, l.Attrs().Index, nil))
		}
		if err := d.h.LinkDelByName(name); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// removeStaleRouters deletes this node's router namespaces of networks
// that are not primary networks in nets.
func (d *Datapath) removeStaleRouters(nets []Network) error {
	prefix := routerNSPrefix(d.cfg)
	names, err := nl.ListNamedNS(prefix)
	if err != nil {
		return err
	}
	want := map[int]bool{} // network ID -> has a router
	for _, n := range nets {
		want[n.ID] = n.HasRouter()
	}
	var errs []error
	for _, name := range names {
		id, ok := parseID(strings.TrimPrefix(name, prefix))
		if !ok || want[id] {
			continue
		}
		delete(d.lastRouterPolicies, id)
		if err := nl.DeleteNamedNS(name); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Counters returns the packet counts of kvnet's counted nftables rules on
// this node (node namespace and router namespaces), keyed by rule comment,
// e.g. "port pod1: spoofed IPv4 source". Comments are unique per node.
func (d *Datapath) Counters() (map[string]uint64, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.h == nil {
		return nil, fmt.Errorf("read counters of node %q: %w", d.cfg.Name, ErrClosed)
	}
	out := map[string]uint64{}
	conn, err := nftConn(int(d.nsh))
	if err != nil {
		return nil, err
	}
	if err := readCounters(conn, out); err != nil {
		return nil, fmt.Errorf("read counters of node %q: %w", d.cfg.Name, err)
	}
	names, err := nl.ListNamedNS(routerNSPrefix(d.cfg))
	if err != nil {
		return nil, err
	}
	for _, name := range names {
		if _, ok := parseID(strings.TrimPrefix(name, routerNSPrefix(d.cfg))); !ok {
			continue
		}
		if err := withNS(nl.NSPath(name), func(fd int) error {
			conn, err := nftConn(fd)
			if err != nil {
				return err
			}
			return readCounters(conn, out)
		}); err != nil {
			return nil, fmt.Errorf("read counters of router %q: %w", name, err)
		}
	}
	return out, nil
}

// withNS opens the namespace at path and passes its fd to f.
func withNS(path string, f func(fd int) error) error {
	h, err := nl.OpenNS(path)
	if err != nil {
		return err
	}
	defer h.Close()
	return f(int(h))
}

// servicesOf returns the services of network name, in a stable order.
func servicesOf(all []Service, name string) []Service {
	var out []Service
	for _, sv := range all {
		if sv.Network == name {
			out = append(out, sv)
		}
	}
	slices.SortFunc(out, func(a, b Service) int {
		return cmp.Or(cmp.Compare(a.Protocol, b.Protocol), a.VIP.Compare(b.VIP), cmp.Compare(a.Name, b.Name))
	})
	return out
}
