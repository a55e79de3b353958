//go:build cluster

package cluster

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// kvnetNodeState lists what kvnet left on node i (1-based), looked at from
// outside, independently of kvnet-node's own cleanup code: links whose
// name starts with "kv" in the node's network namespace, its nftables
// tables named kvnet, namespaces named kvnet-* in its /run/netns, its
// /run/kvnet (the node's /run is a tmpfs of its mount namespace, read
// through its PID 1's /proc/<pid>/root), and kvnet-cni's files in the
// node's own /opt/cni/bin, /etc/cni and /var/lib/cni (bind-mounted from
// <cluster dir>/nodes/node-i/root).
func (c *Cluster) kvnetNodeState(i int) ([]string, error) {
	var left []string
	ns, err := netns.GetFromPath("/run/netns/" + Netns(i))
	if err != nil {
		return nil, fmt.Errorf("open netns %s: %w", Netns(i), err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return nil, err
	}
	defer h.Close()
	links, err := h.LinkList()
	if err != nil {
		return nil, fmt.Errorf("list links of %s: %w", NodeName(i), err)
	}
	for _, l := range links {
		if strings.HasPrefix(l.Attrs().Name, "kv") {
			left = append(left, "link "+l.Attrs().Name)
		}
	}
	conn, err := nftables.New(nftables.WithNetNSFd(int(ns)))
	if err != nil {
		return nil, err
	}
	tables, err := conn.ListTables()
	if err != nil {
		return nil, fmt.Errorf("list nftables tables of %s: %w", NodeName(i), err)
	}
	for _, t := range tables {
		if t.Name == "kvnet" {
			left = append(left, "nftables table "+familyName[t.Family]+" kvnet")
		}
	}

	pid, err := c.nodeInitPID(i)
	if err != nil {
		return nil, err
	}
	nodeRun := filepath.Join("/proc", strconv.Itoa(pid), "root", "run")
	entries, err := os.ReadDir(filepath.Join(nodeRun, "netns"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "kvnet-") {
			left = append(left, "netns "+e.Name())
		}
	}
	root := filepath.Join(c.Dir, "nodes", NodeName(i), "root")
	for _, p := range []string{filepath.Join(nodeRun, "kvnet"),
		filepath.Join(root, "opt/cni/bin/kvnet-cni"), filepath.Join(root, "opt/cni/bin/kvnet-ipam"),
		filepath.Join(root, "etc/cni/net.d/kvnet.d"), filepath.Join(root, "var/lib/cni/kvnet")} {
		if _, err := os.Lstat(p); err == nil {
			left = append(left, "file "+p)
		} else if !errors.Is(err, fs.ErrNotExist) {
			return nil, err
		}
	}
	return left, nil
}

var familyName = map[nftables.TableFamily]string{
	nftables.TableFamilyBridge: "bridge", nftables.TableFamilyINet: "inet", nftables.TableFamilyIPv4: "ip",
	nftables.TableFamilyIPv6: "ip6", nftables.TableFamilyARP: "arp", nftables.TableFamilyNetdev: "netdev",
}

// nodeInitPID returns the PID of node i's PID 1 (its init.sh): the child
// of the unshare the cluster started for the node.
func (c *Cluster) nodeInitPID(i int) (int, error) {
	for _, p := range c.procs {
		if p.name != "node "+NodeName(i) || p.cmd.Process == nil {
			continue
		}
		pid := p.cmd.Process.Pid
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
		if err != nil {
			return 0, fmt.Errorf("node %s: %w", NodeName(i), err)
		}
		f := strings.Fields(string(b))
		if len(f) != 1 {
			return 0, fmt.Errorf("node %s: unshare %d has children %q, want its init alone", NodeName(i), pid, f)
		}
		return strconv.Atoi(f[0])
	}
	return 0, fmt.Errorf("node %s: no process of the cluster's", NodeName(i))
}
