package dhcp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv6"
	"github.com/insomniacslk/dhcp/iana"
)

// The DHCPv6 ports (RFC 8415 §7.2).
const (
	dhcp6ClientPort = 546
	dhcp6ServerPort = 547
)

// allDHCPAgents is the group DHCPv6 clients send every message to
// (RFC 8415 §7.1): the server answers renewals from any node.
var allDHCPAgents = netip.MustParseAddr("ff02::1:2")

// Reasons a DHCPv6 message gets no reply (logs and tests only).
var (
	errNotDHCP6       = errors.New("not a DHCPv6 message to the server port")
	errIgnoredType6   = errors.New("message type not served")
	errNoClientID     = errors.New("message without a client identifier")
	errOtherServer6   = errors.New("message for another server")
	errNamesServer    = errors.New("message to all servers names one")
	errNoIPv6Lease    = errors.New("mac has no ipv6 lease on this server")
	errConfirmNoAddrs = errors.New("confirm without addresses")
	errShortFrame     = errors.New("frame too short")
	errNotIPv6UDP     = errors.New("not ipv6 udp")
	errBadUDPLength   = errors.New("udp length does not match the ipv6 payload")
	errBadIPv6Payload = errors.New("ipv6 payload length exceeds the frame")
)

// frame6 is what the server takes from one Ethernet frame carrying a
// DHCPv6 client message: who sent it and the message bytes.
type frame6 struct {
	mac     net.HardwareAddr // Ethernet source: the lease key
	src     netip.Addr       // IPv6 source, where the reply goes
	srcPort uint16
	payload []byte // the DHCPv6 message (UDP payload)
}

// Offsets in an untagged Ethernet frame carrying IPv6 without extension
// headers, which is how every DHCPv6 client sends (RFC 8415 §7 uses plain
// UDP).
const (
	ethHeaderLen  = 14
	ipv6HeaderLen = 40
	udpHeaderLen  = 8
	ethTypeIPv6   = 0x86dd
	ipProtoUDP    = 17
)

// decodeFrame6 decodes an Ethernet frame read from a packet socket: an
// IPv6 UDP datagram to the DHCPv6 server port. It never panics; anything
// else is an error naming what is wrong.
func decodeFrame6(b []byte) (frame6, error) {
	if len(b) < ethHeaderLen+ipv6HeaderLen+udpHeaderLen {
		return frame6{}, fmt.Errorf("frame of %d bytes: %w", len(b), errShortFrame)
	}
	if et := binary.BigEndian.Uint16(b[12:14]); et != ethTypeIPv6 {
		return frame6{}, fmt.Errorf("ethertype %#04x: %w", et, errNotIPv6UDP)
	}
	ip := b[ethHeaderLen:]
	if v := ip[0] >> 4; v != 6 {
		return frame6{}, fmt.Errorf("ip version %d: %w", v, errNotIPv6UDP)
	}
	if nh := ip[6]; nh != ipProtoUDP {
		return frame6{}, fmt.Errorf("next header %d: %w", nh, errNotIPv6UDP)
	}
	plen := int(binary.BigEndian.Uint16(ip[4:6]))
	if plen > len(ip)-ipv6HeaderLen {
		return frame6{}, fmt.Errorf("payload length %d of %d bytes: %w", plen, len(ip)-ipv6HeaderLen, errBadIPv6Payload)
	}
	udp := ip[ipv6HeaderLen : ipv6HeaderLen+plen]
	if len(udp) < udpHeaderLen {
		return frame6{}, fmt.Errorf("udp datagram of %d bytes: %w", len(udp), errShortFrame)
	}
	if dp := binary.BigEndian.Uint16(udp[2:4]); dp != dhcp6ServerPort {
		return frame6{}, fmt.Errorf("udp destination port %d: %w", dp, errNotDHCP6)
	}
	if ul := int(binary.BigEndian.Uint16(udp[4:6])); ul != len(udp) {
		return frame6{}, fmt.Errorf("udp length %d, ipv6 payload %d: %w", ul, len(udp), errBadUDPLength)
	}
	src, _ := netip.AddrFromSlice(ip[8:24])
	return frame6{
		mac:     net.HardwareAddr(append([]byte(nil), b[6:12]...)),
		src:     src,
		srcPort: binary.BigEndian.Uint16(udp[0:2]),
		payload: udp[udpHeaderLen:],
	}, nil
}

