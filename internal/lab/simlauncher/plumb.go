package simlauncher

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/go-logr/logr"

	"kvnet.io/kvnet/internal/dhcp"
	"kvnet.io/kvnet/internal/nl"
)

// Binding is how a guest NIC is connected to its pod interface.
type Binding string

// The bindings the lab runs.
const (
	BindingBridge     Binding = "bridge"
	BindingManagedTap Binding = "managedTap"
	BindingMasquerade Binding = "masquerade"
)

// Masquerade addresses, KubeVirt's defaults (vmNetworkCIDR 10.0.2.0/24).
var (
	masqGateway = netip.MustParsePrefix("10.0.2.1/24")
	masqGuest   = netip.MustParsePrefix("10.0.2.2/24")
	// IPv6 (vmIPv6NetworkCIDR fd10:0:2::/120), where the pod has IPv6.
	masqGateway6 = netip.MustParsePrefix("fd10:0:2::1/120")
	masqGuest6   = netip.MustParsePrefix("fd10:0:2::2/120")
)

// masqBridgeMAC is the MAC of a masquerade bridge, as KubeVirt sets it.
const masqBridgeMAC = "02:00:00:00:00:00"

// Port is a port a masquerade interface forwards to the guest.
type Port struct {
	Protocol string // "TCP" (default) or "UDP"
	Port     int32
}

// Iface is one VMI interface to plumb in a launcher pod.
type Iface struct {
	Name     string // the VMI interface name, e.g. "default"
	PodIface string // the pod's interface, e.g. "ovn-udn1", "pod16477688c0e"
	Binding  Binding
	// MAC is the guest's MAC; "" is the pod interface's (bridge,
	// managedTap) or one derived from it (masquerade).
	MAC string
	// Index is the interface's position among the VMI's: 0 gets tap0.
	Index int
	// Ports are what a masquerade interface forwards; none forwards all.
	Ports []Port
	// DNS is what the launcher's DHCP server offers (its IPv6 addresses:
	// its DHCPv6 server).
	DNS []netip.Addr
}

// Validate reports an Iface the lab cannot plumb, naming the field.
func (ifc Iface) Validate() error {
	switch {
	case ifc.PodIface == "" || len(ifc.PodIface) > 15 || strings.ContainsAny(ifc.PodIface, "/ "):
		return fmt.Errorf("interface %q: podIface %q: not an interface name", ifc.Name, ifc.PodIface)
	case ifc.Binding != BindingBridge && ifc.Binding != BindingManagedTap && ifc.Binding != BindingMasquerade:
		return fmt.Errorf("interface %q: binding %q: the lab runs bridge, masquerade and managedTap", ifc.Name, ifc.Binding)
	case ifc.Index < 0 || ifc.Index > 9:
		return fmt.Errorf("interface %q: index %d: must be 0 to 9", ifc.Name, ifc.Index)
	}
	if ifc.MAC != "" {
		if _, err := net.ParseMAC(ifc.MAC); err != nil {
			return fmt.Errorf("interface %q: macAddress %q: %w", ifc.Name, ifc.MAC, err)
		}
	}
	for _, p := range ifc.Ports {
		if p.Port < 1 || p.Port > 65535 {
			return fmt.Errorf("interface %q: port %d: must be 1 to 65535", ifc.Name, p.Port)
		}
		if pr := strings.ToUpper(p.Protocol); pr != "" && pr != "TCP" && pr != "UDP" {
			return fmt.Errorf("interface %q: port %d: protocol %q: must be TCP or UDP", ifc.Name, p.Port, p.Protocol)
		}
	}
	if len(ifc.Ports) > 0 && ifc.Binding != BindingMasquerade {
		return fmt.Errorf("interface %q: ports: only a masquerade interface forwards ports", ifc.Name)
	}
	return nil
}

