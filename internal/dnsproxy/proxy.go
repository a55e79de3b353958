package dnsproxy

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/sys/unix"

	"kvnet.io/kvnet/internal/nl"
)

// Network is what the proxy does for one network.
type Network struct {
	// Name names the network in logs.
	Name string
	// Listen are the addresses the proxy takes queries at, UDP and TCP
	// (the node's end of the network's transit link, which need not exist
	// yet: the sockets bind freely).
	Listen []netip.AddrPort
	// Clients are the only sources answered (the network's router, which
	// masquerades its pods' queries); a query from any other is dropped.
	Clients []netip.Addr
	// UDP and TCP are the cluster DNS servers queries are forwarded to,
	// by the protocol they came in; none: queries of that protocol get
	// no answer.
	UDP, TCP []netip.AddrPort
	// Rewrite maps a pod's default-network address to its address on the
	// network, of the same family.
	Rewrite map[netip.Addr]netip.Addr
}

// Config configures a Proxy.
type Config struct {
	// NetNS is the network namespace the proxy's sockets are opened in
	// ("": the calling thread's): the node's.
	NetNS string
	// Timeout bounds each exchange with an upstream server (default 2 s,
	// below resolvers' usual 5 s, so a client's retry meets a fresh one).
	Timeout time.Duration
	// Observe, if set, is told each query's outcome ("answered",
	// "upstream-error", "dropped") and how many records it rewrote.
	Observe func(outcome string, rewritten int)
}

// Outcomes given to Config.Observe.
const (
	OutcomeAnswered      = "answered"
	OutcomeUpstreamError = "upstream-error"
	OutcomeDropped       = "dropped"
)

// maxInFlight bounds the UDP queries one listener forwards at once;
// beyond it queries are dropped (the client retries).
const maxInFlight = 256

// tcpIdle closes a client's TCP connection idle this long (RFC 7766
// suggests seconds).
const tcpIdle = 10 * time.Second

// Proxy serves the networks given to Sync. Its methods are safe for
// concurrent use.
type Proxy struct {
	cfg Config

	mu        sync.Mutex                   // guards following
	listeners map[netip.AddrPort]*listener // listening address -> its sockets
	closed    bool
}

// New returns a proxy serving nothing until Sync.
func New(cfg Config) *Proxy {
	if cfg.Timeout <= 0 {
		cfg.Timeout = 2 * time.Second
	}
	return &Proxy{cfg: cfg, listeners: map[netip.AddrPort]*listener{}}
}

// listener is one listening address's UDP and TCP sockets.
type listener struct {
	p    *Proxy
	addr netip.AddrPort
	net  atomic.Pointer[Network]
	udp  *net.UDPConn
	tcp  *net.TCPListener
	sem  chan struct{}
	// ctx ends when the listener closes, and with it open client
	// connections.
	ctx    context.Context
	cancel context.CancelFunc
	done   sync.WaitGroup
	log    logr.Logger
}

// Sync makes the proxy serve exactly nets: it opens the addresses new to
// it, closes those no network lists any more, and updates the rest in
// place (queries in flight finish with what they started with). It
// returns the names of the networks it serves on all their addresses;
// for the others (an address that could not be opened, or listed by two
// networks) it returns an error naming each, and they should not be sent
// here.
func (p *Proxy) Sync(ctx context.Context, nets []Network) (map[string]bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, errors.New("dns proxy: closed")
	}
	logger := logr.FromContextOrDiscard(ctx)
	want := map[netip.AddrPort]*Network{}
	var errs []error
	failed := map[string]bool{}
	for i := range nets {
		n := &nets[i]
		for _, a := range n.Listen {
			if other, dup := want[a]; dup {
				errs = append(errs, fmt.Errorf("dns proxy: networks %q and %q both listen at %s", other.Name, n.Name, a))
				failed[n.Name], failed[other.Name] = true, true
				continue
			}
			want[a] = n
		}
	}
	for a, l := range p.listeners {
		if want[a] == nil {
			l.close()
			delete(p.listeners, a)
		}
	}
	for a, n := range want {
		if l := p.listeners[a]; l != nil {
			l.net.Store(n)
			continue
		}
		l, err := p.listen(a, logger.WithValues("network", n.Name, "listen", a.String()))
		if err != nil {
			errs = append(errs, fmt.Errorf("dns proxy for network %q: %w", n.Name, err))
			failed[n.Name] = true
			continue
		}
		l.net.Store(n)
		p.listeners[a] = l
		l.serve()
	}
	served := map[string]bool{}
	for _, n := range nets {
		if !failed[n.Name] {
			served[n.Name] = true
		}
	}
	return served, errors.Join(errs...)
}

