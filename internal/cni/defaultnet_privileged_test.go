package cni_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nadv1 "kvnet.io/kvnet/api/k8scni/v1"
	udnv1 "kvnet.io/kvnet/api/udn/v1"
	"kvnet.io/kvnet/internal/datapath"
	"kvnet.io/kvnet/internal/nl"
	"kvnet.io/kvnet/internal/testenv"
	"kvnet.io/kvnet/internal/testenv/nstest"
)

// TestDefaultNetworkOptOut: a pod on a primary UDN also has eth0 on the
// cluster default network (a bridge cni0 in a stand-in node namespace,
// 10.87.0.0/24, as Multus attaches it before ovn-udn1), and a pod of the
// default network only sits on the same bridge. kvnet-cni's ADD of
// ovn-udn1 restricts eth0 by default: an "inet kvnet" table in the pod's
// namespace, and the default-network pod's connections over eth0 are
// dropped. With kvnet-node's --allow-default-network in the status file,
// the same ADD programs no table and the default-network pod connects.
// Restricted, the primary-UDN pod opens no connection to the
// default-network pod over eth0 either; open, it does. The control: before
// ovn-udn1, eth0 carries traffic both ways.
func TestDefaultNetworkOptOut(t *testing.T) {
	testenv.NeedsFixture(t, cniCfg != nil)
	ctx := context.Background()
	const ns = "cni-defnet"
	statusFile := filepath.Join(t.TempDir(), "status.json")
	list := primaryUDN(t, ns, "10.86.0.0/24", statusFile)

	// The cluster default network.
	node := netnsFor(t)
	h, err := nl.NewHandle(node)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "cni0"}}
	if err := h.LinkAdd(br); err != nil {
		t.Fatal(err)
	}
	if err := h.AddrAdd(br, &netlink.Addr{IPNet: &net.IPNet{IP: net.IPv4(10, 87, 0, 1), Mask: net.CIDRMask(24, 32)}}); err != nil {
		t.Fatal(err)
	}
	if err := h.LinkSetUp(br); err != nil {
		t.Fatal(err)
	}
	// eth0 attaches the pod at nsPath to cni0 with ip, as the default
	// network's plugin would.
	eth0 := func(nsPath, host, ip string, mac byte) {
		t.Helper()
		if err := nl.Do(node, func() error {
			return datapath.SetupPodInterface(nsPath, datapath.DefaultNetworkIfName, host, net.HardwareAddr{2, 0x87, 0, 0, 0, mac},
				[]netip.Prefix{netip.MustParsePrefix(ip + "/24")}, nil, 1500)
		}); err != nil {
			t.Fatal(err)
		}
		l, err := h.LinkByName(host)
		if err != nil {
			t.Fatal(err)
		}
		if err := h.LinkSetMaster(l, br); err != nil {
			t.Fatal(err)
		}
		if err := h.LinkSetUp(l); err != nil {
			t.Fatal(err)
		}
	}
	const defIP = "10.87.0.12"
	def := netnsFor(t)
	eth0(def, "vddef", defIP, 12)
	serveName(t, def, defIP, "def")

	for i, tt := range []struct {
		name, status string
		open         bool // the default-network pod reaches the primary-UDN pod over eth0
	}{
		{"restricted by default", `{"ready":true,"exhaustedNetworks":[]}`, false},
		{"allowDefaultNetwork", `{"ready":true,"exhaustedNetworks":[],"allowDefaultNetwork":true}`, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			pod, ip := fmt.Sprintf("p%d", i), fmt.Sprintf("10.87.0.%d", 20+i)
			annotatedPod(t, ns, pod, "net@ovn-udn1")
			nsPath := netnsFor(t)
			eth0(nsPath, "vd"+pod, ip, byte(20+i))
			serveName(t, nsPath, ip, pod)
			// The control: eth0 carries traffic both ways before ovn-udn1.
			if err := reachName(nsPath, defIP, "def", 5*time.Second); err != nil {
				t.Fatalf("control: pod -> default-network pod over eth0: %v", err)
			}
			if err := reachName(def, ip, pod, 5*time.Second); err != nil {
				t.Fatalf("control: default-network pod -> pod over eth0: %v", err)
			}
			if err := os.WriteFile(statusFile, []byte(tt.status), 0o644); err != nil {
				t.Fatal(err)
			}
			r := rt(ns, pod, nsPath, "ctr-defnet-"+pod, "ovn-udn1")
			if _, err := cniCfg.AddNetworkList(ctx, list, r); err != nil {
				t.Fatalf("ADD ovn-udn1: %v", err)
			}
			t.Cleanup(func() { _ = cniCfg.DelNetworkList(ctx, list, r) })

			if got := hasKvnetTable(t, nsPath); got == tt.open {
				t.Errorf("inet kvnet table in the pod's namespace: %v, want %v", got, !tt.open)
			}
			if tt.open {
				if err := reachName(def, ip, pod, 5*time.Second); err != nil {
					t.Errorf("default-network pod -> primary-UDN pod over eth0 with allowDefaultNetwork: %v, want it to connect", err)
				}
				if err := reachName(nsPath, defIP, "def", 5*time.Second); err != nil {
					t.Errorf("primary-UDN pod -> default-network pod over eth0 with allowDefaultNetwork: %v, want it to connect", err)
				}
				return
			}
			if err := reachName(def, ip, pod, 0); err == nil {
				t.Error("default-network pod -> primary-UDN pod over eth0 connected; by default only the node may")
			}
			if err := reachName(nsPath, defIP, "def", 0); err == nil {
				t.Error("primary-UDN pod -> default-network pod over eth0 connected; by default it reaches only the node there")
			}
		})
	}
}

