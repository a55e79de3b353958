package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"kvnet.io/kvnet/internal/nl"
	"kvnet.io/kvnet/internal/repo"
	"kvnet.io/kvnet/internal/testenv"
	"kvnet.io/kvnet/internal/testenv/nstest"
)

// TestPTP32Layout runs the ptp32 layout's chain (ptp with host-local and
// the link-local gateway, then ptp32) from a node namespace for a pod
// namespace, as containerd does on a ptp32 node, and checks Calico's
// layout: the pod's eth0 holds a /32 with one route, default via
// 169.254.1.1 onlink; the node's end has no address, proxy ARP on, and
// the host route to the pod; the node reaches the pod from its own
// address (through proxy ARP for the gateway on the way back); DEL
// removes the veth.
func TestPTP32Layout(t *testing.T) {
	testenv.NeedsRoot(t)
	root, err := repo.Root()
	if err != nil {
		t.Fatal(err)
	}
	bin := t.TempDir()
	build := testenv.GoBuild(root, "-o", bin+"/",
		"github.com/containernetworking/plugins/plugins/main/ptp",
		"github.com/containernetworking/plugins/plugins/ipam/host-local",
		"./internal/lab/cluster/ptp32")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ptp, host-local, ptp32: %v\n%s", err, out)
	}
	node, pod := namedNS(t, "kvptp32-node"), namedNS(t, "kvptp32-pod")
	// The node: its own address on eth0 (a veth to a namespace standing in
	// for the host), default route via the host, as a cluster node has.
	host := namedNS(t, "kvptp32-host")
	for _, args := range [][]string{
		{"ip", "link", "add", "eth0", "type", "veth", "peer", "name", "up0", "netns", filepath.Base(host)},
		{"ip", "addr", "add", "10.89.7.11/24", "dev", "eth0"},
		{"ip", "link", "set", "eth0", "up"},
		{"ip", "route", "add", "default", "via", "10.89.7.1"},
		{"sysctl", "-qw", "net.ipv4.ip_forward=1"},
	} {
		if err := nstest.Exec(node, args...); err != nil {
			t.Fatal(err)
		}
	}
	if err := nstest.Exec(host, "ip", "link", "set", "up0", "up"); err != nil {
		t.Fatal(err)
	}
	conf := fmt.Sprintf(`{"cniVersion":"1.0.0","name":"kvnet-lab","plugins":[`+
		`{"type":"ptp","ipMasq":false,"ipam":{"type":"host-local","dataDir":%q,"ranges":[[{"subnet":"10.244.7.0/24","gateway":"169.254.1.1"}]]}},`+
		`{"type":"ptp32"}]}`, filepath.Join(t.TempDir(), "ipam"))
	list, err := libcni.ConfListFromBytes([]byte(conf))
	if err != nil {
		t.Fatal(err)
	}
	cni := libcni.NewCNIConfigWithCacheDir([]string{bin}, t.TempDir(), nil)
	rt := &libcni.RuntimeConf{ContainerID: "ctr-ptp32", NetNS: pod, IfName: "eth0"}
	ctx := context.Background()
	var res *current.Result
	if err := nl.Do(node, func() error {
		r, err := cni.AddNetworkList(ctx, list, rt)
		if err != nil {
			return err
		}
		res, err = current.NewResultFromResult(r)
		return err
	}); err != nil {
		t.Fatalf("ADD: %v", err)
	}
	if len(res.IPs) != 1 || res.IPs[0].Address.String() != res.IPs[0].Address.IP.String()+"/32" || len(res.Routes) != 1 ||
		res.Routes[0].Dst.String() != "0.0.0.0/0" || !res.Routes[0].GW.Equal(net.IPv4(169, 254, 1, 1)) {
		t.Errorf("result %s: want one /32 and the default route via 169.254.1.1", res)
	}
	podIP := res.IPs[0].Address.IP

	ph, err := nl.NewHandle(pod)
	if err != nil {
		t.Fatal(err)
	}
	defer ph.Close()
	eth0, err := ph.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	addrs, err := ph.AddrList(eth0, unix.AF_INET)
	if err != nil {
		t.Fatal(err)
	}
	if len(addrs) != 1 || addrs[0].IPNet.String() != podIP.String()+"/32" {
		t.Errorf("pod eth0 addresses %v: want %s/32 alone", addrs, podIP)
	}
	routes, err := ph.RouteListFiltered(unix.AF_INET, &netlink.Route{LinkIndex: eth0.Attrs().Index}, netlink.RT_FILTER_OIF)
	if err != nil {
		t.Fatal(err)
	}
	if len(routes) != 1 || routes[0].Dst != nil && routes[0].Dst.String() != "0.0.0.0/0" ||
		!routes[0].Gw.Equal(net.IPv4(169, 254, 1, 1)) || routes[0].Flags&int(netlink.FLAG_ONLINK) == 0 {
		t.Errorf("pod eth0 routes %v: want default via 169.254.1.1 onlink alone", routes)
	}

	nh, err := nl.NewHandle(node)
	if err != nil {
		t.Fatal(err)
	}
	defer nh.Close()
	hostEnd := res.Interfaces[0].Name
	veth, err := nh.LinkByName(hostEnd)
	if err != nil {
		t.Fatal(err)
	}
	if a, err := nh.AddrList(veth, unix.AF_INET); err != nil || len(a) != 0 {
		t.Errorf("node end %s: addresses %v (%v), want none", hostEnd, a, err)
	}
	if err := nl.Do(node, func() error {
		b, err := os.ReadFile("/proc/sys/net/ipv4/conf/" + hostEnd + "/proxy_arp")
		if err == nil && strings.TrimSpace(string(b)) != "1" {
			err = fmt.Errorf("proxy_arp %q", strings.TrimSpace(string(b)))
		}
		return err
	}); err != nil {
		t.Errorf("node end %s: %v, want proxy ARP on", hostEnd, err)
	}
	hr, err := nh.RouteGet(podIP)
	if err != nil || len(hr) == 0 || hr[0].LinkIndex != veth.Attrs().Index || !hr[0].Src.Equal(net.IPv4(10, 89, 7, 11)) {
		t.Errorf("node route to %s: %+v (%v), want through %s from the node's 10.89.7.11", podIP, hr, err, hostEnd)
	}

	// The node reaches the pod from its own address; the reply goes by
	// the pod's default route, to the gateway the node's end answers for.
	addr := net.JoinHostPort(podIP.String(), "8080")
	nstest.ServeLine(t, pod, addr, func(c net.Conn) string { return c.RemoteAddr().String() })
	got, err := nstest.ReadLine(node, addr, 5*time.Second)
	if err != nil || !strings.HasPrefix(got, "10.89.7.11:") {
		t.Errorf("node to pod %s: %q (%v), want an answer to the node's 10.89.7.11", addr, got, err)
	}

	if err := nl.Do(node, func() error { return cni.DelNetworkList(ctx, list, rt) }); err != nil {
		t.Fatalf("DEL: %v", err)
	}
	if _, err := nh.LinkByName(hostEnd); !nl.IsNotFound(err) {
		t.Errorf("node end %s after DEL: %v, want gone", hostEnd, err)
	}
}

// namedNS makes a named network namespace for the test and returns its
// path; it goes when the test ends.
func namedNS(t *testing.T, name string) string {
	t.Helper()
	_ = nl.DeleteNamedNS(name) // a killed run's
	p, err := nl.CreateNamedNS(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nl.DeleteNamedNS(name) })
	return p
}
