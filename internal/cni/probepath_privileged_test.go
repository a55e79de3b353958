package cni_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"kvnet.io/kvnet/internal/nl"
	"kvnet.io/kvnet/internal/testenv"
	"kvnet.io/kvnet/internal/testenv/nstest"
)

// TestProbePathLayouts: a pod on a primary UDN keeps answering the
// kubelet's probes on eth0 whatever layout the cluster default network
// gives it, though ovn-udn1 takes its default route. In a node namespace
// (the node's own address 10.99.0.11 on lo) the reference ptp plugin
// attaches eth0, then kvnet-cni attaches ovn-udn1 from the same node
// namespace, as Multus does. The node "probes" (connects to the pod's
// eth0 address, as the kubelet's HTTP and TCP probes do):
//   - ptp with its gateway in the subnet: the node's side of the veth
//     holds the gateway, the probe comes from it, the pod's host route to
//     it is on eth0;
//   - a link-local gateway (default via 169.254.1.1, as Calico lays pods
//     out) with the node probing from its own address (Calico's host side
//     has none): the reply needs a route via that gateway, which
//     kvnet-cni adds.
//
// Either way the pod reaches another pod of the default network over
// eth0 before ovn-udn1 (the control) and not after.
func TestProbePathLayouts(t *testing.T) {
	testenv.NeedsFixture(t, cniCfg != nil)
	ctx := context.Background()
	const ns = "cni-probes"
	statusFile := filepath.Join(t.TempDir(), "status.json")
	if err := os.WriteFile(statusFile, []byte(`{"ready":true,"exhaustedNetworks":[]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	udn := primaryUDN(t, ns, "10.85.0.0/24", statusFile)
	ptpConf := func(name, subnet, gw, routes string) string {
		return fmt.Sprintf(`{"cniVersion":"1.0.0","name":%q,"type":"ptp","ipMasq":false,"mtu":1500,`+
			`"ipam":{"type":"host-local","dataDir":%q,"ranges":[[{"subnet":%q,"gateway":%q}]],"routes":[%s]}}`,
			name, filepath.Join(t.TempDir(), "ipam"), subnet, gw, routes)
	}

	node := netnsFor(t)
	nodeIP := net.IPv4(10, 99, 0, 11)
	err := nl.Do(node, func() error {
		h, err := nl.NewHandle("")
		if err != nil {
			return err
		}
		defer h.Close()
		lo, err := h.LinkByName("lo")
		if err != nil {
			return err
		}
		if err := h.LinkSetUp(lo); err != nil {
			return err
		}
		return h.AddrAdd(lo, &netlink.Addr{IPNet: &net.IPNet{IP: nodeIP, Mask: net.CIDRMask(32, 32)}})
	})
	if err != nil {
		t.Fatal(err)
	}
	// kvnet-cni runs in the node namespace and reads the API server at
	// the kubeconfig's 127.0.0.1 address: forward it from there.
	api := strings.TrimSuffix(strings.TrimPrefix(env.Config.Host, "https://"), "/")
	nstest.Serve(nstest.Listen(t, node, api), func(in net.Conn) {
		defer in.Close()
		out, err := net.Dial("tcp", api)
		if err != nil {
			return
		}
		defer out.Close()
		go func() { _, _ = io.Copy(out, in) }()
		_, _ = io.Copy(in, out)
	})

	for i, tt := range []struct {
		name, conf string
		// linkLocal: the pod's default route is via 169.254.1.1 on
		// eth0, which ptp cannot add itself (its IPAM routes come before
		// its route to an off-subnet gateway), and the node probes from
		// its own address (Calico's host side of the veth has none).
		linkLocal bool
	}{
		{"ptp, gateway in the subnet", ptpConf("ptp", "10.84.0.0/24", "10.84.0.1", `{"dst":"0.0.0.0/0"}`), false},
		{"link-local gateway, probes from the node's address", ptpConf("calico-like", "10.84.1.0/24", "169.254.1.1", ""), true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			pod := fmt.Sprintf("p%d", i)
			annotatedPod(t, ns, pod, "net@ovn-udn1")
			nsPath := netnsFor(t)
			eth0 := rt(ns, pod, nsPath, "ctr-probe-"+pod, "eth0")
			ptp := confList(t, tt.conf)
			if err := nl.Do(node, func() error { _, err := cniCfg.AddNetworkList(ctx, ptp, eth0); return err }); err != nil {
				t.Fatalf("ptp ADD: %v", err)
			}
			t.Cleanup(func() { _ = nl.Do(node, func() error { return cniCfg.DelNetworkList(ctx, ptp, eth0) }) })
			ip := podAddr(t, nsPath, "eth0")
			serveName(t, nsPath, ip.String(), pod)
			if tt.linkLocal {
				if err := defaultVia(nsPath, "eth0", net.IPv4(169, 254, 1, 1)); err != nil {
					t.Fatal(err)
				}
				if err := nl.Do(node, func() error { return routeFrom(ip, nodeIP) }); err != nil {
					t.Fatal(err)
				}
			}
			if err := reachName(node, ip.String(), pod, 5*time.Second); err != nil {
				t.Fatalf("control: the node probes eth0 before ovn-udn1: %v", err)
			}
			// Another pod of the default network, on the same node.
			otherNS := netnsFor(t)
			otherRT := rt(ns, pod+"-other", otherNS, "ctr-probe-other-"+pod, "eth0")
			if err := nl.Do(node, func() error { _, err := cniCfg.AddNetworkList(ctx, ptp, otherRT); return err }); err != nil {
				t.Fatalf("ptp ADD of another pod: %v", err)
			}
			t.Cleanup(func() { _ = nl.Do(node, func() error { return cniCfg.DelNetworkList(ctx, ptp, otherRT) }) })
			other := podAddr(t, otherNS, "eth0")
			serveName(t, otherNS, other.String(), "other")
			if tt.linkLocal {
				if err := defaultVia(otherNS, "eth0", net.IPv4(169, 254, 1, 1)); err != nil {
					t.Fatal(err)
				}
			}
			if err := reachName(nsPath, other.String(), "other", 5*time.Second); err != nil {
				t.Fatalf("control: the pod reaches another default-network pod over eth0 before ovn-udn1: %v", err)
			}

			udnRT := rt(ns, pod, nsPath, "ctr-probe-"+pod, "ovn-udn1")
			if err := nl.Do(node, func() error { _, err := cniCfg.AddNetworkList(ctx, udn, udnRT); return err }); err != nil {
				t.Fatalf("ADD ovn-udn1: %v", err)
			}
			t.Cleanup(func() { _ = nl.Do(node, func() error { return cniCfg.DelNetworkList(ctx, udn, udnRT) }) })

			if err := reachName(node, ip.String(), pod, 5*time.Second); err != nil {
				t.Errorf("the node probes eth0 after ovn-udn1 took the default route: %v", err)
			}
			if err := reachName(nsPath, other.String(), "other", 0); err == nil {
				t.Error("the pod reached another pod of the default network over eth0")
			}
		})
	}
}

// podAddr returns the IPv4 address of ifName in the namespace at nsPath.
func podAddr(t *testing.T, nsPath, ifName string) net.IP {
	t.Helper()
	h, err := nl.NewHandle(nsPath)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	l, err := h.LinkByName(ifName)
	if err != nil {
		t.Fatal(err)
	}
	addrs, err := h.AddrList(l, netlink.FAMILY_V4)
	if err != nil || len(addrs) == 0 {
		t.Fatalf("addresses of %s: %v %v", ifName, addrs, err)
	}
	return addrs[0].IP
}

// defaultVia adds, in the namespace at nsPath, a default route via gw on
// ifName.
func defaultVia(nsPath, ifName string, gw net.IP) error {
	h, err := nl.NewHandle(nsPath)
	if err != nil {
		return err
	}
	defer h.Close()
	l, err := h.LinkByName(ifName)
	if err != nil {
		return err
	}
	return h.RouteReplace(&netlink.Route{LinkIndex: l.Attrs().Index, Gw: gw})
}

// routeFrom makes the current namespace's route to ip take src as its
// source address.
func routeFrom(ip, src net.IP) error {
	h, err := nl.NewHandle("")
	if err != nil {
		return err
	}
	defer h.Close()
	rs, err := h.RouteGet(ip)
	if err != nil || len(rs) == 0 {
		return fmt.Errorf("route to %s: %v", ip, err)
	}
	r := &netlink.Route{LinkIndex: rs[0].LinkIndex, Dst: &net.IPNet{IP: ip, Mask: net.CIDRMask(32, 32)}, Scope: netlink.SCOPE_LINK, Src: src}
	return h.RouteReplace(r)
}
