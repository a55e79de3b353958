package node_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"k8s.io/client-go/rest"

	"kvnet.io/kvnet/internal/datapath"
	"kvnet.io/kvnet/internal/nl"
	"kvnet.io/kvnet/internal/node"
	"kvnet.io/kvnet/internal/testenv"
)

// TestCleanup: a node where kvnet-node ran (a primary Layer2 network with
// a pod plumbed by the real kvnet-cni, kvnet-node's files for kvnet-cni)
// is left with nothing of kvnet after Cleanup, while the node's other
// links, nftables tables, namespaces and CNI files (some with names close
// to kvnet's) stay; a second Cleanup removes nothing and succeeds.
func TestCleanup(t *testing.T) {
	l := newLab(t, "n1")
	nad := tenant(t, "cleanup-a", "10.1.7.0/24", false)
	p := l.runPod(nad, "c1", "n1", nil)
	id := networkID(t, nad)
	nodeNS := l.node("n1").NS
	dpCfg := datapath.NodeConfig{Name: "n1", NetNS: nodeNS}
	router := datapath.RouterNSName(dpCfg, id)
	bridge := datapath.BridgeName(id)
	testenv.Eventually(t, waitTimeout, "kvnet-node made the network's bridge and router", func() error {
		if !linkExists(nodeNS, bridge) || !nl.NamedNSExists(router) {
			return fmt.Errorf("bridge %s %v, router %s %v", bridge, linkExists(nodeNS, bridge), router, nl.NamedNSExists(router))
		}
		return nil
	})
	// kvnet-node stops (its DaemonSet is deleted first), else it would
	// make everything again.
	l.stopAgent("n1")

	// Someone else's things next to kvnet's.
	withNodeHandle(t, nodeNS, func(h *nl.Handle) error {
		// kvbr0: no kvnet network has ID 0.
		return h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "kvbr0"}, PeerName: "other0"})
	})
	otherNS := strings.TrimSuffix(router, fmt.Sprint(id)) + "x"
	if _, err := nl.CreateNamedNS(otherNS); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nl.DeleteNamedNS(otherNS) })
	conn := nftConnIn(t, nodeNS)
	conn.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: "other"})
	if err := conn.Flush(); err != nil {
		t.Fatal(err)
	}

	// kvnet-node's files for kvnet-cni, as it writes them, and kvnet-cni's
	// cache, under a node root of the test's own.
	root := t.TempDir()
	bin := filepath.Join(root, "opt/cni/bin")
	mkdirs(t, bin, filepath.Join(root, "run"), filepath.Join(root, "var/lib/cni/networks"), filepath.Join(root, "etc/cni/net.d"))
	if err := node.InstallCNI(cniBinary, bin); err != nil {
		t.Fatal(err)
	}
	if _, err := node.WriteCNIKubeconfig(filepath.Join(root, "etc/cni/net.d/kvnet.d/kvnet.kubeconfig"), &rest.Config{Host: "https://192.0.2.1", BearerToken: "t"}); err != nil {
		t.Fatal(err)
	}
	kvnetFiles := []string{"opt/cni/bin/kvnet-cni", "opt/cni/bin/kvnet-ipam", "opt/cni/bin/.kvnet-cni-123",
		"etc/cni/net.d/kvnet.d", "run/kvnet", "var/lib/cni/kvnet"}
	otherFiles := []string{"opt/cni/bin/bridge", "opt/cni/bin/kvnet-other", "etc/cni/net.d/10-flannel.conflist",
		"etc/cni/net.d/kvnet.conf", "run/flannel", "var/lib/cni/networks/cbr0"}
	for _, f := range append([]string{"opt/cni/bin/.kvnet-cni-123", "run/kvnet/cni-status.json", "var/lib/cni/kvnet/default-network/ctr.conflist"}, otherFiles...) {
		writeFile(t, filepath.Join(root, f))
	}
	cfg := node.CleanupConfig{Datapath: dpCfg, HostRoot: root}

	before, err := node.Leftovers(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"link " + bridge, "link " + p.hostIf(t, l), "netns " + router, "nftables table bridge kvnet", "nftables table inet kvnet",
		"file " + filepath.Join(root, "run/kvnet"), "file " + filepath.Join(root, "opt/cni/bin/kvnet-cni")} {
		if !slices.Contains(before, want) {
			t.Errorf("before cleanup: leftovers %q lack %q", before, want)
		}
	}

	removed, err := node.Cleanup(cfg)
	t.Logf("removed: %q", removed)
	if err != nil {
		t.Fatalf("cleanup: %v", err)
	}
	if !slices.Equal(removed, before) {
		t.Errorf("cleanup removed %q, want what Leftovers listed: %q", removed, before)
	}

	// Checked without node.Leftovers, which shares Cleanup's matching.
	var links []string
	withNodeHandle(t, nodeNS, func(h *nl.Handle) error {
		ls, err := h.LinkList()
		for _, l := range ls {
			links = append(links, l.Attrs().Name)
		}
		return err
	})
	for _, name := range links {
		if strings.HasPrefix(name, "kv") && name != "kvbr0" {
			t.Errorf("link %s left in the node namespace (links %v)", name, links)
		}
	}
	for _, name := range []string{"kvbr0", "other0"} {
		if !slices.Contains(links, name) {
			t.Errorf("cleanup deleted %s, which is not kvnet's (links %v)", name, links)
		}
	}
	if nl.NamedNSExists(router) {
		t.Errorf("router namespace %s left", router)
	}
	if !nl.NamedNSExists(otherNS) {
		t.Errorf("cleanup deleted namespace %s, which is not kvnet's", otherNS)
	}
	tables, err := nftConnIn(t, nodeNS).ListTables()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tb := range tables {
		names = append(names, tb.Name)
	}
	if slices.Contains(names, "kvnet") || !slices.Contains(names, "other") {
		t.Errorf("nftables tables after cleanup %v, want other's kept and no kvnet", names)
	}
	for _, f := range kvnetFiles {
		if _, err := os.Lstat(filepath.Join(root, f)); !os.IsNotExist(err) {
			t.Errorf("%s left (%v)", f, err)
		}
	}
	for _, f := range otherFiles {
		if _, err := os.Lstat(filepath.Join(root, f)); err != nil {
			t.Errorf("cleanup removed %s, which is not kvnet's: %v", f, err)
		}
	}

	again, err := node.Cleanup(cfg)
	if err != nil || len(again) > 0 {
		t.Errorf("second cleanup: removed %q, %v; want nothing, no error", again, err)
	}
	if left, err := node.Leftovers(cfg); err != nil || len(left) > 0 {
		t.Errorf("leftovers after cleanup: %q, %v", left, err)
	}
}

