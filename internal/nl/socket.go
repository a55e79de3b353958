package nl

import (
	"fmt"
	"syscall"

	"golang.org/x/sys/unix"
)

// BindToDevice is a net.ListenConfig.Control that binds the socket to the
// interface dev (SO_BINDTODEVICE), as servers answering on one link do.
func BindToDevice(dev string) func(network, address string, c syscall.RawConn) error {
	return func(_, _ string, c syscall.RawConn) error {
		var serr error
		if err := c.Control(func(fd uintptr) {
			serr = unix.SetsockoptString(int(fd), unix.SOL_SOCKET, unix.SO_BINDTODEVICE, dev)
		}); err != nil {
			return err
		}
		if serr != nil {
			return fmt.Errorf("bind to device %q: %w", dev, serr)
		}
		return nil
	}
}
