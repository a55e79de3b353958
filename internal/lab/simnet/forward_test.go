package simnet

import (
	"bufio"
	"io"
	"net"
	"testing"
	"time"
)

// A Forwarder in the caller's namespace (no root needed) relays a
// connection, and Close ends the connections it relays (a long-lived one,
// like an API watch, included) and returns.
func TestForwarderClose(t *testing.T) {
	target, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer target.Close()
	go func() {
		for {
			c, err := target.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }() // echo until the peer closes
		}
	}()
	f, err := Forward("", "127.0.0.1:0", target.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()

	c, err := net.Dial("tcp", f.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("ping\n")); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(c)
	if line, err := r.ReadString('\n'); err != nil || line != "ping\n" {
		t.Fatalf("relayed echo = %q, %v; want \"ping\\n\"", line, err)
	}

	closed := make(chan error, 1)
	go func() { closed <- f.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Fatalf("Close = %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return within 10s with a connection open")
	}
	// The relayed connection is over: the client reads EOF (or a reset),
	// where it would otherwise wait for the target forever. The deadline
	// only guards against a hang.
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := r.ReadByte(); err == nil {
		t.Fatal("read a byte from a connection the closed forwarder relayed")
	} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatal("the relayed connection is still open after Close")
	}
	if err := f.Close(); err != nil {
		t.Errorf("second Close = %v", err)
	}
	if _, err := net.Dial("tcp", f.Addr().String()); err == nil {
		t.Error("the forwarder still accepts connections after Close")
	}
}
