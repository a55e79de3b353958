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

// dhcp6Lifetime is the preferred and valid lifetime of the address
// handed out: KubeVirt's "infinite" lease, 999 days. The IA_NA's T1 and
// T2 are 0 (the client chooses when to renew), as KubeVirt's.
const dhcp6Lifetime = 999 * 24 * time.Hour

// dhcp6Lease is what the launcher's DHCPv6 server hands every client on
// its bridge (a masquerade interface's guest is alone there).
type dhcp6Lease struct {
	Addr     netip.Addr   // the guest's address (IA_NA)
	DNS      []netip.Addr // IPv6 DNS servers, possibly none
	ServerID dhcpv6.DUID  // the server's DUID
}

// dhcp6Server is the single-client DHCPv6 server virt-launcher runs on
// the bridge of a masquerade interface when the pod has IPv6 (KubeVirt
// v1.8.4, pkg/network/dhcp/serverv6): every answer hands out the one
// lease (see answer6). It sends no router advertisements, and neither
// does anything else of the launcher's: a guest's client that waits for
// one before it asks DHCPv6 never asks.
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
// errNoAnswer saying why it gets none. It answers as KubeVirt v1.8.4's
// serverv6 does, built with the same dhcpv6 calls: an Advertise for a
// Solicit, a Reply with Rapid Commit for one with Rapid Commit, a Reply
// for a Request, Confirm, Renew, Rebind, Release or Information-request,
// whatever server ID it names; nothing for any other message (a Decline
// too) or one without a client ID. Every answer carries the client ID,
// one IA_NA (with the IAID of the message's first IA_NA, 0 if it has
// none; T1 and T2 0) holding lease.Addr for dhcp6Lifetime, the server ID
// and, when lease.DNS is not empty, the DNS servers.
func answer6(pkt []byte, lease dhcp6Lease) (*dhcpv6.Message, error) {
	req, err := dhcpv6.MessageFromBytes(pkt)
	if err != nil {
		return nil, fmt.Errorf("%w: not a DHCPv6 client message: %v", errNoAnswer, err)
	}
	mods := []dhcpv6.Modifier{
		dhcpv6.WithIANA(dhcpv6.OptIAAddress{IPv6Addr: net.IP(lease.Addr.AsSlice()), PreferredLifetime: dhcp6Lifetime, ValidLifetime: dhcp6Lifetime}),
		dhcpv6.WithServerID(lease.ServerID),
	}
	if len(lease.DNS) > 0 {
		dns := make([]net.IP, 0, len(lease.DNS))
		for _, a := range lease.DNS {
			dns = append(dns, net.IP(a.AsSlice()))
		}
		mods = append(mods, dhcpv6.WithDNS(dns...))
	}
	var resp *dhcpv6.Message
	if req.MessageType == dhcpv6.MessageTypeSolicit && req.GetOneOption(dhcpv6.OptionRapidCommit) == nil {
		resp, err = dhcpv6.NewAdvertiseFromSolicit(req, mods...)
	} else {
		// Reply from a Solicit with Rapid Commit (the library adds the
		// option), Request, Confirm, Renew, Rebind, Release or
		// Information-request; an error for any other type.
		resp, err = dhcpv6.NewReplyFromMessage(req, mods...)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", errNoAnswer, req.MessageType, err)
	}
	if ia := req.Options.OneIANA(); ia != nil {
		out := resp.Options.OneIANA()
		out.IaId = ia.IaId
		resp.UpdateOption(out)
	}
	return resp, nil
}

// serverDUID is the launcher's DUID on a bridge: link-layer (DUID-LL) with
// the bridge's MAC.
func serverDUID(mac net.HardwareAddr) dhcpv6.DUID {
	return &dhcpv6.DUIDLL{HWType: iana.HWTypeEthernet, LinkLayerAddr: bytes.Clone(mac)}
}
