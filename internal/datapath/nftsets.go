package datapath

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"time"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// This file syncs named address sets (nftSet, the policies' peer sets):
// only elements that differ are added or deleted.

// addrSet returns the nftables set for ws in table t (see vmapSet for the
// ID).
func addrSet(t *nftables.Table, ws nftSet) *nftables.Set {
	return &nftables.Set{Table: t, Name: ws.name, ID: setIDs.Add(1), KeyType: ws.keyType,
		Comment: ws.comment, HasTimeout: ws.timeout > 0, Dynamic: ws.timeout > 0, Timeout: ws.timeout}
}

// sameSetSpec reports whether the existing set hs is a set of ws's key
// type, as kvnet makes them: plain, or dynamic with ws's timeout.
func sameSetSpec(hs *nftables.Set, ws nftSet) bool {
	dynamic := ws.timeout > 0
	return !hs.IsMap && !hs.Interval && !hs.Concatenation && !hs.Constant && hs.HasTimeout == dynamic &&
		hs.Dynamic == dynamic && (!dynamic || hs.Timeout == ws.timeout) && hs.KeyType.Name == ws.keyType.Name
}

// syncSet queues the changes that make set hs (nil: missing) hold exactly
// ws's elements. A set of another kind under ws's name is replaced (its
// referring rules are rewritten in the same transaction).
//
// known, when not nil, holds the set's element keys as the last sync
// wrote them, which the kernel still has (see knownTables): they are not
// read.
func syncSet(conn *nftables.Conn, t *nftables.Table, ws nftSet, hs *nftables.Set, known map[string]bool) error {
	if ws.timeout > 0 && hs != nil && sameSetSpec(hs, ws) {
		return nil // a dynamic set: its rules fill it, and its elements time out
	}
	if hs != nil && known != nil && len(known) == len(ws.elems) && sameSetSpec(hs, ws) &&
		!slices.ContainsFunc(ws.elems, func(a netip.Addr) bool { return !known[string(a.AsSlice())] }) {
		return nil // as the last sync left it
	}
	want := make([]nftables.SetElement, 0, len(ws.elems))
	for _, a := range ws.elems {
		want = append(want, nftables.SetElement{Key: a.AsSlice()})
	}
	if hs != nil && !sameSetSpec(hs, ws) {
		conn.DelSet(hs)
		hs = nil
	}
	if hs == nil {
		if err := conn.AddSet(addrSet(t, ws), want); err != nil {
			return fmt.Errorf("add set %q: %w", ws.name, err)
		}
		return nil
	}
	haveKeys := maps.Clone(known)
	if haveKeys == nil {
		have, err := conn.GetSetElements(hs)
		if err != nil {
			return fmt.Errorf("list elements of set %q: %w", ws.name, err)
		}
		haveKeys = make(map[string]bool, len(have))
		for _, he := range have {
			haveKeys[string(he.Key)] = true
		}
	}
	var add, del []nftables.SetElement
	for _, we := range want {
		if !haveKeys[string(we.Key)] {
			add = append(add, we)
		}
		delete(haveKeys, string(we.Key))
	}
	for k := range haveKeys {
		del = append(del, nftables.SetElement{Key: []byte(k)})
	}
	s := addrSet(t, ws)
	if len(del) > 0 {
		if err := conn.SetDeleteElements(s, del); err != nil {
			return fmt.Errorf("delete elements of set %q: %w", ws.name, err)
		}
	}
	if len(add) > 0 {
		if err := conn.SetAddElements(s, add); err != nil {
			return fmt.Errorf("add elements to set %q: %w", ws.name, err)
		}
	}
	return nil
}

// setText renders ws for golden files.
func setText(ws nftSet) string {
	s := fmt.Sprintf("\tset %s {\n\t\ttype %s\n", ws.name, ws.keyType.Name)
	if ws.timeout > 0 {
		s += fmt.Sprintf("\t\tflags dynamic,timeout\n\t\ttimeout %ds\n", int64(ws.timeout/time.Second))
	}
	s += fmt.Sprintf("\t\tcomment %q\n", ws.comment)
	if len(ws.elems) > 0 {
		s += "\t\telements = { "
		for i, a := range ws.elems {
			if i > 0 {
				s += ", "
			}
			s += a.String()
		}
		s += " }\n"
	}
	return s + "\t}\n\n"
}

// knownTables holds the rules of the chains and the elements of the
// sets the last rules sync wrote in one namespace. Reading back every
// chain and a thousand policy sets costs as many netlink round trips per
// Apply (about 0.3 s with 1,000 policies on 100 ports), so the node
// namespace's are remembered, and trusted while the namespace's nftables
// generation is the one the last sync's transaction left (nothing
// committed since) and for at most knownTablesTTL.
type knownTables struct {
	sets   map[string]map[string]bool // tableKey -> element keys
	chains map[string][]byte          // tableKey -> rulesKey
	// wants, during a sync, are the chains of the tables being synced
	// (tableKey -> rulesKey), computed once for the sync and the next.
	wants map[string][]byte
}

