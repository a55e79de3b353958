package node_test

import (
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"kvnet.io/kvnet/internal/lab/simcluster"
	"kvnet.io/kvnet/internal/nl"
	"kvnet.io/kvnet/internal/portalias"
	"kvnet.io/kvnet/internal/testenv"
)

// TestAgentAttachesPortLabelledWhileDown: kvnet-cni creates a pod's host
// end down and labels it (alias) afterwards; the kernel announces an alias
// change only for a link that is up, so kvnet-node hears of the link once,
// before it carries the alias. It must still attach the port soon, not at
// the next resync (an hour here) or at some unrelated event. This is what
// kept a live migration's target port unattached until the VMI moved.
func TestAgentAttachesPortLabelledWhileDown(t *testing.T) {
	testenv.NeedsFixture(t, env != nil)
	nad := tenant(t, "alias-late", "10.66.0.0/24", false)
	l := newLabWith(t, env.Config, kubeconfig, func(cfg *simcluster.Config) { cfg.Resync = time.Hour }, "a")
	p := l.allocatedPod(nad, "late", "a", "ovn-udn1", nil)
	nodeNS := l.node("a").NS
	host := "kvplatealias"

	// The host end, down and unlabelled, as kvnet-cni makes it.
	h, err := nl.NewHandle(nodeNS)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	podNS, err := netns.GetFromPath(p.netns)
	if err != nil {
		t.Fatal(err)
	}
	defer podNS.Close()
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: host}, PeerName: "ovn-udn1", PeerNamespace: netlink.NsFd(int(podNS))}
	if err := h.LinkAdd(veth); err != nil {
		t.Fatal(err)
	}
	// kvnet-node has seen the link and planned without it: the pod's
	// attachment waits for its host interface.
	testenv.Eventually(t, waitTimeout, "kvnet-node waiting for the pod's port", func() error {
		if w := waitingPorts(t, l.nodeName("a")); w < 1 {
			return fmt.Errorf("kvnet_node_waiting_ports = %v", w)
		}
		return nil
	})
	link, err := h.LinkByName(host)
	if err != nil {
		t.Fatal(err)
	}
	if link.Attrs().MasterIndex != 0 {
		t.Fatal("the unlabelled port is already attached")
	}
	if err := h.LinkSetAlias(link, portalias.Format(p.ns+"/"+p.name, p.ns+"/"+nad.Name)); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, waitTimeout, "the labelled port attached to the network's bridge", func() error {
		l, err := h.LinkByName(host)
		if err != nil {
			return err
		}
		if l.Attrs().MasterIndex == 0 || l.Attrs().Flags&net.FlagUp == 0 {
			return fmt.Errorf("%s: master %d, flags %s", host, l.Attrs().MasterIndex, l.Attrs().Flags)
		}
		master, err := h.LinkByIndex(l.Attrs().MasterIndex)
		if err != nil {
			return err
		}
		if want := fmt.Sprintf("kvbr%d", networkID(t, nad)); master.Attrs().Name != want {
			return fmt.Errorf("%s is a port of %s, want %s", host, master.Attrs().Name, want)
		}
		return nil
	})
}

// waitingPorts reads kvnet_node_waiting_ports of node from the process's
// metrics (the lab's agents run in this test process).
func waitingPorts(t *testing.T, node string) float64 {
	t.Helper()
	mfs, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "kvnet_node_waiting_ports" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if labelValue(m, "node") == node {
				return m.GetGauge().GetValue()
			}
		}
	}
	return 0
}

func labelValue(m *dto.Metric, name string) string {
	for _, lp := range m.GetLabel() {
		if strings.EqualFold(lp.GetName(), name) {
			return lp.GetValue()
		}
	}
	return ""
}
