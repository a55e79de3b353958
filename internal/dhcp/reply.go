package dhcp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/rfc1035label"
)

// Reasons a request gets no reply. They are unexported because only logs
// and tests look at them; callers of Server never see a per-request error.
var (
	errNotRequest    = errors.New("not a BOOTREQUEST")
	errNotEthernet   = errors.New("not an ethernet client")
	errIgnoredType   = errors.New("message type not served")
	errUnknownClient = errors.New("mac has no lease on this server")
	errOtherServer   = errors.New("client selected another server")
	errNoRequestedIP = errors.New("request names no address")
)

// minMaxMessageSize is the DHCP message size every client must accept
// (RFC 2131 §2: 576-byte IP datagram minus IP and UDP headers). Replies
// larger than what the client advertised (option 57) would be dropped or
// truncated by the client, so reply refuses to build them.
const minMaxMessageSize = 576 - 20 - 8

// answer is the whole per-request policy, without sockets: who gets a reply,
// which reply, and where it goes. A nil reply comes with an error saying why
// the request is ignored.
func answer(req *dhcpv4.DHCPv4, leases Leases, serverIP netip.Addr) (*dhcpv4.DHCPv4, *net.UDPAddr, error) {
	if req.OpCode != dhcpv4.OpcodeBootRequest {
		return nil, nil, errNotRequest
	}
	if len(req.ClientHWAddr) != 6 {
		return nil, nil, fmt.Errorf("client hardware address %q: %w", req.ClientHWAddr, errNotEthernet)
	}
	switch t := req.MessageType(); t {
	case dhcpv4.MessageTypeDiscover, dhcpv4.MessageTypeRequest:
	default:
		return nil, nil, fmt.Errorf("message type %s: %w", t, errIgnoredType)
	}
	lease, ok := leases.Lookup(req.ClientHWAddr)
	if !ok {
		return nil, nil, fmt.Errorf("mac %s: %w", req.ClientHWAddr, errUnknownClient)
	}
	resp, err := reply(req, lease, serverIP)
	if err != nil {
		return nil, nil, err
	}
	return resp, destination(req, resp), nil
}

// reply builds the answer to a DISCOVER or REQUEST from a client whose lease
// is lease: OFFER for DISCOVER, ACK for a REQUEST of the leased address
// (selecting, init-reboot, renewing or rebinding), NAK for a REQUEST of any
// other address. A REQUEST naming another server, or no address at all,
// and every other message type get an error and must be ignored.
func reply(req *dhcpv4.DHCPv4, lease Lease, serverIP netip.Addr) (*dhcpv4.DHCPv4, error) {
	if !serverIP.Is4() {
		return nil, fmt.Errorf("server ip %q: not ipv4", serverIP)
	}
	if !lease.IP.IsValid() || !lease.IP.Addr().Is4() {
		return nil, fmt.Errorf("lease ip %q: not ipv4", lease.IP)
	}
	leased := lease.IP.Addr()

	var typ dhcpv4.MessageType
	switch req.MessageType() {
	case dhcpv4.MessageTypeDiscover:
		typ = dhcpv4.MessageTypeOffer
	case dhcpv4.MessageTypeRequest:
		// RFC 2131 §4.3.2: a REQUEST carrying a server identifier is in
		// SELECTING state; if it names someone else, that server won.
		if sid, ok := addrOf(req.ServerIdentifier()); ok && sid != serverIP {
			return nil, fmt.Errorf("server identifier %s: %w", sid, errOtherServer)
		}
		// SELECTING and INIT-REBOOT name the address in option 50;
		// RENEWING and REBINDING put it in ciaddr.
		want, ok := addrOf(req.RequestedIPAddress())
		if !ok {
			want, ok = addrOf(req.ClientIPAddr)
		}
		if !ok {
			return nil, errNoRequestedIP
		}
		if want != leased {
			return nak(req, serverIP)
		}
		typ = dhcpv4.MessageTypeAck
	default:
		return nil, fmt.Errorf("message type %s: %w", req.MessageType(), errIgnoredType)
	}

	opts, err := leaseOptions(lease, serverIP)
	if err != nil {
		return nil, err
	}
	mods := []dhcpv4.Modifier{
		dhcpv4.WithMessageType(typ),
		dhcpv4.WithYourIP(leased.AsSlice()),
	}
	if typ == dhcpv4.MessageTypeAck {
		// RFC 2131 table 3: an ACK echoes the client's ciaddr.
		mods = append(mods, dhcpv4.WithClientIP(req.ClientIPAddr))
	}
	for _, o := range opts {
		mods = append(mods, dhcpv4.WithOption(o))
	}
	resp, err := dhcpv4.NewReplyFromRequest(req, mods...)
	if err != nil {
		return nil, fmt.Errorf("build %s for %s: %w", typ, req.ClientHWAddr, err)
	}
	limit := minMaxMessageSize
	if m, err := req.MaxMessageSize(); err == nil && int(m) > limit {
		limit = int(m)
	}
	if n := len(resp.ToBytes()); n > limit {
		return nil, fmt.Errorf("%s for %s is %d bytes, over the client's limit of %d", typ, req.ClientHWAddr, n, limit)
	}
	return resp, nil
}

