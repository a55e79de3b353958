// Package dhcp is the DHCPv4 server (Server), and the router advertisement
// and DHCPv6 server (Server6), kvnet runs for VMs on a primary network.
//
// Upstream OVN-Kubernetes answers DHCP on the logical switch port of a VM
// on a primary Layer2 UDN, and KubeVirt's l2bridge (managedTap) binding
// relies on that: virt-launcher serves no DHCP of its own on that binding.
// kvnet has no OVN, so it runs one Server per node per network instead,
// inside the network's router namespace, listening on the interface that
// faces the network's bridge and holds the gateway IP.
//
// The server allocates nothing. It answers only MACs its Leases knows (the
// pods on this node) and always with exactly their allocated Lease: OFFER
// for DISCOVER, ACK for a REQUEST of the leased address, NAK for a REQUEST
// of any other address. Unknown MACs and every other message type get no
// reply at all, so several nodes' servers can share a Layer2 segment. The
// options served follow KubeVirt's built-in server (subnet mask, router,
// DNS, hostname, domain, search list, MTU, classless static routes).
//
// On a network with an IPv6 subnet, Server6 does for IPv6 what OVN does on
// such a port: router advertisements with the Managed flag, the gateway's
// link-local address as default router, the subnet on-link but never for
// SLAAC, and the MTU; and stateful DHCPv6 handing each known MAC its
// Lease.IP6 in an IA_NA, with DNS servers and search list. Its DUID is
// derived from the gateway interface's MAC, which kvnet makes the same on
// every node, so a guest that migrated renews with its new node's server.
package dhcp

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/go-logr/logr"
	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/dhcpv4/server4"
	"golang.org/x/net/ipv4"
)

// Config configures New.
type Config struct {
	// NetNS is the path of the network namespace to serve in (for example
	// /var/run/netns/<name>); "" serves in the caller's namespace.
	NetNS string
	// Interface is the interface to listen on: the gateway interface that
	// faces the network's bridge. Required.
	Interface string
	// ServerIP is the server identifier (option 54) and the source address
	// of every reply. It must be an IPv4 address on Interface: clients
	// unicast renewals to it.
	ServerIP netip.Addr
	// Leases answers which lease each MAC gets. Required. It is called
	// from the Serve goroutine only.
	Leases Leases
	// Log receives one debug (V(1)) line per request with the MAC, message
	// type and address. The zero value discards.
	Log logr.Logger
}

// Server is a DHCPv4 server bound to one interface. Create it with New,
// run it with Serve and stop it by cancelling Serve's context or calling
// Close.
type Server struct {
	cfg     Config
	ifIndex int // of cfg.Interface, for IP_PKTINFO on replies
	udp     net.PacketConn
	conn    *ipv4.PacketConn

	closeOnce sync.Once
	closed    chan struct{} // closed by Close
}

// New validates cfg and opens the listening socket in cfg.NetNS, so that a
// missing interface or address, or a busy port, is reported here rather
// than from Serve. The socket stays in that namespace whatever thread later
// uses it. The caller must Close the server (or cancel a running Serve).
func New(cfg Config) (*Server, error) {
	if cfg.Interface == "" {
		return nil, errors.New("dhcp config: interface is required")
	}
	if !cfg.ServerIP.Is4() {
		return nil, fmt.Errorf("dhcp config: server ip %q: not ipv4", cfg.ServerIP)
	}
	if cfg.Leases == nil {
		return nil, errors.New("dhcp config: leases is required")
	}
	s := &Server{cfg: cfg, closed: make(chan struct{})}
	open := func(ns.NetNS) error {
		ifc, err := net.InterfaceByName(cfg.Interface)
		if err != nil {
			return fmt.Errorf("find interface %q: %w", cfg.Interface, err)
		}
		if err := hasAddr(ifc, cfg.ServerIP); err != nil {
			return err
		}
		s.ifIndex = ifc.Index
		// server4's socket sets SO_BINDTODEVICE, so only this
		// interface's broadcasts reach us, and SO_BROADCAST for replies
		// to 255.255.255.255.
		udp, err := server4.NewIPv4UDPConn(cfg.Interface, &net.UDPAddr{Port: dhcpv4.ServerPort})
		if err != nil {
			return fmt.Errorf("listen on %q: %w", cfg.Interface, err)
		}
		s.udp = udp
		return nil
	}
	var err error
	if cfg.NetNS == "" {
		err = open(nil)
	} else {
		err = ns.WithNetNSPath(cfg.NetNS, open)
	}
	if err != nil {
		return nil, fmt.Errorf("open dhcp server in netns %q: %w", cfg.NetNS, err)
	}
	s.conn = ipv4.NewPacketConn(s.udp)
	return s, nil
}

