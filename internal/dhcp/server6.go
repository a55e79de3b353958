package dhcp

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/go-logr/logr"
	"github.com/insomniacslk/dhcp/dhcpv6"
	"golang.org/x/net/bpf"
	"golang.org/x/net/ipv6"
	"golang.org/x/sys/unix"
	"kvnet.io/kvnet/internal/nl"
)

// Config6 configures New6.
type Config6 struct {
	// NetNS is the path of the network namespace to serve in; "" serves
	// in the caller's namespace.
	NetNS string
	// Interface is the gateway interface facing the network's bridge.
	// Required. Its MAC is the server's DUID (see serverDUID) and the
	// advertised router's link-layer address; its link-local address is
	// the router guests get.
	Interface string
	// Leases answers which lease each MAC gets; the server serves
	// Lease.IP6, Lease.DNS's IPv6 entries and Lease.Search. Required.
	Leases Leases
	// Prefixes are the network's IPv6 subnets on this link, advertised
	// on-link (never for address autoconfiguration). At least one.
	Prefixes []netip.Prefix
	// MTU is advertised in the router advertisement; 0 omits it.
	MTU int
	// DefaultRouter advertises the gateway as default router (primary
	// networks); otherwise the router lifetime is 0.
	DefaultRouter bool
	// RAInterval is the longest interval between unsolicited router
	// advertisements (RFC 4861's MaxRtrAdvInterval; each interval is
	// random between a third of it and it); 0 means DefaultRAInterval.
	RAInterval time.Duration
	// DeclineHold is how long an address a client declined is withheld
	// from it; 0 means DefaultDeclineHold.
	DeclineHold time.Duration
	// OnDecline, if set, is called when a client declines its lease's
	// address (its duplicate address detection found another node
	// holding it), once per hold: the caller reports the conflict. It
	// must not block.
	OnDecline func(mac net.HardwareAddr, addr netip.Addr)
	// Log receives one debug (V(1)) line per message. The zero value
	// discards.
	Log logr.Logger
}

// Server6 serves IPv6 to the guests of one network on one node: router
// advertisements (answering router solicitations, and unsolicited ones
// periodically, all multicast and paced by raPacer) and stateful DHCPv6.
// Like Server, it answers only the MACs its Leases knows.
//
// The advertisements carry the IPv6 DNS servers and search domains every
// lease shares (RDNSS and DNSSL, RFC 8106) when Leases can list them
// (StaticLeases can): an advertisement goes to every guest on the link.
//
// DHCPv6 clients send from link-local addresses, which need not be derived
// from their MAC, so the server reads client messages from a packet socket
// (filtered to UDP port 547) to learn the sender's MAC, the lease key; it
// replies through a UDP socket on port 547.
type Server6 struct {
	cfg     Config6
	ifIndex int
	mac     net.HardwareAddr
	duid    dhcpv6.DUID
	dec     *declines

	// solicits wakes the advertiser: a valid router solicitation came.
	solicits chan struct{}
	// now and raDelay are the advertiser's clock and its random delay of
	// solicited advertisements (seams for tests).
	now     func() time.Time
	raDelay func() time.Duration
	// raSent counts multicast advertisements sent (tests).
	raSent atomic.Int64

	pkt  *os.File       // AF_PACKET, the client messages
	udp  net.PacketConn // UDP [::]:547 on the interface, the replies
	udp6 *ipv6.PacketConn
	icmp net.PacketConn // ICMPv6, router solicitations in, advertisements out
	nd   *ipv6.PacketConn

	closeOnce sync.Once
	closed    chan struct{}
}

// allRouters and allNodes are the link-local groups of router
// solicitations and advertisements.
var (
	allRouters = netip.MustParseAddr("ff02::2")
	allNodes   = netip.MustParseAddr("ff02::1")
)

