package cni_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	current "github.com/containernetworking/cni/pkg/types/100"
	nadutils "github.com/k8snetworkplumbingwg/network-attachment-definition-client/pkg/utils"
	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nadv1 "kvnet.io/kvnet/api/k8scni/v1"
	"kvnet.io/kvnet/internal/multus"
	"kvnet.io/kvnet/internal/nl"
	"kvnet.io/kvnet/internal/podnetworks"
	"kvnet.io/kvnet/internal/testenv"
)

// TestAttachDefaultNetwork: kvnet-cni as a pod's default network for
// Multus (the primary NAD with args.cni "kvnet.io/attach-default-network",
// as Multus injects the webhook's cni-args). Called for eth0, it runs the
// node's cluster default network (a conflist of the upstream bridge and
// host-local plugins, found in the CNI configuration directory past
// Multus's own file) for eth0, attaches the primary network as ovn-udn1,
// and returns both. Fed to the NAD client's CreateNetworkStatuses as
// Multus feeds its master plugin's result, ovn-udn1 is the one default
// entry and eth0 carries the default network's address; the pod's default
// route is ovn-udn1's. DEL removes both and releases eth0's address in
// host-local, even when its configuration lacks the cni-arg. The result
// is CNI 1.0.0 for the NAD's 1.1.0, for runtimes that read no newer
// result through thin Multus.
func TestAttachDefaultNetwork(t *testing.T) {
	testenv.NeedsFixture(t, cniCfg != nil)
	ctx := context.Background()
	const ns = "cni-master"
	f := newDefaultNetFixture(ctx, t, ns, "kvdefbr0", "10.84.0.0/24", "10.85.0.0/24", true)
	hostLocal, conf := f.hostLocal, f.conf
	plainConfig, _ := json.Marshal(conf)
	conf["args"] = map[string]any{"cni": map[string]any{multus.AttachDefaultNetworkArg: true}}
	config, _ := json.Marshal(conf)
	list := confList(t, string(config))
	// The same NAD without the element's cni-args, as a DEL from a
	// runtime or Multus that reloaded the NAD would bring it.
	plain := confList(t, string(plainConfig))

	create(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "p"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}})
	var alloc podnetworks.Attachment
	testenv.Eventually(t, waitTimeout, "primary allocation of p", func() error {
		var p corev1.Pod
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "p"}, &p); err != nil {
			return err
		}
		nets, err := podnetworks.Parse(p.Annotations[podnetworks.Annotation])
		if err != nil {
			return err
		}
		a, ok := nets[ns+"/net"]
		if !ok {
			return fmt.Errorf("no entry for %s/net in %v", ns, nets)
		}
		alloc = a
		return nil
	})
	udnIP := strings.Split(alloc.IPAddresses[0], "/")[0]

	nsPath := netnsFor(t)
	r := rt(ns, "p", nsPath, "ctr-master", "eth0")
	res, err := cniCfg.AddNetworkList(ctx, list, r)
	if err != nil {
		t.Fatalf("ADD: %v", err)
	}
	deleted := false
	t.Cleanup(func() {
		if !deleted {
			_ = cniCfg.DelNetworkList(ctx, list, r)
		}
	})

	// Thin Multus hands the result to the runtime as it is, and
	// containerd 1.6/1.7 read results up to CNI 1.0.0.
	if conf["cniVersion"] == "1.1.0" && res.Version() != "1.0.0" {
		t.Errorf("result version %s for a %s configuration, want 1.0.0", res.Version(), conf["cniVersion"])
	}
	// What Multus writes for its master plugin.
	statuses, err := nadutils.CreateNetworkStatuses(res, ns+"/net", true, nil)
	if err != nil {
		t.Fatal(err)
	}
	byIface := map[string]bool{}
	var eth0IP string
	for _, s := range statuses {
		byIface[s.Interface] = s.Default
		if s.Interface == "eth0" && len(s.IPs) > 0 {
			eth0IP = s.IPs[0]
		}
		if s.Interface == multus.PrimaryInterface && (len(s.IPs) != 1 || s.IPs[0] != udnIP) {
			t.Errorf("network-status ovn-udn1 IPs %v, want [%s]", s.IPs, udnIP)
		}
	}
	if !byIface[multus.PrimaryInterface] || byIface["eth0"] || len(byIface) != 2 {
		b, _ := json.Marshal(statuses)
		t.Fatalf("network-status from the result: %s; want eth0 and ovn-udn1, ovn-udn1 alone default", b)
	}
	if a, err := netip.ParseAddr(eth0IP); err != nil || !netip.MustParsePrefix("10.84.0.0/24").Contains(a) {
		t.Errorf("eth0's address %q is not the default network's (10.84.0.0/24)", eth0IP)
	}
	// The runtime takes eth0's addresses as the pod IPs: they must be
	// indexed to eth0.
	cur, err := current.NewResultFromResult(res)
	if err != nil {
		t.Fatal(err)
	}
	for _, ip := range cur.IPs {
		if ip.Interface == nil || *ip.Interface >= len(cur.Interfaces) {
			t.Fatalf("result IP %s has no valid interface index", ip.Address.String())
		}
		iface := cur.Interfaces[*ip.Interface].Name
		if want := map[bool]string{true: multus.PrimaryInterface, false: "eth0"}[ip.Address.IP.String() == udnIP]; iface != want {
			t.Errorf("result IP %s indexed to %s, want %s", ip.Address.String(), iface, want)
		}
	}

	h, err := nl.NewHandle(nsPath)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	routes, err := h.RouteList(nil, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	defaultVia := ""
	for _, rt := range routes {
		if rt.Dst == nil || rt.Dst.String() == "0.0.0.0/0" {
			if l, err := h.LinkByIndex(rt.LinkIndex); err == nil && rt.Table == 254 {
				defaultVia = l.Attrs().Name
			}
		}
	}
	if defaultVia != multus.PrimaryInterface {
		t.Errorf("pod's default route leaves through %q, want %s", defaultVia, multus.PrimaryInterface)
	}
	if leases, _ := filepath.Glob(filepath.Join(hostLocal, "defnet", "10.84.0.*")); len(leases) != 1 {
		t.Errorf("host-local holds %v, want eth0's one address", leases)
	}

	if err := cniCfg.DelNetworkList(ctx, plain, r); err != nil {
		t.Fatalf("DEL without the cni-arg: %v", err)
	}
	deleted = true
	for _, name := range []string{"eth0", multus.PrimaryInterface} {
		if _, err := h.LinkByName(name); err == nil {
			t.Errorf("%s still in the pod's namespace after DEL", name)
		}
	}
	if leases, _ := filepath.Glob(filepath.Join(hostLocal, "defnet", "10.84.0.*")); len(leases) != 0 {
		t.Errorf("host-local still holds %v after DEL: the default network's DEL did not run", leases)
	}
	// DEL again (the runtime retries): nothing left, no error.
	if err := cniCfg.DelNetworkList(ctx, list, r); err != nil {
		t.Errorf("second DEL: %v", err)
	}
}

