// Package nstest runs the small network probes that privileged tests make
// from inside network namespaces: a command, a ping, a TCP server that
// answers each connection with a line, and a client that dials or reads
// that line. It is for tests only and needs root, as its callers do.
//
// A namespace is given as a path (/run/netns/NAME) or, for Exec and Ping,
// as a name; the machine has busybox, not iputils, so Ping runs busybox.
package nstest

import (
	"bufio"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"kvnet.io/kvnet/internal/nl"
)

// Exec runs args in the namespace ns (a path under /run/netns or a name)
// with `ip netns exec`; the error names the command and carries its
// output.
func Exec(ns string, args ...string) error {
	out, err := exec.Command("ip", append([]string{"netns", "exec", filepath.Base(ns)}, args...)...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s in %s: %v: %s", strings.Join(args, " "), filepath.Base(ns), err, out)
	}
	return nil
}

// Ping sends one ICMP echo request from ns to ip and waits a second for
// the reply.
func Ping(ns, ip string) error {
	return Exec(ns, "busybox", "ping", "-c", "1", "-W", "1", ip)
}

// Listen opens a TCP (IPv4) listener at addr inside the namespace at
// nsPath, closed when the test ends. The socket keeps the namespace, so
// Accept may run on any goroutine.
func Listen(tb testing.TB, nsPath, addr string) net.Listener {
	tb.Helper()
	var ln net.Listener
	if err := nl.Do(nsPath, func() (err error) {
		ln, err = net.Listen("tcp4", addr)
		return err
	}); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { ln.Close() })
	return ln
}

// Serve runs handle on its own goroutine for every connection ln accepts,
// closing the connection when handle returns, until ln closes.
func Serve(ln net.Listener, handle func(net.Conn)) {
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				handle(conn)
			}()
		}
	}()
}

// ServeLine answers each TCP connection to addr in the namespace at nsPath
// with the line answer gives for it, then closes it, until the test ends.
func ServeLine(tb testing.TB, nsPath, addr string, answer func(net.Conn) string) {
	tb.Helper()
	Serve(Listen(tb, nsPath, addr), func(conn net.Conn) { fmt.Fprintln(conn, answer(conn)) })
}

// Dial opens a TCP (IPv4) connection from the namespace at nsPath to addr.
func Dial(nsPath, addr string, timeout time.Duration) (net.Conn, error) {
	var conn net.Conn
	err := nl.Do(nsPath, func() (err error) {
		conn, err = net.DialTimeout("tcp4", addr, timeout)
		return err
	})
	return conn, err
}

// ReadLine connects from the namespace at nsPath to addr and returns the
// first line the server sends, without its line end. timeout bounds the
// connection and, again, the read.
func ReadLine(nsPath, addr string, timeout time.Duration) (string, error) {
	conn, err := Dial(nsPath, addr, timeout)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(timeout))
	got, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return "", fmt.Errorf("read a line from %s: %w", addr, err)
	}
	return strings.TrimSpace(got), nil
}

// ServeUDPLine answers each UDP datagram to addr (IPv4) in the namespace
// at nsPath with the line answer gives, until the test ends.
func ServeUDPLine(tb testing.TB, nsPath, addr string, answer func(from net.Addr) string) {
	tb.Helper()
	var pc net.PacketConn
	if err := nl.Do(nsPath, func() (err error) {
		pc, err = net.ListenPacket("udp4", addr)
		return err
	}); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 1500)
		for {
			_, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = pc.WriteTo([]byte(answer(from)+"\n"), from)
		}
	}()
}

// UDPReadLine sends a datagram from the namespace at nsPath to addr
// (IPv4) and returns the first line of the answer, without its line end;
// timeout bounds the exchange.
func UDPReadLine(nsPath, addr string, timeout time.Duration) (string, error) {
	var conn net.Conn
	if err := nl.Do(nsPath, func() (err error) {
		conn, err = net.Dial("udp4", addr)
		return err
	}); err != nil {
		return "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(timeout))
	if _, err := conn.Write([]byte("?\n")); err != nil {
		return "", err
	}
	buf := make([]byte, 1500)
	n, err := conn.Read(buf)
	if err != nil {
		return "", fmt.Errorf("read an answer from %s: %w", addr, err)
	}
	return strings.TrimSpace(string(buf[:n])), nil
}