// New6 validates cfg and opens the server's sockets in cfg.NetNS, so that
// a missing interface or a busy port is reported here. The caller must
// Close the server (or cancel a running Serve).
func New6(cfg Config6) (*Server6, error) {
	if cfg.Interface == "" {
		return nil, errors.New("dhcpv6 config: interface is required")
	}
	if cfg.Leases == nil {
		return nil, errors.New("dhcpv6 config: leases is required")
	}
	if len(cfg.Prefixes) == 0 {
		return nil, errors.New("dhcpv6 config: prefixes: at least one ipv6 prefix is required")
	}
	for _, p := range cfg.Prefixes {
		if !p.IsValid() || !p.Addr().Is6() || p.Addr().Is4In6() {
			return nil, fmt.Errorf("dhcpv6 config: prefix %q: not ipv6", p)
		}
	}
	if cfg.MTU < 0 || (cfg.MTU > 0 && cfg.MTU < 1280) {
		return nil, fmt.Errorf("dhcpv6 config: mtu %d: below the IPv6 minimum 1280", cfg.MTU)
	}
	if cfg.RAInterval == 0 {
		cfg.RAInterval = DefaultRAInterval
	}
	if cfg.RAInterval < 4*time.Second || cfg.RAInterval > 1800*time.Second {
		return nil, fmt.Errorf("dhcpv6 config: ra interval %s: out of range 4s-1800s", cfg.RAInterval)
	}
	if cfg.DeclineHold == 0 {
		cfg.DeclineHold = DefaultDeclineHold
	}
	if cfg.DeclineHold < 0 {
		return nil, fmt.Errorf("dhcpv6 config: decline hold %s: negative", cfg.DeclineHold)
	}
	s := &Server6{cfg: cfg, closed: make(chan struct{}), solicits: make(chan struct{}, 1),
		now: time.Now, raDelay: func() time.Duration { return rand.N(maxRADelay) }}
	s.dec = newDeclines(cfg.DeclineHold, s.now, cfg.OnDecline)
	open := func(ns.NetNS) error {
		ifc, err := net.InterfaceByName(cfg.Interface)
		if err != nil {
			return fmt.Errorf("find interface %q: %w", cfg.Interface, err)
		}
		if len(ifc.HardwareAddr) != 6 {
			return fmt.Errorf("interface %q: mac %q: not ethernet", cfg.Interface, ifc.HardwareAddr)
		}
		s.ifIndex = ifc.Index
		s.mac = ifc.HardwareAddr
		s.duid = serverDUID(ifc.HardwareAddr)
		if _, err := s.advertisement().marshal(); err != nil {
			return fmt.Errorf("router advertisement: %w", err)
		}
		if err := s.openUDP(ifc); err != nil {
			return err
		}
		if err := s.openICMP(ifc); err != nil {
			return err
		}
		return s.openPacket(ifc)
	}
	var err error
	if cfg.NetNS == "" {
		err = open(nil)
	} else {
		err = ns.WithNetNSPath(cfg.NetNS, open)
	}
	if err != nil {
		s.closeSockets()
		return nil, fmt.Errorf("open dhcpv6 server in netns %q: %w", cfg.NetNS, err)
	}
	return s, nil
}

func (s *Server6) openUDP(ifc *net.Interface) error {
	lc := net.ListenConfig{Control: nl.BindToDevice(ifc.Name)}
	udp, err := lc.ListenPacket(context.Background(), "udp6", fmt.Sprintf("[::]:%d", dhcp6ServerPort))
	if err != nil {
		return fmt.Errorf("listen on %q port %d: %w", ifc.Name, dhcp6ServerPort, err)
	}
	s.udp, s.udp6 = udp, ipv6.NewPacketConn(udp)
	// Joined so that the interface accepts the group's frames; the packet
	// socket reads them.
	if err := s.udp6.JoinGroup(ifc, &net.UDPAddr{IP: allDHCPAgents.AsSlice()}); err != nil {
		return fmt.Errorf("join %s on %q: %w", allDHCPAgents, ifc.Name, err)
	}
	return nil
}

func (s *Server6) openICMP(ifc *net.Interface) error {
	lc := net.ListenConfig{Control: nl.BindToDevice(ifc.Name)}
	c, err := lc.ListenPacket(context.Background(), "ip6:ipv6-icmp", "::")
	if err != nil {
		return fmt.Errorf("open icmpv6 socket on %q: %w", ifc.Name, err)
	}
	s.icmp, s.nd = c, ipv6.NewPacketConn(c)
	var f ipv6.ICMPFilter
	f.SetAll(true)
	f.Accept(ipv6.ICMPTypeRouterSolicitation)
	for _, step := range []error{
		s.nd.SetICMPFilter(&f),
		s.nd.SetControlMessage(ipv6.FlagHopLimit|ipv6.FlagSrc, true),
		s.nd.SetMulticastHopLimit(255),
		s.nd.SetHopLimit(255),
		s.nd.SetMulticastInterface(ifc),
		s.nd.SetMulticastLoopback(false),
		s.nd.JoinGroup(ifc, &net.IPAddr{IP: allRouters.AsSlice()}),
	} {
		if step != nil {
			return fmt.Errorf("icmpv6 socket on %q: %w", ifc.Name, step)
		}
	}
	return nil
}

// dhcp6Filter passes only IPv6 UDP datagrams to port 547 (offsets in an
// Ethernet frame without extension headers).
var dhcp6Filter = []bpf.Instruction{
	bpf.LoadAbsolute{Off: 12, Size: 2},
	bpf.JumpIf{Cond: bpf.JumpEqual, Val: ethTypeIPv6, SkipFalse: 5},
	bpf.LoadAbsolute{Off: ethHeaderLen + 6, Size: 1},
	bpf.JumpIf{Cond: bpf.JumpEqual, Val: ipProtoUDP, SkipFalse: 3},
	bpf.LoadAbsolute{Off: ethHeaderLen + ipv6HeaderLen + 2, Size: 2},
	bpf.JumpIf{Cond: bpf.JumpEqual, Val: dhcp6ServerPort, SkipFalse: 1},
	bpf.RetConstant{Val: 1 << 16},
	bpf.RetConstant{Val: 0},
}