// primaryUDN makes namespace ns with a primary Layer2 UDN "net" on
// subnet and returns its NAD's configuration, kvnet-cni reading its
// status from statusFile.
func primaryUDN(t *testing.T, ns, subnet, statusFile string) *libcni.NetworkConfigList {
	t.Helper()
	create(t, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns,
		Labels: map[string]string{"k8s.ovn.org/primary-user-defined-network": ""}}})
	create(t, primaryUDNObject(ns, subnet))
	var nad nadv1.NetworkAttachmentDefinition
	testenv.Eventually(t, waitTimeout, "NAD", func() error {
		return c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "net"}, &nad)
	})
	var conf map[string]any
	if err := json.Unmarshal([]byte(nad.Spec.Config), &conf); err != nil {
		t.Fatal(err)
	}
	if conf["role"] != "primary" {
		t.Fatalf("NAD role %v, want primary", conf["role"])
	}
	conf["statusFile"] = statusFile
	config, _ := json.Marshal(conf)
	return confList(t, string(config))
}

// primaryUDNObject is a primary Layer2 UDN "net" in ns on subnet.
func primaryUDNObject(ns, subnet string) *udnv1.UserDefinedNetwork {
	return &udnv1.UserDefinedNetwork{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "net"},
		Spec: udnv1.UserDefinedNetworkSpec{Topology: udnv1.NetworkTopologyLayer2, Layer2: &udnv1.Layer2Config{
			Role: udnv1.NetworkRolePrimary, Subnets: udnv1.DualStackCIDRs{udnv1.CIDR(subnet)}}},
	}
}

// serveName answers every TCP connection to ip:8080 in the namespace at
// nsPath with name and a newline, until the test ends.
func serveName(t *testing.T, nsPath, ip, name string) {
	t.Helper()
	nstest.ServeLine(t, nsPath, ip+":8080", func(net.Conn) string { return name })
}

// reachName connects from the namespace at nsPath to ip:8080 and expects
// name back; it tries again until wait has passed (0: once). A fresh
// bridge and its ports may take a moment on a busy machine.
func reachName(nsPath, ip, name string, wait time.Duration) error {
	deadline := time.Now().Add(wait)
	for {
		got, err := nstest.ReadLine(nsPath, ip+":8080", time.Second)
		if err == nil && got != name {
			err = fmt.Errorf("answered by %q, not %s", got, name)
		}
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// hasKvnetTable reports whether the namespace at nsPath has an inet table
// named "kvnet" (the eth0 restriction).
func hasKvnetTable(t *testing.T, nsPath string) bool {
	t.Helper()
	nsh, err := nl.OpenNS(nsPath)
	if err != nil {
		t.Fatal(err)
	}
	defer nsh.Close()
	conn, err := nftables.New(nftables.WithNetNSFd(int(nsh)))
	if err != nil {
		t.Fatal(err)
	}
	tables, err := conn.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		t.Fatal(err)
	}
	for _, tb := range tables {
		if tb.Name == "kvnet" {
			return true
		}
	}
	return false
}
