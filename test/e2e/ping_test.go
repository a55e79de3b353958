package e2e

import (
	"net"
	"net/netip"
	"os"
	"sync"
	"time"

	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"

	"kvnet.io/kvnet/internal/nl"
)

// pinger sends an ICMP echo request every interval from a network
// namespace and records when each reply arrives.
type pinger struct {
	conn    *icmp.PacketConn
	dst     net.Addr
	id      int
	mu      sync.Mutex
	replies []time.Time
	sent    map[int]time.Time // echo request sequence number -> sent
	done    chan struct{}
	wg      sync.WaitGroup
}

func startPinger(netns string, dst netip.Addr, interval time.Duration) (*pinger, error) {
	var conn *icmp.PacketConn
	if err := nl.Do(netns, func() (err error) {
		conn, err = icmp.ListenPacket("ip4:icmp", "0.0.0.0")
		return err
	}); err != nil {
		return nil, err
	}
	id := os.Getpid() & 0xffff
	p := &pinger{conn: conn, id: id, dst: &net.IPAddr{IP: dst.AsSlice()}, sent: map[int]time.Time{}, done: make(chan struct{})}
	p.wg.Go(func() {
		buf := make([]byte, 1500)
		for {
			n, _, err := conn.ReadFrom(buf)
			if err != nil {
				return
			}
			m, err := icmp.ParseMessage(1, buf[:n])
			if err != nil || m.Type != ipv4.ICMPTypeEchoReply {
				continue
			}
			if e, ok := m.Body.(*icmp.Echo); ok && e.ID == id {
				p.mu.Lock()
				p.replies = append(p.replies, time.Now())
				p.mu.Unlock()
			}
		}
	})
	p.wg.Go(func() {
		t := time.NewTicker(interval)
		defer t.Stop()
		for seq := 0; ; seq++ {
			select {
			case <-p.done:
				return
			case <-t.C:
			}
			msg := icmp.Message{Type: ipv4.ICMPTypeEcho, Body: &icmp.Echo{ID: id, Seq: seq & 0xffff, Data: []byte("kvnet")}}
			if b, err := msg.Marshal(nil); err == nil {
				p.mu.Lock()
				p.sent[seq&0xffff] = time.Now()
				p.mu.Unlock()
				_, _ = conn.WriteTo(b, p.dst)
			}
		}
	})
	return p, nil
}

// longestGapAt is the longest time without a reply between from and to,
// and when it started (the last reply before it).
func (p *pinger) longestGapAt(from, to time.Time) (time.Time, time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	last, start, gap := from, from, time.Duration(0)
	for _, r := range p.replies {
		if r.Before(from) {
			continue
		}
		if r.After(to) {
			break
		}
		if r.Sub(last) > gap {
			start, gap = last, r.Sub(last)
		}
		last = r
	}
	if to.Sub(last) > gap {
		start, gap = last, to.Sub(last)
	}
	return start, gap
}

// sentBetween returns the sequence numbers of the requests sent between
// from and to, with when each was sent.
func (p *pinger) sentBetween(from, to time.Time) map[int]time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[int]time.Time{}
	for seq, at := range p.sent {
		if !at.Before(from) && !at.After(to) {
			out[seq] = at
		}
	}
	return out
}

func (p *pinger) stop() {
	close(p.done)
	p.conn.Close()
	p.wg.Wait()
}