// htons converts a 16-bit protocol number to network byte order.
func htons(v uint16) uint16 { return v<<8 | v>>8 }

func (s *Server6) openPacket(ifc *net.Interface) error {
	// Protocol 0 receives nothing until bind, so the filter is in place
	// before the first frame.
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		return fmt.Errorf("open packet socket: %w", err)
	}
	raw, err := bpf.Assemble(dhcp6Filter)
	if err != nil {
		unix.Close(fd)
		return fmt.Errorf("assemble dhcpv6 filter: %w", err)
	}
	prog := make([]unix.SockFilter, len(raw))
	for i, r := range raw {
		prog[i] = unix.SockFilter{Code: r.Op, Jt: r.Jt, Jf: r.Jf, K: r.K}
	}
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: (*unix.SockFilter)(unsafe.Pointer(&prog[0]))}
	if err := unix.SetsockoptSockFprog(fd, unix.SOL_SOCKET, unix.SO_ATTACH_FILTER, &fprog); err != nil {
		unix.Close(fd)
		return fmt.Errorf("attach dhcpv6 filter: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_IPV6), Ifindex: ifc.Index}); err != nil {
		unix.Close(fd)
		return fmt.Errorf("bind packet socket to %q: %w", ifc.Name, err)
	}
	s.pkt = os.NewFile(uintptr(fd), "dhcpv6-"+ifc.Name)
	return nil
}

// Serve answers DHCPv6 clients and router solicitations and sends
// unsolicited router advertisements until ctx ends or Close is called
// (then it returns nil); a socket error is returned. Serve must be called
// at most once.
func (s *Server6) Serve(ctx context.Context) error {
	stop := context.AfterFunc(ctx, func() { _ = s.Close() })
	defer stop()
	defer func() { _ = s.Close() }()

	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for _, loop := range []func() error{s.serveDHCP, s.drainUDP, s.serveRS, s.advertise} {
		wg.Go(func() {
			if err := loop(); err != nil {
				errs <- err
				_ = s.Close()
			}
		})
	}
	wg.Wait()
	close(errs)
	select {
	case <-ctx.Done():
		return nil
	default:
	}
	return <-errs // nil after Close
}

// Close stops Serve and releases the sockets. It is safe to call more
// than once and concurrently with Serve.
func (s *Server6) Close() error {
	s.closeOnce.Do(func() {
		close(s.closed)
		s.closeSockets()
	})
	return nil
}

func (s *Server6) closeSockets() {
	for _, c := range []interface{ Close() error }{s.pkt, s.udp, s.icmp} {
		if c != nil && !isNilCloser(c) {
			_ = c.Close()
		}
	}
}

// isNilCloser reports whether c is a typed nil (a socket never opened).
func isNilCloser(c interface{ Close() error }) bool {
	switch v := c.(type) {
	case *os.File:
		return v == nil
	}
	return false
}

// readErr turns a read error into nil once the server is closed.
func (s *Server6) readErr(what string, err error) error {
	select {
	case <-s.closed:
		return nil
	default:
	}
	return fmt.Errorf("%s on %q: %w", what, s.cfg.Interface, err)
}

func (s *Server6) serveDHCP() error {
	buf := make([]byte, 1<<16)
	for {
		n, err := s.pkt.Read(buf)
		if err != nil {
			return s.readErr("read dhcpv6", err)
		}
		s.handleDHCP(buf[:n])
	}
}

func (s *Server6) handleDHCP(b []byte) {
	log := s.cfg.Log
	f, req, resp, err := respond6(b, s.cfg.Leases, s.duid, s.dec)
	if req == nil {
		log.V(1).Info("dropping malformed DHCPv6 packet", "len", len(b), "error", err.Error())
		return
	}
	log = log.WithValues("mac", f.mac.String(), "type", req.MessageType.String(), "xid", req.TransactionID.String())
	if err != nil {
		log.V(1).Info("ignoring DHCPv6 message", "reason", err.Error())
		return
	}
	dst := &net.UDPAddr{IP: f.src.AsSlice(), Port: int(f.srcPort)}
	if f.src.IsLinkLocalUnicast() || f.src.IsLinkLocalMulticast() {
		dst.Zone = s.cfg.Interface
	}
	cm := &ipv6.ControlMessage{IfIndex: s.ifIndex}
	if _, err := s.udp6.WriteTo(resp.ToBytes(), cm, dst); err != nil {
		log.Error(err, "sending DHCPv6 reply failed", "reply", resp.MessageType.String(), "dst", dst.String())
		return
	}
	log.V(1).Info("answered DHCPv6 message", "reply", resp.MessageType.String(), "dst", dst.String())
}