// defaultNetFixture is a node whose cluster default network is the
// upstream bridge plugin (bridge) with host-local on defSubnet, found in
// a CNI configuration directory (after Multus's own file when withMultus)
// through KVNET_CNI_CONF_DIR, kvnet-cni's cache in KVNET_CNI_CACHE_DIR,
// and namespace ns with a primary Layer2 UDN on udnSubnet whose NAD's
// configuration (statusFile set, no cni-args) is conf.
type defaultNetFixture struct {
	hostLocal, cacheDir string
	plugin              string // the bridge plugin's configuration in the conflist
	conf                map[string]any
}

func newDefaultNetFixture(ctx context.Context, t *testing.T, ns, bridge, defSubnet, udnSubnet string, withMultus bool) defaultNetFixture {
	t.Helper()
	dir := t.TempDir()
	f := defaultNetFixture{hostLocal: filepath.Join(dir, "host-local"), cacheDir: filepath.Join(dir, "cache")}
	statusFile := filepath.Join(dir, "status.json")
	if err := os.WriteFile(statusFile, []byte(`{"ready":true,"exhaustedNetworks":[]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	confDir := filepath.Join(dir, "net.d")
	if err := os.MkdirAll(confDir, 0o755); err != nil {
		t.Fatal(err)
	}
	f.plugin = fmt.Sprintf(`{"type":"bridge","bridge":%q,"isGateway":true,"isDefaultGateway":true,
		"ipam":{"type":"host-local","dataDir":%q,"ranges":[[{"subnet":%q}]]}}`, bridge, f.hostLocal, defSubnet)
	files := map[string]string{
		"10-default.conflist": `{"cniVersion":"1.0.0","name":"defnet","plugins":[` + f.plugin + `]}`,
	}
	if withMultus {
		// Multus's own file comes first and must be passed over.
		files["00-multus.conf"] = `{"cniVersion":"1.0.0","name":"multus-cni-network","type":"multus-shim"}`
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(confDir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("KVNET_CNI_CONF_DIR", confDir)
	t.Setenv("KVNET_CNI_CACHE_DIR", f.cacheDir)
	t.Cleanup(func() {
		if l, err := netlink.LinkByName(bridge); err == nil {
			_ = netlink.LinkDel(l)
		}
	})
	create(t, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns,
		Labels: map[string]string{"k8s.ovn.org/primary-user-defined-network": ""}}})
	create(t, primaryUDNObject(ns, udnSubnet))
	var nad nadv1.NetworkAttachmentDefinition
	testenv.Eventually(t, waitTimeout, "NAD", func() error {
		return c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "net"}, &nad)
	})
	if err := json.Unmarshal([]byte(nad.Spec.Config), &f.conf); err != nil {
		t.Fatal(err)
	}
	f.conf["statusFile"] = statusFile
	return f
}
