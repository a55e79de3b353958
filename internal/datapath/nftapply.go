package datapath

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"sync/atomic"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// managedFamilies are the families in which a table named kvnet is ours:
// any of them not wanted by the state is deleted, which also removes
// tables left by older kvnet versions that used ip/ip6 tables.
var managedFamilies = []nftables.TableFamily{
	nftables.TableFamilyBridge, nftables.TableFamilyINet,
	nftables.TableFamilyIPv4, nftables.TableFamilyIPv6, nftables.TableFamilyARP,
}

// nftConn opens an nftables connection in the namespace of fd.
func nftConn(nsFd int) (*nftables.Conn, error) {
	c, err := nftables.New(nftables.WithNetNSFd(nsFd), nftables.WithSockOptions(largeBuffers))
	if err != nil {
		return nil, fmt.Errorf("open nftables connection: %w", err)
	}
	return c, nil
}

// nftSocketBuffer is the send and receive buffer of nftables sockets. One
// Apply is one transaction: a router's first Apply with 500 Services sends
// about 2,000 messages (a chain and 3 rules per Service, and the map) and
// gets an acknowledgement for each (with one rule per endpoint and no
// per-Service chains, it was 1.3 MB in 1,500 messages), which overflow
// the default buffers (about 208 KiB) from some 30 Services on (the kernel
// commits, but the reply is lost and Apply fails) and from about 100 on
// the batch cannot even be sent (BenchmarkApplyServices).
const nftSocketBuffer = 32 << 20

// largeBuffers raises an nftables socket's buffers to nftSocketBuffer
// (forced past net.core.[rw]mem_max: kvnet-node runs privileged).
func largeBuffers(c *netlink.Conn) error {
	if err := c.SetReadBuffer(nftSocketBuffer); err != nil {
		return fmt.Errorf("nftables socket receive buffer: %w", err)
	}
	if err := c.SetWriteBuffer(nftSocketBuffer); err != nil {
		return fmt.Errorf("nftables socket send buffer: %w", err)
	}
	return nil
}

// syncTables makes the kvnet tables reachable through conn match want, in
// one atomic transaction. It rewrites only chains whose rules differ (so
// counters of unchanged chains survive an Apply), adds missing chains and
// deletes chains and tables the state no longer has.
func syncTables(conn *nftables.Conn, want []nftTable) error {
	return syncTablesKnown(conn, want, nil)
}

// syncTablesKnown is syncTables trusting known (see knownTables) for
// the rules of the chains and the elements of the sets it lists instead
// of reading them; nil reads everything.
func syncTablesKnown(conn *nftables.Conn, want []nftTable, known *knownTables) error {
	tables, err := conn.ListTables()
	if err != nil {
		return fmt.Errorf("list nftables tables: %w", err)
	}
	have := map[nftables.TableFamily]*nftables.Table{} // family -> existing kvnet table
	for _, t := range tables {
		if t.Name == tableName {
			have[t.Family] = t
		}
	}
	wanted := map[nftables.TableFamily]bool{} // family -> in want
	for _, wt := range want {
		wanted[wt.family] = true
	}
	for _, fam := range managedFamilies {
		if t := have[fam]; t != nil && !wanted[fam] {
			conn.DelTable(t)
		}
	}
	for _, wt := range want {
		if err := syncTable(conn, wt, have[wt.family] != nil, known); err != nil {
			return err
		}
	}
	if err := conn.Flush(); err != nil {
		return fmt.Errorf("program nftables tables %q: %w", tableName, err)
	}
	return nil
}

