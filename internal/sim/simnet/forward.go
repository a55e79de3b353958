package simnet

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"

	"kvnet.io/kvnet/internal/nl"
)

// Forwarder relays TCP connections accepted in one namespace to an address
// reached from the process's own namespace.
type Forwarder struct {
	ln     net.Listener
	target string
	wg     sync.WaitGroup
}

// Forward listens on listenAddr inside the namespace at nsPath and relays
// every connection to target, dialled from the caller's namespace. The
// lab and tests use it to give simulated nodes the API server at the
// same 127.0.0.1 address the host uses, so the kubeconfig of kvnet-cni
// works unchanged in a node namespace (as on a node that reaches the API
// server through a local proxy).
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
	f := &Forwarder{ln: ln, target: target}
	f.wg.Go(f.serve)
	return f, nil
}

func (f *Forwarder) serve() {
	for {
		in, err := f.ln.Accept()
		if err != nil {
			return // closed
		}
		f.wg.Go(func() {
			defer in.Close()
			out, err := net.Dial("tcp", f.target)
			if err != nil {
				return
			}
			defer out.Close()
			done := make(chan struct{}, 2)
			relay := func(dst, src net.Conn) {
				_, _ = io.Copy(dst, src)
				if tc, ok := dst.(*net.TCPConn); ok {
					_ = tc.CloseWrite()
				}
				done <- struct{}{}
			}
			go relay(out, in)
			go relay(in, out)
			<-done
			<-done
		})
	}
}

// Close stops listening. Relayed connections end when either side closes
// them.
func (f *Forwarder) Close() error {
	err := f.ln.Close()
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}
