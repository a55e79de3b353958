package demo

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"os"
	"slices"
	"strings"
	"time"

	"kvnet.io/kvnet/internal/lab/cli/lab"
	"kvnet.io/kvnet/internal/lab/guest"
	"kvnet.io/kvnet/internal/lab/simkubelet"
	"kvnet.io/kvnet/internal/lab/simlauncher"
)

// checkLease6 returns an error unless the DHCPv6 lease the guest reported
// on eth<i> is the IPv6 address its IPAMClaim holds (addresses compared:
// the guest adds a /128 whatever the subnet's length), for the MAC the
// VMI has for the interface.
func checkLease6(i int, f ifaceState, l guest.Lease) error {
	ok := slices.ContainsFunc(f.claimed6, func(p netip.Prefix) bool { return p.Addr() == l.IP() })
	if !ok || f.specMAC == "" || !strings.EqualFold(l.MAC.String(), f.specMAC) {
		return fmt.Errorf("network %s: the guest's DHCPv6 lease on eth%d is %s for MAC %s, but IPAMClaim %s holds %s and the VMI has MAC %q",
			f.network, i, l.Addr, l.MAC, f.claim, prefixes(f.claimed6), f.specMAC)
	}
	return nil
}

// guestIPv6 checks the IPv6 address the IPAMClaim of the VM's primary
// network holds: the guest's console shows it leased by DHCPv6 (from
// kvnet-node, after its router advertisement), waiting up to timeout for
// the lease (it may come after the guest's IPv4 one). It prints the lease
// and returns the address; the zero Addr when the claim holds no IPv6
// address.
func guestIPv6(ctx context.Context, out io.Writer, labDir string, st vmState, timeout time.Duration) (netip.Addr, error) {
	i := slices.IndexFunc(st.ifaces, func(f ifaceState) bool { return f.podIface == simkubelet.PrimaryIfName })
	if i < 0 || len(st.ifaces[i].claimed6) == 0 {
		return netip.Addr{}, nil
	}
	f := st.ifaces[i]
	iface := fmt.Sprintf("eth%d", i)
	path := simlauncher.ConsoleLog(lab.VMsDir(labDir), demoVMNamespace, demoVM)
	deadline := time.Now().Add(timeout)
	for {
		leases, err := consoleLeases6(path)
		if err != nil {
			return netip.Addr{}, err
		}
		l, ok := leases[iface]
		if ok {
			err = checkLease6(i, f, l)
		} else {
			err = fmt.Errorf("the guest's console shows no DHCPv6 lease on %s (network %s; IPAMClaim %s holds %s)", iface, f.network, f.claim, prefixes(f.claimed6))
		}
		if err == nil {
			router := "none"
			if l.Router.IsValid() {
				router = l.Router.String()
			}
			fmt.Fprintf(out, "  guest DHCPv6 lease %s %s router %s mtu %d (MAC %s) = IPAMClaim %s\n", iface, l.Addr, router, l.MTU, l.MAC, f.claim)
			return l.IP(), nil
		}
		if time.Now().After(deadline) {
			return netip.Addr{}, fmt.Errorf("after %s: %w", timeout, err)
		}
		select {
		case <-ctx.Done():
			return netip.Addr{}, ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// reachIPv6 checks that peer reaches the guest's TCP echo service at its
// IPv6 address ip on node, waiting up to timeout (the guest adds the
// address after duplicate address detection).
func reachIPv6(ctx context.Context, out io.Writer, peer labPod, ip netip.Addr, node string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		err := echo(ctx, peer.netns, ip)
		if err == nil {
			fmt.Fprintf(out, "  reached %s (%s) -> %s [%s]:%d (%s; TCP echo in the guest, over IPv6)\n", peer, peer.pod.Spec.NodeName, demoVM, ip, guest.EchoPort, node)
			return nil
		}
		if time.Now().After(deadline) {
			fmt.Fprintf(out, "  blocked %s (%s) -> %s [%s]:%d (%s)   <-- WRONG\n", peer, peer.pod.Spec.NodeName, demoVM, ip, guest.EchoPort, node)
			return fmt.Errorf("%s cannot reach the guest of VM %s at [%s]:%d: %w", peer, demoVM, ip, guest.EchoPort, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// consoleLeases6 returns the last DHCPv6 lease the guest reported per NIC
// on its console (KVNET-LEASE6 lines).
func consoleLeases6(path string) (map[string]guest.Lease, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("the guest's console log: %w", err)
	}
	leases := map[string]guest.Lease{}
	for _, line := range strings.Split(string(b), "\n") {
		i := strings.Index(line, guest.Lease6Prefix+" ")
		if i < 0 {
			continue
		}
		if l, err := guest.ParseLease6(line[i:]); err == nil {
			leases[l.Iface] = l
		}
	}
	return leases, nil
}
