package cluster

import (
	"net/netip"
	"strings"
	"testing"
	"time"
)

func TestParseGuestLeases(t *testing.T) {
	console := "[    1.2] virtio_net virtio0 eth0: renamed\r\n" +
		"KVNET-LEASE iface=eth0 mac=02:00:00:00:00:01 ip=10.0.2.2/24 router=10.0.2.1 dns=10.96.0.10 mtu=1450\r\n" +
		"KVNET-LEASE iface=eth1 mac=02:00:00:00:00:02 ip=not-an-ip router=\r\n" +
		"KVNET-LEASE iface=eth1 mac=02:00:00:00:00:02 ip=192.168.100.7/24\n" +
		"KVNET-READY name=vm-m\n"
	got := parseGuestLeases(console)
	want := []guestLease{
		{Iface: "eth0", MAC: "02:00:00:00:00:01", IP: netip.MustParsePrefix("10.0.2.2/24")},
		{Iface: "eth1", MAC: "02:00:00:00:00:02", IP: netip.MustParsePrefix("192.168.100.7/24")},
	}
	if len(got) != len(want) {
		t.Fatalf("parseGuestLeases = %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("lease %d = %v, want %v", i, got[i], want[i])
		}
	}
	if l := parseGuestLeases("no lease here"); len(l) != 0 {
		t.Errorf("parseGuestLeases of a console without leases = %v", l)
	}
}

func TestCheckEchoLines(t *testing.T) {
	for _, tc := range []struct {
		name, out string
		n         int
		err       string
	}{
		{"in order", "1\n2\n3\n", 3, ""},
		{"last line cut", "1\n2\n3", 3, ""},
		{"last line half written", "1\n2\n3\n1", 3, ""},
		{"empty", "", 0, ""},
		{"gap", "1\n2\n4\n5\n", 2, `echo line 3 is "4", want 3`},
		{"closed", "1\n2\nclosed\n", 2, "closed after 2 lines"},
		{"garbage", "1\nx\n3\n", 1, `echo line 2 is "x"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n, err := checkEchoLines(tc.out)
			if n != tc.n {
				t.Errorf("lines = %d, want %d", n, tc.n)
			}
			switch {
			case tc.err == "" && err != nil:
				t.Errorf("unexpected error %v", err)
			case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
				t.Errorf("error %v, want one containing %q", err, tc.err)
			}
		})
	}
}

func TestMaxEchoGap(t *testing.T) {
	gaps := "gap 150 before 40\ngap 900 before 97\nhttpget: connection ended: <nil>\ngap 310 before 2100\nnot a gap\n"
	for _, tc := range []struct {
		after int
		want  time.Duration
	}{
		{0, 900 * time.Millisecond},
		{97, 310 * time.Millisecond},
		{2100, 0},
	} {
		if got := maxEchoGap(gaps, tc.after); got != tc.want {
			t.Errorf("maxEchoGap(after %d) = %s, want %s", tc.after, got, tc.want)
		}
	}
}
