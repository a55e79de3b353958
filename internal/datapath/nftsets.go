package datapath

import (
	"fmt"

	"github.com/google/nftables"
)

// This file syncs named address sets (nftSet, the policies' peer sets):
// only elements that differ are added or deleted.

// addrSet returns the nftables set for ws in table t (see vmapSet for the
// ID).
func addrSet(t *nftables.Table, ws nftSet) *nftables.Set {
	return &nftables.Set{Table: t, Name: ws.name, ID: setIDs.Add(1), KeyType: ws.keyType,
		Comment: ws.comment}
}

// sameSetSpec reports whether the existing set hs is a plain set of ws's
// key type, as kvnet makes them.
func sameSetSpec(hs *nftables.Set, ws nftSet) bool {
	return !hs.IsMap && !hs.Interval && !hs.Concatenation && !hs.Constant && !hs.HasTimeout &&
		!hs.Dynamic && hs.KeyType.Name == ws.keyType.Name
}

// syncSet queues the changes that make set hs (nil: missing) hold exactly
// ws's elements. A set of another kind under ws's name is replaced (its
// referring rules are rewritten in the same transaction).
func syncSet(conn *nftables.Conn, t *nftables.Table, ws nftSet, hs *nftables.Set) error {
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
	have, err := conn.GetSetElements(hs)
	if err != nil {
		return fmt.Errorf("list elements of set %q: %w", ws.name, err)
	}
	haveKeys := make(map[string]bool, len(have))
	for _, he := range have {
		haveKeys[string(he.Key)] = true
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
	s := fmt.Sprintf("\tset %s {\n\t\ttype %s\n\t\tcomment %q\n", ws.name, ws.keyType.Name, ws.comment)
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
