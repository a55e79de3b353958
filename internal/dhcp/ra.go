package dhcp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"time"
)

// ICMPv6 neighbour discovery message types and options (RFC 4861 §4).
const (
	icmp6RouterSolicitation  = 133
	icmp6RouterAdvertisement = 134

	ndOptSourceLinkAddr = 1
	ndOptPrefixInfo     = 3
	ndOptMTU            = 5
	ndOptRDNSS          = 25 // RFC 8106 §5.1
	ndOptDNSSL          = 31 // RFC 8106 §5.2

	raHeaderLen = 16 // type, code, checksum, hop limit, flags, lifetime, reachable, retrans
	rsHeaderLen = 8  // type, code, checksum, reserved

	raFlagManaged    = 0x80
	raFlagOther      = 0x40
	prefixFlagOnLink = 0x80
	prefixFlagAuto   = 0x40
)

// Router advertisement timing. Every advertisement is multicast to all
// nodes, and RFC 4861 §6.2.6 limits those to one per MIN_DELAY_BETWEEN_RAS
// (3 s), whatever the solicitations: raPacer schedules them.
const (
	// DefaultRAInterval is the longest interval between unsolicited
	// advertisements (MaxRtrAdvInterval; RFC 4861 allows 4 s to 1800 s,
	// radvd defaults to 600 s). A guest that missed every solicited one
	// gets its default route within it.
	DefaultRAInterval = time.Minute
	// DefaultRouterLifetime is how long a guest keeps the gateway as its
	// default router without hearing from it: 30 minutes, three times
	// radvd's default interval, as RFC 4861 suggests.
	DefaultRouterLifetime = 30 * time.Minute
	// raPrefixLifetime is the lifetime of the on-link prefixes.
	raPrefixLifetime = 24 * time.Hour

	// RFC 4861 §10's router constants.
	minDelayBetweenRAs   = 3 * time.Second        // MIN_DELAY_BETWEEN_RAS
	maxRADelay           = 500 * time.Millisecond // MAX_RA_DELAY_TIME
	maxInitialRAInterval = 16 * time.Second       // MAX_INITIAL_RTR_ADVERT_INTERVAL
	maxInitialRAs        = 3                      // MAX_INITIAL_RTR_ADVERTISEMENTS
)

// raPacer decides when a Server6 multicasts its next advertisement (RFC
// 4861 §6.2.4 and §6.2.6). It has no clock: its callers pass the time and
// the random values, so that tests drive it.
type raPacer struct {
	interval time.Duration // MaxRtrAdvInterval
	last     time.Time     // the last advertisement; zero before the first
	next     time.Time     // when the next one goes
	count    int           // advertisements sent
}

// newRAPacer schedules the first advertisement at now.
func newRAPacer(now time.Time, interval time.Duration) *raPacer {
	return &raPacer{interval: interval, next: now}
}

// solicit schedules the answer to a solicitation received at now, delay
// (random in [0, maxRADelay)) later, or, when an advertisement went out
// less than minDelayBetweenRAs before that, minDelayBetweenRAs plus delay
// after it. It only ever brings the next advertisement forward: the
// solicitations that come while one is scheduled share it.
func (p *raPacer) solicit(now time.Time, delay time.Duration) {
	at := now.Add(delay)
	if earliest := p.last.Add(minDelayBetweenRAs); !p.last.IsZero() && at.Before(earliest) {
		at = earliest.Add(delay)
	}
	if at.Before(p.next) {
		p.next = at
	}
}

// sent records an advertisement sent at now and schedules the next
// unsolicited one: r (random in [0, 1)) of the way between
// MinRtrAdvInterval (a third of the interval) and the interval, at most
// maxInitialRAInterval for the first few, never below
// minDelayBetweenRAs.
func (p *raPacer) sent(now time.Time, r float64) {
	p.last = now
	p.count++
	lo := p.interval / 3
	d := lo + time.Duration(r*float64(p.interval-lo))
	if p.count <= maxInitialRAs {
		d = min(d, maxInitialRAInterval)
	}
	p.next = now.Add(max(d, minDelayBetweenRAs))
}

