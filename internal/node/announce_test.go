package node

import (
	"bytes"
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

// An ARP request parsed and answered: the reply swaps the roles, carries
// the neighbour's MAC, and parses as no request itself.
func TestARPReply(t *testing.T) {
	peerMAC := net.HardwareAddr{0x0a, 0x58, 0x0a, 0x50, 0x00, 0x04}
	req := make([]byte, 42)
	copy(req[0:6], []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	copy(req[6:12], guestMAC)
	binary.BigEndian.PutUint16(req[12:], 0x0806)
	a := req[14:]
	binary.BigEndian.PutUint16(a[0:], 1)
	binary.BigEndian.PutUint16(a[2:], 0x0800)
	a[4], a[5] = 6, 4
	binary.BigEndian.PutUint16(a[6:], 1)
	copy(a[8:14], guestMAC)
	copy(a[14:18], []byte{10, 80, 0, 3})
	copy(a[24:28], []byte{10, 80, 0, 4})
	r, ok := parseARPRequest(req)
	if !ok || r.senderMAC.String() != guestMAC.String() || r.senderIP.String() != "10.80.0.3" || r.targetIP.String() != "10.80.0.4" {
		t.Fatalf("parseARPRequest = %+v, %v", r, ok)
	}
	reply := arpReply(r, peerMAC)
	if len(reply) != 60 || !bytes.Equal(reply[0:6], guestMAC) || !bytes.Equal(reply[6:12], peerMAC) ||
		binary.BigEndian.Uint16(reply[20:22]) != 2 || !bytes.Equal(reply[22:28], peerMAC) ||
		!bytes.Equal(reply[28:32], []byte{10, 80, 0, 4}) || !bytes.Equal(reply[32:38], guestMAC) || !bytes.Equal(reply[38:42], []byte{10, 80, 0, 3}) {
		t.Fatalf("arpReply = % x", reply)
	}
	if _, ok := parseARPRequest(reply); ok {
		t.Error("the reply parsed as a request")
	}
	binary.BigEndian.PutUint16(a[2:], 0x86dd)
	if _, ok := parseARPRequest(req); ok {
		t.Error("an ARP request for a non-IPv4 protocol parsed")
	}
	if _, ok := parseARPRequest(req[:41]); ok {
		t.Error("a truncated request parsed")
	}
}

func FuzzParseARPRequest(f *testing.F) {
	f.Add(make([]byte, 42))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, ok := parseARPRequest(b)
		if !ok {
			return
		}
		if len(b) < 42 || binary.BigEndian.Uint16(b[20:22]) != 1 {
			t.Fatalf("parsed %+v from a frame that is no ARP request", r)
		}
		if got, ok := parseARPRequest(arpReply(r, guestMAC)); ok {
			t.Fatalf("the reply to %+v parsed as request %+v", r, got)
		}
	})
}

// TestStandbyProbe: the probe is a valid ICMP echo request from the
// gateway to the guest's address; a reply to it that the pod's own stack
// sends (TTL 64) is not the guest's first frame, one forwarded from the
// guest behind the pod's NAT (TTL 63) is.
func TestStandbyProbe(t *testing.T) {
	gwMAC := net.HardwareAddr{0x0a, 0x58, 0x0a, 0x50, 0x00, 0x01}
	gw, guest := netip.MustParseAddr("10.80.0.1"), netip.MustParseAddr("10.80.0.3")
	f := probeFrame(guestMAC, gwMAC, gw, guest, 7)
	if !bytes.Equal(f[0:6], guestMAC) || !bytes.Equal(f[6:12], gwMAC) || binary.BigEndian.Uint16(f[12:14]) != 0x0800 {
		t.Fatalf("Ethernet header % x", f[:14])
	}
	ip, icmp := f[14:34], f[34:]
	if inetChecksum(ip) != 0 || inetChecksum(icmp) != 0 {
		t.Fatalf("checksums do not verify: IP %#x, ICMP %#x", inetChecksum(ip), inetChecksum(icmp))
	}
	if ip[8] != 64 || ip[9] != 1 || netip.AddrFrom4([4]byte(ip[12:16])) != gw || netip.AddrFrom4([4]byte(ip[16:20])) != guest ||
		int(binary.BigEndian.Uint16(ip[2:4])) != len(f)-14 {
		t.Fatalf("IPv4 header % x", ip)
	}
	if icmp[0] != 8 || binary.BigEndian.Uint16(icmp[4:6]) != ProbeID || binary.BigEndian.Uint16(icmp[6:8]) != 7 {
		t.Fatalf("ICMP header % x", icmp[:8])
	}
	// The answer: addresses and MACs swapped, echo reply.
	reply := func(ttl byte, id uint16) []byte {
		r := bytes.Clone(f)
		copy(r[0:6], gwMAC)
		copy(r[6:12], guestMAC)
		copy(r[14+12:14+16], guest.AsSlice())
		copy(r[14+16:14+20], gw.AsSlice())
		r[14+8] = ttl
		r[34] = 0
		binary.BigEndian.PutUint16(r[34+4:34+6], id)
		return r
	}
	if got := guestFrame(reply(64, ProbeID), guestPort); got != "" {
		t.Errorf("the pod's own answer to the probe taken for the guest's frame: %q", got)
	}
	if got := guestFrame(reply(63, ProbeID), guestPort); got != "IPv4 from 10.80.0.3" {
		t.Errorf("the guest's answer forwarded by the pod: %q, want its first frame", got)
	}
	if got := guestFrame(reply(64, 0x1234), guestPort); got != "IPv4 from 10.80.0.3" {
		t.Errorf("a reply to someone else's ping: %q, want the guest's first frame", got)
	}
}
