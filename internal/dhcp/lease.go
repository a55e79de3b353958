package dhcp

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"time"
)

// DefaultLeaseTime is the lease time offered when Lease.LeaseTime is 0.
//
// Addresses are allocated by kvnet, not by this server, so the lease time
// does not decide who owns an address: a renewal always returns the same
// address for as long as the allocation exists. One hour is short enough
// that a guest picks up changed options (DNS, MTU, routes) without a
// reboot, and long enough that a DHCP server that is restarting (for
// example during a node agent upgrade) is never noticed by the guest.
// KubeVirt's built-in server uses 999 days instead because its options can
// never change for the life of the pod.
const DefaultLeaseTime = time.Hour

// Lease is what the server hands to one MAC: the allocated address and the
// options that go with it. The zero value of an optional field omits the
// corresponding option.
type Lease struct {
	// IP is the guest address; the prefix length becomes option 1 (subnet
	// mask). It must be IPv4.
	IP netip.Prefix
	// IP6 is the guest's IPv6 address, served by the DHCPv6 server
	// (Server6) in an IA_NA; invalid (zero) serves no IPv6 address. IP may
	// then be zero, for a guest on an IPv6-only network.
	IP6 netip.Addr
	// Router is option 3. Invalid (zero) omits it.
	Router netip.Addr
	// DNS is option 6. Only IPv4 entries are sent: option 6 cannot carry
	// IPv6 addresses, and a resolv.conf-derived list may contain them.
	// The IPv6 entries are DHCPv6's option 23.
	DNS []netip.Addr
	// MTU is option 26; 0 omits it.
	MTU int
	// Hostname is option 12; "" omits it.
	Hostname string
	// Domain is option 15; "" omits it.
	Domain string
	// Search is option 119 (RFC 3397 domain search list) and DHCPv6's
	// option 24; empty omits it.
	Search []string
	// Routes is option 121 (RFC 3442 classless static routes). When it is
	// not empty and Router is set, the reply appends the default route via
	// Router after these routes (unless Routes already holds one), as
	// KubeVirt does: RFC 3442 tells clients that receive option 121 to
	// ignore option 3, so without it the guest would lose its default
	// route.
	Routes []Route
	// LeaseTime is option 51 and the lifetimes of the DHCPv6 address; 0
	// means DefaultLeaseTime.
	LeaseTime time.Duration
}

// Route is one classless static route. An invalid (zero) Via means the
// destination is on-link, encoded as router 0.0.0.0 (RFC 3442 §1).
type Route struct {
	Dst netip.Prefix
	Via netip.Addr
}

// Leases answers for a MAC. ok=false means "not ours": the request is
// ignored and no reply at all is sent, so that a MAC allocated on another
// node, or a foreign DHCP client on the same segment, never gets an answer
// from this server. Implementations must be safe for concurrent use; the
// returned Lease is only read.
type Leases interface {
	Lookup(mac net.HardwareAddr) (Lease, bool)
}

// StaticLeases is a concurrency-safe Leases for callers that push updates
// (Set/Delete by MAC). The zero value is not usable; call NewStaticLeases.
type StaticLeases struct {
	mu sync.RWMutex // guards following
	// byMAC maps the canonical MAC string (net.HardwareAddr.String, lower
	// case) to its lease.
	byMAC map[string]Lease
}

var _ Leases = (*StaticLeases)(nil)

// NewStaticLeases returns an empty StaticLeases.
func NewStaticLeases() *StaticLeases {
	return &StaticLeases{byMAC: map[string]Lease{}}
}

// Set adds or replaces the lease for mac. It stores a copy, so the caller
// may reuse lease's slices afterwards.
func (l *StaticLeases) Set(mac net.HardwareAddr, lease Lease) {
	lease.DNS = slices.Clone(lease.DNS)
	lease.Search = slices.Clone(lease.Search)
	lease.Routes = slices.Clone(lease.Routes)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.byMAC[mac.String()] = lease
}

// Delete removes the lease for mac; deleting an unknown MAC is a no-op.
func (l *StaticLeases) Delete(mac net.HardwareAddr) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.byMAC, mac.String())
}

// Lookup implements Leases.
func (l *StaticLeases) Lookup(mac net.HardwareAddr) (Lease, bool) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	lease, ok := l.byMAC[mac.String()]
	return lease, ok
}

// Range calls fn with each MAC and its lease until fn returns false.
// fn must not call Set or Delete.
func (l *StaticLeases) Range(fn func(mac net.HardwareAddr, lease Lease) bool) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	for k, v := range l.byMAC {
		mac, err := net.ParseMAC(k)
		if err != nil {
			continue
		}
		if !fn(mac, v) {
			return
		}
	}
}

// DefaultDNS reads the nameserver lines of a resolv.conf file, for callers
// that give guests "the node's DNS". Comment lines (# or ;), trailing
// comments and lines whose address does not parse are skipped, as the
// libc resolver does. Loopback nameservers (such as systemd-resolved's
// 127.0.0.53 stub) are dropped because a guest cannot reach the node's
// loopback; on such nodes pass /run/systemd/resolve/resolv.conf instead.
// IPv6 nameservers are returned; Lease.DNS drops them from option 6.
func DefaultDNS(resolvConf string) ([]netip.Addr, error) {
	data, err := os.ReadFile(resolvConf)
	if err != nil {
		return nil, fmt.Errorf("read resolv.conf %q: %w", resolvConf, err)
	}
	out, err := parseResolvConf(data)
	if err != nil {
		return nil, fmt.Errorf("parse resolv.conf %q: %w", resolvConf, err)
	}
	return out, nil
}

// parseResolvConf is DefaultDNS without the file.
func parseResolvConf(data []byte) ([]netip.Addr, error) {
	var out []netip.Addr
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := sc.Text()
		if i := strings.IndexAny(line, "#;"); i >= 0 {
			line = line[:i]
		}
		f := strings.Fields(line)
		if len(f) < 2 || f[0] != "nameserver" {
			continue
		}
		a, err := netip.ParseAddr(f[1])
		if err != nil {
			continue
		}
		a = a.Unmap()
		if a.IsLoopback() || !a.IsValid() || a.IsUnspecified() {
			continue
		}
		if !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return out, nil
}
