// Package dnsproxy is kvnet-node's DNS proxy for primary user-defined
// networks. The cluster DNS answers a headless Service, or a pod's
// hostname.subdomain name, with the pods' addresses on the cluster
// default network (their status.podIPs), which a pod on a primary UDN
// cannot reach. A network's router sends its pods' DNS queries to the
// proxy, which forwards them to the cluster DNS and rewrites each A and
// AAAA record holding the default-network address of a pod of the same
// network to that pod's address on the network. Other records pass
// unchanged.
//
// Rewrite works on the wire format in place (addresses keep their
// length), so nothing else of an answer (names, compression, EDNS, other
// record types) is ever re-encoded. The proxy serves UDP and TCP (RFC
// 7766 framing) on each listening address; it answers only the
// addresses a network names as its clients.
package dnsproxy

import (
	"encoding/binary"
	"fmt"
	"net/netip"
)

// Wire format (RFC 1035 section 4.1).
const (
	headerLen = 12
	typeA     = 1
	typeAAAA  = 28
	classINET = 1
)

// Rewrite replaces, in msg (a DNS message), the address of every A and
// AAAA record of class IN for which to returns an address of the same
// family, and returns how many it replaced. A message it cannot walk
// (truncated, a bad name) is an error and is left unchanged.
func Rewrite(msg []byte, to func(netip.Addr) (netip.Addr, bool)) (int, error) {
	if len(msg) < headerLen {
		return 0, fmt.Errorf("dns message of %d bytes: shorter than its %d-byte header", len(msg), headerLen)
	}
	qd := int(binary.BigEndian.Uint16(msg[4:]))
	rrs := int(binary.BigEndian.Uint16(msg[6:])) + int(binary.BigEndian.Uint16(msg[8:])) + int(binary.BigEndian.Uint16(msg[10:]))
	off := headerLen
	var err error
	for i := range qd {
		if off, err = skipName(msg, off); err != nil {
			return 0, fmt.Errorf("dns question %d: %w", i, err)
		}
		if off += 4; off > len(msg) {
			return 0, fmt.Errorf("dns question %d: truncated", i)
		}
	}
	type patch struct {
		at   int
		addr netip.Addr
	}
	var patches []patch
	for i := range rrs {
		if off, err = skipName(msg, off); err != nil {
			return 0, fmt.Errorf("dns record %d: %w", i, err)
		}
		if off+10 > len(msg) {
			return 0, fmt.Errorf("dns record %d: truncated header", i)
		}
		typ := binary.BigEndian.Uint16(msg[off:])
		class := binary.BigEndian.Uint16(msg[off+2:])
		rdlen := int(binary.BigEndian.Uint16(msg[off+8:]))
		off += 10
		if off+rdlen > len(msg) {
			return 0, fmt.Errorf("dns record %d: data of %d bytes past the message's end", i, rdlen)
		}
		data := msg[off : off+rdlen]
		off += rdlen
		if class != classINET {
			continue
		}
		switch {
		case typ == typeA && rdlen == 4:
			if b, ok := to(netip.AddrFrom4([4]byte(data))); ok && b.Is4() {
				patches = append(patches, patch{off - rdlen, b})
			}
		case typ == typeAAAA && rdlen == 16:
			if b, ok := to(netip.AddrFrom16([16]byte(data))); ok && b.Is6() && !b.Is4In6() {
				patches = append(patches, patch{off - rdlen, b})
			}
		}
	}
	for _, p := range patches {
		copy(msg[p.at:], p.addr.AsSlice())
	}
	return len(patches), nil
}

// skipName returns the offset past the (possibly compressed) name at off.
// It never follows a pointer: a pointer ends a name.
func skipName(msg []byte, off int) (int, error) {
	for {
		if off >= len(msg) {
			return 0, fmt.Errorf("name at offset %d: truncated", off)
		}
		l := int(msg[off])
		switch l & 0xC0 {
		case 0x00:
			if l == 0 {
				return off + 1, nil
			}
			off += 1 + l
		case 0xC0:
			if off+2 > len(msg) {
				return 0, fmt.Errorf("name pointer at offset %d: truncated", off)
			}
			return off + 2, nil
		default:
			return 0, fmt.Errorf("name at offset %d: label type %#x is not supported", off, l&0xC0)
		}
	}
}
