package allocator

import (
	"errors"
	"math/bits"
	"net/netip"
	"slices"
	"strings"
	"testing"
)

// parsePrefixes parses a comma-separated list, skipping what does not parse.
func parsePrefixes(s string) []netip.Prefix {
	var out []netip.Prefix
	for f := range strings.SplitSeq(s, ",") {
		if p, err := netip.ParsePrefix(strings.TrimSpace(f)); err == nil {
			out = append(out, p)
		}
	}
	return out
}

// fuzzAddr builds an address from data: mostly inside one of the
// network's subnets (host bits from data, so far beyond an IPv6 window too),
// sometimes anywhere.
func fuzzAddr(n *Network, data []byte) netip.Addr {
	var raw [16]byte
	copy(raw[:], data)
	if len(n.subnets) == 0 || raw[0]&7 == 7 {
		if raw[0]&8 != 0 {
			return netip.AddrFrom4([4]byte(raw[12:]))
		}
		return netip.AddrFrom16(raw)
	}
	r := n.subnets[int(raw[0]>>4)%len(n.subnets)].r
	host := u128{lo: uint64(raw[1])<<8 | uint64(raw[2])}
	if raw[0]&1 != 0 {
		host = u128{hi: uint64(raw[3]) << 56, lo: uint64(raw[4])<<40 | uint64(raw[5])<<8 | uint64(raw[6])}
	}
	hostBits := r.prefix.Addr().BitLen() - r.prefix.Bits()
	m := hostMask(hostBits)
	v := r.base.or(u128{host.hi & m.hi, host.lo & m.lo})
	if r.is4 {
		return netip.AddrFrom4([4]byte{byte(v.lo >> 24), byte(v.lo >> 16), byte(v.lo >> 8), byte(v.lo)})
	}
	var b [16]byte
	for i := range 8 {
		b[i] = byte(v.hi >> (56 - 8*i))
		b[8+i] = byte(v.lo >> (56 - 8*i))
	}
	return netip.AddrFrom16(b)
}

