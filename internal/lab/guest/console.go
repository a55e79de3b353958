package guest

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
)

// The prefixes of the guest's console lines (see the package doc).
const (
	LeasePrefix  = "KVNET-LEASE"
	Lease6Prefix = "KVNET-LEASE6"
	// Lease6GonePrefix starts the line of a NIC whose DHCPv6 address is
	// gone: KVNET-LEASE6-GONE iface=eth0 reason=RELEASE6.
	Lease6GonePrefix = "KVNET-LEASE6-GONE"
	ReadyPrefix      = "KVNET-READY"
	ErrorPrefix      = "KVNET-ERROR"
)

// Lease is a DHCP lease the guest reported on its console: a DHCPv4 lease
// (KVNET-LEASE) or a DHCPv6 one (KVNET-LEASE6).
type Lease struct {
	Iface string           // guest NIC, e.g. eth0
	MAC   net.HardwareAddr // its MAC address
	Addr  netip.Prefix     // address and prefix length, e.g. 10.0.0.5/24
	// Router is the default gateway (IPv6: the router whose advertisement
	// the default route came from, a link-local address); invalid when
	// there is none.
	Router netip.Addr
	DNS    []netip.Addr // DNS servers, possibly none
	MTU    int          // the NIC's MTU after the lease was applied
}

// IP is the leased address.
func (l Lease) IP() netip.Addr { return l.Addr.Addr() }

// ParseLease parses a console line
//
//	KVNET-LEASE iface=eth0 mac=52:54:00:77:00:10 ip=10.77.0.10/24 router=10.77.0.1 dns=10.77.0.1 mtu=1400
//
// Keys may come in any order; unknown keys are ignored; router and dns may
// be empty. iface, mac, ip and mtu are required.
func ParseLease(line string) (Lease, error) {
	return parseLease(LeasePrefix, line)
}

// ParseLease6 parses a console line reporting a DHCPv6 lease, with the keys
// of ParseLease and an IPv6 ip:
//
//	KVNET-LEASE6 iface=eth0 mac=52:54:00:77:00:10 ip=fd00:10:100::5/128 router=fe80::1 dns=fd00:10:96::a mtu=1400
func ParseLease6(line string) (Lease, error) {
	l, err := parseLease(Lease6Prefix, line)
	if err != nil {
		return Lease{}, err
	}
	if a := l.Addr.Addr(); !a.Is6() || a.Is4In6() {
		return Lease{}, fmt.Errorf("lease line %q: ip: %s is not an IPv6 address", strings.TrimRight(line, "\r\n"), l.Addr)
	}
	return l, nil
}

// parseLease parses a lease line starting with prefix.
func parseLease(prefix, line string) (Lease, error) {
	line = strings.TrimRight(line, "\r\n")
	fields := strings.Fields(line)
	if len(fields) == 0 || fields[0] != prefix {
		return Lease{}, fmt.Errorf("not a %s line: %q", prefix, line)
	}
	var l Lease
	seen := map[string]bool{}
	for _, f := range fields[1:] {
		k, v, ok := strings.Cut(f, "=")
		if !ok {
			return Lease{}, fmt.Errorf("lease line %q: field %q is not key=value", line, f)
		}
		seen[k] = true
		var err error
		switch k {
		case "iface":
			l.Iface = v
		case "mac":
			l.MAC, err = net.ParseMAC(v)
		case "ip":
			l.Addr, err = netip.ParsePrefix(v)
		case "router":
			if v != "" {
				l.Router, err = netip.ParseAddr(v)
			}
		case "dns":
			for d := range strings.SplitSeq(v, ",") {
				if d == "" {
					continue
				}
				a, perr := netip.ParseAddr(d)
				if perr != nil {
					err = perr
					break
				}
				l.DNS = append(l.DNS, a)
			}
		case "mtu":
			l.MTU, err = strconv.Atoi(v)
		}
		if err != nil {
			return Lease{}, fmt.Errorf("lease line %q: %s: %w", line, k, err)
		}
	}
	for _, k := range []string{"iface", "mac", "ip", "mtu"} {
		if !seen[k] {
			return Lease{}, fmt.Errorf("lease line %q: no %s", line, k)
		}
	}
	if l.Iface == "" {
		return Lease{}, fmt.Errorf("lease line %q: empty iface", line)
	}
	return l, nil
}

// console follows a guest's console log from an offset on: the log is
// appended to, and may hold the lines of earlier runs before it.
type console struct {
	path    string
	off     int64
	partial []byte
	leases  map[string]Lease // DHCPv4, by guest NIC
	leases6 map[string]Lease // DHCPv6, by guest NIC
	gone6   map[string]bool  // NICs whose last DHCPv6 line says the address is gone
	ready   bool
	name    string // the name of the KVNET-READY line
	errors  []string
	tail    []string // the last lines, for error messages
}

const consoleTailLines = 20

func newConsole(path string, off int64) *console {
	return &console{path: path, off: off, leases: map[string]Lease{}, leases6: map[string]Lease{}, gone6: map[string]bool{}}
}

// poll reads what the guest printed since the last poll.
func (c *console) poll() error {
	f, err := os.Open(c.path)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := f.Seek(c.off, io.SeekStart); err != nil {
		return err
	}
	b, err := io.ReadAll(f)
	if err != nil {
		return err
	}
	c.off += int64(len(b))
	b = append(c.partial, b...)
	for {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			break
		}
		c.line(strings.TrimRight(string(b[:i]), "\r"))
		b = b[i+1:]
	}
	c.partial = append([]byte(nil), b...)
	return nil
}

func (c *console) line(s string) {
	if s == "" {
		return
	}
	c.tail = append(c.tail, s)
	if len(c.tail) > consoleTailLines {
		c.tail = c.tail[len(c.tail)-consoleTailLines:]
	}
	// A line may carry garbage before our prefix (a kernel message cut by
	// ours); the prefix is what counts.
	switch {
	case strings.Contains(s, Lease6GonePrefix+" "):
		if iface, ok := gone6Iface(s[strings.Index(s, Lease6GonePrefix+" "):]); ok {
			delete(c.leases6, iface)
			c.gone6[iface] = true
		}
	case strings.Contains(s, Lease6Prefix+" "):
		if l, err := ParseLease6(s[strings.Index(s, Lease6Prefix+" "):]); err == nil {
			c.leases6[l.Iface] = l
			delete(c.gone6, l.Iface)
		}
	case strings.Contains(s, LeasePrefix+" "):
		if l, err := ParseLease(s[strings.Index(s, LeasePrefix+" "):]); err == nil {
			c.leases[l.Iface] = l
		}
	case strings.Contains(s, ReadyPrefix):
		c.ready = true
		for _, f := range strings.Fields(s[strings.Index(s, ReadyPrefix):]) {
			if v, ok := strings.CutPrefix(f, "name="); ok {
				c.name = v
			}
		}
	case strings.Contains(s, ErrorPrefix):
		c.errors = append(c.errors, s[strings.Index(s, ErrorPrefix):])
	}
}

// gone6Iface returns the NIC a KVNET-LEASE6-GONE line names.
func gone6Iface(line string) (string, bool) {
	fields := strings.Fields(line)
	if len(fields) == 0 || fields[0] != Lease6GonePrefix {
		return "", false
	}
	for _, f := range fields[1:] {
		if v, ok := strings.CutPrefix(f, "iface="); ok && v != "" {
			return v, true
		}
	}
	return "", false
}

// tailText is the last lines of the console, for error messages.
func (c *console) tailText() string {
	if len(c.tail) == 0 {
		return "(console empty)"
	}
	return strings.Join(c.tail, "\n")
}
