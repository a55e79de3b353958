package simlauncher

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/insomniacslk/dhcp/dhcpv6"
	"github.com/insomniacslk/dhcp/iana"
	"golang.org/x/net/ipv6"

	"kvnet.io/kvnet/internal/nl"
)

// The DHCPv6 ports and the group clients send to (RFC 8415).
const (
	dhcp6ServerPort = 547
	dhcp6ClientPort = 546
)

var allDHCPAgents = net.ParseIP("ff02::1:2")

// The times of the address handed out: the guest renews (T1) at half its
// lifetime and rebinds (T2) at 80%.
const (
	dhcp6Lifetime = time.Hour
	dhcp6T1       = dhcp6Lifetime / 2
	dhcp6T2       = dhcp6Lifetime * 4 / 5
)

// dhcp6Lease is what the launcher's DHCPv6 server hands every client on
// its bridge (a masquerade interface's guest is alone there).
type dhcp6Lease struct {
	Addr     netip.Addr   // the guest's address (IA_NA)
	DNS      []netip.Addr // IPv6 DNS servers, possibly none
	ServerID dhcpv6.DUID  // the server's DUID
}

// dhcp6Server is the stateful DHCPv6 server virt-launcher runs on the
// bridge of a masquerade interface when the pod has IPv6: Advertise for a
// Solicit (Reply for one with Rapid Commit), Reply for Request, Renew,
// Rebind, Confirm, Release, Decline and Information-request, each with
// the one lease.
type dhcp6Server struct {
	bridge string
	lease  dhcp6Lease
	log    logr.Logger
	udp    net.PacketConn
	conn   *ipv6.PacketConn

	closeOnce sync.Once
	closed    chan struct{}
}