// Close stops serving and waits for the listeners' goroutines.
func (p *Proxy) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for a, l := range p.listeners {
		l.close()
		delete(p.listeners, a)
	}
}

// listen opens a's UDP and TCP sockets in the proxy's namespace.
func (p *Proxy) listen(a netip.AddrPort, logger logr.Logger) (*listener, error) {
	lc := net.ListenConfig{Control: freebind(a.Addr().Is6())}
	udpNet, tcpNet := "udp4", "tcp4"
	if a.Addr().Is6() {
		udpNet, tcpNet = "udp6", "tcp6"
	}
	l := &listener{p: p, addr: a, sem: make(chan struct{}, maxInFlight), log: logger}
	l.ctx, l.cancel = context.WithCancel(context.Background())
	err := nl.Do(p.cfg.NetNS, func() error {
		pc, err := lc.ListenPacket(context.Background(), udpNet, a.String())
		if err != nil {
			return err
		}
		ln, err := lc.Listen(context.Background(), tcpNet, a.String())
		if err != nil {
			pc.Close()
			return err
		}
		l.udp, l.tcp = pc.(*net.UDPConn), ln.(*net.TCPListener)
		return nil
	})
	if err != nil {
		l.cancel()
		return nil, fmt.Errorf("listen at %s: %w", a, err)
	}
	return l, nil
}

// freebind lets a socket bind an address the node does not hold yet:
// the transit link is made by the same apply that sends queries here.
func freebind(v6 bool) func(string, string, syscall.RawConn) error {
	return func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			if v6 {
				serr = unix.SetsockoptInt(int(fd), unix.SOL_IPV6, unix.IPV6_FREEBIND, 1)
			} else {
				serr = unix.SetsockoptInt(int(fd), unix.SOL_IP, unix.IP_FREEBIND, 1)
			}
		})
		return errors.Join(err, serr)
	}
}

func (l *listener) close() {
	l.cancel()
	l.udp.Close()
	l.tcp.Close()
	l.done.Wait()
}

func (l *listener) serve() {
	l.done.Go(l.serveUDP)
	l.done.Go(l.serveTCP)
}

func (l *listener) observe(outcome string, rewritten int) {
	if f := l.p.cfg.Observe; f != nil {
		f(outcome, rewritten)
	}
}

// client returns the network serving from, or nil when from is not one
// of its clients.
func (l *listener) client(from netip.Addr) *Network {
	n := l.net.Load()
	if !slices.Contains(n.Clients, from.Unmap()) {
		return nil
	}
	return n
}

func (l *listener) serveUDP() {
	var inFlight sync.WaitGroup
	defer inFlight.Wait()
	buf := make([]byte, 65535)
	for {
		size, from, err := l.udp.ReadFromUDPAddrPort(buf)
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				l.log.Error(err, "DNS proxy: read")
			}
			return
		}
		n := l.client(from.Addr())
		if n == nil || size < headerLen {
			l.observe(OutcomeDropped, 0)
			continue
		}
		select {
		case l.sem <- struct{}{}:
		default:
			l.observe(OutcomeDropped, 0)
			continue
		}
		query := slices.Clone(buf[:size])
		inFlight.Go(func() {
			defer func() { <-l.sem }()
			resp, err := l.p.exchangeUDP(n.UDP, query)
			if err != nil {
				l.observe(OutcomeUpstreamError, 0)
				return
			}
			k := rewrite(resp, n)
			if _, err := l.udp.WriteToUDPAddrPort(resp, from); err != nil {
				l.observe(OutcomeDropped, k)
				return
			}
			l.observe(OutcomeAnswered, k)
		})
	}
}

// rewrite rewrites resp for n; an answer it cannot walk passes as it is.
func rewrite(resp []byte, n *Network) int {
	k, _ := Rewrite(resp, func(a netip.Addr) (netip.Addr, bool) {
		b, ok := n.Rewrite[a]
		return b, ok
	})
	return k
}