// serverDUID returns the server's DUID: link-layer (DUID-LL, RFC 8415
// §11.4) with the MAC of the interface it serves on. kvnet gives a
// network's gateway interface the same MAC on every node and across
// restarts (the network's gateway MAC), so every node's server has the
// same DUID and a migrated guest's Renew, naming the source node's server,
// is answered by the target's.
func serverDUID(mac net.HardwareAddr) dhcpv6.DUID {
	return &dhcpv6.DUIDLL{HWType: iana.HWTypeEthernet, LinkLayerAddr: append(net.HardwareAddr(nil), mac...)}
}

// answer6 is the DHCPv6 policy without sockets: the reply to message req
// from the client with Ethernet address mac, or an error saying why it
// gets none. Like the DHCPv4 server, it allocates nothing and answers only
// MACs leases knows, always with their lease's IPv6 address:
//
//   - Solicit: Advertise with Preference 255, so that the client requests
//     at once instead of collecting Advertises for a second (RFC 8415
//     §18.2.1); Reply with Rapid Commit when asked for;
//   - Request, Renew (for this server's DUID), Rebind: Reply binding the
//     lease's address to the first IA_NA; an address the client holds
//     that is not the lease's is returned with zero lifetimes, so a guest
//     whose claim changed drops it;
//   - Confirm: Reply Success when every address is the lease's, else
//     NotOnLink (stricter than "on the link", so that a guest whose
//     claim changed starts over); a Confirm without addresses gets no
//     reply (RFC 8415 §18.3.3);
//   - Release: Reply Success (the address stays the guest's);
//   - Decline of the lease's address: Reply Success, and dec withholds
//     that address from that client for dec's hold time, during which a
//     Solicit gets an Advertise with NoAddrsAvail only and a Request
//     NoAddrsAvail in its IA_NA (RFC 8415 §18.3.1, §18.3.2), so that a
//     client whose duplicate address detection failed is not handed the
//     same address again at once, in a loop; an IA declining anything
//     else gets NoBinding (§18.3.8);
//   - Information-request: Reply with DNS servers and search list.
//
// Every other message type, a message naming another server, and unknown
// MACs get no answer, so that servers of several nodes can share a
// segment. dec may be nil: no address is withheld.
func answer6(req *dhcpv6.Message, mac net.HardwareAddr, leases Leases, sid dhcpv6.DUID, dec *declines) (*dhcpv6.Message, error) {
	t := req.MessageType
	cid := req.Options.ClientID()
	reqSID := req.Options.ServerID()
	switch t {
	case dhcpv6.MessageTypeSolicit, dhcpv6.MessageTypeRebind, dhcpv6.MessageTypeConfirm:
		// RFC 8415 §16: these go to all servers and must not name one.
		if reqSID != nil {
			return nil, fmt.Errorf("%s: %w", t, errNamesServer)
		}
	case dhcpv6.MessageTypeRequest, dhcpv6.MessageTypeRenew, dhcpv6.MessageTypeRelease, dhcpv6.MessageTypeDecline:
		if reqSID == nil || !reqSID.Equal(sid) {
			return nil, fmt.Errorf("%s for server %v: %w", t, reqSID, errOtherServer6)
		}
	case dhcpv6.MessageTypeInformationRequest:
		if reqSID != nil && !reqSID.Equal(sid) {
			return nil, fmt.Errorf("%s for server %v: %w", t, reqSID, errOtherServer6)
		}
	default:
		return nil, fmt.Errorf("message type %s: %w", t, errIgnoredType6)
	}
	if cid == nil && t != dhcpv6.MessageTypeInformationRequest {
		return nil, fmt.Errorf("%s: %w", t, errNoClientID)
	}
	lease, ok := leases.Lookup(mac)
	if !ok {
		return nil, fmt.Errorf("mac %s: %w", mac, errUnknownClient)
	}
	if t != dhcpv6.MessageTypeInformationRequest && !lease.IP6.Is6() {
		return nil, fmt.Errorf("mac %s: %w", mac, errNoIPv6Lease)
	}
	if t == dhcpv6.MessageTypeConfirm && !hasAddresses(req) {
		return nil, fmt.Errorf("%s: %w", t, errConfirmNoAddrs)
	}
	withheld := dec.held(mac, lease.IP6)
	if t == dhcpv6.MessageTypeSolicit && withheld {
		// RFC 8415 §18.3.1: no address for any IA: an Advertise with
		// only the status, the server's and the client's identifiers.
		resp := &dhcpv6.Message{MessageType: dhcpv6.MessageTypeAdvertise, TransactionID: req.TransactionID}
		resp.AddOption(dhcpv6.OptClientID(cid))
		resp.AddOption(dhcpv6.OptServerID(sid))
		resp.AddOption(&dhcpv6.OptStatusCode{StatusCode: iana.StatusNoAddrsAvail, StatusMessage: declinedMessage(lease.IP6)})
		return resp, nil
	}

	resp := &dhcpv6.Message{MessageType: dhcpv6.MessageTypeReply, TransactionID: req.TransactionID}
	rapid := t == dhcpv6.MessageTypeSolicit && req.GetOneOption(dhcpv6.OptionRapidCommit) != nil
	if t == dhcpv6.MessageTypeSolicit && !rapid {
		resp.MessageType = dhcpv6.MessageTypeAdvertise
	}
	if cid != nil {
		resp.AddOption(dhcpv6.OptClientID(cid))
	}
	resp.AddOption(dhcpv6.OptServerID(sid))
	if rapid {
		resp.AddOption(&dhcpv6.OptionGeneric{OptionCode: dhcpv6.OptionRapidCommit})
	}
	if resp.MessageType == dhcpv6.MessageTypeAdvertise {
		resp.AddOption(dhcpv6.OptPreference(255))
	}

	switch t {
	case dhcpv6.MessageTypeRelease:
		resp.AddOption(&dhcpv6.OptStatusCode{StatusCode: iana.StatusSuccess, StatusMessage: "the address stays allocated to this client"})
		return resp, nil
	case dhcpv6.MessageTypeDecline:
		resp.AddOption(&dhcpv6.OptStatusCode{StatusCode: iana.StatusSuccess, StatusMessage: "declined"})
		for _, ia := range req.Options.IANA() {
			if iaHolds(ia, lease.IP6) {
				dec.add(mac, lease.IP6)
				continue
			}
			out := &dhcpv6.OptIANA{IaId: ia.IaId}
			out.Options.Add(&dhcpv6.OptStatusCode{StatusCode: iana.StatusNoBinding, StatusMessage: fmt.Sprintf("the address of this client is %s", lease.IP6)})
			resp.AddOption(out)
		}
		return resp, nil
	case dhcpv6.MessageTypeConfirm:
		status := &dhcpv6.OptStatusCode{StatusCode: iana.StatusSuccess, StatusMessage: "on link"}
		for _, ia := range req.Options.IANA() {
			for _, a := range ia.Options.Addresses() {
				if ip, ok := netip.AddrFromSlice(a.IPv6Addr); !ok || ip.Unmap() != lease.IP6 {
					status = &dhcpv6.OptStatusCode{StatusCode: iana.StatusNotOnLink, StatusMessage: fmt.Sprintf("the address of this client is %s", lease.IP6)}
				}
			}
		}
		resp.AddOption(status)
	case dhcpv6.MessageTypeSolicit, dhcpv6.MessageTypeRequest, dhcpv6.MessageTypeRenew, dhcpv6.MessageTypeRebind:
		addIANAs(resp, req, lease, withheld)
	}
	if err := addConfig6(resp, lease); err != nil {
		return nil, err
	}
	return resp, nil
}

