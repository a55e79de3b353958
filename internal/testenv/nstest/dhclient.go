package nstest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// dhclientScript is dhclient's script: for the DHCPv6 events it adds the
// leased address as Debian's dhclient-script does (the address alone,
// hence a /128) and records the variables dhclient derives from the
// reply, plus the interface's default route and global addresses as the
// kernel has them, in a file named after the reason. It touches nothing
// outside the namespace's interface and its own directory (Debian's script
// would rewrite the host's /etc/resolv.conf).
const dhclientScript = `#!/bin/sh
out=%q
case "$reason" in
PREINIT6)
	ip link set "$interface" up
	;;
BOUND6|RENEW6|REBIND6|REBOOT6)
	if [ -n "$new_ip6_address" ]; then
		ip -6 addr replace "$new_ip6_address" dev "$interface" scope global valid_lft "$new_max_life" preferred_lft "$new_preferred_life"
	fi
	{
		echo "ip=$new_ip6_address"
		echo "prefixlen=$new_ip6_prefixlen"
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

// dhclientConf asks for the DNS servers and search list, as Debian's
// default dhclient.conf does.
const dhclientConf = `request dhcp6.name-servers, dhcp6.domain-search;
`

// DHClient is an ISC dhclient started by DHClient6. Its Event returns
// ip, prefixlen, dns, search, serverid, route (the default route then, ""
// without one) and global (the interface's global addresses).
type DHClient struct {
	hookClient // Event, Happened, Log
}

// DHClient6 runs ISC dhclient -6 (Debian's isc-dhcp-client: stateful
// DHCPv6, no router solicitation of its own; the kernel takes the router
// advertisements) on iface in the network namespace at nsPath, in the
// foreground, with a DUID from the MAC and its lease, pid and
// configuration files in a temporary directory. It first waits for the
// interface's link-local address to leave duplicate address detection
// (dhclient cannot bind to a tentative one). It is killed when the test
// ends. Events are read with Event, as dhcpcd's are.
func DHClient6(tb testing.TB, nsPath, iface string) *DHClient {
	tb.Helper()
	if _, err := exec.LookPath("dhclient"); err != nil {
		tb.Fatalf("dhclient not found (hack/install-deps.sh installs isc-dhcp-client): %v", err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		out, err := exec.Command("nsenter", "-n"+nsPath, "ip", "-6", "-o", "addr", "show", "dev", iface, "scope", "link").CombinedOutput()
		if err == nil && strings.Contains(string(out), "fe80:") && !strings.Contains(string(out), "tentative") {
			break
		}
		if time.Now().After(deadline) {
			tb.Fatalf("%s in %s: no usable link-local address after 30s: %v %s", iface, nsPath, err, out)
		}
		time.Sleep(50 * time.Millisecond)
	}
	dir := tb.TempDir()
	d := &DHClient{hookClient{name: "dhclient", out: filepath.Join(dir, "events"), log: filepath.Join(dir, "dhclient.log")}}
	script := filepath.Join(dir, "event.sh")
	conf := filepath.Join(dir, "dhclient.conf")
	if err := os.Mkdir(d.out, 0o755); err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(script, fmt.Appendf(nil, dhclientScript, d.out), 0o755); err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(conf, []byte(dhclientConf), 0o644); err != nil {
		tb.Fatal(err)
	}
	cmd := exec.Command("nsenter", "-n"+nsPath, "-F", "dhclient", "-6", "-d", "-v", "-D", "LL",
		"-cf", conf, "-lf", filepath.Join(dir, "leases"), "-pf", filepath.Join(dir, "pid"), "-sf", script, iface)
	d.start(tb, cmd)
	return d
}