// trim cuts s to n bytes.
func trim(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

// Link names, as virt-launcher derives them: the bridge k6t-<iface>, the
// renamed pod NIC <iface>-nic, the tap tap0 for the first interface and
// "tap"+<iface>[3:] for the others (all at most 15 bytes).
func bridgeName(ifc Iface) string { return trim("k6t-"+ifc.PodIface, 15) }
func nicName(ifc Iface) string    { return trim(ifc.PodIface, 11) + "-nic" }
func tapName(ifc Iface) string {
	if ifc.Index == 0 || len(ifc.PodIface) <= 3 {
		return fmt.Sprintf("tap%d", ifc.Index)
	}
	return trim("tap"+ifc.PodIface[3:], 15)
}

// Plumbed is an interface made ready for QEMU.
type Plumbed struct {
	Tap      string // tap device in the pod's namespace for QEMU
	GuestMAC string // the MAC QEMU gives the guest NIC
	// GuestIPv4 is what the launcher's DHCP server hands the guest;
	// invalid when it serves none (managedTap, a bridge without an IP).
	GuestIPv4 netip.Prefix
	// GuestIPv6 is the guest's IPv6 network and address (fd10:0:2::2/120)
	// behind NAT66 (a masquerade interface whose pod has IPv6): the
	// launcher's DHCPv6 server hands out the address to a client that
	// asks; nothing gives the guest the network or a default route (no
	// router advertisements, as KubeVirt). Invalid when there is none.
	GuestIPv6 netip.Prefix

	srv      *dhcp.Server
	lease    dhcp.Lease // what the launcher's DHCP server hands out
	serverIP netip.Addr // its address on bridge; invalid: no server
	bridge   string
	anyMAC   bool // serve every MAC (masquerade)

	srv6   *dhcp6Server // DHCPv6 on bridge
	lease6 dhcp6Lease
}

// Close stops the interface's DHCP servers, if any.
func (p *Plumbed) Close() error {
	var errs []error
	if p.srv != nil {
		errs = append(errs, p.srv.Close())
	}
	if p.srv6 != nil {
		errs = append(errs, p.srv6.Close())
	}
	return errors.Join(errs...)
}

// saved is what plumbing takes from the pod interface, kept as the
// renamed NIC's alias so that a restarted lab plumbs the same again.
type saved struct {
	MAC     string       `json:"mac"`
	IPv4    netip.Prefix `json:"ipv4,omitzero"`
	Gateway netip.Addr   `json:"gw,omitzero"`
	MTU     int          `json:"mtu"`
}

// Plumb prepares ifc in the network namespace nsPath as virt-launcher
// does for its binding and starts the launcher's DHCP server where the
// binding has one, and for a masquerade interface whose pod has IPv6 its
// DHCPv6 server (they run until Close or ctx ends). It is idempotent: a
// pod plumbed by an earlier run (of a restarted lab) is found as it was
// left and gives the same result.
func Plumb(ctx context.Context, nsPath string, ifc Iface, log logr.Logger) (*Plumbed, error) {
	if err := ifc.Validate(); err != nil {
		return nil, err
	}
	ns := filepath.Base(nsPath)
	var p *Plumbed
	var err error
	if ifc.Binding == BindingMasquerade {
		p, err = plumbMasquerade(ns, nsPath, ifc)
	} else {
		p, err = plumbBridge(ns, nsPath, ifc)
	}
	if err != nil {
		return nil, fmt.Errorf("interface %q (pod interface %s, binding %s): %w", ifc.Name, ifc.PodIface, ifc.Binding, err)
	}
	if err := p.serveDHCP(ctx, nsPath, ifc, log); err != nil {
		return nil, fmt.Errorf("interface %q (pod interface %s, binding %s): DHCP: %w", ifc.Name, ifc.PodIface, ifc.Binding, err)
	}
	if err := p.serveDHCP6(ctx, nsPath, ifc, log); err != nil {
		p.Close()
		return nil, fmt.Errorf("interface %q (pod interface %s, binding %s): DHCPv6: %w", ifc.Name, ifc.PodIface, ifc.Binding, err)
	}
	return p, nil
}

// plumbBridge: the pod interface, renamed <iface>-nic with another MAC and
// no IP, and a tap are ports of bridge k6t-<iface>; the guest takes the
// pod interface's MAC and (bridge binding only) its IPv4 by DHCP.
func plumbBridge(ns, nsPath string, ifc Iface) (*Plumbed, error) {
	br, nic, tap := bridgeName(ifc), nicName(ifc), tapName(ifc)
	var sv saved
	if l, err := link(ns, ifc.PodIface); err == nil {
		sv = saved{MAC: l.Address, MTU: l.MTU}
		for _, a := range l.AddrInfo {
			if a.Family == "inet" && a.Scope == "global" {
				sv.IPv4 = netip.PrefixFrom(netip.MustParseAddr(a.Local), a.PrefixLen)
			}
		}
		sv.Gateway = defaultGateway(ns, ifc.PodIface)
		alias, _ := json.Marshal(sv)
		newMAC := localMAC(sv.MAC)
		if err := ipCmds(ns,
			[]string{"addr", "flush", "dev", ifc.PodIface},
			[]string{"link", "set", ifc.PodIface, "down"},
			[]string{"link", "set", ifc.PodIface, "name", nic, "address", newMAC, "alias", string(alias)},
		); err != nil {
			return nil, err
		}
	} else {
		// `ip addr` does not show the alias; `ip link` does.
		out, err2 := ipOut(ns, "-j", "link", "show", "dev", nic)
		if err2 != nil {
			return nil, fmt.Errorf("neither %s nor %s in the pod: %v", ifc.PodIface, nic, err)
		}
		var ls []ipLink
		if err := json.Unmarshal(out, &ls); err != nil || len(ls) != 1 {
			return nil, fmt.Errorf("ip link show dev %s: unexpected output %q", nic, out)
		}
		if err := json.Unmarshal([]byte(ls[0].IfAlias), &sv); err != nil {
			return nil, fmt.Errorf("%s: alias %q (what plumbing saved of %s): %w", nic, ls[0].IfAlias, ifc.PodIface, err)
		}
	}
	mtu := fmt.Sprint(sv.MTU)
	if _, err := link(ns, br); err != nil {
		if err := ipCmds(ns, []string{"link", "add", br, "mtu", mtu, "type", "bridge"}); err != nil {
			return nil, err
		}
	}
	if _, err := link(ns, tap); err != nil {
		if err := ipCmds(ns, []string{"tuntap", "add", "dev", tap, "mode", "tap"}); err != nil {
			return nil, err
		}
	}
	if err := ipCmds(ns,
		[]string{"link", "set", nic, "master", br, "up"},
		[]string{"link", "set", "dev", nic, "type", "bridge_slave", "learning", "off"},
		[]string{"link", "set", tap, "mtu", mtu, "master", br, "up"},
		[]string{"link", "set", br, "up"},
	); err != nil {
		return nil, err
	}
	p := &Plumbed{Tap: tap, GuestMAC: sv.MAC}
	if ifc.MAC != "" {
		p.GuestMAC = ifc.MAC
	}
	if ifc.Binding == BindingBridge && sv.IPv4.IsValid() {
		p.GuestIPv4 = sv.IPv4
		srvIP := netip.PrefixFrom(netip.AddrFrom4([4]byte{169, 254, 75, byte(10 + ifc.Index)}), 32)
		if err := ipCmds(ns, []string{"addr", "replace", srvIP.String(), "dev", br}); err != nil {
			return nil, err
		}
		if err := nl.SetSysctl(nsPath, "net/ipv4/conf/"+br+"/arp_ignore", "1"); err != nil {
			return nil, err
		}
		p.lease = dhcp.Lease{IP: sv.IPv4, Router: sv.Gateway, MTU: sv.MTU, DNS: ifc.DNS}
		p.serverIP = srvIP.Addr()
		p.bridge = br
	}
	return p, nil
}

// plumbMasquerade: the pod interface stays; bridge k6t-<iface> holds the
// guest's gateway 10.0.2.1/24 with a tap; the guest gets 10.0.2.2/24 by
// DHCP, and nftables NAT (as KubeVirt writes it) forwards the pod's
// traffic (or ifc.Ports) to the guest and masquerades the guest's.
func plumbMasquerade(ns, nsPath string, ifc Iface) (*Plumbed, error) {
	br, tap := bridgeName(ifc), tapName(ifc)
	l, err := link(ns, ifc.PodIface)
	if err != nil {
		return nil, err
	}
	mtu := fmt.Sprint(l.MTU)
	if _, err := link(ns, br); err != nil {
		if err := ipCmds(ns, []string{"link", "add", br, "mtu", mtu, "address", masqBridgeMAC, "type", "bridge"}); err != nil {
			return nil, err
		}
	}
	if _, err := link(ns, tap); err != nil {
		if err := ipCmds(ns, []string{"tuntap", "add", "dev", tap, "mode", "tap"}); err != nil {
			return nil, err
		}
	}
	if err := ipCmds(ns,
		[]string{"addr", "replace", masqGateway.String(), "dev", br},
		[]string{"link", "set", tap, "mtu", mtu, "master", br, "up"},
		[]string{"link", "set", br, "up"},
	); err != nil {
		return nil, err
	}
	sysctls := [][2]string{{"net/ipv4/ip_forward", "1"}, {"net/ipv4/conf/" + br + "/route_localnet", "1"}}
	script := masqueradeRules("ip", ifc.PodIface, br, masqGuest.Addr(), masqGateway.Addr(), ifc.Ports)
	v6 := hasGlobalIPv6(l)
	if v6 {
		// As KubeVirt: the bridge gets fd10:0:2::1/120 and NAT66 forwards to
		// fd10:0:2::2, which the launcher's DHCPv6 server hands out to a
		// client that asks. No router advertisements: the guest learns
		// neither the /120 nor a default route (kubevirt/kubevirt#19193).
		// Unlike KubeVirt, the bridge's addresses skip DAD, so that the
		// DHCPv6 server can answer from its link-local address as soon as
		// the tap has a carrier.
		if err := nl.SetSysctl(nsPath, "net/ipv6/conf/"+br+"/accept_dad", "0"); err != nil {
			return nil, err
		}
		if err := ipCmds(ns, []string{"-6", "addr", "replace", masqGateway6.String(), "dev", br, "nodad"}); err != nil {
			return nil, err
		}
		sysctls = append(sysctls, [2]string{"net/ipv6/conf/all/forwarding", "1"})
		script += masqueradeRules("ip6", ifc.PodIface, br, masqGuest6.Addr(), masqGateway6.Addr(), ifc.Ports)
	}
	for _, kv := range sysctls {
		if err := nl.SetSysctl(nsPath, kv[0], kv[1]); err != nil {
			return nil, err
		}
	}
	if err := nft(ns, script); err != nil {
		return nil, err
	}
	p := &Plumbed{Tap: tap, GuestMAC: ifc.MAC, GuestIPv4: masqGuest}
	if p.GuestMAC == "" {
		p.GuestMAC = localMAC(l.Address)
	}
	p.lease = dhcp.Lease{IP: masqGuest, Router: masqGateway.Addr(), MTU: l.MTU, DNS: ifc.DNS}
	p.serverIP, p.bridge, p.anyMAC = masqGateway.Addr(), br, true
	if v6 {
		brMAC, err := net.ParseMAC(masqBridgeMAC)
		if err != nil {
			return nil, err
		}
		p.GuestIPv6 = masqGuest6
		p.lease6 = dhcp6Lease{Addr: masqGuest6.Addr(), ServerID: serverDUID(brMAC)}
		for _, d := range ifc.DNS {
			if d.Is6() && !d.Is4In6() {
				p.lease6.DNS = append(p.lease6.DNS, d)
			}
		}
	}
	return p, nil
}

// masqueradeRules is KubeVirt's masquerade NAT for one family ("ip" or
// "ip6"), the guest at g behind gateway gw, as an nft script that
// replaces the family's nat table (so that it is idempotent).
func masqueradeRules(family, podIface, br string, g, gw netip.Addr, ports []Port) string {
	lo := "127.0.0.1"
	if family == "ip6" {
		lo = "::1"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "table %s nat\ndelete table %s nat\ntable %s nat {\n", family, family, family)
	fmt.Fprintf(&b, "  chain prerouting { type nat hook prerouting priority -100; iifname %q counter jump KUBEVIRT_PREINBOUND; }\n", podIface)
	fmt.Fprintf(&b, "  chain input { type nat hook input priority 100; }\n")
	b.WriteString("  chain output { type nat hook output priority -100;")
	if len(ports) == 0 {
		fmt.Fprintf(&b, " %s daddr { %s } counter dnat to %s;", family, lo, g)
	}
	for _, p := range ports {
		fmt.Fprintf(&b, " %s daddr { %s } %s dport %d counter dnat to %s;", family, lo, proto(p), p.Port, g)
	}
	b.WriteString(" }\n")
	fmt.Fprintf(&b, "  chain postrouting { type nat hook postrouting priority 100; %s saddr %s counter masquerade; oifname %q counter jump KUBEVIRT_POSTINBOUND; }\n", family, g, br)
	b.WriteString("  chain KUBEVIRT_PREINBOUND {")
	if len(ports) == 0 {
		fmt.Fprintf(&b, " counter dnat to %s;", g)
	}
	for _, p := range ports {
		fmt.Fprintf(&b, " %s dport { %d } counter dnat to %s;", proto(p), p.Port, g)
	}
	b.WriteString(" }\n  chain KUBEVIRT_POSTINBOUND {")
	if len(ports) == 0 {
		fmt.Fprintf(&b, " %s saddr { %s } counter snat to %s;", family, lo, gw)
	}
	for _, p := range ports {
		fmt.Fprintf(&b, " %s dport %d %s saddr { %s } counter snat to %s;", proto(p), p.Port, family, lo, gw)
	}
	b.WriteString(" }\n}\n")
	return b.String()
}

// hasGlobalIPv6 reports whether l has a global IPv6 address.
func hasGlobalIPv6(l *ipLink) bool {
	for _, a := range l.AddrInfo {
		if a.Family == "inet6" && a.Scope == "global" {
			return true
		}
	}
	return false
}

func proto(p Port) string {
	if strings.EqualFold(p.Protocol, "UDP") {
		return "udp"
	}
	return "tcp"
}

// localMAC is a locally administered MAC derived from mac (another MAC
// for the pod NIC, which gives its own to the guest).
func localMAC(mac string) string {
	hw, err := net.ParseMAC(mac)
	if err != nil || len(hw) != 6 {
		return "02:00:00:00:00:01"
	}
	out := net.HardwareAddr{0x02, 0x6b, 0x36, hw[3], hw[4], hw[5] ^ 0x01}
	return out.String()
}

// ipLink is what `ip -j addr show` says of a link.
type ipLink struct {
	IfName   string `json:"ifname"`
	Address  string `json:"address"`
	MTU      int    `json:"mtu"`
	IfAlias  string `json:"ifalias"`
	AddrInfo []struct {
		Family    string `json:"family"`
		Local     string `json:"local"`
		PrefixLen int    `json:"prefixlen"`
		Scope     string `json:"scope"`
	} `json:"addr_info"`
}

func link(ns, name string) (*ipLink, error) {
	out, err := ipOut(ns, "-j", "addr", "show", "dev", name)
	if err != nil {
		return nil, err
	}
	var ls []ipLink
	if err := json.Unmarshal(out, &ls); err != nil || len(ls) != 1 {
		return nil, fmt.Errorf("ip addr show dev %s: unexpected output %q", name, out)
	}
	return &ls[0], nil
}

// defaultGateway is the IPv4 default route's gateway through dev, if any.
func defaultGateway(ns, dev string) netip.Addr {
	out, err := ipOut(ns, "-j", "-4", "route", "show", "default", "dev", dev)
	if err != nil {
		return netip.Addr{}
	}
	var rs []struct {
		Gateway string `json:"gateway"`
	}
	if json.Unmarshal(out, &rs) != nil {
		return netip.Addr{}
	}
	for _, r := range rs {
		if a, err := netip.ParseAddr(r.Gateway); err == nil {
			return a
		}
	}
	return netip.Addr{}
}

func ipOut(ns string, args ...string) ([]byte, error) {
	cmd := exec.Command("ip", append([]string{"-n", ns}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

func ipCmds(ns string, cmds ...[]string) error {
	for _, c := range cmds {
		if _, err := ipOut(ns, c...); err != nil {
			return err
		}
	}
	return nil
}

// nft loads script in netns ns.
func nft(ns, script string) error {
	cmd := exec.Command("ip", "netns", "exec", ns, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("nft: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// anyLease serves one lease to every MAC (masquerade: the guest is alone
// behind the bridge).
type anyLease struct{ l dhcp.Lease }

func (a anyLease) Lookup(net.HardwareAddr) (dhcp.Lease, bool) { return a.l, true }

// serveDHCP6 starts the launcher's DHCPv6 server, when the interface has
// one (masquerade with IPv6).
func (p *Plumbed) serveDHCP6(ctx context.Context, nsPath string, ifc Iface, log logr.Logger) error {
	p.srv6 = nil
	if !p.GuestIPv6.IsValid() {
		return nil
	}
	srv, err := newDHCP6Server(nsPath, p.bridge, p.lease6, log)
	if err != nil {
		return err
	}
	p.srv6 = srv
	go func() {
		if err := srv.Serve(ctx); err != nil && !errors.Is(err, context.Canceled) {
			log.V(1).Info("launcher DHCPv6 server stopped", "interface", ifc.Name, "error", err.Error())
		}
	}()
	return nil
}

// serveDHCP starts the launcher's DHCP server, when the binding has one.
func (p *Plumbed) serveDHCP(ctx context.Context, nsPath string, ifc Iface, log logr.Logger) error {
	p.srv = nil
	if !p.serverIP.IsValid() {
		return nil
	}
	var leases dhcp.Leases = anyLease{p.lease}
	if !p.anyMAC {
		st := dhcp.NewStaticLeases()
		mac, err := net.ParseMAC(p.GuestMAC)
		if err != nil {
			return err
		}
		st.Set(mac, p.lease)
		leases = st
	}
	srv, err := dhcp.New(dhcp.Config{NetNS: nsPath, Interface: p.bridge, ServerIP: p.serverIP, Leases: leases, Log: log})
	if err != nil {
		return err
	}
	p.srv = srv
	go func() {
		if err := srv.Serve(ctx); err != nil && !errors.Is(err, context.Canceled) {
			log.V(1).Info("launcher DHCP server stopped", "interface", ifc.Name, "error", err.Error())
		}
	}()
	return nil
}
