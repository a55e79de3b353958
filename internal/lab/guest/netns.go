package guest

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"kvnet.io/kvnet/internal/nl"
)

// DialContext connects to address from the network namespace netns (a
// name under /run/netns or a path; "" is the caller's). The socket is
// made in the namespace and stays there; the calling goroutine's thread
// is switched only while the socket is made.
func DialContext(ctx context.Context, netns, network, address string) (net.Conn, error) {
	var d net.Dialer
	if netns == "" {
		return d.DialContext(ctx, network, address)
	}
	nsPath := netns
	if !strings.ContainsRune(nsPath, '/') {
		nsPath = nl.NSPath(netns)
	}
	var conn net.Conn
	err := nl.Do(nsPath, func() error {
		var err error
		conn, err = d.DialContext(ctx, network, address)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("dial %s %s from netns %q: %w", network, address, netns, err)
	}
	return conn, nil
}

// Exec runs command, one line of sh, in the guest at addr through its
// lab-only exec service (ExecPort), connecting from netns. It returns the
// command's output (stdout and stderr); a non-zero exit status is an error
// along with the output. ctx bounds the whole exchange.
func Exec(ctx context.Context, netns string, addr netip.Addr, command string) (string, error) {
	if strings.ContainsAny(command, "\r\n") {
		return "", fmt.Errorf("guest exec: the command must be one line: %q", command)
	}
	conn, err := DialContext(ctx, netns, "tcp", netip.AddrPortFrom(addr, ExecPort).String())
	if err != nil {
		return "", fmt.Errorf("guest exec: %w", err)
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if _, err := io.WriteString(conn, command+"\n"); err != nil {
		return "", fmt.Errorf("guest exec %q on %s: %w", command, addr, err)
	}
	var out strings.Builder
	status := -1
	r := bufio.NewReader(conn)
	for {
		line, err := r.ReadString('\n')
		if s, ok := strings.CutPrefix(line, "KVNET-EXIT "); ok && err == nil {
			if n, perr := strconv.Atoi(strings.TrimSpace(s)); perr == nil {
				status = n
				continue
			}
		}
		out.WriteString(line)
		if err == io.EOF {
			break
		}
		if err != nil {
			if ctx.Err() != nil {
				err = ctx.Err()
			}
			return out.String(), fmt.Errorf("guest exec %q on %s: %w", command, addr, err)
		}
	}
	switch {
	case status < 0:
		return out.String(), fmt.Errorf("guest exec %q on %s: the exec service closed without an exit status", command, addr)
	case status != 0:
		return out.String(), fmt.Errorf("guest exec %q on %s: exit status %d: %s", command, addr, status, strings.TrimSpace(out.String()))
	}
	return out.String(), nil
}
