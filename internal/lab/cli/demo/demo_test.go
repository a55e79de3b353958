package demo

import (
	"context"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kvnet.io/kvnet/internal/lab/guest"
	"kvnet.io/kvnet/internal/podnetworks"
	"kvnet.io/kvnet/internal/testenv/netiptest"
)

func TestLookTools(t *testing.T) {
	look := func(missing string) func(string) (string, error) {
		return func(name string) (string, error) {
			if name == missing {
				return "", exec.ErrNotFound
			}
			return "/usr/bin/" + name, nil
		}
	}
	if _, err := lookTools(look("busybox")); err == nil || err.Error() != "busybox not found: install the Debian package busybox (hack/install-deps.sh does)" {
		t.Errorf("busybox missing: %v", err)
	}
	if _, err := lookTools(look("ip")); err == nil || err.Error() != "ip not found: install the Debian package iproute2 (hack/install-deps.sh does)" {
		t.Errorf("ip missing: %v", err)
	}
	tl, err := lookTools(look(""))
	if err != nil || tl.ip != "/usr/bin/ip" || tl.busybox != "/usr/bin/busybox" {
		t.Errorf("all there: %+v, %v", tl, err)
	}
}

// Outputs of `ip netns exec <ns> busybox ...` as seen in the lab.
const (
	pingReplyOut = "PING 10.0.0.1 (10.0.0.1): 56 data bytes\n64 bytes from 10.0.0.1: seq=0 ttl=64 time=0.410 ms\n\n" +
		"--- 10.0.0.1 ping statistics ---\n1 packets transmitted, 1 packets received, 0% packet loss\nround-trip min/avg/max = 0.410/0.410/0.410 ms\n"
	pingNoReplyOut = "PING 10.0.0.4 (10.0.0.4): 56 data bytes\n\n--- 10.0.0.4 ping statistics ---\n" +
		"1 packets transmitted, 0 packets received, 100% packet loss\n"
	// A pod namespace with no interface but lo: no route anywhere.
	noNetworkStdout = "PING 10.0.0.4 (10.0.0.4): 56 data bytes\n"
	noNetworkStderr = "ping: sendto: Network is unreachable\n"
)

func TestClassify(t *testing.T) {
	for _, tc := range []struct {
		name           string
		code           int
		stdout, stderr string
		want           outcome
		errHas         string
	}{
		{"ping reply", 0, pingReplyOut, "", answered, ""},
		{"ping no reply (busybox exit status 1)", 1, pingNoReplyOut, "", noAnswer, ""},
		{"no network at all", 1, noNetworkStdout, noNetworkStderr, failed, "Network is unreachable"},
		{"busybox missing in the namespace's PATH", 1, "", `exec of "busybox" failed: No such file or directory`, failed, `exec of "busybox" failed`},
		{"netns missing", 255, "", `Cannot open network namespace "x": No such file or directory`, failed, "Cannot open network namespace"},
		{"bad address", 1, "", "ping: bad address 'x'", failed, "bad address"},
		{"exit 1 and no output", 1, "", "", failed, "no ping statistics"},
		{"killed", -1, "PING 10.0.0.4 (10.0.0.4): 56 data bytes\n", "", failed, "exit status -1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := classify(tc.code, tc.stdout, tc.stderr)
			if r.outcome != tc.want {
				t.Fatalf("outcome %v (%v), want %v", r.outcome, r.err, tc.want)
			}
			if tc.errHas != "" && (r.err == nil || !strings.Contains(r.err.Error(), tc.errHas)) {
				t.Fatalf("error %v lacks %q", r.err, tc.errHas)
			}
		})
	}
}

// fakeProber answers probes by netns and address; an unknown probe fails
// the test.
type fakeProber struct {
	t       *testing.T
	results map[string][]result // "<netns> <addr>" -> results of successive calls (the last repeats)
	calls   map[string]int
}

func (f *fakeProber) probe(_ context.Context, p probe) result {
	k := p.netns + " " + p.addr
	rs, ok := f.results[k]
	if !ok {
		f.t.Fatalf("unexpected probe %s from %s", p, p.netns)
	}
	if f.calls == nil {
		f.calls = map[string]int{}
	}
	i := min(f.calls[k], len(rs)-1)
	f.calls[k]++
	return rs[i]
}