// Errors of the neighbour discovery parsers.
var (
	errNotRA      = errors.New("not a router advertisement")
	errNotRS      = errors.New("not a router solicitation")
	errShortND    = errors.New("message too short")
	errBadNDOpt   = errors.New("malformed option")
	errBadPrefix  = errors.New("malformed prefix information")
	errBadLLAddr  = errors.New("malformed link-layer address option")
	errRAOverflow = errors.New("router advertisement too large")
	errBadRDNSS   = errors.New("malformed recursive dns server option")
	errBadDNSSL   = errors.New("malformed dns search list option")
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
	// DNS is option 25 (RDNSS), Search option 31 (DNSSL), each with its
	// lifetime (whole seconds); empty omits the option. The parser
	// appends the entries of repeated options and keeps the first
	// lifetime.
	DNS            []netip.Addr
	DNSLifetime    time.Duration
	Search         []string // domain names without the trailing dot
	SearchLifetime time.Duration
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
	if len(ra.DNS) > 0 {
		if len(ra.DNS) > 127 {
			return nil, fmt.Errorf("%d dns servers: %w", len(ra.DNS), errRAOverflow)
		}
		b = append(b, ndOptRDNSS, byte(1+2*len(ra.DNS)), 0, 0)
		b = binary.BigEndian.AppendUint32(b, secs(ra.DNSLifetime))
		for _, a := range ra.DNS {
			if !a.Is6() || a.Zone() != "" {
				return nil, fmt.Errorf("dns server %q: %w", a, errBadRDNSS)
			}
			a16 := a.As16()
			b = append(b, a16[:]...)
		}
	}
	if len(ra.Search) > 0 {
		var names []byte
		for _, d := range ra.Search {
			var err error
			if names, err = appendDomain(names, d); err != nil {
				return nil, err
			}
		}
		n := (8 + len(names) + 7) / 8
		if n > 255 {
			return nil, fmt.Errorf("search list of %d bytes: %w", len(names), errRAOverflow)
		}
		b = append(b, ndOptDNSSL, byte(n), 0, 0)
		b = binary.BigEndian.AppendUint32(b, secs(ra.SearchLifetime))
		b = append(b, names...)
		b = append(b, make([]byte, n*8-8-len(names))...)
	}
	if len(b) > 1280-40 {
		return nil, fmt.Errorf("%d bytes: %w", len(b), errRAOverflow)
	}
	return b, nil
}

// appendDomain appends domain name d (a trailing dot allowed) in DNS wire
// format without compression (RFC 1035 §3.1), as DNSSL carries it.
func appendDomain(b []byte, d string) ([]byte, error) {
	name := strings.TrimSuffix(d, ".")
	if name == "" || len(name) > 253 {
		return nil, fmt.Errorf("search domain %q: length %d not 1-253: %w", d, len(name), errBadDNSSL)
	}
	for part := range strings.SplitSeq(name, ".") {
		if part == "" || len(part) > 63 {
			return nil, fmt.Errorf("search domain %q: label %q not 1-63 bytes: %w", d, part, errBadDNSSL)
		}
		b = append(b, byte(len(part)))
		b = append(b, part...)
	}
	return append(b, 0), nil
}

