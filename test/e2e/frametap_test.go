package e2e

import (
	"encoding/binary"
	"errors"
	"net"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// frameTap records, in each of a lab's node namespaces, the frames one
// guest MAC sends and receives on the nodes' pod ports (kvp*): what
// reaches the guest's port and when, to tell kvnet's part of a live
// migration's blackout from the guest's.
type frameTap struct {
	mac    net.HardwareAddr
	mu     sync.Mutex
	frames []tappedFrame
	done   chan struct{}
	wg     sync.WaitGroup
}

// tappedFrame is one frame seen on a pod port of node.
type tappedFrame struct {
	at        time.Time
	node      string
	port      string
	fromGuest bool // sent by the guest (else delivered towards it)
	// guestOnly: a frame only the running guest sends (QEMU's RARP, or
	// IP to a unicast address), the frames kvnet-node switches on.
	guestOnly bool
	echoReq   int // sequence number of an ICMP echo request to the guest, else -1
	echoReply int // sequence number of an ICMP echo reply from the guest, else -1
}

// startFrameTap taps the node namespaces (node name -> namespace path)
// for frames from or to mac.
func startFrameTap(nodes map[string]string, mac net.HardwareAddr) (*frameTap, error) {
	t := &frameTap{mac: mac, done: make(chan struct{})}
	for node, ns := range nodes {
		started := make(chan error, 1)
		t.wg.Go(func() { t.read(node, ns, started) })
		if err := <-started; err != nil {
			t.stop()
			return nil, err
		}
	}
	return t, nil
}

// read runs on a thread of its own, moved into the node's namespace for
// good (the thread ends with the goroutine).
func (t *frameTap) read(node, nsPath string, started chan<- error) {
	runtime.LockOSThread()
	fd, err := func() (int, error) {
		ns, err := netns.GetFromPath(nsPath)
		if err != nil {
			return -1, err
		}
		defer ns.Close()
		if err := netns.Set(ns); err != nil {
			return -1, err
		}
		proto := int(uint16(unix.ETH_P_ALL)<<8 | uint16(unix.ETH_P_ALL)>>8)
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, proto)
		if err != nil {
			return -1, err
		}
		tv := unix.NsecToTimeval((100 * time.Millisecond).Nanoseconds())
		if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
			unix.Close(fd)
			return -1, err
		}
		return fd, nil
	}()
	started <- err
	if err != nil {
		return
	}
	defer unix.Close(fd)
	names := map[int]string{}
	buf := make([]byte, 2048)
	for {
		select {
		case <-t.done:
			return
		default:
		}
		n, from, err := unix.Recvfrom(fd, buf, 0)
		if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return
		}
		at := time.Now()
		ll, ok := from.(*unix.SockaddrLinklayer)
		if !ok || n < 14 {
			continue
		}
		f := buf[:n]
		fromGuest := string(f[6:12]) == string(t.mac)
		if !fromGuest && string(f[0:6]) != string(t.mac) {
			continue
		}
		name, ok := names[ll.Ifindex]
		if !ok {
			if ifc, err := net.InterfaceByIndex(ll.Ifindex); err == nil {
				name = ifc.Name
			}
			names[ll.Ifindex] = name
		}
		if !strings.HasPrefix(name, "kvp") {
			continue
		}
		// A pod port's own direction: frames from the guest come in,
		// frames to it go out.
		if fromGuest == (ll.Pkttype == unix.PACKET_OUTGOING) {
			continue
		}
		tf := tappedFrame{at: at, node: node, port: name, fromGuest: fromGuest, echoReq: -1, echoReply: -1}
		if fromGuest {
			switch binary.BigEndian.Uint16(f[12:14]) {
			case 0x8035: // RARP
				tf.guestOnly = true
			case unix.ETH_P_IP, unix.ETH_P_IPV6:
				tf.guestOnly = f[0]&1 == 0 // unicast destination MAC
			}
		}
		if typ, seq, ok := icmpEcho(f); ok {
			switch {
			case typ == 8 && !fromGuest:
				tf.echoReq = seq
			case typ == 0 && fromGuest:
				tf.echoReply = seq
			}
		}
		t.mu.Lock()
		t.frames = append(t.frames, tf)
		t.mu.Unlock()
	}
}

// icmpEcho returns the type and sequence number of an IPv4 ICMP echo
// request or reply frame.
func icmpEcho(f []byte) (typ, seq int, ok bool) {
	if len(f) < 14+20 || binary.BigEndian.Uint16(f[12:14]) != unix.ETH_P_IP || f[14]>>4 != 4 || f[14+9] != unix.IPPROTO_ICMP {
		return 0, 0, false
	}
	ihl := int(f[14]&0x0f) * 4
	icmp := f[14+ihl:]
	if len(icmp) < 8 || (icmp[0] != 0 && icmp[0] != 8) {
		return 0, 0, false
	}
	return int(icmp[0]), int(binary.BigEndian.Uint16(icmp[6:8])), true
}

// between returns the frames seen on node from from to to, in order.
func (t *frameTap) between(node string, from, to time.Time) []tappedFrame {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []tappedFrame
	for _, f := range t.frames {
		if f.node == node && !f.at.Before(from) && !f.at.After(to) {
			out = append(out, f)
		}
	}
	return out
}

func (t *frameTap) stop() {
	close(t.done)
	t.wg.Wait()
}
