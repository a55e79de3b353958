package allocator

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
)

func prefixes(ss ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, s := range ss {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}

func addrs(ss ...string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

func mac(s string) net.HardwareAddr {
	if s == "" {
		return nil
	}
	m, err := net.ParseMAC(s)
	if err != nil {
		panic(err)
	}
	return m
}

func strs[T fmt.Stringer](xs []T) []string {
	var out []string
	for _, x := range xs {
		out = append(out, x.String())
	}
	return out
}

func newNetwork(t testing.TB, cfg Config) *Network {
	t.Helper()
	if cfg.Name == "" {
		cfg.Name = "ns_net"
	}
	n, err := NewNetwork(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// step is one operation on a network in a table test.
type step struct {
	op      string // "allocate" (default), "reserve" or "release"
	owner   string
	ips     []string
	mac     string
	want    []string // IPs with prefix length; nil skips the check
	wantMAC string   // "" skips the check
	wantGW  []string // nil skips the check
	err     error
}

func runSteps(t *testing.T, n *Network, steps []step) {
	t.Helper()
	for i, s := range steps {
		var (
			a   Allocation
			err error
		)
		switch s.op {
		case "", "allocate":
			a, err = n.Allocate(Request{Owner: s.owner, IPs: addrs(s.ips...), MAC: mac(s.mac)})
		case "reserve":
			a, err = n.Reserve(s.owner, addrs(s.ips...), mac(s.mac))
		case "release":
			n.Release(s.owner)
			continue
		default:
			t.Fatalf("step %d: unknown op %q", i, s.op)
		}
		if s.err != nil {
			if !errors.Is(err, s.err) {
				t.Fatalf("step %d (%s %s): err = %v, want %v", i, s.op, s.owner, err, s.err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("step %d (%s %s): %v", i, s.op, s.owner, err)
		}
		if s.want != nil && !slices.Equal(strs(a.IPs), s.want) {
			t.Fatalf("step %d (%s %s): IPs %v, want %v", i, s.op, s.owner, a.IPs, s.want)
		}
		if s.wantMAC != "" && a.MAC.String() != s.wantMAC {
			t.Fatalf("step %d (%s %s): MAC %s, want %s", i, s.op, s.owner, a.MAC, s.wantMAC)
		}
		if s.wantGW != nil && !slices.Equal(strs(a.Gateways), s.wantGW) {
			t.Fatalf("step %d (%s %s): gateways %v, want %v", i, s.op, s.owner, a.Gateways, s.wantGW)
		}
	}
}

func TestNetworkAllocate(t *testing.T) {
	v4 := prefixes("10.0.0.0/24")
	tests := []struct {
		name  string
		cfg   Config
		steps []step
	}{
		{
			name: "automatic",
			cfg:  Config{Subnets: v4},
			steps: []step{
				{owner: "a", want: []string{"10.0.0.1/24"}, wantMAC: "0a:58:0a:00:00:01"},
				{owner: "b", want: []string{"10.0.0.2/24"}, wantMAC: "0a:58:0a:00:00:02"},
			},
		},
		{
			name: "idempotent whatever the request",
			cfg:  Config{Subnets: v4},
			steps: []step{
				{owner: "a", ips: []string{"10.0.0.5"}, want: []string{"10.0.0.5/24"}},
				{owner: "a", ips: []string{"10.0.0.9"}, mac: "02:00:00:00:00:01", want: []string{"10.0.0.5/24"}, wantMAC: "0a:58:0a:00:00:05"},
				{owner: "a", ips: []string{"192.0.2.1"}, want: []string{"10.0.0.5/24"}},
				{owner: "b", want: []string{"10.0.0.1/24"}},
			},
		},
		{
			name: "static conflicts",
			cfg:  Config{Subnets: v4},
			steps: []step{
				{owner: "a", ips: []string{"10.0.0.5"}, want: []string{"10.0.0.5/24"}},
				{owner: "b", ips: []string{"10.0.0.5"}, err: ErrAllocated},
				{owner: "b", ips: []string{"10.0.0.6"}, want: []string{"10.0.0.6/24"}},
			},
		},
		{
			name: "static outside the network",
			cfg:  Config{Subnets: v4},
			steps: []step{
				{owner: "a", ips: []string{"10.0.1.5"}, err: ErrNotInSubnet},
				{owner: "a", ips: []string{"fd00::5"}, err: ErrInvalid},
				{owner: "a", ips: []string{"10.0.0.5", "10.0.0.6"}, err: ErrInvalid},
				{owner: "a", ips: []string{"10.0.0.0"}, err: ErrExcluded},
				{owner: "a", ips: []string{"10.0.0.255"}, err: ErrExcluded},
				{owner: "", err: ErrInvalid},
				{owner: "a", ips: []string{"::ffff:10.0.0.5"}, want: []string{"10.0.0.5/24"}},
			},
		},
		{
			name: "exclusions",
			cfg:  Config{Subnets: v4, Exclude: prefixes("10.0.0.0/30", "10.0.0.9/32")},
			steps: []step{
				{owner: "a", ips: []string{"10.0.0.2"}, err: ErrExcluded},
				{owner: "a", ips: []string{"10.0.0.9"}, err: ErrExcluded},
				{owner: "a", want: []string{"10.0.0.4/24"}},
				{owner: "b", ips: []string{"10.0.0.8"}},
				{owner: "c", want: []string{"10.0.0.5/24"}},
				{owner: "d", want: []string{"10.0.0.6/24"}},
				{owner: "e", want: []string{"10.0.0.7/24"}},
				{owner: "f", want: []string{"10.0.0.10/24"}},
			},
		},
		{
			name: "reserved",
			cfg:  Config{Subnets: v4, Reserved: prefixes("10.0.0.0/29")},
			steps: []step{
				{owner: "a", want: []string{"10.0.0.8/24"}},
				{owner: "b", ips: []string{"10.0.0.3"}, want: []string{"10.0.0.3/24"}},
				{owner: "c", ips: []string{"10.0.0.3"}, err: ErrAllocated},
				{op: "release", owner: "b"},
				{owner: "c", ips: []string{"10.0.0.3"}, want: []string{"10.0.0.3/24"}},
				{owner: "d", want: []string{"10.0.0.9/24"}},
			},
		},
		{
			name: "primary gateway and management",
			cfg:  Config{Subnets: v4, Primary: true},
			steps: []step{
				{owner: "a", ips: []string{"10.0.0.1"}, err: ErrExcluded},
				{owner: "a", ips: []string{"10.0.0.2"}, err: ErrExcluded},
				{owner: "a", want: []string{"10.0.0.3/24"}, wantGW: []string{"10.0.0.1"}},
			},
		},
		{
			name: "secondary has no gateway",
			cfg:  Config{Subnets: v4, Gateways: addrs("10.0.0.9")},
			steps: []step{
				{owner: "a", want: []string{"10.0.0.1/24"}, wantGW: []string{}},
				{owner: "b", ips: []string{"10.0.0.9"}},
			},
		},
		{
			name: "infrastructure at the end",
			cfg:  Config{Subnets: v4, Primary: true, Infrastructure: prefixes("10.0.0.248/29")},
			steps: []step{
				{owner: "a", want: []string{"10.0.0.1/24"}, wantGW: []string{"10.0.0.248"}},
				{owner: "b", want: []string{"10.0.0.2/24"}},
				{owner: "c", ips: []string{"10.0.0.250"}, err: ErrExcluded},
				{owner: "c", ips: []string{"10.0.0.248"}, err: ErrExcluded},
				{owner: "c", ips: []string{"10.0.0.247"}},
			},
		},
		{
			name: "infrastructure at the start",
			cfg:  Config{Subnets: v4, Primary: true, Infrastructure: prefixes("10.0.0.0/29")},
			steps: []step{
				{owner: "a", want: []string{"10.0.0.8/24"}, wantGW: []string{"10.0.0.1"}},
				{owner: "b", ips: []string{"10.0.0.7"}, err: ErrExcluded},
			},
		},
		{
			name: "default gateway",
			cfg:  Config{Subnets: v4, Primary: true, Gateways: addrs("10.0.0.254")},
			steps: []step{
				{owner: "a", want: []string{"10.0.0.1/24"}, wantGW: []string{"10.0.0.254"}},
				{owner: "b", ips: []string{"10.0.0.254"}, err: ErrExcluded},
				{owner: "b", ips: []string{"10.0.0.2"}, err: ErrExcluded}, // management
				{owner: "b", want: []string{"10.0.0.3/24"}},
			},
		},
		{
			name: "default gateway on the management address",
			cfg:  Config{Subnets: v4, Primary: true, Gateways: addrs("10.0.0.2")},
			steps: []step{
				{owner: "a", want: []string{"10.0.0.3/24"}, wantGW: []string{"10.0.0.2"}},
				{owner: "b", ips: []string{"10.0.0.1"}, err: ErrExcluded},
			},
		},
		{
			name: "default gateway in infrastructure",
			cfg:  Config{Subnets: v4, Primary: true, Infrastructure: prefixes("10.0.0.240/28"), Gateways: addrs("10.0.0.250")},
			steps: []step{
				{owner: "a", want: []string{"10.0.0.1/24"}, wantGW: []string{"10.0.0.250"}},
				{owner: "b", ips: []string{"10.0.0.240"}, err: ErrExcluded},
				{owner: "b", ips: []string{"10.0.0.2"}, want: []string{"10.0.0.2/24"}},
			},
		},
		{
			name: "dual stack",
			cfg:  Config{Subnets: prefixes("fd00::/64", "10.0.0.0/24")},
			steps: []step{
				{owner: "a", want: []string{"10.0.0.1/24", "fd00::1/64"}, wantMAC: "0a:58:0a:00:00:01"},
				{owner: "b", ips: []string{"10.0.0.50"}, want: []string{"10.0.0.50/24", "fd00::2/64"}},
				{owner: "c", ips: []string{"fd00::50"}, want: []string{"10.0.0.2/24", "fd00::50/64"}},
				{owner: "d", ips: []string{"fd00::60", "10.0.0.60"}, want: []string{"10.0.0.60/24", "fd00::60/64"}},
				{owner: "e", ips: []string{"fd00::60"}, err: ErrAllocated},
				{owner: "e", ips: []string{"fd00::61", "fd00::62"}, err: ErrInvalid},
			},
		},
		{
			name: "dual stack primary",
			cfg:  Config{Subnets: prefixes("10.0.0.0/24", "fd00::/64"), Primary: true},
			steps: []step{
				{owner: "a", want: []string{"10.0.0.3/24", "fd00::3/64"}, wantGW: []string{"10.0.0.1", "fd00::1"}},
				{owner: "b", ips: []string{"fd00::2"}, err: ErrExcluded},
			},
		},
		{
			name: "ipv6 /64 beyond the window",
			cfg:  Config{Subnets: prefixes("fd00::/64")},
			steps: []step{
				{owner: "a", want: []string{"fd00::1/64"}},
				{owner: "b", ips: []string{"fd00::1234:5678:9abc:def0"}, want: []string{"fd00::1234:5678:9abc:def0/64"}, wantMAC: "0a:58:9a:bc:de:f0"},
				{owner: "c", ips: []string{"fd00::1234:5678:9abc:def0"}, err: ErrAllocated},
				// Same last four bytes, so the same derived MAC.
				{owner: "c", ips: []string{"fd00::1:2:9abc:def0"}, err: ErrMACConflict},
				{owner: "c", ips: []string{"fd00::1:2:9abc:def0"}, mac: "02:00:00:00:00:0c"},
				{op: "release", owner: "b"},
				{owner: "d", ips: []string{"fd00::1234:5678:9abc:def0"}},
			},
		},
		{
			name: "macs",
			cfg:  Config{Subnets: v4},
			steps: []step{
				{owner: "a", mac: "02:aa:bb:cc:dd:ee", want: []string{"10.0.0.1/24"}, wantMAC: "02:aa:bb:cc:dd:ee"},
				{owner: "b", mac: "02:aa:bb:cc:dd:ee", err: ErrMACConflict},
				{owner: "b", mac: "01:00:5e:00:00:01", err: ErrInvalid},
				{owner: "b", mac: "ff:ff:ff:ff:ff:ff", err: ErrInvalid},
				{owner: "b", mac: "00:00:00:00:00:00", err: ErrInvalid},
				{owner: "b", mac: "00:00:00:00:fe:80:00:00:00:00:00:00:02:00:5e:10:00:00:00:01", err: ErrInvalid},
				// Nothing stuck from the failures: b gets the next IP.
				{owner: "b", want: []string{"10.0.0.2/24"}, wantMAC: "0a:58:0a:00:00:02"},
				// A requested MAC equal to a derived one.
				{owner: "c", mac: "0a:58:0a:00:00:02", err: ErrMACConflict},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			runSteps(t, newNetwork(t, tt.cfg), tt.steps)
		})
	}
}

func TestNetworkExhaustion(t *testing.T) {
	tests := []struct {
		name  string
		cfg   Config
		count int
		never []string
	}{
		{name: "secondary /29", cfg: Config{Subnets: prefixes("10.0.0.0/29")}, count: 6, never: []string{"10.0.0.0", "10.0.0.7"}},
		{name: "primary /29", cfg: Config{Subnets: prefixes("10.0.0.0/29"), Primary: true}, count: 4, never: []string{"10.0.0.0", "10.0.0.1", "10.0.0.2", "10.0.0.7"}},
		{name: "excluded /29", cfg: Config{Subnets: prefixes("10.0.0.0/29"), Exclude: prefixes("10.0.0.4/30")}, count: 3, never: []string{"10.0.0.4", "10.0.0.5", "10.0.0.6"}},
		{name: "reserved /29", cfg: Config{Subnets: prefixes("10.0.0.0/29"), Reserved: prefixes("10.0.0.1/32")}, count: 5, never: []string{"10.0.0.1"}},
		{name: "dual stack, smaller IPv6", cfg: Config{Subnets: prefixes("10.0.0.0/29", "fd00::/126")}, count: 3, never: []string{"fd00::"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := newNetwork(t, tt.cfg)
			seen := map[netip.Addr]bool{}
			for i := range tt.count {
				a, err := n.Allocate(Request{Owner: fmt.Sprint("o", i)})
				if err != nil {
					t.Fatalf("allocation %d: %v", i, err)
				}
				for _, p := range a.IPs {
					if seen[p.Addr()] {
						t.Fatalf("%s handed out twice", p.Addr())
					}
					seen[p.Addr()] = true
				}
			}
			for _, s := range tt.never {
				if seen[netip.MustParseAddr(s)] {
					t.Errorf("%s handed out", s)
				}
			}
			size, used := n.Stats()
			_, err := n.Allocate(Request{Owner: "last"})
			if !errors.Is(err, ErrFull) || ReasonOf(err) != ReasonSubnetExhausted {
				t.Fatalf("err = %v, want ErrFull", err)
			}
			// All or nothing: the failed request left the other family alone.
			if s2, u2 := n.Stats(); s2 != size || u2 != used {
				t.Fatalf("stats %d/%d after failure, %d/%d before", u2, s2, used, size)
			}
			if _, ok := n.Get("last"); ok {
				t.Fatal("failed owner holds an allocation")
			}
		})
	}
}

func TestNetworkRoundRobin(t *testing.T) {
	n := newNetwork(t, Config{Subnets: prefixes("10.0.0.0/29")})
	var got []string
	for i := range 8 {
		owner := fmt.Sprint("o", i)
		a, err := n.Allocate(Request{Owner: owner})
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, a.IPs[0].Addr().String())
		n.Release(owner)
	}
	want := []string{"10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5", "10.0.0.6", "10.0.0.1", "10.0.0.2"}
	if !slices.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
}

func TestNetworkMACOnly(t *testing.T) {
	n := newNetwork(t, Config{Name: "ns_mac"})
	seen := map[string]bool{}
	for i := range 100 {
		a, err := n.Allocate(Request{Owner: fmt.Sprint("o", i)})
		if err != nil {
			t.Fatal(err)
		}
		if len(a.IPs) != 0 || len(a.MAC) != 6 || a.MAC[0] != 0x0a || a.MAC[1] != 0x58 || seen[a.MAC.String()] {
			t.Fatalf("allocation %+v", a)
		}
		seen[a.MAC.String()] = true
	}
	a, err := n.Allocate(Request{Owner: "req", MAC: mac("02:00:00:00:00:01")})
	if err != nil || a.MAC.String() != "02:00:00:00:00:01" {
		t.Fatalf("requested MAC: %+v, %v", a, err)
	}
	if _, err := n.Allocate(Request{Owner: "x", IPs: addrs("10.0.0.1")}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("static IP on a MAC-only network: %v", err)
	}
	if size, used := n.Stats(); size != 0 || used != 0 {
		t.Fatalf("stats %d/%d", used, size)
	}
	if n.Gateways() != nil {
		t.Fatal("gateways on a secondary network")
	}
}

func TestNetworkRollback(t *testing.T) {
	tests := []struct {
		name    string
		cfg     Config
		setup   []step
		fail    step
		freeIPs []string // must be free after the failure
		next    []string // the next automatic allocation, if set
	}{
		{
			name:    "mac conflict frees static and automatic IPs",
			cfg:     Config{Subnets: prefixes("10.0.0.0/24", "fd00::/64")},
			setup:   []step{{owner: "a", mac: "02:00:00:00:00:0a"}},
			fail:    step{owner: "b", ips: []string{"10.0.0.9"}, mac: "02:00:00:00:00:0a", err: ErrMACConflict},
			freeIPs: []string{"10.0.0.9", "fd00::2"},
			next:    []string{"10.0.0.2/24", "fd00::2/64"},
		},
		{
			name:    "derived mac conflict",
			cfg:     Config{Subnets: prefixes("10.0.0.0/24", "fd00::/64")},
			setup:   []step{{owner: "a", mac: "0a:58:0a:00:00:09"}},
			fail:    step{owner: "b", ips: []string{"10.0.0.9"}, err: ErrMACConflict},
			freeIPs: []string{"10.0.0.9", "fd00::2"},
			next:    []string{"10.0.0.2/24", "fd00::2/64"},
		},
		{
			name:    "full IPv6 frees IPv4",
			cfg:     Config{Subnets: prefixes("10.0.0.0/24", "fd00::/126")},
			setup:   []step{{owner: "a"}, {owner: "b"}, {owner: "c"}},
			fail:    step{owner: "d", err: ErrFull},
			freeIPs: []string{"10.0.0.4"},
		},
		{
			name:    "conflicting IPv6 keeps IPv4 free",
			cfg:     Config{Subnets: prefixes("10.0.0.0/24", "fd00::/64")},
			setup:   []step{{owner: "a"}},
			fail:    step{owner: "b", ips: []string{"10.0.0.7", "fd00::1"}, err: ErrAllocated},
			freeIPs: []string{"10.0.0.7"},
		},
		{
			name:    "reserve with a conflicting MAC",
			cfg:     Config{Subnets: prefixes("10.0.0.0/24", "fd00::/64")},
			setup:   []step{{owner: "a", mac: "02:00:00:00:00:0a"}},
			fail:    step{op: "reserve", owner: "b", ips: []string{"10.0.0.9", "fd00::9"}, mac: "02:00:00:00:00:0a", err: ErrMACConflict},
			freeIPs: []string{"10.0.0.9", "fd00::9"},
		},
		{
			name:    "reserve with one conflicting IP",
			cfg:     Config{Subnets: prefixes("10.0.0.0/24", "fd00::/64")},
			setup:   []step{{owner: "a"}},
			fail:    step{op: "reserve", owner: "b", ips: []string{"10.0.0.9", "fd00::1"}, err: ErrAllocated},
			freeIPs: []string{"10.0.0.9"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := newNetwork(t, tt.cfg)
			runSteps(t, n, tt.setup)
			size, used := n.Stats()
			runSteps(t, n, []step{tt.fail})
			if s2, u2 := n.Stats(); s2 != size || u2 != used {
				t.Fatalf("stats %d/%d after failure, %d/%d before", u2, s2, used, size)
			}
			if _, ok := n.Get(tt.fail.owner); ok {
				t.Fatal("failed owner holds an allocation")
			}
			for _, s := range tt.freeIPs {
				ip := netip.MustParseAddr(s)
				if o, ok := n.OwnerOf(ip); ok {
					t.Fatalf("%s held by %q after the failure", s, o)
				}
				if n.subnetOf(ip).r.Has(ip) {
					t.Fatalf("%s still taken in the bitmap after the failure", s)
				}
			}
			if tt.next != nil {
				runSteps(t, n, []step{{owner: "next", mac: "02:11:22:33:44:55", want: tt.next}})
			}
		})
	}
}

func TestNetworkReserve(t *testing.T) {
	v4 := prefixes("10.0.0.0/24")
	tests := []struct {
		name  string
		cfg   Config
		steps []step
	}{
		{
			name: "same owner is idempotent",
			cfg:  Config{Subnets: v4},
			steps: []step{
				{op: "reserve", owner: "a", ips: []string{"10.0.0.5"}, mac: "02:00:00:00:00:0a", want: []string{"10.0.0.5/24"}, wantMAC: "02:00:00:00:00:0a"},
				{op: "reserve", owner: "a", ips: []string{"10.0.0.5"}, mac: "02:00:00:00:00:0a", want: []string{"10.0.0.5/24"}, wantMAC: "02:00:00:00:00:0a"},
				{owner: "a", want: []string{"10.0.0.5/24"}, wantMAC: "02:00:00:00:00:0a"},
			},
		},
		{
			name: "other owner",
			cfg:  Config{Subnets: v4},
			steps: []step{
				{op: "reserve", owner: "a", ips: []string{"10.0.0.5"}, mac: "02:00:00:00:00:0a"},
				{op: "reserve", owner: "b", ips: []string{"10.0.0.5"}, err: ErrAllocated},
				{op: "reserve", owner: "b", ips: []string{"10.0.0.6"}, mac: "02:00:00:00:00:0a", err: ErrMACConflict},
				{owner: "b", ips: []string{"10.0.0.5"}, err: ErrAllocated},
			},
		},
		{
			name: "reserved IPs are never handed out",
			cfg:  Config{Subnets: prefixes("10.0.0.0/29")},
			steps: []step{
				{op: "reserve", owner: "a", ips: []string{"10.0.0.1"}, mac: "02:00:00:00:00:0a"},
				{op: "reserve", owner: "b", ips: []string{"10.0.0.3"}},
				{owner: "c", want: []string{"10.0.0.2/29"}},
				{owner: "d", want: []string{"10.0.0.4/29"}},
				{owner: "e", want: []string{"10.0.0.5/29"}},
				{owner: "f", want: []string{"10.0.0.6/29"}},
				{owner: "g", err: ErrFull},
			},
		},
		{
			name: "excluded and reserved IPs are accepted",
			cfg:  Config{Subnets: v4, Primary: true, Exclude: prefixes("10.0.0.128/25"), Reserved: prefixes("10.0.0.64/26")},
			steps: []step{
				{op: "reserve", owner: "a", ips: []string{"10.0.0.200"}},
				{op: "reserve", owner: "b", ips: []string{"10.0.0.70"}},
				{op: "reserve", owner: "c", ips: []string{"10.0.0.1"}},
				{op: "reserve", owner: "d", ips: []string{"10.0.0.200"}, err: ErrAllocated},
				{op: "release", owner: "a"},
				{op: "reserve", owner: "d", ips: []string{"10.0.0.200"}},
				{owner: "e", ips: []string{"10.0.0.70"}, err: ErrAllocated},
			},
		},
		{
			name: "outside",
			cfg:  Config{Subnets: v4},
			steps: []step{
				{op: "reserve", owner: "a", ips: []string{"10.0.1.5"}, err: ErrNotInSubnet},
				{op: "reserve", owner: "a", ips: []string{"fd00::5"}, err: ErrNotInSubnet},
				{op: "reserve", owner: "a", ips: []string{"10.0.0.5", "10.0.0.6"}, err: ErrInvalid},
				{op: "reserve", owner: "a", mac: "03:00:00:00:00:01", err: ErrInvalid},
				{op: "reserve", owner: "a", err: ErrInvalid},
				{op: "reserve", owner: "", ips: []string{"10.0.0.5"}, err: ErrInvalid},
			},
		},
		{
			name: "replaces what the owner held",
			cfg:  Config{Subnets: prefixes("10.0.0.0/24", "fd00::/64"), Primary: true},
			steps: []step{
				{owner: "a", want: []string{"10.0.0.3/24", "fd00::3/64"}, wantMAC: "0a:58:0a:00:00:03"},
				{op: "reserve", owner: "a", ips: []string{"fd00::9", "10.0.0.3"}, want: []string{"10.0.0.3/24", "fd00::9/64"}, wantMAC: "0a:58:0a:00:00:03", wantGW: []string{"10.0.0.1", "fd00::1"}},
				{op: "reserve", owner: "a", ips: []string{"fd00::9"}, mac: "02:00:00:00:00:0a", want: []string{"fd00::9/64"}, wantGW: []string{"fd00::1"}},
				// The IPv4 address and the old MAC are free again.
				{owner: "b", ips: []string{"10.0.0.3", "fd00::3"}, want: []string{"10.0.0.3/24", "fd00::3/64"}, wantMAC: "0a:58:0a:00:00:03"},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			runSteps(t, newNetwork(t, tt.cfg), tt.steps)
		})
	}
}

func TestNetworkRelease(t *testing.T) {
	n := newNetwork(t, Config{Subnets: prefixes("10.0.0.0/24", "fd00::/64")})
	a, err := n.Allocate(Request{Owner: "a", IPs: addrs("10.0.0.9"), MAC: mac("02:00:00:00:00:0a")})
	if err != nil {
		t.Fatal(err)
	}
	if o, ok := n.OwnerOf(netip.MustParseAddr("10.0.0.9")); !ok || o != "a" {
		t.Fatalf("OwnerOf = %q, %v", o, ok)
	}
	if o, ok := n.OwnerOf(netip.MustParseAddr("::ffff:10.0.0.9")); !ok || o != "a" {
		t.Fatalf("OwnerOf IPv4-mapped = %q, %v", o, ok)
	}
	n.Release("a")
	n.Release("a")
	n.Release("nobody")
	if _, ok := n.Get("a"); ok {
		t.Fatal("released owner still holds an allocation")
	}
	for _, p := range a.IPs {
		if _, ok := n.OwnerOf(p.Addr()); ok {
			t.Fatalf("%s still owned", p)
		}
	}
	if _, used := n.Stats(); used != 0 {
		t.Fatalf("used %d after release", used)
	}
	b, err := n.Allocate(Request{Owner: "b", IPs: []netip.Addr{a.IPs[0].Addr(), a.IPs[1].Addr()}, MAC: a.MAC})
	if err != nil {
		t.Fatalf("IPs and MAC not free after release: %v", err)
	}
	// Callers get copies.
	b.IPs[0] = netip.MustParsePrefix("192.0.2.1/32")
	b.MAC[5] = 0xff
	if got, _ := n.Get("b"); got.IPs[0] != a.IPs[0] || got.MAC.String() != "02:00:00:00:00:0a" {
		t.Fatalf("internal state changed through a returned allocation: %+v", got)
	}
}

func TestNetworkTransfer(t *testing.T) {
	n := newNetwork(t, Config{Subnets: prefixes("10.0.0.0/24", "fd00::/64")})
	a, err := n.Allocate(Request{Owner: "reserve/1"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n.Allocate(Request{Owner: "b"}); err != nil {
		t.Fatal(err)
	}
	got, err := n.Transfer("reserve/1", "pod/x")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(strs(got.IPs), strs(a.IPs)) || got.MAC.String() != a.MAC.String() {
		t.Fatalf("transferred %v %s, want %v %s", got.IPs, got.MAC, a.IPs, a.MAC)
	}
	if _, ok := n.Get("reserve/1"); ok {
		t.Fatal("the old owner still holds an allocation")
	}
	for _, p := range a.IPs {
		if o, _ := n.OwnerOf(p.Addr()); o != "pod/x" {
			t.Fatalf("%s owned by %q, want pod/x", p, o)
		}
	}
	if o, _ := n.OwnerOfMAC(a.MAC); o != "pod/x" {
		t.Fatalf("MAC owned by %q, want pod/x", o)
	}
	if _, used := n.Stats(); used != 4 {
		t.Fatalf("used %d, want 4 (2 owners, 2 families)", used)
	}
	// What the new owner holds is released as its own.
	n.Release("pod/x")
	if o, ok := n.OwnerOfMAC(a.MAC); ok {
		t.Fatalf("MAC still owned by %q", o)
	}
	for _, tc := range []struct{ from, to string }{
		{"nobody", "pod/y"}, // holds nothing
		{"b", ""},           // no new owner
		{"b", "b"},
	} {
		if _, err := n.Transfer(tc.from, tc.to); !errors.Is(err, ErrInvalid) {
			t.Errorf("Transfer(%q, %q) = %v, want ErrInvalid", tc.from, tc.to, err)
		}
	}
	if _, err := n.Allocate(Request{Owner: "c"}); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Transfer("b", "c"); !errors.Is(err, ErrAllocated) {
		t.Fatalf("Transfer to an owner holding an allocation = %v, want ErrAllocated", err)
	}
	if _, ok := n.Get("b"); !ok {
		t.Fatal("a refused transfer changed the old owner")
	}
	if _, ok := n.OwnerOfMAC(net.HardwareAddr{1, 2, 3}); ok {
		t.Fatal("OwnerOfMAC of a short MAC")
	}
}

func TestNetworkStats(t *testing.T) {
	tests := []struct {
		name   string
		cfg    Config
		steps  []step
		size   int
		used   int
		gwsOut []string
	}{
		{name: "empty /24", cfg: Config{Subnets: prefixes("10.0.0.0/24")}, size: 254},
		{name: "primary /24", cfg: Config{Subnets: prefixes("10.0.0.0/24"), Primary: true}, size: 252, gwsOut: []string{"10.0.0.1"}},
		{
			name:  "exclusions and reservations",
			cfg:   Config{Subnets: prefixes("10.0.0.0/24"), Exclude: prefixes("10.0.0.0/26"), Reserved: prefixes("10.0.0.64/26", "10.0.0.100/32")},
			steps: []step{{owner: "a"}, {owner: "b", ips: []string{"10.0.0.70"}}, {owner: "c", ips: []string{"10.0.0.200"}}},
			size:  127,
			used:  2,
		},
		{
			name:   "dual stack /64",
			cfg:    Config{Subnets: prefixes("10.0.0.0/24", "fd00::/64"), Primary: true},
			steps:  []step{{owner: "a"}, {owner: "b", ips: []string{"fd00::1:2:3:4"}}},
			size:   252 + 65534,
			used:   3,
			gwsOut: []string{"10.0.0.1", "fd00::1"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := newNetwork(t, tt.cfg)
			runSteps(t, n, tt.steps)
			if size, used := n.Stats(); size != tt.size || used != tt.used {
				t.Fatalf("Stats = %d, %d; want %d, %d", size, used, tt.size, tt.used)
			}
			if !slices.Equal(strs(n.Gateways()), tt.gwsOut) {
				t.Fatalf("Gateways = %v, want %v", n.Gateways(), tt.gwsOut)
			}
			if n.Name() != "ns_net" {
				t.Fatalf("Name = %q", n.Name())
			}
		})
	}
}

func TestNetworkIPv6Memory(t *testing.T) {
	n := newNetwork(t, Config{Subnets: prefixes("fd00:1:2:3::/64")})
	for i := range 1000 {
		if _, err := n.Allocate(Request{Owner: fmt.Sprint("far", i), IPs: addrs(fmt.Sprintf("fd00:1:2:3:%x::%x:0", i+1, i+1))}); err != nil {
			t.Fatal(err)
		}
	}
	r := n.subnets[0].r
	if len(r.free) > 1024 || len(r.summary) > 16 || len(r.sparse) != 1000 {
		t.Fatalf("bitmap %d words, summary %d, sparse %d", len(r.free), len(r.summary), len(r.sparse))
	}
	if _, err := n.Allocate(Request{Owner: "x", IPs: addrs("fd00:1:2:3:7::7:0")}); !errors.Is(err, ErrAllocated) {
		t.Fatalf("conflict beyond the window: %v", err)
	}
	a, err := n.Allocate(Request{Owner: "auto"})
	if err != nil || a.IPs[0].String() != "fd00:1:2:3::1/64" {
		t.Fatalf("automatic: %+v, %v", a, err)
	}
}

func TestReasonOf(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want Reason
	}{
		{name: "nil", err: nil, want: ""},
		{name: "full", err: fmt.Errorf("x: %w", ErrFull), want: ReasonSubnetExhausted},
		{name: "allocated", err: fmt.Errorf("x: %w", ErrAllocated), want: ReasonIPConflict},
		{name: "mac", err: fmt.Errorf("x: %w", ErrMACConflict), want: ReasonMACConflict},
		{name: "not in subnet", err: fmt.Errorf("x: %w", ErrNotInSubnet), want: ReasonInvalidRequest},
		{name: "excluded", err: ErrExcluded, want: ReasonInvalidRequest},
		{name: "invalid", err: ErrInvalid, want: ReasonInvalidRequest},
		{name: "other", err: errors.New("boom"), want: ReasonInternalError},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := ReasonOf(tt.err); got != tt.want {
				t.Fatalf("ReasonOf(%v) = %q, want %q", tt.err, got, tt.want)
			}
		})
	}
}

func TestDeriveMAC(t *testing.T) {
	tests := []struct {
		ip   string
		want string
	}{
		{ip: "10.0.0.1", want: "0a:58:0a:00:00:01"},
		{ip: "192.168.255.254", want: "0a:58:c0:a8:ff:fe"},
		{ip: "fd00::1:2:3:4", want: "0a:58:00:03:00:04"},
		{ip: "::ffff:10.0.0.1", want: "0a:58:0a:00:00:01"},
	}
	for _, tt := range tests {
		t.Run(tt.ip, func(t *testing.T) {
			if got := DeriveMAC(netip.MustParseAddr(tt.ip)).String(); got != tt.want {
				t.Fatalf("DeriveMAC = %s, want %s", got, tt.want)
			}
		})
	}
	if DeriveMAC(netip.Addr{}) != nil {
		t.Fatal("DeriveMAC of the zero Addr is not nil")
	}
}

func TestNewNetworkValidation(t *testing.T) {
	v4 := prefixes("10.0.0.0/24")
	tests := []struct {
		name string
		cfg  Config
		want string // substring of the error
	}{
		{name: "reserved outside", cfg: Config{Subnets: v4, Reserved: prefixes("10.9.0.0/24")}, want: `reservedSubnets "10.9.0.0/24" is not inside any subnet of network "ns_net"`},
		{name: "excluded outside", cfg: Config{Subnets: v4, Exclude: prefixes("10.0.1.0/30")}, want: `excludeSubnets "10.0.1.0/30" is not inside any subnet`},
		{name: "excluded larger than subnet", cfg: Config{Subnets: v4, Exclude: prefixes("10.0.0.0/16")}, want: `excludeSubnets "10.0.0.0/16"`},
		{name: "excluded without subnets", cfg: Config{Exclude: prefixes("10.0.0.0/30")}, want: `excludeSubnets "10.0.0.0/30"`},
		{name: "infrastructure outside", cfg: Config{Subnets: v4, Primary: true, Infrastructure: prefixes("fd00::/120")}, want: `infrastructureSubnets "fd00::/120"`},
		{name: "two IPv4 subnets", cfg: Config{Subnets: prefixes("10.0.0.0/24", "10.1.0.0/24")}, want: `subnets "10.1.0.0/24": network "ns_net" already has subnet "10.0.0.0/24"`},
		{name: "two IPv6 subnets", cfg: Config{Subnets: prefixes("fd00::/64", "fd01::/64")}, want: `subnets "fd01::/64"`},
		{name: "invalid subnet", cfg: Config{Subnets: []netip.Prefix{{}}}, want: `subnets "invalid Prefix"`},
		{name: "mapped subnet", cfg: Config{Subnets: prefixes("::ffff:10.0.0.0/120")}, want: `subnets "::ffff:10.0.0.0/120"`},
		{name: "subnet too small", cfg: Config{Subnets: prefixes("10.0.0.0/31")}, want: `subnets "10.0.0.0/31" of network "ns_net": prefix "10.0.0.0/31" is too small`},
		{name: "gateway outside", cfg: Config{Subnets: v4, Primary: true, Gateways: addrs("10.0.1.1")}, want: `defaultGatewayIPs "10.0.1.1" is not inside any subnet`},
		{name: "two gateways", cfg: Config{Subnets: v4, Primary: true, Gateways: addrs("10.0.0.1", "10.0.0.2")}, want: `defaultGatewayIPs "10.0.0.2": network "ns_net" already has gateway "10.0.0.1"`},
		{name: "gateway is broadcast", cfg: Config{Subnets: v4, Primary: true, Gateways: addrs("10.0.0.255")}, want: `defaultGatewayIPs "10.0.0.255" is the network or broadcast address`},
		{name: "gateway outside infrastructure", cfg: Config{Subnets: v4, Primary: true, Infrastructure: prefixes("10.0.0.0/29"), Gateways: addrs("10.0.0.9")}, want: `defaultGatewayIPs "10.0.0.9" is not inside the infrastructureSubnets`},
		{name: "invalid gateway", cfg: Config{Subnets: v4, Primary: true, Gateways: []netip.Addr{{}}}, want: `defaultGatewayIPs "invalid IP"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.cfg.Name = "ns_net"
			_, err := NewNetwork(tt.cfg)
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want ErrInvalid containing %q", err, tt.want)
			}
			if ReasonOf(err) != ReasonInvalidRequest {
				t.Fatalf("ReasonOf = %q", ReasonOf(err))
			}
		})
	}

	t.Run("valid", func(t *testing.T) {
		for _, cfg := range []Config{
			{},
			{Subnets: prefixes("10.0.0.5/24")}, // host bits are masked
			{Subnets: prefixes("10.0.0.0/24", "fd00::/64"), Primary: true, Infrastructure: prefixes("10.0.0.0/30", "fd00::/126"), Gateways: addrs("fd00::2"), Exclude: prefixes("10.0.0.128/25"), Reserved: prefixes("fd00::100/120")},
		} {
			if _, err := NewNetwork(cfg); err != nil {
				t.Errorf("%+v: %v", cfg, err)
			}
		}
	})
}

func TestNetworkConcurrent(t *testing.T) {
	n := newNetwork(t, Config{Subnets: prefixes("10.0.0.0/20", "fd00::/64"), Primary: true})
	const workers, each = 32, 60
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				owner := fmt.Sprintf("w%d-%d", w, i)
				if _, err := n.Allocate(Request{Owner: owner}); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
					return
				}
				if i%3 == 0 {
					n.Release(owner) // churn, so round robin and releases race too
				}
				n.Stats()
			}
		})
	}
	wg.Wait()
	if len(errs) > 0 {
		t.Fatal(errs[0])
	}
	seenIP := map[netip.Addr]string{}
	seenMAC := map[string]string{}
	held := 0
	for w := range workers {
		for i := range each {
			owner := fmt.Sprintf("w%d-%d", w, i)
			a, ok := n.Get(owner)
			if !ok {
				continue
			}
			held++
			for _, p := range a.IPs {
				if o, dup := seenIP[p.Addr()]; dup {
					t.Fatalf("%s held by %s and %s", p.Addr(), o, owner)
				}
				seenIP[p.Addr()] = owner
				if o, _ := n.OwnerOf(p.Addr()); o != owner {
					t.Fatalf("OwnerOf(%s) = %q, want %q", p.Addr(), o, owner)
				}
			}
			if o, dup := seenMAC[a.MAC.String()]; dup {
				t.Fatalf("MAC %s held by %s and %s", a.MAC, o, owner)
			}
			seenMAC[a.MAC.String()] = owner
		}
	}
	if _, used := n.Stats(); used != 2*held {
		t.Fatalf("used %d, %d owners hold two IPs each", used, held)
	}
}