var (
	ok      = result{outcome: answered}
	silent  = result{outcome: noAnswer}
	noNet   = classify(1, noNetworkStdout, noNetworkStderr)
	noBB    = classify(1, "", `exec of "busybox" failed: No such file or directory`)
	noNetNS = classify(255, "", `Cannot open network namespace "x": No such file or directory`)
)

func labPodFor(ns, name, node, netns string, ips []string, gws ...string) labPod {
	return labPod{
		pod:   corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: corev1.PodSpec{NodeName: node}},
		a:     podnetworks.Attachment{IPAddresses: ips, GatewayIPs: gws, Role: podnetworks.RolePrimary, Network: ns + "_net"},
		netns: netns,
	}
}

func TestEvaluate(t *testing.T) {
	db := labPodFor("tenant-b", "db-1", "node-1", "/run/netns/db", []string{"10.0.0.3/24"}, "10.0.0.1")
	web := labPodFor("udn-demo", "web-2", "node-2", "/run/netns/web2", []string{"10.0.0.4/24"}, "10.0.0.1")
	byName := map[string]labPod{db.String(): db, web.String(): web}
	isolation, err := resolve(check{"tenant-b/db-1", "udn-demo/web-2", false, "another tenant"}, byName)
	if err != nil {
		t.Fatal(err)
	}
	reach, err := resolve(check{"udn-demo/web-2", "tenant-b/db-1", true, "made up"}, byName)
	if err != nil {
		t.Fatal(err)
	}
	web1 := labPodFor("udn-demo", "web-1", "node-1", "/run/netns/web1", []string{"10.0.0.3/24"}, "10.0.0.1")
	byName[web1.String()] = web1
	sameAddr, err := resolve(check{"tenant-b/db-1", "udn-demo/web-1", false, "same address"}, byName)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		step    step
		gateway []result // the source's control probe
		target  []result
		word    string
		errHas  string // "" for a pass
	}{
		{"isolated", isolation, []result{ok}, []result{silent}, "blocked", ""},
		{"leak", isolation, []result{ok}, []result{silent, ok}, "reached", "reached, want blocked"},
		// A broken source answers nothing: without the control it would
		// print "blocked".
		{"source without a network", isolation, []result{noNet}, []result{noNet}, "ERROR", "source tenant-b/db-1 is broken"},
		{"source whose probes go unanswered", isolation, []result{silent}, []result{silent}, "ERROR", "source tenant-b/db-1 is broken: its gateway 10.0.0.1 (the positive control) did not answer"},
		{"source namespace missing", isolation, []result{noNetNS}, []result{silent}, "ERROR", "Cannot open network namespace"},
		{"busybox cannot run for the target probe", isolation, []result{ok}, []result{noBB}, "ERROR", `exec of "busybox" failed`},
		{"control answered after retries", isolation, []result{silent, silent, ok}, []result{silent}, "blocked", ""},
		// No probe runs (the fake fails the test on any): not "blocked".
		{"same address", sameAddr, nil, nil, "NOT CHECKED", ""},
		{"reached", reach, nil, []result{ok}, "reached", ""},
		{"reached after retries", reach, nil, []result{silent, noNet, ok}, "reached", ""},
		{"not reached", reach, nil, []result{silent}, "blocked", "blocked, want reached"},
		{"reach probe cannot run", reach, nil, []result{noBB}, "ERROR", `exec of "busybox" failed`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fp := &fakeProber{t: t, results: map[string][]result{}}
			if tc.target != nil {
				fp.results[tc.step.target.netns+" "+tc.step.target.addr] = tc.target
			}
			if tc.gateway != nil {
				fp.results[tc.step.control.netns+" "+tc.step.control.addr] = tc.gateway
			}
			v := evaluate(context.Background(), fp, tc.step)
			if v.word != tc.word {
				t.Errorf("word %q, want %q (err %v)", v.word, tc.word, v.err)
			}
			switch {
			case tc.errHas == "" && v.err != nil:
				t.Errorf("unexpected error %v", v.err)
			case tc.errHas != "" && (v.err == nil || !strings.Contains(v.err.Error(), tc.errHas)):
				t.Errorf("error %v lacks %q", v.err, tc.errHas)
			}
		})
	}
}

