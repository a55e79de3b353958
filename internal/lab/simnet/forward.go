package simnet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"

	"kvnet.io/kvnet/internal/nl"
)

// Forwarder relays TCP connections accepted in one namespace to an address
// reached from the process's own namespace.
type Forwarder struct {
	ln     net.Listener
	target string
	ctx    context.Context // ends with Close: aborts dials in progress
	cancel context.CancelFunc
	wg     sync.WaitGroup // serve, and one per relayed connection

	mu     sync.Mutex
	closed bool
	conns  map[net.Conn]struct{} // both ends of every relayed connection

	// received counts the bytes relayed from the target back to the
	// namespace: what its clients received.
	received atomic.Int64
}

// Received is the number of bytes relayed from the target to the
// namespace's clients so far (the scale lab's measure of a node's API
// traffic).
func (f *Forwarder) Received() int64 { return f.received.Load() }

// Forward listens on listenAddr inside the namespace at nsPath ("" is the
// caller's) and relays every connection to target, dialled from the
// caller's namespace. The lab and tests use it to give simulated nodes the
// API server at the same 127.0.0.1 address the host uses, so the
// kubeconfig of kvnet-cni works unchanged in a node namespace (as on a
// node that reaches the API server through a local proxy).
func Forward(nsPath, listenAddr, target string) (*Forwarder, error) {
	var ln net.Listener
	err := nl.Do(nsPath, func() error {
		var err error
		ln, err = net.Listen("tcp", listenAddr)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("simnet: listen on %s in %s: %w", listenAddr, nsPath, err)
	}
	f := &Forwarder{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	f.ctx, f.cancel = context.WithCancel(context.Background())
	f.wg.Go(f.serve)
	return f, nil
}

// Addr is the address the forwarder listens on (in its namespace).
func (f *Forwarder) Addr() net.Addr { return f.ln.Addr() }

func (f *Forwarder) serve() {
	for {
		in, err := f.ln.Accept()
		if err != nil {
			return // closed
		}
		if !f.track(in) {
			return
		}
		f.wg.Go(func() {
			defer f.untrack(in)
			var d net.Dialer
			out, err := d.DialContext(f.ctx, "tcp", f.target)
			if err != nil || !f.track(out) {
				return
			}
			defer f.untrack(out)
			done := make(chan struct{}, 2)
			relay := func(dst, src net.Conn, count *atomic.Int64) {
				if count != nil {
					// Counted as it flows: watches last as long as
					// the connection.
					_, _ = io.Copy(countingWriter{dst, count}, src)
				} else {
					_, _ = io.Copy(dst, src)
				}
				if tc, ok := dst.(*net.TCPConn); ok {
					_ = tc.CloseWrite()
				}
				done <- struct{}{}
			}
			go relay(out, in, nil)
			go relay(in, out, &f.received)
			<-done
			<-done
		})
	}
}

// track records c as relayed, so that Close ends it; after Close it closes
// c instead and reports false.
func (f *Forwarder) track(c net.Conn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		_ = c.Close()
		return false
	}
	f.conns[c] = struct{}{}
	return true
}

// untrack closes c and forgets it.
func (f *Forwarder) untrack(c net.Conn) {
	f.mu.Lock()
	delete(f.conns, c)
	f.mu.Unlock()
	_ = c.Close()
}

// Close stops listening, ends the relayed connections and returns once
// every goroutine of the forwarder has returned. It may be called again.
func (f *Forwarder) Close() error {
	f.mu.Lock()
	f.closed = true
	conns := make([]net.Conn, 0, len(f.conns))
	for c := range f.conns {
		conns = append(conns, c)
	}
	f.mu.Unlock()
	f.cancel()
	err := f.ln.Close()
	for _, c := range conns {
		_ = c.Close()
	}
	f.wg.Wait()
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

// countingWriter adds what it writes to n.
type countingWriter struct {
	w io.Writer
	n *atomic.Int64
}

func (c countingWriter) Write(p []byte) (int, error) {
	k, err := c.w.Write(p)
	c.n.Add(int64(k))
	return k, err
}
