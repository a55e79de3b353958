package node

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"kvnet.io/kvnet/internal/datapath"
	"kvnet.io/kvnet/internal/nl"
	"kvnet.io/kvnet/internal/testenv"
)

// TestStandbyProbeStartsWithGateway: a standby port watched while its
// network has no gateway in the plan gets no probes; once a plan brings
// the gateway, kvnet-node probes it (echo requests from the gateway to
// the port's address, seen on the veth's other end).
func TestStandbyProbeStartsWithGateway(t *testing.T) {
	testenv.NeedsRoot(t)
	name := fmt.Sprintf("kvtest-probe-%d", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	if out, err := exec.Command("ip", "-n", name, "link", "add", "kvpprobe0", "type", "veth", "peer", "name", "pod0").CombinedOutput(); err != nil {
		t.Fatalf("ip link add: %v: %s", err, out)
	}
	for _, l := range []string{"kvpprobe0", "pod0"} {
		if out, err := exec.Command("ip", "-n", name, "link", "set", l, "up").CombinedOutput(); err != nil {
			t.Fatalf("ip link set %s up: %v: %s", l, err, out)
		}
	}
	w := newAnnouncements(nl.NSPath(name), func(datapath.Port) error { return nil }, func() {}, logr.Discard())
	t.Cleanup(func() {
		w.sync(nil, nil, nil)
		w.wg.Wait()
	})
	// What the pod's end receives.
	pod, err := w.open("pod0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pod.Close() })
	probes := func(within time.Duration) int {
		t.Helper()
		n := 0
		buf := make([]byte, 256)
		deadline := time.Now().Add(within)
		for {
			if err := pod.SetReadDeadline(deadline); err != nil {
				t.Fatal(err)
			}
			m, err := pod.Read(buf)
			if err != nil {
				return n
			}
			f := buf[:m]
			if m >= 42 && binary.BigEndian.Uint16(f[12:14]) == 0x0800 && f[23] == 1 && f[34] == 8 && binary.BigEndian.Uint16(f[38:40]) == ProbeID {
				n++
			}
		}
	}
	port := datapath.Port{Network: "ns_udn", HostIfName: "kvpprobe0", MAC: net.HardwareAddr{2, 0, 0, 0, 0, 9},
		IPs: []netip.Prefix{netip.MustParsePrefix("10.80.0.9/24")}, Standby: true, Migrating: true}
	w.sync([]datapath.Port{port}, nil, nil)
	// Ten probe intervals: none without a gateway.
	if n := probes(10 * probeInterval); n != 0 {
		t.Fatalf("%d probes without a gateway in the plan", n)
	}
	if n := w.probesSent(port.MAC.String()); n != 0 {
		t.Fatalf("%d probes counted without a gateway in the plan", n)
	}
	gw := Gateway{IP: netip.MustParseAddr("10.80.0.1"), MAC: net.HardwareAddr{0x0a, 0x58, 0x0a, 0x50, 0x00, 0x01}}
	w.sync([]datapath.Port{port}, nil, map[string]Gateway{"ns_udn": gw})
	testenv.Eventually(t, 30*time.Second, "probes once the plan has the gateway", func() error {
		if n := probes(5 * probeInterval); n == 0 {
			return fmt.Errorf("no probe")
		}
		return nil
	})
	if n := w.probesSent(port.MAC.String()); n == 0 {
		t.Fatal("probes seen on the pod's end, none counted")
	}
	// The guest left: its count goes with it.
	w.sync(nil, nil, nil)
	if n := w.probesSent(port.MAC.String()); n != 0 {
		t.Fatalf("%d probes still counted after the port went", n)
	}
}