// FuzzAllocate builds a network from fuzzed prefixes and runs fuzzed
// requests against it, checking that no IP is handed to two owners and that
// every IP handed out is inside its subnet and allowed.
func FuzzAllocate(f *testing.F) {
	f.Add("10.0.0.0/29", "", "10.0.0.4/31", "", "", "", false, []byte{0, 4, 8, 12, 16, 20, 24, 28, 2, 0})
	f.Add("10.0.0.0/24", "fd00::/64", "10.0.0.128/25,fd00::/120", "10.0.0.0/28", "", "", true, []byte{0, 1, 0x11, 0xff, 0xff, 3, 0x21, 1, 2, 3, 4, 5, 6, 7, 2})
	f.Add("192.168.0.0/30", "fd00::/126", "", "", "192.168.0.0/30", "fd00::3", true, []byte{0, 4, 8, 12, 1, 0x10, 0, 3})
	f.Add("fd00:1::/64", "172.16.0.0/20", "", "fd00:1::/112", "fd00:1::/120,172.16.15.0/24", "172.16.15.9", true, []byte{3, 1, 1, 2, 3, 4, 5, 6, 7, 0, 0, 1, 0x10})
	f.Add("", "", "", "", "", "", false, []byte{0, 4, 2, 3})
	f.Fuzz(func(t *testing.T, sub1, sub2, exclude, reserved, infra, gateways string, primary bool, ops []byte) {
		cfg := Config{
			Name:           "fuzz",
			Subnets:        parsePrefixes(sub1 + "," + sub2),
			Exclude:        parsePrefixes(exclude),
			Reserved:       parsePrefixes(reserved),
			Infrastructure: parsePrefixes(infra),
			Primary:        primary,
		}
		for _, s := range strings.Split(gateways, ",") {
			if a, err := netip.ParseAddr(s); err == nil {
				cfg.Gateways = append(cfg.Gateways, a)
			}
		}
		for _, p := range cfg.Subnets {
			if p.Addr().Is4() && p.Bits() < 12 {
				return // valid, but a 2 MiB bitmap per run slows the fuzzer down
			}
		}
		n, err := NewNetwork(cfg)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("NewNetwork: %v does not wrap ErrInvalid", err)
			}
			return
		}
		gws := n.Gateways()

		held := map[netip.Addr]string{}    // the model: who holds what
		owned := map[string][]netip.Addr{} // and the reverse
		record := func(owner string, ips []netip.Addr) {
			for _, ip := range owned[owner] {
				delete(held, ip)
			}
			for _, ip := range ips {
				if o, ok := held[ip]; ok && o != owner {
					t.Fatalf("%s handed to %q while %q holds it", ip, owner, o)
				}
				held[ip] = owner
			}
			owned[owner] = ips
		}
		allowed := func(owner string, a Allocation, static netip.Addr) {
			var ips []netip.Addr
			for _, p := range a.IPs {
				ip := p.Addr()
				s := n.subnetOf(ip)
				switch {
				case s == nil:
					t.Fatalf("%s of %q is outside every subnet", p, owner)
				case p.Bits() != s.r.prefix.Bits():
					t.Fatalf("%s of %q has the wrong length for %s", p, owner, s.r.prefix)
				case s.r.isNetworkOrBroadcast(ip), inAny(cfg.Exclude, ip), slices.Contains(gws, ip):
					t.Fatalf("%s of %q is excluded", p, owner)
				case primary && inAny(cfg.Infrastructure, ip):
					t.Fatalf("%s of %q is in infrastructureSubnets", p, owner)
				case ip != static && inAny(cfg.Reserved, ip):
					t.Fatalf("%s of %q is reserved", p, owner)
				}
				ips = append(ips, ip)
			}
			if checkMAC(a.MAC) != nil {
				t.Fatalf("bad MAC %s for %q", a.MAC, owner)
			}
			record(owner, ips)
		}
		checkErr := func(op string, err error) {
			if err != nil && ReasonOf(err) == ReasonInternalError {
				t.Fatalf("%s: %v wraps no sentinel", op, err)
			}
		}

		for len(ops) > 0 {
			op := ops[0]
			owner := string(rune('a' + op>>2%16))
			ops = ops[1:]
			take := func(k int) []byte {
				k = min(k, len(ops))
				d := ops[:k]
				ops = ops[k:]
				return d
			}
			switch op % 4 {
			case 0:
				_, had := n.Get(owner)
				a, err := n.Allocate(Request{Owner: owner})
				checkErr("allocate", err)
				if err == nil && !had { // what an owner held may come from Reserve
					allowed(owner, a, netip.Addr{})
				}
			case 1:
				ip := fuzzAddr(n, take(8))
				_, had := n.Get(owner)
				a, err := n.Allocate(Request{Owner: owner, IPs: []netip.Addr{ip}})
				checkErr("allocate static", err)
				if err == nil && !had {
					if !slices.ContainsFunc(a.IPs, func(p netip.Prefix) bool { return p.Addr() == ip.Unmap() }) {
						t.Fatalf("static %s not in %v", ip, a.IPs)
					}
					allowed(owner, a, ip.Unmap())
				}
			case 2:
				n.Release(owner)
				record(owner, nil)
			case 3:
				ip := fuzzAddr(n, take(8))
				a, err := n.Reserve(owner, []netip.Addr{ip}, nil)
				checkErr("reserve", err)
				if err == nil {
					var ips []netip.Addr
					for _, p := range a.IPs {
						ips = append(ips, p.Addr())
					}
					record(owner, ips)
				}
			}
		}

		for ip, o := range held {
			if got, ok := n.OwnerOf(ip); !ok || got != o {
				t.Fatalf("OwnerOf(%s) = %q, model %q", ip, got, o)
			}
		}
		size, used := n.Stats()
		if used < 0 || used > size {
			t.Fatalf("Stats = %d, %d", size, used)
		}
		for _, s := range n.subnets {
			r := s.r
			taken := 0
			for w, word := range r.free {
				taken += 64 - bits.OnesCount64(word)
				if (word != 0) != (r.summary[w>>6]&(1<<(w&63)) != 0) {
					t.Fatalf("%s: summary bit of word %d disagrees", r.prefix, w)
				}
			}
			if tail := len(r.free)*64 - r.size; taken-tail != r.used {
				t.Fatalf("%s: %d bits taken, used %d", r.prefix, taken-tail, r.used)
			}
		}
	})
}
