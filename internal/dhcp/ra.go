package dhcp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"time"
)

// ICMPv6 neighbour discovery message types and options (RFC 4861 §4).
const (
	icmp6RouterSolicitation  = 133
	icmp6RouterAdvertisement = 134

	ndOptSourceLinkAddr = 1
	ndOptPrefixInfo     = 3
	ndOptMTU            = 5

	raHeaderLen = 16 // type, code, checksum, hop limit, flags, lifetime, reachable, retrans
	rsHeaderLen = 8  // type, code, checksum, reserved

	raFlagManaged    = 0x80
	raFlagOther      = 0x40
	prefixFlagOnLink = 0x80
	prefixFlagAuto   = 0x40
)

// Router advertisement timing. Guests solicit at boot and otherwise wait
// for unsolicited advertisements, so the server sends a first burst at
// growing intervals (1 s, 2 s, 4 s, ...) up to RAInterval, then every
// RAInterval.
const (
	// DefaultRAInterval is the interval of unsolicited advertisements
	// (RFC 4861 allows 4 s to 1800 s; radvd defaults to 600 s). A guest
	// that missed every solicited one gets its default route within it.
	DefaultRAInterval = time.Minute
	// DefaultRouterLifetime is how long a guest keeps the gateway as its
	// default router without hearing from it: 30 minutes, three times
	// radvd's default interval, as RFC 4861 suggests.
	DefaultRouterLifetime = 30 * time.Minute
	// raPrefixLifetime is the lifetime of the on-link prefixes.
	raPrefixLifetime = 24 * time.Hour
)

// Errors of the neighbour discovery parsers.
var (
	errNotRA      = errors.New("not a router advertisement")
	errNotRS      = errors.New("not a router solicitation")
	errShortND    = errors.New("message too short")
	errBadNDOpt   = errors.New("malformed option")
	errBadPrefix  = errors.New("malformed prefix information")
	errBadLLAddr  = errors.New("malformed link-layer address option")
	errRAOverflow = errors.New("router advertisement too large")
)

// routerAdvert is a router advertisement as kvnet sends and parses it
// (RFC 4861 §4.2). Options other than those below are skipped by the
// parser and never sent.
type routerAdvert struct {
	HopLimit       uint8
	Managed, Other bool
	// RouterLifetime is whole seconds; 0 means "not a default router".
	RouterLifetime time.Duration
	SourceMAC      net.HardwareAddr // option 1; nil omits it
	MTU            uint32           // option 5; 0 omits it
	Prefixes       []raPrefix       // option 3, one each
}

// raPrefix is one prefix information option (RFC 4861 §4.6.2).
type raPrefix struct {
	Prefix                   netip.Prefix
	OnLink, Autonomous       bool
	ValidLifetime, Preferred time.Duration // whole seconds
}

// secs converts d to the 32-bit seconds of an ND field, saturating.
func secs(d time.Duration) uint32 {
	s := d / time.Second
	if s < 0 {
		return 0
	}
	if s > 0xffffffff {
		return 0xffffffff
	}
	return uint32(s)
}

// marshal encodes ra as an ICMPv6 message with a zero checksum (the kernel
// computes it for ICMPv6 sockets).
func (ra *routerAdvert) marshal() ([]byte, error) {
	b := make([]byte, raHeaderLen, raHeaderLen+8+8+32*len(ra.Prefixes))
	b[0] = icmp6RouterAdvertisement
	b[4] = ra.HopLimit
	if ra.Managed {
		b[5] |= raFlagManaged
	}
	if ra.Other {
		b[5] |= raFlagOther
	}
	rl := ra.RouterLifetime / time.Second
	if rl < 0 || rl > 0xffff {
		return nil, fmt.Errorf("router lifetime %s: out of range 0-65535s", ra.RouterLifetime)
	}
	binary.BigEndian.PutUint16(b[6:8], uint16(rl))
	if ra.SourceMAC != nil {
		if len(ra.SourceMAC) != 6 {
			return nil, fmt.Errorf("source link-layer address %q: %w", ra.SourceMAC, errBadLLAddr)
		}
		b = append(b, ndOptSourceLinkAddr, 1)
		b = append(b, ra.SourceMAC...)
	}
	if ra.MTU != 0 {
		b = append(b, ndOptMTU, 1, 0, 0)
		b = binary.BigEndian.AppendUint32(b, ra.MTU)
	}
	for _, p := range ra.Prefixes {
		if !p.Prefix.IsValid() || !p.Prefix.Addr().Is6() || p.Prefix.Addr().Is4In6() {
			return nil, fmt.Errorf("prefix %q: %w", p.Prefix, errBadPrefix)
		}
		var flags byte
		if p.OnLink {
			flags |= prefixFlagOnLink
		}
		if p.Autonomous {
			flags |= prefixFlagAuto
		}
		b = append(b, ndOptPrefixInfo, 4, byte(p.Prefix.Bits()), flags)
		b = binary.BigEndian.AppendUint32(b, secs(p.ValidLifetime))
		b = binary.BigEndian.AppendUint32(b, secs(p.Preferred))
		b = append(b, 0, 0, 0, 0)
		a := p.Prefix.Masked().Addr().As16()
		b = append(b, a[:]...)
	}
	if len(b) > 1280-40 {
		return nil, fmt.Errorf("%d bytes: %w", len(b), errRAOverflow)
	}
	return b, nil
}