// knownTablesTTL bounds how long knownTables are trusted without reading
// the kernel: a commit between a sync's transaction and its reading of
// the generation right after would otherwise go unseen.
const knownTablesTTL = 30 * time.Second

// tableKey keys a chain or set of a table family in knownTables.
func tableKey(fam nftables.TableFamily, name string) string { return fmt.Sprintf("%d/%s", fam, name) }

// set returns the known element keys of set name, or nil.
func (k *knownTables) set(fam nftables.TableFamily, name string) map[string]bool {
	if k == nil {
		return nil
	}
	return k.sets[tableKey(fam, name)]
}

// sameChain reports whether the known rules of wc's chain are wc's, or
// nil when they are not known. k.wants, when set, holds wc's encoding
// (knownTablesOf of the tables being synced).
func (k *knownTables) sameChain(fam nftables.TableFamily, wc nftChain) (*bool, error) {
	if k == nil {
		return nil, nil
	}
	have, ok := k.chains[tableKey(fam, wc.name)]
	if !ok {
		return nil, nil
	}
	want, ok := k.wants[tableKey(fam, wc.name)]
	if !ok {
		var err error
		if want, err = rulesKey(fam, wc.rules); err != nil {
			return nil, err
		}
	}
	same := bytes.Equal(have, want)
	return &same, nil
}

// rulesKey encodes rules (expressions in canonical form and comments).
func rulesKey(fam nftables.TableFamily, rules []nftRule) ([]byte, error) {
	var key []byte
	for _, r := range rules {
		k, err := exprsKey(fam, r.exprs)
		if err != nil {
			return nil, err
		}
		key = binary.BigEndian.AppendUint32(key, uint32(len(k)))
		key = append(key, k...)
		key = binary.BigEndian.AppendUint32(key, uint32(len(r.comment)))
		key = append(key, r.comment...)
	}
	return key, nil
}

// knownTablesOf returns the rules and elements of tables.
func knownTablesOf(tables []nftTable) (*knownTables, error) {
	out := &knownTables{sets: map[string]map[string]bool{}, chains: map[string][]byte{}}
	for _, t := range tables {
		for _, s := range t.sets {
			keys := make(map[string]bool, len(s.elems))
			for _, a := range s.elems {
				keys[string(a.AsSlice())] = true
			}
			out.sets[tableKey(t.family, s.name)] = keys
		}
		for _, c := range t.chains {
			k, err := rulesKey(t.family, c.rules)
			if err != nil {
				return nil, err
			}
			out.chains[tableKey(t.family, c.name)] = k
		}
	}
	return out, nil
}

// tablesCache is knownTables with the generation and time they hold for.
type tablesCache struct {
	known *knownTables
	gen   uint32
	at    time.Time
}

// valid returns the cached tables if the namespace of fd is still at the
// cached generation and the cache is young enough, else nil.
func (c *tablesCache) valid(fd int) *knownTables {
	if c == nil || c.known == nil || time.Since(c.at) > knownTablesTTL {
		return nil
	}
	if gen, err := nftGenID(fd); err != nil || gen != c.gen {
		return nil
	}
	return c.known
}

// nftGenID returns the nftables generation of the namespace of fd, which
// every committed transaction advances (NFT_MSG_GETGEN).
func nftGenID(fd int) (uint32, error) {
	conn, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: fd})
	if err != nil {
		return 0, fmt.Errorf("nftables generation: %w", err)
	}
	defer conn.Close()
	msgs, err := conn.Execute(netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETGEN), Flags: netlink.Request},
		Data:   []byte{unix.AF_UNSPEC, unix.NFNETLINK_V0, 0, 0}, // nfgenmsg
	})
	if err != nil {
		return 0, fmt.Errorf("nftables generation: %w", err)
	}
	if len(msgs) != 1 || len(msgs[0].Data) < 4 {
		return 0, fmt.Errorf("nftables generation: %d replies", len(msgs))
	}
	ad, err := netlink.NewAttributeDecoder(msgs[0].Data[4:])
	if err != nil {
		return 0, fmt.Errorf("nftables generation: %w", err)
	}
	ad.ByteOrder = binary.BigEndian
	for ad.Next() {
		if ad.Type() == unix.NFTA_GEN_ID {
			return ad.Uint32(), nil
		}
	}
	return 0, fmt.Errorf("nftables generation: no generation ID (%v)", ad.Err())
}