// addIANAs answers each IA_NA of req: the first gets the lease's address,
// the others NoAddrsAvail (a guest has one address per network). A
// Solicit without IA_NA gets NoAddrsAvail: only addresses are served.
// withheld (the client declined the lease's address) gives the first
// NoAddrsAvail too.
func addIANAs(resp, req *dhcpv6.Message, lease Lease, withheld bool) {
	life := lifetimeOrDefault(lease.LeaseTime)
	ianas := req.Options.IANA()
	if len(ianas) == 0 {
		resp.AddOption(&dhcpv6.OptStatusCode{StatusCode: iana.StatusNoAddrsAvail, StatusMessage: "only addresses (IA_NA) are served"})
		return
	}
	for i, ia := range ianas {
		out := &dhcpv6.OptIANA{IaId: ia.IaId}
		if i > 0 {
			out.Options.Add(&dhcpv6.OptStatusCode{StatusCode: iana.StatusNoAddrsAvail, StatusMessage: "one address per client"})
			resp.AddOption(out)
			continue
		}
		if withheld {
			out.Options.Add(&dhcpv6.OptStatusCode{StatusCode: iana.StatusNoAddrsAvail, StatusMessage: declinedMessage(lease.IP6)})
		} else {
			out.T1, out.T2 = life/2, life*4/5
			out.Options.Add(&dhcpv6.OptIAAddress{IPv6Addr: net.IP(lease.IP6.AsSlice()), PreferredLifetime: life, ValidLifetime: life})
		}
		for _, a := range ia.Options.Addresses() {
			if ip, ok := netip.AddrFromSlice(a.IPv6Addr); ok && (withheld || ip.Unmap() != lease.IP6) {
				// RFC 8415 §18.3.4: an address the client may no
				// longer use goes back with zero lifetimes.
				out.Options.Add(&dhcpv6.OptIAAddress{IPv6Addr: a.IPv6Addr, PreferredLifetime: 0, ValidLifetime: 0})
			}
		}
		resp.AddOption(out)
	}
}