func TestResolve(t *testing.T) {
	web1 := labPodFor("udn-demo", "web-1", "node-1", "/run/netns/web1", []string{"10.0.0.3/24", "2001:db8::3/60"}, "2001:db8::1", "10.0.0.1")
	web1.secondary = []podnetworks.Attachment{{IPAddresses: []string{"192.168.100.1/24"}, Network: "sec"}}
	web2 := labPodFor("udn-demo", "web-2", "node-2", "/run/netns/web2", []string{"10.0.0.4/24"}, "10.0.0.1")
	db := labPodFor("tenant-b", "db-1", "node-1", "/run/netns/db", []string{"10.0.0.3/24"}, "10.0.0.1")
	noGW := labPodFor("tenant-c", "x", "node-1", "/run/netns/x", []string{"10.0.0.9/24"})
	byName := map[string]labPod{}
	for _, p := range []labPod{web1, web2, db, noGW} {
		byName[p.String()] = p
	}

	// Pods, attachments and gateways a check needs are errors when missing.
	for _, tc := range []struct {
		ch     check
		errHas string
	}{
		{check{"udn-demo/gone", "udn-demo/web-2", true, ""}, "pod udn-demo/gone is not running"},
		{check{"udn-demo/web-1", "udn-demo/gone", true, ""}, "pod udn-demo/gone is not running"},
		{check{"udn-demo/web-1", "secondary:udn-demo/gone", true, ""}, "pod udn-demo/gone is not running"},
		{check{"udn-demo/web-1", "secondary:udn-demo/web-2", true, ""}, "pod udn-demo/web-2 has no secondary attachment"},
		{check{"tenant-c/x", "udn-demo/web-2", false, ""}, "pod tenant-c/x has no gateway"},
	} {
		if _, err := resolve(tc.ch, byName); err == nil || !strings.Contains(err.Error(), tc.errHas) {
			t.Errorf("%s -> %s: error %v, want %q", tc.ch.from, tc.ch.to, err, tc.errHas)
		}
	}

	// An isolation check has a positive control from the same source, of
	// the target's family.
	st, err := resolve(check{"tenant-b/db-1", "udn-demo/web-2", false, ""}, byName)
	if err != nil {
		t.Fatal(err)
	}
	if st.target != (probe{netns: "/run/netns/db", addr: "10.0.0.4"}) || st.unprobed != "" ||
		st.control == nil || *st.control != (probe{netns: "/run/netns/db", addr: "10.0.0.1"}) {
		t.Errorf("isolation step: target %+v control %+v", st.target, st.control)
	}
	// The other tenant's pod with the source's own address: no probe can
	// tell, and the step says so.
	st, err = resolve(check{"tenant-b/db-1", "udn-demo/web-1", false, ""}, byName)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(st.unprobed, "both pods have the address 10.0.0.3") {
		t.Errorf("same-address step: %+v", st)
	}
	if _, err := resolve(check{"tenant-b/db-1", "udn-demo/web-1", true, ""}, byName); err == nil {
		t.Error("a check that must reach the source's own address accepted")
	}
	// Checks that must reach have no control.
	st, err = resolve(check{"udn-demo/web-1", "secondary:udn-demo/web-1", true, ""}, byName)
	if err != nil || st.control != nil || st.target.addr != "192.168.100.1" {
		t.Errorf("reach step: %+v, %v", st, err)
	}
}

func TestExpectedPodsAndRequirePods(t *testing.T) {
	want := []string{"blue-namespace/blue-1", "l3-demo/app-1", "l3-demo/app-2", "red-namespace/red-1", "tenant-b/db-1", "udn-demo/web-1", "udn-demo/web-2"}
	got := expectedPods(checks)
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("expected pods %v, want %v", got, want)
	}
	pod := func(ns, name, node string) corev1.Pod {
		return corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: corev1.PodSpec{NodeName: node}}
	}
	pods := []corev1.Pod{pod("udn-demo", "web-1", "node-1"), pod("udn-demo", "web-2", ""), pod("tenant-b", "db-1", "node-1")}
	err := requirePods(pods, []string{"udn-demo/web-1", "udn-demo/web-2", "tenant-b/db-1", "red-namespace/red-1"})
	if err == nil {
		t.Fatal("missing and unbound pods accepted")
	}
	for _, s := range []string{"pod red-namespace/red-1 does not exist", "pod udn-demo/web-2 is bound to no node"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q lacks %q", err, s)
		}
	}
	if strings.Contains(err.Error(), "web-1") || strings.Contains(err.Error(), "db-1") {
		t.Errorf("error %q names a pod that is there", err)
	}
	if err := requirePods(pods[:1], []string{"udn-demo/web-1"}); err != nil {
		t.Errorf("all there: %v", err)
	}
}