// parseDNSSLNames decodes the domain names of a DNSSL option's body: names
// in DNS wire format, then zero padding to the option's end.
func parseDNSSLNames(b []byte) ([]string, error) {
	var out []string
	for len(b) > 0 && b[0] != 0 {
		var labels []string
		wire := 0
		for {
			if len(b) == 0 {
				return nil, fmt.Errorf("domain name without its end: %w", errBadDNSSL)
			}
			l := int(b[0])
			if l == 0 {
				b = b[1:]
				break
			}
			if l > 63 {
				return nil, fmt.Errorf("label length %d (compression is not allowed): %w", l, errBadDNSSL)
			}
			if l+1 > len(b) {
				return nil, fmt.Errorf("label of %d bytes in %d: %w", l, len(b)-1, errBadDNSSL)
			}
			label := string(b[1 : 1+l])
			if strings.Contains(label, ".") {
				return nil, fmt.Errorf("label %q holds a dot: %w", label, errBadDNSSL)
			}
			labels = append(labels, label)
			wire += 1 + l
			b = b[1+l:]
		}
		name := strings.Join(labels, ".")
		if wire+1 > 255 || len(name) > 253 {
			return nil, fmt.Errorf("domain name of %d bytes: %w", wire+1, errBadDNSSL)
		}
		out = append(out, name)
	}
	for _, c := range b {
		if c != 0 {
			return nil, fmt.Errorf("data after the padding: %w", errBadDNSSL)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no domain name: %w", errBadDNSSL)
	}
	return out, nil
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
		case ndOptRDNSS:
			if len(opt) < 24 || (len(opt)-8)%16 != 0 {
				return fmt.Errorf("rdnss option of %d bytes: %w", len(opt), errBadRDNSS)
			}
			if ra.DNS == nil {
				ra.DNSLifetime = time.Duration(binary.BigEndian.Uint32(opt[4:8])) * time.Second
			}
			for a := opt[8:]; len(a) > 0; a = a[16:] {
				ra.DNS = append(ra.DNS, netip.AddrFrom16([16]byte(a[:16])))
			}
		case ndOptDNSSL:
			if len(opt) < 16 {
				return fmt.Errorf("dnssl option of %d bytes: %w", len(opt), errBadDNSSL)
			}
			names, err := parseDNSSLNames(opt[8:])
			if err != nil {
				return err
			}
			if ra.Search == nil {
				ra.SearchLifetime = time.Duration(binary.BigEndian.Uint32(opt[4:8])) * time.Second
			}
			ra.Search = append(ra.Search, names...)
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

// raContent is what a Server6's advertisements say (see advertisement).
type raContent struct {
	prefixes      []netip.Prefix
	mac           net.HardwareAddr
	mtu           int
	defaultRouter bool
	// dns and search go in RDNSS and DNSSL options with lifetime
	// dnsLifetime; empty omits them.
	dns         []netip.Addr
	search      []string
	dnsLifetime time.Duration
}

// advertisement is the router advertisement a Server6 sends on a network
// with c.prefixes on its link, gateway MAC c.mac and MTU c.mtu: the
// Managed (and Other) flag, so guests ask DHCPv6 for their address and
// DNS; each prefix on-link but never autonomous, since kvnet assigns
// addresses and a SLAAC address would be one the port's anti-spoofing
// rules drop; the gateway as default router when c.defaultRouter is set
// (a primary network), else lifetime 0 (a secondary network has no
// egress); and the DNS servers and search list (RFC 8106), for guests
// that take DNS from advertisements only.
func advertisement(c raContent) *routerAdvert {
	ra := &routerAdvert{HopLimit: 64, Managed: true, Other: true, SourceMAC: c.mac}
	if c.mtu > 0 {
		ra.MTU = uint32(c.mtu)
	}
	if c.defaultRouter {
		ra.RouterLifetime = DefaultRouterLifetime
	}
	for _, p := range c.prefixes {
		ra.Prefixes = append(ra.Prefixes, raPrefix{Prefix: p.Masked(), OnLink: true, ValidLifetime: raPrefixLifetime, Preferred: raPrefixLifetime})
	}
	if len(c.dns) > 0 {
		ra.DNS, ra.DNSLifetime = slices.Clone(c.dns), c.dnsLifetime
	}
	if len(c.search) > 0 {
		ra.Search, ra.SearchLifetime = slices.Clone(c.search), c.dnsLifetime
	}
	return ra
}