// newDHCP6Server opens the server's socket in the network namespace nsPath:
// UDP port 547 bound to bridge, in the group of all DHCP agents there.
func newDHCP6Server(nsPath, bridge string, lease dhcp6Lease, log logr.Logger) (*dhcp6Server, error) {
	s := &dhcp6Server{bridge: bridge, lease: lease, log: log, closed: make(chan struct{})}
	err := nl.Do(nsPath, func() error {
		ifi, err := net.InterfaceByName(bridge)
		if err != nil {
			return err
		}
		lc := net.ListenConfig{Control: nl.BindToDevice(bridge)}
		udp, err := lc.ListenPacket(context.Background(), "udp6", fmt.Sprintf("[::]:%d", dhcp6ServerPort))
		if err != nil {
			return err
		}
		conn := ipv6.NewPacketConn(udp)
		if err := conn.JoinGroup(ifi, &net.UDPAddr{IP: allDHCPAgents}); err != nil {
			udp.Close()
			return fmt.Errorf("join %s on %s: %w", allDHCPAgents, bridge, err)
		}
		s.udp, s.conn = udp, conn
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("dhcpv6 server on %s: %w", bridge, err)
	}
	return s, nil
}

// Serve answers clients until ctx ends or Close is called (then it returns
// nil).
func (s *dhcp6Server) Serve(ctx context.Context) error {
	stop := context.AfterFunc(ctx, func() { _ = s.Close() })
	defer stop()
	buf := make([]byte, 1<<16)
	for {
		n, _, src, err := s.conn.ReadFrom(buf)
		if err != nil {
			select {
			case <-s.closed:
				return nil
			default:
			}
			return fmt.Errorf("dhcpv6 server on %s: read: %w", s.bridge, err)
		}
		resp, err := answer6(buf[:n], s.lease)
		if err != nil {
			s.log.V(1).Info("DHCPv6: no answer", "bridge", s.bridge, "from", src.String(), "reason", err.Error())
			continue
		}
		if _, err := s.conn.WriteTo(resp.ToBytes(), nil, src); err != nil {
			s.log.V(1).Info("DHCPv6: sending the answer failed", "bridge", s.bridge, "to", src.String(), "error", err.Error())
			continue
		}
		s.log.V(1).Info("DHCPv6: answered", "bridge", s.bridge, "to", src.String(), "answer", resp.Summary())
	}
}

// Close stops Serve and releases the socket; it may be called more than
// once.
func (s *dhcp6Server) Close() error {
	var err error
	s.closeOnce.Do(func() {
		close(s.closed)
		err = s.udp.Close()
	})
	return err
}

// errNoAnswer is answer6's error for a message the server leaves
// unanswered.
var errNoAnswer = errors.New("no answer")

// answer6 is the server's answer to the datagram pkt, or an error wrapping
// errNoAnswer saying why it gets none. Every address is lease.Addr, bound
// to the first IA_NA a client asks for, with the client's IAID; other
// IA_NAs of the same message get status NoAddrsAvail.
func answer6(pkt []byte, lease dhcp6Lease) (*dhcpv6.Message, error) {
	req, err := dhcpv6.MessageFromBytes(pkt)
	if err != nil {
		return nil, fmt.Errorf("%w: not a DHCPv6 client message: %v", errNoAnswer, err)
	}
	t := req.MessageType
	cid := req.Options.ClientID()
	sid := req.Options.ServerID()
	switch t {
	case dhcpv6.MessageTypeSolicit, dhcpv6.MessageTypeRebind, dhcpv6.MessageTypeConfirm:
		// Sent to every server: one naming a server is malformed.
		if sid != nil {
			return nil, fmt.Errorf("%w: %s names a server", errNoAnswer, t)
		}
	case dhcpv6.MessageTypeRequest, dhcpv6.MessageTypeRenew, dhcpv6.MessageTypeRelease, dhcpv6.MessageTypeDecline:
		// For the server the client chose: another one's are not ours.
		if sid == nil || !sid.Equal(lease.ServerID) {
			return nil, fmt.Errorf("%w: %s for another server (%v)", errNoAnswer, t, sid)
		}
	case dhcpv6.MessageTypeInformationRequest:
		if sid != nil && !sid.Equal(lease.ServerID) {
			return nil, fmt.Errorf("%w: %s for another server (%v)", errNoAnswer, t, sid)
		}
	default:
		return nil, fmt.Errorf("%w: message type %s is not a client's request", errNoAnswer, t)
	}
	if cid == nil && t != dhcpv6.MessageTypeInformationRequest {
		return nil, fmt.Errorf("%w: %s without a client ID", errNoAnswer, t)
	}

	resp := &dhcpv6.Message{MessageType: dhcpv6.MessageTypeReply, TransactionID: req.TransactionID}
	if t == dhcpv6.MessageTypeSolicit && req.GetOneOption(dhcpv6.OptionRapidCommit) == nil {
		resp.MessageType = dhcpv6.MessageTypeAdvertise
	}
	if cid != nil {
		resp.AddOption(dhcpv6.OptClientID(cid))
	}
	resp.AddOption(dhcpv6.OptServerID(lease.ServerID))
	if t == dhcpv6.MessageTypeSolicit && resp.MessageType == dhcpv6.MessageTypeReply {
		resp.AddOption(&dhcpv6.OptionGeneric{OptionCode: dhcpv6.OptionRapidCommit})
	}
	switch t {
	case dhcpv6.MessageTypeRelease, dhcpv6.MessageTypeDecline:
		// Nothing to free: the address stays the guest's.
		resp.AddOption(&dhcpv6.OptStatusCode{StatusCode: iana.StatusSuccess, StatusMessage: "ok"})
		return resp, nil
	case dhcpv6.MessageTypeConfirm:
		// The addresses confirmed must be the lease's (on this link).
		for _, ia := range req.Options.IANA() {
			for _, a := range ia.Options.Addresses() {
				if ip, ok := netip.AddrFromSlice(a.IPv6Addr); !ok || ip.Unmap() != lease.Addr {
					resp.AddOption(&dhcpv6.OptStatusCode{StatusCode: iana.StatusNotOnLink, StatusMessage: lease.Addr.String() + " is the address on this link"})
					return resp, nil
				}
			}
		}
		resp.AddOption(&dhcpv6.OptStatusCode{StatusCode: iana.StatusSuccess, StatusMessage: "ok"})
	}
	if t != dhcpv6.MessageTypeInformationRequest {
		ianas := req.Options.IANA()
		if len(ianas) == 0 && t == dhcpv6.MessageTypeSolicit {
			resp.AddOption(&dhcpv6.OptStatusCode{StatusCode: iana.StatusNoAddrsAvail, StatusMessage: "only addresses (IA_NA) are served"})
		}
		for i, ia := range ianas {
			out := &dhcpv6.OptIANA{IaId: ia.IaId}
			if i == 0 {
				out.T1, out.T2 = dhcp6T1, dhcp6T2
				out.Options.Add(&dhcpv6.OptIAAddress{IPv6Addr: net.IP(lease.Addr.AsSlice()), PreferredLifetime: dhcp6Lifetime, ValidLifetime: dhcp6Lifetime})
			} else {
				out.Options.Add(&dhcpv6.OptStatusCode{StatusCode: iana.StatusNoAddrsAvail, StatusMessage: "one address per client"})
			}
			resp.AddOption(out)
		}
	}
	if len(lease.DNS) > 0 {
		dns := make([]net.IP, 0, len(lease.DNS))
		for _, a := range lease.DNS {
			dns = append(dns, net.IP(a.AsSlice()))
		}
		resp.AddOption(dhcpv6.OptDNS(dns...))
	}
	return resp, nil
}

// serverDUID is the launcher's DUID on a bridge: link-layer (DUID-LL) with
// the bridge's MAC.
func serverDUID(mac net.HardwareAddr) dhcpv6.DUID {
	return &dhcpv6.DUIDLL{HWType: iana.HWTypeEthernet, LinkLayerAddr: bytes.Clone(mac)}
}