// nak builds a DHCPNAK. RFC 2131 table 3 allows only the message type,
// server identifier, message and client identifier options in it.
func nak(req *dhcpv4.DHCPv4, serverIP netip.Addr) (*dhcpv4.DHCPv4, error) {
	resp, err := dhcpv4.NewReplyFromRequest(req,
		dhcpv4.WithMessageType(dhcpv4.MessageTypeNak),
		dhcpv4.WithOption(dhcpv4.OptServerIdentifier(serverIP.AsSlice())),
		dhcpv4.WithOption(dhcpv4.OptMessage("requested address is not leased to this client")),
	)
	if err != nil {
		return nil, fmt.Errorf("build nak for %s: %w", req.ClientHWAddr, err)
	}
	return resp, nil
}

// leaseOptions turns a Lease into the options of an OFFER or ACK.
func leaseOptions(lease Lease, serverIP netip.Addr) ([]dhcpv4.Option, error) {
	leaseTime := lease.LeaseTime
	switch {
	case leaseTime == 0:
		leaseTime = DefaultLeaseTime
	case leaseTime < 0 || leaseTime.Seconds() >= 1<<32-1:
		// 0xffffffff means "infinite" (RFC 2131 §3.3), which is never
		// what a caller passing a Duration means.
		return nil, fmt.Errorf("lease time %s: out of range", lease.LeaseTime)
	}
	opts := []dhcpv4.Option{
		dhcpv4.OptServerIdentifier(serverIP.AsSlice()),
		dhcpv4.OptSubnetMask(net.CIDRMask(lease.IP.Bits(), 32)),
		dhcpv4.OptIPAddressLeaseTime(leaseTime),
	}
	if lease.Router.IsValid() {
		if !lease.Router.Is4() {
			return nil, fmt.Errorf("router %q: not ipv4", lease.Router)
		}
		opts = append(opts, dhcpv4.OptRouter(lease.Router.AsSlice()))
	}
	var dns []net.IP
	for _, a := range lease.DNS {
		if a = a.Unmap(); a.Is4() {
			dns = append(dns, a.AsSlice())
		}
	}
	if len(dns) > 0 {
		opts = append(opts, dhcpv4.OptDNS(dns...))
	}
	if lease.MTU != 0 {
		// 68 is the smallest MTU RFC 2132 §5.1 allows.
		if lease.MTU < 68 || lease.MTU > 65535 {
			return nil, fmt.Errorf("mtu %d: out of range 68-65535", lease.MTU)
		}
		opts = append(opts, dhcpv4.OptGeneric(dhcpv4.OptionInterfaceMTU, binary.BigEndian.AppendUint16(nil, uint16(lease.MTU))))
	}
	if lease.Hostname != "" {
		opts = append(opts, dhcpv4.OptHostName(lease.Hostname))
	}
	if lease.Domain != "" {
		opts = append(opts, dhcpv4.OptDomainName(lease.Domain))
	}
	if len(lease.Search) > 0 {
		labels, err := searchLabels(lease.Search)
		if err != nil {
			return nil, err
		}
		opts = append(opts, dhcpv4.OptDomainSearch(labels))
	}
	if len(lease.Routes) > 0 {
		routes, err := classlessRoutes(lease.Routes, lease.Router)
		if err != nil {
			return nil, err
		}
		opts = append(opts, dhcpv4.OptClasslessStaticRoute(routes...))
	}
	return opts, nil
}