// syncTable queues the changes that make one table match wt.
func syncTable(conn *nftables.Conn, wt nftTable, exists bool, known *knownTables) error {
	t := &nftables.Table{Family: wt.family, Name: tableName}
	haveChains := map[string]*nftables.Chain{} // chain name -> existing chain
	haveMaps := map[string]*nftables.Set{}     // map name -> existing named set or map
	if exists {
		sets, err := conn.GetSets(t)
		if err != nil {
			return fmt.Errorf("list sets of table %s %q: %w", familyNames[wt.family], tableName, err)
		}
		for _, s := range sets {
			if !s.Anonymous {
				haveMaps[s.Name] = s
			}
		}
		for _, wm := range wt.vmaps {
			if hm := haveMaps[wm.name]; hm != nil && !sameVMapSpec(hm) {
				// Not a map kvnet makes (an older kvnet's): rules may
				// refer to it, so the table starts afresh.
				conn.DelTable(t)
				exists, haveMaps = false, map[string]*nftables.Set{}
				break
			}
		}
	}
	if exists {
		chains, err := conn.ListChainsOfTableFamily(wt.family)
		if err != nil {
			return fmt.Errorf("list chains of table %s %q: %w", familyNames[wt.family], tableName, err)
		}
		for _, c := range chains {
			if c.Table.Name == tableName {
				haveChains[c.Name] = c
			}
		}
	} else {
		conn.AddTable(t)
	}

	// Order inside the transaction: create every missing chain first (jump
	// rules and map elements need their target), then update maps
	// (deleting stale elements before adding new ones: one may replace
	// another of the same key), then rewrite rules, then flush chains that
	// are no longer wanted, delete maps that no rule refers to any more and
	// last the chains that nothing jumps to any more.
	type rewrite struct {
		chain *nftables.Chain
		rules []nftRule
		flush bool
	}
	var rewrites []rewrite
	wantChains := map[string]bool{} // chain name -> wanted
	for _, wc := range wt.chains {
		wantChains[wc.name] = true
		hc := haveChains[wc.name]
		c := chainSpec(t, wc)
		switch {
		case hc == nil:
			conn.AddChain(c)
			rewrites = append(rewrites, rewrite{chain: c, rules: wc.rules})
		case !sameChainSpec(hc, wc):
			// A base chain's hook or policy changed (an older kvnet): its
			// rules go with it and no rule refers to a base chain.
			conn.FlushChain(hc)
			conn.DelChain(hc)
			conn.AddChain(c)
			rewrites = append(rewrites, rewrite{chain: c, rules: wc.rules})
		default:
			same, err := known.sameChain(wt.family, wc)
			if err == nil && same == nil {
				var current []*nftables.Rule
				if current, err = conn.GetRules(t, hc); err != nil {
					return fmt.Errorf("list rules of chain %q: %w", wc.name, err)
				}
				var s bool
				s, err = sameRules(wt.family, current, wc.rules)
				same = &s
			}
			if err != nil {
				return err
			}
			if !*same {
				rewrites = append(rewrites, rewrite{chain: c, rules: wc.rules, flush: true})
			}
		}
	}
	wantMaps := map[string]bool{} // map name -> wanted
	for _, wm := range wt.vmaps {
		wantMaps[wm.name] = true
		if err := syncVMap(conn, t, wm, haveMaps[wm.name]); err != nil {
			return err
		}
	}
	for _, ws := range wt.sets {
		wantMaps[ws.name] = true
		if err := syncSet(conn, t, ws, haveMaps[ws.name], known.set(wt.family, ws.name)); err != nil {
			return err
		}
	}
	for _, rw := range rewrites {
		if rw.flush {
			conn.FlushChain(rw.chain)
		}
		for _, r := range rw.rules {
			conn.AddRule(&nftables.Rule{Table: t, Chain: rw.chain, Exprs: r.exprs, UserData: ruleUserData(r)})
		}
	}
	var stale []*nftables.Chain
	for name, hc := range haveChains {
		if !wantChains[name] {
			conn.FlushChain(hc)
			stale = append(stale, hc)
		}
	}
	for name, hm := range haveMaps {
		if !wantMaps[name] {
			conn.DelSet(hm)
		}
	}
	for _, hc := range stale {
		conn.DelChain(hc)
	}
	return nil
}

// vmapSet returns the nftables map for wm in table t.
//
// Its ID (which names a set within one transaction) comes from setIDs:
// given none, google/nftables' AddSet takes one from a package variable it
// increments under the connection's own lock only, a data race between
// two connections (two routers programmed at once).
func vmapSet(t *nftables.Table, wm nftVMap) *nftables.Set {
	return &nftables.Set{Table: t, Name: wm.name, ID: setIDs.Add(1), IsMap: true, Concatenation: true,
		KeyType: wm.keyType, DataType: nftables.TypeVerdict}
}

