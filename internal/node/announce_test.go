package node

import (
	"encoding/binary"
	"net"
	"net/netip"
	"testing"

	"kvnet.io/kvnet/internal/datapath"
)

var (
	guestMAC  = net.HardwareAddr{0x0a, 0x58, 0x0a, 0x50, 0x00, 0x03}
	otherMAC  = net.HardwareAddr{0x0a, 0x58, 0x0a, 0x50, 0x00, 0x04}
	guestPort = datapath.Port{HostIfName: "kvp1", MAC: guestMAC, Migrating: true, Standby: true,
		IPs: []netip.Prefix{netip.MustParsePrefix("10.80.0.3/24"), netip.MustParsePrefix("fd00:80::3/64")}}
)

func ether(src net.HardwareAddr, typ uint16, payload []byte) []byte {
	b := append(append([]byte{0x0a, 0x58, 0x0a, 0x50, 0x00, 0x01}, src...), 0, 0)
	binary.BigEndian.PutUint16(b[12:], typ)
	return append(b, payload...)
}

func ipv4(src, dst string, proto byte) []byte {
	h := make([]byte, 20)
	h[0], h[9] = 0x45, proto
	copy(h[12:16], netip.MustParseAddr(src).AsSlice())
	copy(h[16:20], netip.MustParseAddr(dst).AsSlice())
	return append(h, 8, 0, 0, 0) // an ICMP echo reply's first bytes
}

func ipv6(src, dst string, next byte, icmpType byte) []byte {
	h := make([]byte, 40)
	h[0], h[6] = 0x60, next
	copy(h[8:24], netip.MustParseAddr(src).AsSlice())
	copy(h[24:40], netip.MustParseAddr(dst).AsSlice())
	return append(h, icmpType, 0, 0, 0)
}

func TestGuestFrame(t *testing.T) {
	rarp := append([]byte{0, 1, 8, 0, 6, 4, 0, 3}, make([]byte, 20)...)
	arp := append([]byte{0, 1, 8, 0, 6, 4, 0, 2}, make([]byte, 20)...)
	for _, tc := range []struct {
		name  string
		frame []byte
		want  string
	}{
		{"QEMU's announce", ether(guestMAC, ethPRARP, rarp), "RARP"},
		{"the guest's ICMP reply", ether(guestMAC, 0x0800, ipv4("10.80.0.3", "10.80.0.4", 1)), "IPv4 from 10.80.0.3"},
		{"the guest's IPv6 TCP", ether(guestMAC, 0x86dd, ipv6("fd00:80::3", "fd00:80::4", 6, 0)), "IPv6 from fd00:80::3"},
		{"the guest's ICMPv6 echo", ether(guestMAC, 0x86dd, ipv6("fd00:80::3", "fd00:80::4", 58, 129)), "IPv6 from fd00:80::3"},
		// What the launcher pod's own stack may send before plumbing.
		{"ARP reply for the guest's address", ether(guestMAC, 0x0806, arp), ""},
		{"neighbour advertisement", ether(guestMAC, 0x86dd, ipv6("fd00:80::3", "fd00:80::4", 58, 136)), ""},
		{"router solicitation from link-local", ether(guestMAC, 0x86dd, ipv6("fe80::858:aff:fe50:3", "fd00:80::1", 58, 133)), ""},
		{"IGMP report", ether(guestMAC, 0x0800, ipv4("10.80.0.3", "224.0.0.22", 2)), ""},
		{"to a multicast group", ether(guestMAC, 0x0800, ipv4("10.80.0.3", "239.1.1.1", 17)), ""},
		{"broadcast", ether(guestMAC, 0x0800, ipv4("10.80.0.3", "255.255.255.255", 17)), ""},
		{"IPv6 to multicast", ether(guestMAC, 0x86dd, ipv6("fd00:80::3", "ff02::16", 0, 0)), ""},
		{"DHCP discover (no address yet)", ether(guestMAC, 0x0800, ipv4("0.0.0.0", "10.80.0.1", 17)), ""},
		{"another address", ether(guestMAC, 0x0800, ipv4("10.80.0.9", "10.80.0.4", 1)), ""},
		{"another MAC", ether(otherMAC, 0x0800, ipv4("10.80.0.3", "10.80.0.4", 1)), ""},
		{"another MAC's RARP", ether(otherMAC, ethPRARP, rarp), ""},
		{"truncated IPv4", ether(guestMAC, 0x0800, ipv4("10.80.0.3", "10.80.0.4", 1)[:12]), ""},
		{"truncated IPv6", ether(guestMAC, 0x86dd, ipv6("fd00:80::3", "fd00:80::4", 6, 0)[:30]), ""},
		{"IPv4 type, IPv6 header", ether(guestMAC, 0x0800, ipv6("fd00:80::3", "fd00:80::4", 6, 0)), ""},
		{"runt", guestMAC, ""},
	} {
		if got := guestFrame(tc.frame, guestPort); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}

func FuzzGuestFrame(f *testing.F) {
	f.Add(ether(guestMAC, 0x0800, ipv4("10.80.0.3", "10.80.0.4", 1)))
	f.Add(ether(guestMAC, 0x86dd, ipv6("fd00:80::3", "fd00:80::4", 58, 135)))
	f.Fuzz(func(t *testing.T, b []byte) {
		got := guestFrame(b, guestPort)
		if got != "" && (len(b) < 14 || net.HardwareAddr(b[6:12]).String() != guestMAC.String()) {
			t.Fatalf("%q from a frame not from the guest's MAC", got)
		}
	})
}
