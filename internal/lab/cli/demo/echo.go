package demo

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"

	"kvnet.io/kvnet/internal/lab/guest"
)

// echo sends one line to the guest's TCP echo service at addr from netns
// and checks it comes back.
func echo(ctx context.Context, netns string, addr netip.Addr) error {
	conn, err := openEcho(ctx, netns, addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	return echoOnce(conn, "kvnet-demo", 2*time.Second)
}

// openEcho connects to the guest's TCP echo service at addr from netns.
func openEcho(ctx context.Context, netns string, addr netip.Addr) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	return guest.DialContext(ctx, netns, "tcp", netip.AddrPortFrom(addr, guest.EchoPort).String())
}

func echoOnce(conn net.Conn, msg string, timeout time.Duration) error {
	if err := conn.SetDeadline(time.Now().Add(timeout)); err != nil {
		return err
	}
	if _, err := fmt.Fprintln(conn, msg); err != nil {
		return err
	}
	got, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return err
	}
	if got != msg+"\n" {
		return fmt.Errorf("echo returned %q, sent %q", got, msg)
	}
	return nil
}

// echoPinger keeps one echo exchange at a time going on a connection and
// records the longest one: across a live migration, the guest's blackout
// as a client on the connection feels it.
type echoPinger struct {
	conn    net.Conn
	done    chan struct{}
	wg      sync.WaitGroup
	longest time.Duration
	echoes  int
	err     error
}

func startEchoPinger(conn net.Conn) *echoPinger {
	p := &echoPinger{conn: conn, done: make(chan struct{})}
	p.wg.Go(func() {
		r := bufio.NewReader(conn)
		for i := 0; ; i++ {
			select {
			case <-p.done:
				return
			case <-time.After(20 * time.Millisecond):
			}
			msg := fmt.Sprintf("kvnet-demo-%d", i)
			start := time.Now()
			// A migration's blackout is well under this; a connection
			// that does not echo for 20 s is broken.
			if err := conn.SetDeadline(start.Add(20 * time.Second)); err != nil {
				p.err = err
				return
			}
			if _, err := fmt.Fprintln(conn, msg); err != nil {
				p.err = err
				return
			}
			got, err := r.ReadString('\n')
			if err != nil {
				p.err = err
				return
			}
			if got != msg+"\n" {
				p.err = fmt.Errorf("echo returned %q, sent %q", got, msg)
				return
			}
			p.echoes++
			p.longest = max(p.longest, time.Since(start))
		}
	})
	return p
}

// stop ends the exchanges and returns the longest one, how many there were
// and the error that ended them early, if any.
func (p *echoPinger) stop() (time.Duration, int, error) {
	close(p.done)
	p.wg.Wait()
	if p.err == nil && p.echoes == 0 {
		p.err = fmt.Errorf("no echo at all")
	}
	return p.longest, p.echoes, p.err
}