// hasAddresses reports whether an IA_NA of req holds an address.
func hasAddresses(req *dhcpv6.Message) bool {
	for _, ia := range req.Options.IANA() {
		if len(ia.Options.Addresses()) > 0 {
			return true
		}
	}
	return false
}

// iaHolds reports whether ia holds address a.
func iaHolds(ia *dhcpv6.OptIANA, a netip.Addr) bool {
	for _, ad := range ia.Options.Addresses() {
		if ip, ok := netip.AddrFromSlice(ad.IPv6Addr); ok && ip.Unmap() == a {
			return true
		}
	}
	return false
}

// declinedMessage is the status message of a withheld address.
func declinedMessage(a netip.Addr) string {
	return fmt.Sprintf("this client declined %s, its only address: another node on the link holds it", a)
}

// addConfig6 adds the lease's IPv6 DNS servers (option 23) and search list
// (option 24). IPv4 entries of lease.DNS are the DHCPv4 server's.
func addConfig6(resp *dhcpv6.Message, lease Lease) error {
	var dns []net.IP
	for _, a := range lease.DNS {
		if a.Is6() && !a.Is4In6() {
			dns = append(dns, net.IP(a.AsSlice()))
		}
	}
	if len(dns) > 0 {
		resp.AddOption(dhcpv6.OptDNS(dns...))
	}
	if len(lease.Search) > 0 {
		labels, err := searchLabels(lease.Search)
		if err != nil {
			return err
		}
		resp.AddOption(dhcpv6.OptDomainSearchList(labels))
	}
	return nil
}

// respond6 is the server's handling of one frame without the socket: it
// decodes the frame and the message and answers as answer6 does. f is set
// when the frame was a DHCPv6 message to the server port.
func respond6(b []byte, leases Leases, sid dhcpv6.DUID, dec *declines) (f frame6, req, resp *dhcpv6.Message, err error) {
	f, err = decodeFrame6(b)
	if err != nil {
		return frame6{}, nil, nil, err
	}
	req, err = dhcpv6.MessageFromBytes(f.payload)
	if err != nil {
		return f, nil, nil, fmt.Errorf("decode dhcpv6 message from %s: %w", f.mac, err)
	}
	resp, err = answer6(req, f.mac, leases, sid, dec)
	return f, req, resp, err
}

// lifetimeOrDefault is a lease time, DefaultLeaseTime for 0.
func lifetimeOrDefault(d time.Duration) time.Duration {
	if d <= 0 {
		return DefaultLeaseTime
	}
	return d
}

// DefaultDeclineHold is how long a Server6 withholds an address its client
// declined (Config6.DeclineHold). The client declined it because duplicate
// address detection found another node holding it: offering it again at
// once would only repeat the failure, in a loop, so the client is offered
// nothing (and keeps soliciting, backing off) until the hold ends, when
// the conflict may have been resolved; a new Decline then holds it again.
const DefaultDeclineHold = 10 * time.Minute

// declines remembers, per client MAC, the address it declined and until
// when it is withheld. A nil *declines withholds nothing. It is safe for
// concurrent use.
type declines struct {
	hold   time.Duration
	now    func() time.Time
	report func(mac net.HardwareAddr, addr netip.Addr) // when a hold starts; may be nil

	mu    sync.Mutex
	byMAC map[string]declined // guarded by mu
}

type declined struct {
	addr  netip.Addr
	until time.Time
}

func newDeclines(hold time.Duration, now func() time.Time, report func(net.HardwareAddr, netip.Addr)) *declines {
	return &declines{hold: hold, now: now, report: report, byMAC: map[string]declined{}}
}

// add withholds addr from mac for the hold time and reports it, unless it
// is withheld already (a retransmitted Decline is reported once).
func (d *declines) add(mac net.HardwareAddr, addr netip.Addr) {
	if d == nil {
		return
	}
	now := d.now()
	d.mu.Lock()
	for k, v := range d.byMAC {
		if !now.Before(v.until) {
			delete(d.byMAC, k)
		}
	}
	cur, ok := d.byMAC[mac.String()]
	d.byMAC[mac.String()] = declined{addr: addr, until: now.Add(d.hold)}
	d.mu.Unlock()
	if (!ok || cur.addr != addr) && d.report != nil {
		d.report(mac, addr)
	}
}

// held reports whether addr is withheld from mac.
func (d *declines) held(mac net.HardwareAddr, addr netip.Addr) bool {
	if d == nil {
		return false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	v, ok := d.byMAC[mac.String()]
	return ok && v.addr == addr && d.now().Before(v.until)
}
