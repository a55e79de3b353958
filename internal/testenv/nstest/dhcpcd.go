package nstest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// dhcpcdScript records each DHCPv6 event of dhcpcd as a file named after
// its reason (BOUND6, RENEW6, REBIND6, ...) holding the variables dhcpcd
// derives from the reply, plus the interface's default route and global
// addresses as the kernel has them. Files are written under a temporary
// name and renamed, so a reader never sees a half-written one.
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

// DHCPCD is a dhcpcd client started by DHCPCD6. Its Event returns ip,
// dns, search, serverid, route (the default route, "" without one) and
// global (the interface's global addresses).
type DHCPCD struct {
	hookClient // Event, Happened, Log
}

// DHCPCD6 runs dhcpcd, IPv6 only (router solicitation, then stateful
// DHCPv6), on iface in the network namespace at nsPath, in the foreground
// and in a mount namespace of its own with private /run/dhcpcd and
// /var/lib/dhcpcd, so that it shares no pid file, control socket or DUID
// with any other dhcpcd on the host. It is killed when the test ends.
func DHCPCD6(tb testing.TB, nsPath, iface string) *DHCPCD {
	tb.Helper()
	if _, err := exec.LookPath("dhcpcd"); err != nil {
		tb.Fatalf("dhcpcd not found (hack/install-deps.sh installs it): %v", err)
	}
	dir := tb.TempDir()
	d := &DHCPCD{hookClient{name: "dhcpcd", out: filepath.Join(dir, "events"), log: filepath.Join(dir, "dhcpcd.log")}}
	script := filepath.Join(dir, "event.sh")
	conf := filepath.Join(dir, "dhcpcd.conf")
	if err := os.Mkdir(d.out, 0o755); err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(script, fmt.Appendf(nil, dhcpcdScript, d.out), 0o755); err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(conf, fmt.Appendf(nil, dhcpcdConf, script), 0o644); err != nil {
		tb.Fatal(err)
	}
	for _, p := range []string{"/run/dhcpcd", "/var/lib/dhcpcd"} {
		if err := os.MkdirAll(p, 0o755); err != nil {
			tb.Fatal(err)
		}
	}
	sh := fmt.Sprintf("mount -t tmpfs kvdhcp /run/dhcpcd && mount -t tmpfs kvdhcp /var/lib/dhcpcd && exec dhcpcd -B -d -f %s %s", conf, iface)
	cmd := exec.Command("nsenter", "-n"+nsPath, "-F", "unshare", "-m", "--propagation", "private", "sh", "-c", sh)
	d.start(tb, cmd)
	return d
}