func TestParseGuestIface(t *testing.T) {
	out := "52:54:00:12:34:56\n2: eth0    inet 10.0.0.5/16 brd 10.0.255.255 scope global eth0\\       valid_lft forever preferred_lft forever\n"
	mac, addrs, err := parseGuestIface(out, "eth0")
	if err != nil {
		t.Fatal(err)
	}
	if mac != "52:54:00:12:34:56" || !samePrefixes(addrs, netiptest.MustPrefixes("10.0.0.5/16")) {
		t.Errorf("MAC %s addresses %v", mac, addrs)
	}
	if _, addrs, err := parseGuestIface("52:54:00:12:34:56\n", "eth1"); err != nil || len(addrs) != 0 {
		t.Errorf("no address: %v %v", addrs, err)
	}
	if _, _, err := parseGuestIface("cat: can't open '/sys/class/net/eth3/address'", "eth3"); err == nil {
		t.Error("a missing NIC accepted")
	}
}

func TestVMChecks(t *testing.T) {
	iface := func(claimed, addrs []netip.Prefix, mac, specMAC string) ifaceState {
		return ifaceState{vmIface: vmIface{network: "podnet", claim: "vm-a.podnet", podIface: "ovn-udn1", specMAC: specMAC},
			claimed: claimed, addrs: addrs, mac: mac}
	}
	good := iface(netiptest.MustPrefixes("10.0.0.5/24", "2001:db8::5/60"), netiptest.MustPrefixes("2001:db8::5/60", "10.0.0.5/24"), "0a:58:0a:00:00:05", "0A:58:0A:00:00:05")
	if err := checkPlumbed(good); err != nil {
		t.Errorf("claim and kernel agree: %v", err)
	}
	for name, f := range map[string]ifaceState{
		// What the old check could not see: the pod's annotation (and the
		// VMI status copied from it) may say 10.0.0.5 while the pod has
		// another address.
		"kernel has another address": iface(netiptest.MustPrefixes("10.0.0.5/24"), netiptest.MustPrefixes("10.0.0.6/24"), "0a:58:0a:00:00:05", ""),
		"kernel lacks one":           iface(netiptest.MustPrefixes("10.0.0.5/24", "2001:db8::5/60"), netiptest.MustPrefixes("10.0.0.5/24"), "0a:58:0a:00:00:05", ""),
		"kernel has one more":        iface(netiptest.MustPrefixes("10.0.0.5/24"), netiptest.MustPrefixes("10.0.0.5/24", "10.0.0.7/24"), "0a:58:0a:00:00:05", ""),
		"claim empty":                iface(nil, nil, "0a:58:0a:00:00:05", ""),
		"MAC not the VM's":           iface(netiptest.MustPrefixes("10.0.0.5/24"), netiptest.MustPrefixes("10.0.0.5/24"), "0a:58:0a:00:00:05", "02:00:00:00:00:01"),
		"VMI names no MAC":           iface(netiptest.MustPrefixes("10.0.0.5/24"), netiptest.MustPrefixes("10.0.0.5/24"), "0a:58:0a:00:00:05", ""),
	} {
		if err := checkPlumbed(f); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}

	before := vmState{node: "node-1", pod: "launcher-a", ifaces: []ifaceState{good}}
	after := vmState{node: "node-2", pod: "launcher-b", ifaces: []ifaceState{good}}
	if err := compareMigration(before, after); err != nil {
		t.Errorf("a good migration: %v", err)
	}
	moved := iface(netiptest.MustPrefixes("10.0.0.9/24", "2001:db8::5/60"), netiptest.MustPrefixes("10.0.0.9/24", "2001:db8::5/60"), "0a:58:0a:00:00:05", good.specMAC)
	newMAC := iface(good.claimed, good.addrs, "0a:58:0a:00:00:09", good.specMAC)
	for name, a := range map[string]vmState{
		"same node":      {node: "node-1", pod: "launcher-b", ifaces: []ifaceState{good}},
		"IP changed":     {node: "node-2", pod: "launcher-b", ifaces: []ifaceState{moved}},
		"MAC changed":    {node: "node-2", pod: "launcher-b", ifaces: []ifaceState{newMAC}},
		"interface gone": {node: "node-2", pod: "launcher-b"},
	} {
		if err := compareMigration(before, a); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// TestCheckLease: the guest's DHCP lease is checked against the VMI's MAC
// and the claim's address; a lease for the MAC the guest has (the guest
// agreeing with itself) but not the VMI's is wrong.
func TestCheckLease(t *testing.T) {
	f := ifaceState{vmIface: vmIface{network: "podnet", claim: "vm-a.podnet", specMAC: "0a:58:0a:00:00:05"},
		claimed: netiptest.MustPrefixes("10.0.0.5/24"), mac: "0a:58:0a:00:00:05"}
	lease := func(mac, addr string) guest.Lease {
		m, err := net.ParseMAC(mac)
		if err != nil {
			t.Fatal(err)
		}
		return guest.Lease{Iface: "eth0", MAC: m, Addr: netip.MustParsePrefix(addr)}
	}
	if err := checkLease(0, f, lease("0a:58:0a:00:00:05", "10.0.0.5/24")); err != nil {
		t.Errorf("lease matching the claim and the VMI's MAC: %v", err)
	}
	wrongGuest := f
	wrongGuest.mac = "02:00:00:00:00:09" // the guest runs with a MAC the VMI does not have
	for name, tc := range map[string]struct {
		f ifaceState
		l guest.Lease
	}{
		"guest's own MAC, not the VMI's": {wrongGuest, lease("02:00:00:00:00:09", "10.0.0.5/24")},
		"another address":                {f, lease("0a:58:0a:00:00:05", "10.0.0.6/24")},
		"VMI names no MAC": {ifaceState{vmIface: vmIface{network: "podnet", claim: "vm-a.podnet"}, claimed: netiptest.MustPrefixes("10.0.0.5/24"), mac: "0a:58:0a:00:00:05"},
			lease("0a:58:0a:00:00:05", "10.0.0.5/24")},
	} {
		if err := checkLease(0, tc.f, tc.l); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// TestCheckLease6: the guest's DHCPv6 lease is checked against the
// claim's IPv6 address, not its prefix length (the guest adds a /128),
// and the VMI's MAC.
func TestCheckLease6(t *testing.T) {
	f := ifaceState{vmIface: vmIface{network: "podnet", claim: "vm-a.podnet", specMAC: "0a:58:0a:00:00:05"},
		claimed: netiptest.MustPrefixes("10.0.0.5/24"), claimed6: netiptest.MustPrefixes("2001:db8::5/60")}
	lease := func(mac, addr string) guest.Lease {
		m, err := net.ParseMAC(mac)
		if err != nil {
			t.Fatal(err)
		}
		return guest.Lease{Iface: "eth0", MAC: m, Addr: netip.MustParsePrefix(addr)}
	}
	if err := checkLease6(0, f, lease("0a:58:0a:00:00:05", "2001:db8::5/128")); err != nil {
		t.Errorf("lease of the claim's address as the guest adds it (/128): %v", err)
	}
	noV6 := f
	noV6.claimed6 = nil
	for name, tc := range map[string]struct {
		f ifaceState
		l guest.Lease
	}{
		"another address":      {f, lease("0a:58:0a:00:00:05", "2001:db8::6/128")},
		"another MAC":          {f, lease("02:00:00:00:00:09", "2001:db8::5/128")},
		"claim without IPv6":   {noV6, lease("0a:58:0a:00:00:05", "2001:db8::5/128")},
		"the claim's IPv4 one": {f, lease("0a:58:0a:00:00:05", "10.0.0.5/32")},
	} {
		if err := checkLease6(0, tc.f, tc.l); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