// pick returns the upstream servers in a random order.
func pick(servers []netip.AddrPort) []netip.AddrPort {
	out := slices.Clone(servers)
	rand.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out
}

// dial connects to server from the proxy's namespace.
func (p *Proxy) dial(network string, server netip.AddrPort) (net.Conn, error) {
	var c net.Conn
	err := nl.Do(p.cfg.NetNS, func() (err error) {
		c, err = net.DialTimeout(network, server.String(), p.cfg.Timeout)
		return err
	})
	return c, err
}

// exchangeUDP asks one of servers query and returns its answer (whose ID
// matches the query's).
func (p *Proxy) exchangeUDP(servers []netip.AddrPort, query []byte) ([]byte, error) {
	if len(servers) == 0 {
		return nil, errors.New("no upstream server")
	}
	server := pick(servers)[0]
	c, err := p.dial("udp", server)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(p.cfg.Timeout))
	if _, err := c.Write(query); err != nil {
		return nil, err
	}
	bp := bufs.Get().(*[]byte)
	defer bufs.Put(bp)
	buf := *bp
	for {
		size, err := c.Read(buf)
		if err != nil {
			return nil, err
		}
		if size >= headerLen && buf[0] == query[0] && buf[1] == query[1] {
			return slices.Clone(buf[:size]), nil
		}
	}
}

// bufs holds the buffers upstream answers are read into: a UDP answer
// may be as large as a datagram.
var bufs = sync.Pool{New: func() any { b := make([]byte, 65535); return &b }}

func (l *listener) serveTCP() {
	var conns sync.WaitGroup
	defer conns.Wait()
	for {
		c, err := l.tcp.AcceptTCP()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				l.log.Error(err, "DNS proxy: accept")
			}
			return
		}
		from := c.RemoteAddr().(*net.TCPAddr).AddrPort()
		n := l.client(from.Addr())
		if n == nil {
			c.Close()
			l.observe(OutcomeDropped, 0)
			continue
		}
		conns.Go(func() { l.relayTCP(c, n) })
	}
}

// relayTCP answers the queries of one client connection over one
// upstream connection, in order, until either side closes or idles.
func (l *listener) relayTCP(c *net.TCPConn, n *Network) {
	defer c.Close()
	stop := context.AfterFunc(l.ctx, func() { c.Close() })
	defer stop()
	var up net.Conn
	defer func() {
		if up != nil {
			up.Close()
		}
	}()
	for {
		_ = c.SetDeadline(time.Now().Add(tcpIdle))
		query, err := readFramed(c)
		if err != nil {
			return
		}
		if up == nil {
			servers := pick(n.TCP)
			if len(servers) == 0 {
				l.observe(OutcomeUpstreamError, 0)
				return
			}
			if up, err = l.p.dial("tcp", servers[0]); err != nil {
				l.observe(OutcomeUpstreamError, 0)
				return
			}
		}
		_ = up.SetDeadline(time.Now().Add(l.p.cfg.Timeout))
		var resp []byte
		if err = writeFramed(up, query); err == nil {
			resp, err = readFramed(up)
		}
		if err != nil {
			l.observe(OutcomeUpstreamError, 0)
			return
		}
		k := rewrite(resp, n)
		if err := writeFramed(c, resp); err != nil {
			l.observe(OutcomeDropped, k)
			return
		}
		l.observe(OutcomeAnswered, k)
	}
}

// readFramed reads one length-prefixed DNS message (RFC 7766).
func readFramed(r io.Reader) ([]byte, error) {
	var n [2]byte
	if _, err := io.ReadFull(r, n[:]); err != nil {
		return nil, err
	}
	size := int(binary.BigEndian.Uint16(n[:]))
	if size < headerLen {
		return nil, fmt.Errorf("dns message of %d bytes: shorter than its header", size)
	}
	msg := make([]byte, size)
	if _, err := io.ReadFull(r, msg); err != nil {
		return nil, err
	}
	return msg, nil
}

// writeFramed writes msg with its length prefix.
func writeFramed(w io.Writer, msg []byte) error {
	_, err := w.Write(append(binary.BigEndian.AppendUint16(make([]byte, 0, len(msg)+2), uint16(len(msg))), msg...))
	return err
}
