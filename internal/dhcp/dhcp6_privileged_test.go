package dhcp

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/vishvananda/netlink"

	"kvnet.io/kvnet/internal/testenv"
)

// dhcpcdScript records each DHCPv6 event of dhcpcd as a file named after
// its reason (BOUND6, RENEW6, REBIND6, ...) holding the variables dhcpcd
// derives from the reply, plus the guest's default route and global
// addresses as the kernel has them. Files are written under a temporary
// name and renamed, so the test never reads a half-written one.
const dhcpcdScript = `#!/bin/sh
out=%q
case "$reason" in
BOUND6|RENEW6|REBIND6|REBOOT6)
	{
		echo "ip=$new_dhcp6_ia_na1_ia_addr1"
		echo "dns=$new_dhcp6_name_servers"
		echo "search=$new_dhcp6_domain_search"
		echo "serverid=$new_dhcp6_server_id"
		echo "route=$(ip -6 route show default dev "$interface" | cut -d' ' -f1-5)"
		echo "global=$(ip -6 -o addr show dev "$interface" scope global | awk '{print $4}' | tr '\n' ' ')"
	} > "$out/$reason.tmp"
	mv "$out/$reason.tmp" "$out/$reason"
	;;
esac
exit 0
`

// dhcpcdConf is the client's configuration: IPv6 only, as the lab's guest
// runs it, with a DUID from the MAC.
const dhcpcdConf = `ipv6only
script %s
duid ll
option dhcp6_name_servers, dhcp6_domain_search
`

// startDHCPCD runs dhcpcd on the guest's eth0 in the foreground, in a
// mount namespace of its own with private /run/dhcpcd and /var/lib/dhcpcd,
// so that it shares no pid file, control socket or DUID with any other
// dhcpcd on the host. It returns the output so far for failure messages.
func (g *guest) startDHCPCD(t *testing.T, out string) fmt.Stringer {
	t.Helper()
	dir := t.TempDir()
	script := filepath.Join(dir, "event.sh")
	conf := filepath.Join(dir, "dhcpcd.conf")
	if err := os.WriteFile(script, []byte(fmt.Sprintf(dhcpcdScript, out)), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(conf, []byte(fmt.Sprintf(dhcpcdConf, script)), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"/run/dhcpcd", "/var/lib/dhcpcd"} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	sh := fmt.Sprintf("mount -t tmpfs kvdhcp /run/dhcpcd && mount -t tmpfs kvdhcp /var/lib/dhcpcd && exec dhcpcd -B -d -f %s %s", conf, guestIface)
	cmd := exec.Command("nsenter", "-n"+g.ns.path, "-F", "unshare", "-m", "--propagation", "private", "sh", "-c", sh)
	// A file, not a pipe: dhcpcd's privilege-separated helpers inherit
	// its stdio, and Wait would wait for them to close a pipe.
	logFile, err := os.Create(filepath.Join(dir, "dhcpcd.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// A process group of its own, so that the helpers, which outlive a
	// SIGTERM, can be killed with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start dhcpcd: %v", err)
	}
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		_ = cmd.Wait()
	})
	log := fileLog(logFile.Name())
	return log
}

// fileLog prints a log file's contents, for failure messages.
type fileLog string

func (f fileLog) String() string {
	b, err := os.ReadFile(string(f))
	if err != nil {
		return err.Error()
	}
	return string(b)
}

// startServer6 plugs a router namespace's gw0 with the gateway MAC into
// the topology's bridge and runs a Server6 there. stop stops the server
// and unplugs the router, as when a VM migrates away from a node.
func (tp *topology) startServer6(t *testing.T, role string, leases Leases) (stop func()) {
	t.Helper()
	rtr := newNetNS(t, role)
	tp.plug(t, rtr, gwIface, "p-"+role, gwMAC6)
	srv, err := New6(Config6{
		NetNS: rtr.path, Interface: gwIface, Leases: leases,
		Prefixes: []netip.Prefix{netip.MustParsePrefix("2001:db8::/64")}, MTU: 1400, DefaultRouter: true,
		Log: testr.NewWithOptions(t, testr.Options{Verbosity: 1}),
	})
	if err != nil {
		t.Fatalf("New6: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-served; err != nil {
				t.Errorf("Serve6 in %s: %v", role, err)
			}
			if err := tp.sw.nl.LinkDel(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "p-" + role}}); err != nil {
				t.Errorf("unplug %s: %v", role, err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// TestServe6DHCPCDPrivileged runs dhcpcd, the lab guest's DHCPv6 client,
// against Server6: the guest gets its address, DNS and search list from
// DHCPv6 and its default route from the router advertisement, takes no
// SLAAC address, and renews with the same server DUID after the server
// moved to another namespace (another node after a live migration).
func TestServe6DHCPCDPrivileged(t *testing.T) {
	testenv.NeedsRoot(t)
	if _, err := exec.LookPath("dhcpcd"); err != nil {
		t.Fatalf("dhcpcd not found (hack/install-deps.sh installs it): %v", err)
	}
	topo := newTopology(t)
	lease := lease6
	// A short lease: dhcpcd renews at T1, half of it.
	lease.LeaseTime = 16 * time.Second
	leases := NewStaticLeases()
	leases.Set(guestMAC6, lease)
	stopA := topo.startServer6(t, "rtra", leases)

	g := topo.addGuest(t, "v6", guestMAC6)
	out := t.TempDir()
	log := g.startDHCPCD(t, out)
	bound := readEnv(t, waitFile(t, filepath.Join(out, "BOUND6"), 30*time.Second, log))
	gwLL := "fe80::858:a9ff:fefe:7" // EUI-64 of gwMAC6
	want := map[string]string{
		"ip":     "2001:db8::5",
		"dns":    "fd00:10:96::a",
		"search": "ns1.svc.cluster.local cluster.local",
		"route":  "default via " + gwLL + " proto ra",
	}
	assertEnv(t, bound, want)
	// Only the leased address: the advertised prefix is not for SLAAC.
	if got := strings.Fields(bound["global"]); len(got) != 1 || !strings.HasPrefix(got[0], "2001:db8::5/") {
		t.Errorf("global addresses %q, want only 2001:db8::5", bound["global"])
	}

	// The VM migrates: its node's server goes, the target's (another
	// namespace, the same gateway MAC and so the same DUID) comes, and
	// the guest's Renew, naming the first server, gets its answer there.
	stopA()
	leases.Set(guestMAC6, lease)
	topo.startServer6(t, "rtrb", leases)
	renew := readEnv(t, waitFile(t, filepath.Join(out, "RENEW6"), 30*time.Second, log))
	want["serverid"] = bound["serverid"]
	assertEnv(t, renew, want)
	if _, err := os.Stat(filepath.Join(out, "REBIND6")); err == nil {
		t.Error("dhcpcd rebound: the target's server did not answer its Renew")
	}
}