// ndOptions walks the options of a neighbour discovery message, calling
// fn with each option's type and whole body (type and length included).
func ndOptions(b []byte, fn func(typ byte, opt []byte) error) error {
	for len(b) > 0 {
		if len(b) < 2 {
			return fmt.Errorf("%d trailing bytes: %w", len(b), errBadNDOpt)
		}
		n := int(b[1]) * 8
		if n == 0 || n > len(b) {
			return fmt.Errorf("option %d of length %d in %d bytes: %w", b[0], n, len(b), errBadNDOpt)
		}
		if err := fn(b[0], b[:n]); err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}

// parseRA decodes an ICMPv6 router advertisement. It never panics.
func parseRA(b []byte) (*routerAdvert, error) {
	if len(b) < raHeaderLen {
		return nil, fmt.Errorf("router advertisement of %d bytes: %w", len(b), errShortND)
	}
	if b[0] != icmp6RouterAdvertisement || b[1] != 0 {
		return nil, fmt.Errorf("icmpv6 type %d code %d: %w", b[0], b[1], errNotRA)
	}
	ra := &routerAdvert{
		HopLimit:       b[4],
		Managed:        b[5]&raFlagManaged != 0,
		Other:          b[5]&raFlagOther != 0,
		RouterLifetime: time.Duration(binary.BigEndian.Uint16(b[6:8])) * time.Second,
	}
	err := ndOptions(b[raHeaderLen:], func(typ byte, opt []byte) error {
		switch typ {
		case ndOptSourceLinkAddr:
			if len(opt) != 8 {
				return fmt.Errorf("source link-layer option of %d bytes: %w", len(opt), errBadLLAddr)
			}
			ra.SourceMAC = net.HardwareAddr(slices.Clone(opt[2:8]))
		case ndOptMTU:
			if len(opt) != 8 {
				return fmt.Errorf("mtu option of %d bytes: %w", len(opt), errBadNDOpt)
			}
			ra.MTU = binary.BigEndian.Uint32(opt[4:8])
		case ndOptPrefixInfo:
			if len(opt) != 32 {
				return fmt.Errorf("prefix option of %d bytes: %w", len(opt), errBadPrefix)
			}
			addr := netip.AddrFrom16([16]byte(opt[16:32]))
			p, err := addr.Prefix(int(opt[2]))
			if err != nil || opt[2] > 128 {
				return fmt.Errorf("prefix length %d: %w", opt[2], errBadPrefix)
			}
			ra.Prefixes = append(ra.Prefixes, raPrefix{
				Prefix:        p,
				OnLink:        opt[3]&prefixFlagOnLink != 0,
				Autonomous:    opt[3]&prefixFlagAuto != 0,
				ValidLifetime: time.Duration(binary.BigEndian.Uint32(opt[4:8])) * time.Second,
				Preferred:     time.Duration(binary.BigEndian.Uint32(opt[8:12])) * time.Second,
			})
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return ra, nil
}

// parseRS decodes an ICMPv6 router solicitation and returns its source
// link-layer address option (nil without one, as from an unspecified
// source). It never panics.
func parseRS(b []byte) (net.HardwareAddr, error) {
	if len(b) < rsHeaderLen {
		return nil, fmt.Errorf("router solicitation of %d bytes: %w", len(b), errShortND)
	}
	if b[0] != icmp6RouterSolicitation || b[1] != 0 {
		return nil, fmt.Errorf("icmpv6 type %d code %d: %w", b[0], b[1], errNotRS)
	}
	var mac net.HardwareAddr
	err := ndOptions(b[rsHeaderLen:], func(typ byte, opt []byte) error {
		if typ == ndOptSourceLinkAddr {
			if len(opt) != 8 {
				return fmt.Errorf("source link-layer option of %d bytes: %w", len(opt), errBadLLAddr)
			}
			mac = net.HardwareAddr(slices.Clone(opt[2:8]))
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return mac, nil
}

// advertisement is the router advertisement a Server6 sends on a network
// with prefixes on its link, gateway MAC mac and MTU mtu: the Managed
// (and Other) flag, so guests ask DHCPv6 for their address and DNS; each
// prefix on-link but never autonomous, since kvnet assigns addresses and a
// SLAAC address would be one the port's anti-spoofing rules drop; the
// gateway as default router when defaultRouter is set (a primary
// network), else lifetime 0 (a secondary network has no egress).
func advertisement(prefixes []netip.Prefix, mac net.HardwareAddr, mtu int, defaultRouter bool) *routerAdvert {
	ra := &routerAdvert{HopLimit: 64, Managed: true, Other: true, SourceMAC: mac}
	if mtu > 0 {
		ra.MTU = uint32(mtu)
	}
	if defaultRouter {
		ra.RouterLifetime = DefaultRouterLifetime
	}
	for _, p := range prefixes {
		ra.Prefixes = append(ra.Prefixes, raPrefix{Prefix: p.Masked(), OnLink: true, ValidLifetime: raPrefixLifetime, Preferred: raPrefixLifetime})
	}
	return ra
}