// setIDs numbers the sets kvnet adds, see vmapSet.
var setIDs atomic.Uint32

// sameVMapSpec reports whether the existing set hm is a verdict map with a
// concatenated key, as kvnet makes them. (google/nftables v0.3.0 decodes a
// verdict map's data type into KeyType, and so loses the key type: the
// map's name stands for it, see nftVMap.)
func sameVMapSpec(hm *nftables.Set) bool {
	return hm.IsMap && hm.Concatenation && hm.KeyType.Name == nftables.TypeVerdict.Name &&
		!hm.Interval && !hm.Constant && !hm.HasTimeout && !hm.Dynamic
}

// syncVMap queues the changes that make map hm (nil: missing) hold
// exactly wm's elements: only elements that differ (in target chain or
// comment) are deleted and added again.
func syncVMap(conn *nftables.Conn, t *nftables.Table, wm nftVMap, hm *nftables.Set) error {
	want := make([]nftables.SetElement, 0, len(wm.elems))
	for _, e := range wm.elems {
		want = append(want, nftables.SetElement{Key: e.key, Comment: e.comment,
			VerdictData: &expr.Verdict{Kind: expr.VerdictJump, Chain: e.chain}})
	}
	if hm == nil {
		if err := conn.AddSet(vmapSet(t, wm), want); err != nil {
			return fmt.Errorf("add map %q: %w", wm.name, err)
		}
		return nil
	}
	have, err := conn.GetSetElements(hm)
	if err != nil {
		return fmt.Errorf("list elements of map %q: %w", wm.name, err)
	}
	haveByKey := make(map[string]nftables.SetElement, len(have))
	for _, he := range have {
		haveByKey[string(he.Key)] = he
	}
	var add, del []nftables.SetElement
	for _, we := range want {
		he, ok := haveByKey[string(we.Key)]
		delete(haveByKey, string(we.Key))
		if ok && sameVMapElem(he, we) {
			continue
		}
		if ok {
			del = append(del, nftables.SetElement{Key: he.Key})
		}
		add = append(add, we)
	}
	for _, he := range haveByKey {
		del = append(del, nftables.SetElement{Key: he.Key})
	}
	s := vmapSet(t, wm)
	if len(del) > 0 {
		if err := conn.SetDeleteElements(s, del); err != nil {
			return fmt.Errorf("delete elements of map %q: %w", wm.name, err)
		}
	}
	if len(add) > 0 {
		if err := conn.SetAddElements(s, add); err != nil {
			return fmt.Errorf("add elements to map %q: %w", wm.name, err)
		}
	}
	return nil
}

// sameVMapElem reports whether the kernel's element he (as read back: its
// verdict still encoded, in Val) equals we.
func sameVMapElem(he, we nftables.SetElement) bool {
	if he.Comment != we.Comment {
		return false
	}
	ad, err := netlink.NewAttributeDecoder(he.Val)
	if err != nil {
		return false
	}
	var code uint32
	var chain string
	for ad.Next() {
		switch ad.Type() {
		case unix.NFTA_VERDICT_CODE:
			code = binary.BigEndian.Uint32(ad.Bytes())
		case unix.NFTA_VERDICT_CHAIN:
			chain = ad.String()
		}
	}
	return ad.Err() == nil && int32(code) == int32(we.VerdictData.Kind) && chain == we.VerdictData.Chain
}

// chainSpec returns the nftables chain for wc in table t.
func chainSpec(t *nftables.Table, wc nftChain) *nftables.Chain {
	c := &nftables.Chain{Name: wc.name, Table: t}
	if b := wc.base; b != nil {
		hook, prio, policy := b.hook, b.priority, b.policy
		c.Type, c.Hooknum, c.Priority, c.Policy = b.typ, &hook, &prio, &policy
	}
	return c
}

// sameChainSpec reports whether the existing chain hc is attached like wc.
func sameChainSpec(hc *nftables.Chain, wc nftChain) bool {
	if wc.base == nil || hc.Hooknum == nil {
		return wc.base == nil && hc.Hooknum == nil
	}
	return hc.Type == wc.base.typ && *hc.Hooknum == wc.base.hook &&
		hc.Priority != nil && *hc.Priority == wc.base.priority &&
		hc.Policy != nil && *hc.Policy == wc.base.policy
}