// hasAddr reports, as an error, whether ip is missing from ifc.
func hasAddr(ifc *net.Interface, ip netip.Addr) error {
	addrs, err := ifc.Addrs()
	if err != nil {
		return fmt.Errorf("list addresses of %q: %w", ifc.Name, err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && slices.Equal(n.IP.To4(), ip.AsSlice()) {
			return nil
		}
	}
	return fmt.Errorf("server ip %s is not on interface %q", ip, ifc.Name)
}

// Serve answers requests until ctx ends or Close is called, and then
// returns nil; any other socket error is returned. Requests are handled one
// at a time: a node serves a handful of VMs per network, and serial
// handling keeps replies to one client in order. Serve must be called at
// most once.
func (s *Server) Serve(ctx context.Context) error {
	stop := context.AfterFunc(ctx, func() { _ = s.Close() })
	defer stop()
	defer func() { _ = s.Close() }()

	// A DHCP message fits one Ethernet frame in practice, but a jumbo-MTU
	// bridge could carry a larger one; read whole datagrams.
	buf := make([]byte, 1<<16)
	for {
		n, _, _, err := s.conn.ReadFrom(buf)
		if err != nil {
			select {
			case <-s.closed:
				return nil
			default:
			}
			return fmt.Errorf("read on %q: %w", s.cfg.Interface, err)
		}
		s.handle(buf[:n])
	}
}

// Close stops Serve and releases the socket. It is safe to call more than
// once and concurrently with Serve.
func (s *Server) Close() error {
	var err error
	s.closeOnce.Do(func() {
		close(s.closed)
		err = s.udp.Close()
	})
	return err
}

// handle answers one datagram; every outcome is logged, none is fatal.
func (s *Server) handle(pkt []byte) {
	log := s.cfg.Log
	req, resp, dst, err := respond(pkt, s.cfg.Leases, s.cfg.ServerIP)
	if req == nil {
		log.V(1).Info("dropping malformed DHCP packet", "len", len(pkt), "error", err.Error())
		return
	}
	log = log.WithValues("mac", req.ClientHWAddr.String(), "type", req.MessageType().String(), "xid", req.TransactionID.String())
	if err != nil {
		log.V(1).Info("ignoring DHCP request", "reason", err.Error())
		return
	}
	// IP_PKTINFO pins the source to ServerIP, which matters when the
	// interface has several addresses: clients compare it with option 54.
	cm := &ipv4.ControlMessage{Src: s.cfg.ServerIP.AsSlice(), IfIndex: s.ifIndex}
	if _, err := s.conn.WriteTo(resp.ToBytes(), cm, dst); err != nil {
		log.Error(err, "sending DHCP reply failed", "reply", resp.MessageType().String(), "dst", dst.String())
		return
	}
	log.V(1).Info("answered DHCP request", "reply", resp.MessageType().String(), "ip", resp.YourIPAddr.String(), "dst", dst.String())
}

// respond is handle without the socket: it decodes a datagram (req is nil
// when it is not a DHCPv4 message) and answers it as answer does.
func respond(pkt []byte, leases Leases, serverIP netip.Addr) (req, resp *dhcpv4.DHCPv4, dst *net.UDPAddr, err error) {
	req, err = dhcpv4.FromBytes(pkt)
	if err != nil {
		return nil, nil, nil, err
	}
	resp, dst, err = answer(req, leases, serverIP)
	return req, resp, dst, err
}