// drainUDP discards what the UDP socket receives: the packet socket has
// the same datagrams with their sender's MAC.
func (s *Server6) drainUDP() error {
	buf := make([]byte, 1<<16)
	for {
		if _, _, err := s.udp.ReadFrom(buf); err != nil {
			return s.readErr("read udp", err)
		}
	}
}

func (s *Server6) serveRS() error {
	buf := make([]byte, 1<<16)
	for {
		n, cm, src, err := s.nd.ReadFrom(buf)
		if err != nil {
			return s.readErr("read router solicitation", err)
		}
		// RFC 4861 §6.1.1: a solicitation from off-link (hop limit
		// below 255) is invalid.
		if cm == nil || cm.HopLimit != 255 {
			continue
		}
		mac, err := parseRS(buf[:n])
		if err != nil {
			s.cfg.Log.V(1).Info("dropping invalid router solicitation", "src", fmt.Sprint(src), "error", err.Error())
			continue
		}
		s.cfg.Log.V(1).Info("router solicitation", "src", fmt.Sprint(src), "mac", mac.String())
		select {
		case s.solicits <- struct{}{}:
		default: // the advertiser has one to handle already
		}
	}
}

// advertise multicasts the advertisements when raPacer says: unsolicited
// ones, and those answering solicitations, never closer than
// minDelayBetweenRAs, however many solicitations come.
func (s *Server6) advertise() error {
	p := newRAPacer(s.now(), s.cfg.RAInterval)
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-s.closed:
			return nil
		case <-s.solicits:
			p.solicit(s.now(), s.raDelay())
		case <-t.C:
			if now := s.now(); !now.Before(p.next) {
				s.sendRA()
				p.sent(now, rand.Float64())
			}
		}
		t.Reset(p.next.Sub(s.now()))
	}
}

// advertisement is the server's advertisement as of now: the DNS servers
// and search domains its leases share may change.
func (s *Server6) advertisement() *routerAdvert {
	dns, search := sharedDNS(s.cfg.Leases)
	return advertisement(raContent{prefixes: s.cfg.Prefixes, mac: s.mac, mtu: s.cfg.MTU, defaultRouter: s.cfg.DefaultRouter,
		dns: dns, search: search, dnsLifetime: 3 * s.cfg.RAInterval})
}

// sendRA multicasts the advertisement to all nodes. Every guest on the
// link gets the same one, so answering a solicitation with it costs
// nothing extra. A failure (the interface's link-local address still
// tentative, say) is logged; the next one is never far.
func (s *Server6) sendRA() {
	ra, err := s.advertisement().marshal()
	if err != nil {
		// The leases' DNS servers or search domains do not fit:
		// advertise without them.
		s.cfg.Log.Error(err, "router advertisement with the leases' DNS: sending it without")
		ra, err = advertisement(raContent{prefixes: s.cfg.Prefixes, mac: s.mac, mtu: s.cfg.MTU, defaultRouter: s.cfg.DefaultRouter}).marshal()
		if err != nil {
			s.cfg.Log.Error(err, "router advertisement")
			return
		}
	}
	dst := &net.IPAddr{IP: allNodes.AsSlice(), Zone: s.cfg.Interface}
	cm := &ipv6.ControlMessage{HopLimit: 255, IfIndex: s.ifIndex}
	if _, err := s.nd.WriteTo(ra, cm, dst); err != nil {
		select {
		case <-s.closed:
		default:
			s.cfg.Log.V(1).Info("sending router advertisement failed", "error", err.Error())
		}
		return
	}
	s.raSent.Add(1)
}

// sharedDNS returns the IPv6 DNS servers and the search domains every
// lease of leases has, in the order of one of them; none when leases
// cannot be listed or has no lease.
func sharedDNS(leases Leases) (dns []netip.Addr, search []string) {
	r, ok := leases.(interface {
		Range(func(net.HardwareAddr, Lease) bool)
	})
	if !ok {
		return nil, nil
	}
	first := true
	r.Range(func(_ net.HardwareAddr, l Lease) bool {
		var v6 []netip.Addr
		for _, a := range l.DNS {
			if a.Is6() && !a.Is4In6() {
				v6 = append(v6, a)
			}
		}
		if first {
			dns, search, first = v6, slices.Clone(l.Search), false
			return true
		}
		dns = slices.DeleteFunc(dns, func(a netip.Addr) bool { return !slices.Contains(v6, a) })
		search = slices.DeleteFunc(search, func(d string) bool { return !slices.Contains(l.Search, d) })
		return len(dns) > 0 || len(search) > 0
	})
	return dns, search
}
