// Package allocator is kvnet's in-memory IP and MAC allocator: it hands out
// the addresses of one network's subnets (Layer2 and localnet, primary and
// secondary) and the MACs that go with them, the way OVN-Kubernetes does.
//
// It keeps state in memory only. After a restart the IPAM controller rebuilds
// it from the API (pod annotations, IPAMClaim statuses) with Network.Reserve
// before it allocates anything new, so the API stays the source of truth.
//
// The package imports no Kubernetes code so that it can be tested, fuzzed
// and benchmarked on its own.
package allocator

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
)

// Sentinel errors. Errors returned by this package wrap one of them, so
// callers can use errors.Is (and ReasonOf) whatever the message says.
var (
	// ErrFull: no free IP is left for automatic allocation.
	ErrFull = errors.New("subnet address pool exhausted")
	// ErrAllocated: a static request or reservation of an IP another owner holds.
	ErrAllocated = errors.New("provided IP is already allocated")
	// ErrNotInSubnet: the IP is outside every subnet of the network.
	ErrNotInSubnet = errors.New("IP is not in any subnet of the network")
	// ErrExcluded: the IP is in excludeSubnets or an infrastructure range, or
	// is a network, broadcast, gateway or management address.
	ErrExcluded = errors.New("IP is excluded from allocation")
	// ErrMACConflict: another owner holds the MAC on this network.
	ErrMACConflict = errors.New("MAC address is already allocated")
	// ErrInvalid: a request or configuration that cannot be served, such as
	// a multicast MAC or two IPs of one family.
	ErrInvalid = errors.New("invalid allocation request")
)

// Reason classifies an allocation error the way IPAMClaim conditions do.
type Reason string

// Reasons, as written to IPAMClaim conditions.
const (
	ReasonSubnetExhausted Reason = "SubnetExhausted"
	ReasonIPConflict      Reason = "IPAddressConflict"
	ReasonMACConflict     Reason = "MACAddressConflict"
	ReasonInvalidRequest  Reason = "InvalidRequest"
	ReasonInternalError   Reason = "InternalError"
)

// ReasonOf classifies err. It returns "" for a nil error and
// ReasonInternalError for errors that wrap none of the sentinels.
func ReasonOf(err error) Reason {
	switch {
	case err == nil:
		return ""
	case errors.Is(err, ErrFull):
		return ReasonSubnetExhausted
	case errors.Is(err, ErrAllocated):
		return ReasonIPConflict
	case errors.Is(err, ErrMACConflict):
		return ReasonMACConflict
	case errors.Is(err, ErrNotInSubnet), errors.Is(err, ErrExcluded), errors.Is(err, ErrInvalid):
		return ReasonInvalidRequest
	default:
		return ReasonInternalError
	}
}

// DeriveMAC returns the MAC OVN-Kubernetes derives from an IP: 0a:58
// followed by the last four bytes of the address (for IPv4 a.b.c.d that is
// 0a:58:a:b:c:d). Deriving keeps a VM's MAC stable when its IP is. It
// returns nil for the zero Addr.
func DeriveMAC(ip netip.Addr) net.HardwareAddr {
	if !ip.IsValid() {
		return nil
	}
	// As16 maps IPv4 into ::ffff:a.b.c.d, whose last four bytes are a.b.c.d,
	// so one expression serves both families.
	b := ip.As16()
	return net.HardwareAddr{0x0a, 0x58, b[12], b[13], b[14], b[15]}
}

// checkMAC reports why mac cannot be handed out, if it cannot.
func checkMAC(mac net.HardwareAddr) error {
	switch {
	case len(mac) != 6:
		return fmt.Errorf("mac %q: must be 6 bytes: %w", mac.String(), ErrInvalid)
	case mac[0]&1 != 0:
		return fmt.Errorf("mac %q: must be unicast: %w", mac.String(), ErrInvalid)
	case mac[0]|mac[1]|mac[2]|mac[3]|mac[4]|mac[5] == 0:
		return fmt.Errorf("mac %q: must not be zero: %w", mac.String(), ErrInvalid)
	}
	return nil
}

// macKey is a MAC usable as a map key; callers check the length first.
func macKey(mac net.HardwareAddr) [6]byte {
	return [6]byte(mac)
}
