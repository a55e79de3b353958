package simlauncher

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv6"

	"kvnet.io/kvnet/internal/nl"
)

// Router advertisements on a masquerade bridge with IPv6: one every
// raInterval, and one for each router solicitation (at most one per
// raMinGap). The default route they give lasts raRouterLifetime.
const (
	raInterval       = time.Minute
	raMinGap         = 200 * time.Millisecond
	raRouterLifetime = 30 * time.Minute
)

var allNodes = net.ParseIP("ff02::1")
var allRouters = net.ParseIP("ff02::2")

// routerAdvertisement is the ICMPv6 message (RFC 4861 4.2) the launcher
// sends on a masquerade bridge: Managed and Other flags (addresses and DNS
// from DHCPv6), the sender as default router, no prefix (no SLAAC), the
// bridge's MAC and, when mtu > 0, the link MTU.
func routerAdvertisement(mac net.HardwareAddr, mtu int) ([]byte, error) {
	const (
		flagManaged = 0x80
		flagOther   = 0x40
	)
	body := make([]byte, 12, 12+8+8)
	body[0] = 64 // current hop limit
	body[1] = flagManaged | flagOther
	binary.BigEndian.PutUint16(body[2:], uint16(raRouterLifetime/time.Second))
	// Reachable time and retransmission timer: 0, unspecified.
	if len(mac) == 6 { // source link-layer address option
		body = append(body, 1, 1)
		body = append(body, mac...)
	}
	if mtu > 0 { // MTU option
		body = append(body, 5, 1, 0, 0)
		body = binary.BigEndian.AppendUint32(body, uint32(mtu))
	}
	m := icmp.Message{Type: ipv6.ICMPTypeRouterAdvertisement, Body: &icmp.RawBody{Data: body}}
	// The kernel computes the checksum of an ICMPv6 raw socket's messages.
	return m.Marshal(nil)
}

// raSender sends router advertisements on a bridge.
type raSender struct {
	bridge string
	msg    []byte
	log    logr.Logger
	ipc    net.PacketConn
	conn   *ipv6.PacketConn
	dst    *net.IPAddr

	mu   sync.Mutex
	last time.Time // of the last advertisement sent

	closeOnce sync.Once
	closed    chan struct{}
}

// newRASender opens an ICMPv6 socket bound to bridge in the network
// namespace nsPath that hears router solicitations there.
func newRASender(nsPath, bridge string, mtu int, log logr.Logger) (*raSender, error) {
	r := &raSender{bridge: bridge, log: log, closed: make(chan struct{}), dst: &net.IPAddr{IP: allNodes, Zone: bridge}}
	err := nl.Do(nsPath, func() error {
		ifi, err := net.InterfaceByName(bridge)
		if err != nil {
			return err
		}
		if r.msg, err = routerAdvertisement(ifi.HardwareAddr, mtu); err != nil {
			return err
		}
		lc := net.ListenConfig{Control: nl.BindToDevice(bridge)}
		ipc, err := lc.ListenPacket(context.Background(), "ip6:ipv6-icmp", "::")
		if err != nil {
			return err
		}
		conn := ipv6.NewPacketConn(ipc)
		var f ipv6.ICMPFilter
		f.SetAll(true)
		f.Accept(ipv6.ICMPTypeRouterSolicitation)
		for _, set := range []func() error{
			func() error { return conn.SetICMPFilter(&f) },
			func() error { return conn.SetMulticastInterface(ifi) },
			func() error { return conn.SetMulticastHopLimit(255) },
			func() error { return conn.SetHopLimit(255) },
			func() error { return conn.JoinGroup(ifi, &net.IPAddr{IP: allRouters}) },
		} {
			if err := set(); err != nil {
				ipc.Close()
				return err
			}
		}
		r.ipc, r.conn = ipc, conn
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("router advertisements on %s: %w", bridge, err)
	}
	return r, nil
}

// Serve sends advertisements until ctx ends or Close is called (then it
// returns nil): one now, one every raInterval and one per solicitation.
// Sending fails while the bridge has no link-local address yet (no port
// with a carrier: QEMU has not opened the tap); the guest's solicitations
// get their answer once it has.
func (r *raSender) Serve(ctx context.Context) error {
	stop := context.AfterFunc(ctx, func() { _ = r.Close() })
	defer stop()
	go func() {
		t := time.NewTicker(raInterval)
		defer t.Stop()
		for {
			r.send("periodic")
			select {
			case <-r.closed:
				return
			case <-t.C:
			}
		}
	}()
	buf := make([]byte, 1500)
	for {
		if _, _, _, err := r.conn.ReadFrom(buf); err != nil {
			select {
			case <-r.closed:
				return nil
			default:
			}
			return fmt.Errorf("router advertisements on %s: read: %w", r.bridge, err)
		}
		// The filter passes router solicitations only.
		r.send("solicited")
	}
}

func (r *raSender) send(why string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if why == "solicited" && time.Since(r.last) < raMinGap {
		return
	}
	if _, err := r.conn.WriteTo(r.msg, nil, r.dst); err != nil {
		r.log.V(1).Info("router advertisement not sent", "bridge", r.bridge, "why", why, "error", err.Error())
		return
	}
	r.last = time.Now()
}

// Close stops Serve and releases the socket; it may be called more than
// once.
func (r *raSender) Close() error {
	var err error
	r.closeOnce.Do(func() {
		close(r.closed)
		err = r.ipc.Close()
	})
	return err
}