func ruleUserData(r nftRule) []byte {
	if r.comment == "" {
		return nil
	}
	return userdata.AppendString(nil, userdata.TypeComment, r.comment)
}

// sameRules reports whether the kernel's rules equal want, comparing the
// netlink encoding of every expression (with counter values zeroed) and
// the comment.
func sameRules(fam nftables.TableFamily, have []*nftables.Rule, want []nftRule) (bool, error) {
	if len(have) != len(want) {
		return false, nil
	}
	for i, hr := range have {
		hk, err := exprsKey(fam, hr.Exprs)
		if err != nil {
			return false, err
		}
		wk, err := exprsKey(fam, want[i].exprs)
		if err != nil {
			return false, err
		}
		hc, _ := userdata.GetString(hr.UserData, userdata.TypeComment)
		if !bytes.Equal(hk, wk) || hc != want[i].comment {
			return false, nil
		}
	}
	return true, nil
}

// exprsKey encodes exprs for comparison, each in canonical form
// (canonicalExpr), so that an expression and its kernel read-back agree.
func exprsKey(fam nftables.TableFamily, exprs []expr.Any) ([]byte, error) {
	var key []byte
	for _, e := range exprs {
		b, err := expr.Marshal(byte(fam), canonicalExpr(e))
		if err != nil {
			return nil, fmt.Errorf("encode nftables expression %T: %w", e, err)
		}
		key = binary.BigEndian.AppendUint32(key, uint32(len(b)))
		key = append(key, b...)
	}
	return key, nil
}

// canonicalExpr returns e in the form in which an expression kvnet
// programs and the kernel's read-back of it compare equal:
//   - a counter without its values;
//   - a ct statement (ct mark set) without its source register: the kernel
//     dumps NFTA_CT_SREG, but google/nftables v0.3.0 decodes only
//     NFTA_CT_DREG, so a read-back `ct set` has neither register nor
//     SourceRegister (kvnet sets ct keys from register 1 only);
//   - a NAT range without a maximum register reads as the minimum one,
//     as the kernel fills it in (nft_nat_init) and dumps it.
//
// Without the last two, no rule with `ct mark set` or `dnat` ever compared
// equal, and every Apply rewrote the router's service chains.
func canonicalExpr(e expr.Any) expr.Any {
	switch e := e.(type) {
	case *expr.Counter:
		return &expr.Counter{}
	case *expr.Ct:
		if e.SourceRegister || e.Register == 0 {
			return &expr.Ct{Key: e.Key, Direction: e.Direction}
		}
	case *expr.NAT:
		c := *e
		if c.RegAddrMin != 0 && c.RegAddrMax == 0 {
			c.RegAddrMax = c.RegAddrMin
		}
		if c.RegProtoMin != 0 && c.RegProtoMax == 0 {
			c.RegProtoMax = c.RegProtoMin
		}
		return &c
	}
	return e
}

// readCounters adds the packet counts of the counted kvnet rules reachable
// through conn to out, keyed by rule comment.
func readCounters(conn *nftables.Conn, out map[string]uint64) error {
	tables, err := conn.ListTables()
	if err != nil {
		return fmt.Errorf("list nftables tables: %w", err)
	}
	for _, t := range tables {
		if t.Name != tableName {
			continue
		}
		chains, err := conn.ListChainsOfTableFamily(t.Family)
		if err != nil {
			return fmt.Errorf("list chains of table %s %q: %w", familyNames[t.Family], tableName, err)
		}
		for _, c := range chains {
			if c.Table.Name != tableName {
				continue
			}
			rules, err := conn.GetRules(t, c)
			if err != nil {
				return fmt.Errorf("list rules of chain %q: %w", c.Name, err)
			}
			for _, r := range rules {
				comment, _ := userdata.GetString(r.UserData, userdata.TypeComment)
				for _, e := range r.Exprs {
					if ctr, ok := e.(*expr.Counter); ok && comment != "" {
						out[comment] += ctr.Packets
					}
				}
			}
		}
	}
	return nil
}
