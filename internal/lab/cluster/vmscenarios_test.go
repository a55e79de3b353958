package cluster

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
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

// TestCheckMasqueradeLease: a masquerade guest's lease is compared with
// KubeVirt's masquerade address, on the NIC with the VMI's MAC, the
// latest one winning; any other address (kvnet's claim, a stale lease)
// fails.
func TestCheckMasqueradeLease(t *testing.T) {
	lease := func(mac, ip string) guestLease {
		return guestLease{Iface: "eth0", MAC: mac, IP: netip.MustParsePrefix(ip)}
	}
	const mac = "02:00:00:aa:bb:01"
	for _, tc := range []struct {
		name   string
		leases []guestLease
		mac    string
		err    string
	}{
		{"masquerade", []guestLease{lease(mac, "10.0.2.2/24")}, mac, ""},
		{"MAC case", []guestLease{lease("02:00:00:AA:BB:01", "10.0.2.2/24")}, mac, ""},
		{"the claim's address", []guestLease{lease(mac, "10.0.0.4/24")}, mac, "leased 10.0.0.4/24, want KubeVirt's masquerade address 10.0.2.2/24"},
		{"wrong prefix", []guestLease{lease(mac, "10.0.2.2/16")}, mac, "leased 10.0.2.2/16"},
		{"latest wins", []guestLease{lease(mac, "10.0.2.2/24"), lease(mac, "10.0.2.9/24")}, mac, "leased 10.0.2.9/24"},
		{"another NIC", []guestLease{lease("02:00:00:aa:bb:02", "10.0.2.2/24")}, mac, "no lease for its NIC"},
		{"none", nil, mac, "no lease"},
		{"no MAC", []guestLease{lease(mac, "10.0.2.2/24")}, "", "without a MAC"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := checkMasqueradeLease(tc.leases, tc.mac)
			switch {
			case tc.err == "" && err != nil:
				t.Errorf("unexpected error %v", err)
			case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
				t.Errorf("error %v, want one containing %q", err, tc.err)
			}
		})
	}
}

// TestVMIClaimIP: the benchmark's "Running with its IPAMClaim's address"
// needs phase Running and the claim's address on the first interface;
// any other address does not count.
func TestVMIClaimIP(t *testing.T) {
	claim := netip.MustParseAddr("10.0.0.4")
	vmi := func(phase, node string, iface map[string]any) *unstructured.Unstructured {
		status := map[string]any{"phase": phase, "nodeName": node}
		if iface != nil {
			status["interfaces"] = []any{iface}
		}
		return &unstructured.Unstructured{Object: map[string]any{
			"metadata": map[string]any{"name": "vm-0", "namespace": "bench-vm-0"},
			"status":   status,
		}}
	}
	mac, node, err := vmiClaimIP(vmi("Running", "node-2", map[string]any{"ipAddress": "10.0.0.4", "mac": "02:00:00:00:00:01"}), claim)
	if err != nil || mac != "02:00:00:00:00:01" || node != "node-2" {
		t.Errorf("Running with the claim's address: %q %q %v", mac, node, err)
	}
	if _, _, err := vmiClaimIP(vmi("Running", "node-2", map[string]any{"ipAddress": "10.244.2.7", "ipAddresses": []any{"10.244.2.7", "10.0.0.4"}}), claim); err != nil {
		t.Errorf("the claim's address among ipAddresses: %v", err)
	}
	for name, v := range map[string]*unstructured.Unstructured{
		"another address": vmi("Running", "node-2", map[string]any{"ipAddress": "10.0.0.5"}),
		"no address":      vmi("Running", "node-2", map[string]any{"mac": "02:00:00:00:00:01"}),
		"scheduled":       vmi("Scheduled", "node-2", map[string]any{"ipAddress": "10.0.0.4"}),
		"no interfaces":   vmi("Running", "node-2", nil),
		"no node":         vmi("Running", "", map[string]any{"ipAddress": "10.0.0.4"}),
	} {
		if _, _, err := vmiClaimIP(v, claim); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// TestContainerDiskChecksum: the checksum is read as virt-handler writes
// it, a JSON number up to 2^32-1, from the first containerDisk volume.
func TestContainerDiskChecksum(t *testing.T) {
	for _, tc := range []struct {
		status string
		want   int64
	}{
		{`{"volumeStatus":[{"name":"cloudinit"},{"name":"disk","containerDiskVolume":{"checksum":3727964686}}]}`, 3727964686},
		{`{"volumeStatus":[{"name":"disk","containerDiskVolume":{"checksum":12}}]}`, 12},
		{`{"volumeStatus":[{"name":"disk"}]}`, 0},
		{`{}`, 0},
	} {
		vmi := &unstructured.Unstructured{}
		if err := vmi.UnmarshalJSON([]byte(`{"apiVersion":"kubevirt.io/v1","kind":"VirtualMachineInstance","status":` + tc.status + `}`)); err != nil {
			t.Fatal(err)
		}
		if got := containerDiskChecksum(vmi); got != tc.want {
			t.Errorf("status %s: checksum %d, want %d", tc.status, got, tc.want)
		}
	}
}

// TestRollTarget: kvnet-node rolls to its tag with "-rolled", and back.
func TestRollTarget(t *testing.T) {
	for _, tc := range []struct{ from, want string }{
		{"10.89.0.1:5000/kvnet/kvnet-node:dev", "10.89.0.1:5000/kvnet/kvnet-node:dev-rolled"},
		{"10.89.0.1:5000/kvnet/kvnet-node:dev-rolled", "10.89.0.1:5000/kvnet/kvnet-node:dev"},
	} {
		got, err := rollTarget(tc.from)
		if err != nil || got != tc.want {
			t.Errorf("rollTarget(%q) = %q, %v; want %q", tc.from, got, err, tc.want)
		}
	}
	if _, err := rollTarget("not a reference!"); err == nil {
		t.Error("rollTarget of a bad reference: no error")
	}
}

func TestSumMetric(t *testing.T) {
	text := `# HELP kvnet_migration_switchovers_total Live migrations...
# TYPE kvnet_migration_switchovers_total counter
kvnet_migration_switchovers_total{network="scn-vm_udn",node="node-2",trigger="api"} 1
kvnet_migration_switchovers_total{network="scn-vm_udn",node="node-2",trigger="first-frame"} 2
kvnet_migration_switchovers_total_other 7
kvnet_node_ready{node="node-2"} 1
`
	if got := sumMetric(text, "kvnet_migration_switchovers_total"); got != 3 {
		t.Fatalf("sum %v, want 3", got)
	}
	if got := sumMetric("", "kvnet_migration_switchovers_total"); got != 0 {
		t.Fatalf("sum of nothing %v", got)
	}
}

func TestGuestCrash(t *testing.T) {
	console := "KVNET-READY\n[  812.1] list_del corruption. prev->next should be ffff\n[  812.2] ------------[ cut here ]------------\n[  812.3] kernel BUG at lib/list_debug.c:62!\n[  812.4] invalid opcode: 0000 [#1] SMP\n[  812.5] RIP: 0010:__list_del_entry_valid\n"
	got := guestCrash(console)
	if !strings.HasPrefix(got, "[  812.1] list_del corruption.") || strings.Count(got, " | ") != 2 {
		t.Errorf("guestCrash = %q", got)
	}
	if got := guestCrash("KVNET-READY\nKVNET-LEASE eth0 02:00:00:00:00:01 10.0.2.2/24\n"); got != "" {
		t.Errorf("guestCrash of a healthy console = %q", got)
	}
}