// hostIf returns the host end of p's veth in the node namespace: the
// link whose peer is p's interface.
func (p *pod) hostIf(t *testing.T, l *lab) string {
	t.Helper()
	var peer int
	withNodeHandle(t, p.netns, func(h *nl.Handle) error {
		link, err := h.LinkByName(p.ifName)
		if err == nil {
			peer = link.Attrs().ParentIndex
		}
		return err
	})
	var name string
	withNodeHandle(t, l.node(p.node).NS, func(h *nl.Handle) error {
		link, err := h.LinkByIndex(peer)
		if err == nil {
			name = link.Attrs().Name
		}
		return err
	})
	if !datapath.IsPodHostIf(name) {
		t.Fatalf("host end of %s's %s is %q, not a kvnet-cni host interface", p.name, p.ifName, name)
	}
	return name
}

func withNodeHandle(t *testing.T, ns string, f func(*nl.Handle) error) {
	t.Helper()
	h, err := nl.NewHandle(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if err := f(h); err != nil {
		t.Fatal(err)
	}
}

func nftConnIn(t *testing.T, ns string) *nftables.Conn {
	t.Helper()
	fd, err := nl.OpenNS(ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fd.Close() })
	conn, err := nftables.New(nftables.WithNetNSFd(int(fd)))
	if err != nil {
		t.Fatal(err)
	}
	return conn
}

func mkdirs(t *testing.T, dirs ...string) {
	t.Helper()
	for _, d := range dirs {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
}

func writeFile(t *testing.T, path string) {
	t.Helper()
	mkdirs(t, filepath.Dir(path))
	if err := os.WriteFile(path, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
}