// searchLabels validates domains for option 119. The library's encoder
// writes whatever it is given, so a trailing dot or an over-long label
// would otherwise go out as a malformed option the guest silently drops.
func searchLabels(domains []string) (*rfc1035label.Labels, error) {
	labels := rfc1035label.NewLabels()
	for _, d := range domains {
		name := strings.TrimSuffix(d, ".")
		if name == "" || len(name) > 253 {
			return nil, fmt.Errorf("search domain %q: invalid length", d)
		}
		for part := range strings.SplitSeq(name, ".") {
			if part == "" || len(part) > 63 {
				return nil, fmt.Errorf("search domain %q: invalid label %q", d, part)
			}
		}
		labels.Labels = append(labels.Labels, name)
	}
	return labels, nil
}

// classlessRoutes converts routes for option 121 and appends the default
// route via router when one is set and routes has none (see Lease.Routes).
func classlessRoutes(routes []Route, router netip.Addr) ([]*dhcpv4.Route, error) {
	out := make([]*dhcpv4.Route, 0, len(routes)+1)
	hasDefault := false
	for _, r := range routes {
		if !r.Dst.IsValid() || !r.Dst.Addr().Is4() {
			return nil, fmt.Errorf("route destination %q: not ipv4", r.Dst)
		}
		via := netip.IPv4Unspecified()
		if r.Via.IsValid() {
			if !r.Via.Is4() {
				return nil, fmt.Errorf("route %s via %q: not ipv4", r.Dst, r.Via)
			}
			via = r.Via
		}
		// RFC 3442 sends only the significant octets of the
		// destination; the library copies them as given, so host bits
		// must be cleared first or they would leak into the encoding.
		dst := r.Dst.Masked()
		hasDefault = hasDefault || dst.Bits() == 0
		out = append(out, &dhcpv4.Route{
			Dest:   &net.IPNet{IP: dst.Addr().AsSlice(), Mask: net.CIDRMask(dst.Bits(), 32)},
			Router: via.AsSlice(),
		})
	}
	if router.IsValid() && !hasDefault {
		out = append(out, &dhcpv4.Route{
			Dest:   &net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)},
			Router: router.AsSlice(),
		})
	}
	return out, nil
}

// destination is where a reply goes, per RFC 2131 §4.1:
//   - through a relay (giaddr set): to the relay's server port;
//   - a NAK without relay: broadcast, since the client's address is wrong;
//   - a client that has an address (ciaddr set, renewing or rebinding):
//     unicast to it;
//   - otherwise broadcast. The RFC also allows unicasting to yiaddr at the
//     client's MAC when the broadcast flag is clear, but that needs an ARP
//     entry the kernel cannot learn from a client that has no address yet;
//     broadcast is always allowed and every client (udhcpc included)
//     accepts it.
func destination(req, resp *dhcpv4.DHCPv4) *net.UDPAddr {
	if gi, ok := addrOf(req.GatewayIPAddr); ok {
		return &net.UDPAddr{IP: gi.AsSlice(), Port: dhcpv4.ServerPort}
	}
	bcast := &net.UDPAddr{IP: net.IPv4bcast, Port: dhcpv4.ClientPort}
	if resp.MessageType() == dhcpv4.MessageTypeNak {
		return bcast
	}
	if ci, ok := addrOf(req.ClientIPAddr); ok {
		return &net.UDPAddr{IP: ci.AsSlice(), Port: dhcpv4.ClientPort}
	}
	return bcast
}

// addrOf converts a wire IPv4 address; ok is false for nil and 0.0.0.0,
// which DHCP uses for "not set".
func addrOf(ip net.IP) (netip.Addr, bool) {
	a, ok := netip.AddrFromSlice(ip)
	if !ok {
		return netip.Addr{}, false
	}
	a = a.Unmap()
	if !a.Is4() || a.IsUnspecified() {
		return netip.Addr{}, false
	}
	return a, true
}
