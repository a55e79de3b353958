package cni

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"

	"kvnet.io/kvnet/internal/datapath"
	"kvnet.io/kvnet/internal/multus"
	"kvnet.io/kvnet/internal/podnetworks"
)

// DefaultNetworkArg is the CNI argument (args.cni of the network
// configuration; Multus injects a selection element's "cni-args" there)
// that makes kvnet-cni a pod's default network for Multus, the
// OVN-Kubernetes way: kvnet's webhook names the namespace's primary NAD in
// the pod's v1.multus-cni.io/default-network annotation with this argument
// set, Multus calls kvnet-cni as its master plugin for eth0, and kvnet-cni
// runs the cluster's default network itself for eth0, then attaches the
// primary network as ovn-udn1 and returns both in one result, the gateway
// on ovn-udn1 alone. Multus marks the interface whose address has the
// gateway default: true in network-status, in its one write, so KubeVirt
// and every other consumer see ovn-udn1 as the default network without a
// second writer (see addWithDefault).
const DefaultNetworkArg = "kvnet.io/attach-default-network"

// Where the cluster default network's configuration is found and where
// kvnet-cni keeps the configuration each pod's eth0 was added with (DEL
// must use the same one).
var (
	cniConfDir = hostFile{what: "CNI configuration directory", env: "KVNET_CNI_CONF_DIR", standard: "/etc/cni/net.d"}

	// defaultNetCacheDir is libcni's cache (results) and kvnet-cni's copy
	// of each eth0's configuration; $KVNET_CNI_CACHE_DIR overrides it.
	defaultNetCacheDir = "/var/lib/cni/kvnet"
)

// pluginsNotDefault are CNI types that are never the cluster default
// network: Multus itself (thin and thick) and kvnet.
var pluginsNotDefault = []string{"multus", "multus-shim", "kvnet-cni"}

// errNoDefaultNetwork: the node has no cluster default network
// configuration besides Multus's and kvnet's.
var errNoDefaultNetwork = errors.New("no cluster default network configuration")

// clusterDefaultNetwork returns the node's cluster default network: the
// first configuration file in dir, in lexical order (.conf, .conflist,
// .json), that is neither Multus's nor kvnet's, as Multus picks it. A file
// that does not parse is skipped, as the runtime skips it.
func clusterDefaultNetwork(dir string) (*libcni.NetworkConfigList, string, error) {
	files, err := libcni.ConfFiles(dir, []string{".conf", ".conflist", ".json"})
	if err != nil {
		return nil, "", err
	}
	slices.Sort(files)
	for _, f := range files {
		list, err := loadConfList(f)
		if err != nil {
			continue
		}
		mine := false
		for _, p := range list.Plugins {
			if slices.Contains(pluginsNotDefault, p.Network.Type) {
				mine = true
			}
		}
		if !mine && len(list.Plugins) > 0 {
			return list, f, nil
		}
	}
	return nil, "", fmt.Errorf("%w in %s (besides Multus's and kvnet's)", errNoDefaultNetwork, dir)
}

// loadConfList reads a .conflist, or a single configuration as a list.
func loadConfList(path string) (*libcni.NetworkConfigList, error) {
	if strings.HasSuffix(path, ".conflist") {
		return libcni.ConfListFromFile(path)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	conf, err := libcni.NetworkPluginConfFromBytes(b)
	if err != nil {
		return nil, err
	}
	return libcni.ConfListFromConf(conf)
}

func cacheDir() string {
	if d := os.Getenv("KVNET_CNI_CACHE_DIR"); d != "" {
		return d
	}
	return filepath.Join(hostRoot, defaultNetCacheDir)
}

// savedConfPath is where ADD keeps the configuration a container's eth0
// was added with.
func savedConfPath(containerID string) string {
	return filepath.Join(cacheDir(), "default-network", containerID+".conflist")
}

// runtimeConf is the cluster default network's invocation for the pod:
// the runtime's container, netns, interface and arguments, and the
// runtime's capabilities (port mappings, ...).
func runtimeConf(args *skel.CmdArgs, r *request) *libcni.RuntimeConf {
	rt := &libcni.RuntimeConf{ContainerID: args.ContainerID, NetNS: args.Netns, IfName: args.IfName, CapabilityArgs: r.runtimeConfig}
	for _, kv := range strings.Split(args.Args, ";") {
		if k, v, ok := strings.Cut(kv, "="); ok && k != "" {
			rt.Args = append(rt.Args, [2]string{k, v})
		}
	}
	return rt
}

func cniExec(args *skel.CmdArgs) *libcni.CNIConfig {
	return libcni.NewCNIConfigWithCacheDir(filepath.SplitList(args.Path), cacheDir(), nil)
}

// addWithDefault is ADD as the pod's default network for Multus: the
// cluster default network's plugins (found as Multus finds them) make
// args.IfName (eth0), then the primary network is attached as ovn-udn1,
// and the result holds both. eth0's addresses lose their gateway and
// ovn-udn1's keep theirs: Multus marks the interface of the first address
// with a gateway default: true in network-status, and the runtime takes
// eth0's addresses as the pod IPs. The configuration eth0 was added with
// is kept for DEL.
func (p *Plugin) addWithDefault(args *skel.CmdArgs, r *request, a podnetworks.Attachment) error {
	if args.IfName == multus.PrimaryInterface {
		return types.NewError(types.ErrInvalidNetworkConfig, "invalid interface",
			fmt.Sprintf("args.cni[%q] makes kvnet-cni the default network: the runtime's interface cannot be %s, which it attaches the primary network as", DefaultNetworkArg, multus.PrimaryInterface))
	}
	dir, err := cniConfDir.find(hostRoot, "", os.Getenv)
	if err != nil {
		return types.NewError(types.ErrTryAgainLater, "cluster default network not found", err.Error())
	}
	list, file, err := clusterDefaultNetwork(dir)
	if err != nil {
		// The default network's plugin may not have written its file yet.
		return types.NewError(types.ErrTryAgainLater, "cluster default network not found", err.Error())
	}
	saved := savedConfPath(args.ContainerID)
	if err := os.MkdirAll(filepath.Dir(saved), 0o700); err != nil {
		return types.NewError(types.ErrInternal, "keep the default network's configuration", err.Error())
	}
	rt := runtimeConf(args, r)
	// The record first: collection (keptgc.go) takes a configuration
	// without one for an older kvnet-cni's.
	if err := writeKeptRecord(rt); err != nil {
		return types.NewError(types.ErrInternal, "record the default network's invocation", err.Error())
	}
	if err := writeFileAtomic(saved, list.Bytes, 0o600); err != nil {
		return types.NewError(types.ErrInternal, "keep the default network's configuration", err.Error())
	}
	r.tr.mark("defaultconf")
	ctx := context.Background()
	defRes, err := cniExec(args).AddNetworkList(ctx, list, rt)
	r.tr.mark("defaultnet")
	if err != nil {
		return types.NewError(types.ErrInternal, fmt.Sprintf("cluster default network %q (%s)", list.Name, file), err.Error())
	}
	def, err := current.NewResultFromResult(defRes)
	if err != nil {
		return types.NewError(types.ErrInternal, fmt.Sprintf("cluster default network %q result", list.Name), err.Error())
	}
	own := *args
	own.IfName = multus.PrimaryInterface
	res, err := wire(&own, r, a)
	if err != nil {
		return err // the runtime calls DEL, which removes eth0 too
	}
	version := masterResultVersion(r.version)
	merged, err := mergeDefault(def, res).GetAsVersion(version)
	if err != nil {
		return types.NewError(types.ErrIncompatibleCNIVersion, "result version", err.Error())
	}
	err = types.PrintResult(merged, version)
	r.tr.mark("result")
	return err
}

// masterResultVersion is the CNI version of addWithDefault's result: the
// request's, but 1.1.0 is answered as 1.0.0. As Multus's default network
// kvnet-cni's result goes back to the container runtime, and thin Multus
// prints it unconverted (thick Multus converts it to its own
// configuration's version); runtimes whose CNI library predates 1.1.0
// read results up to 1.0.0 only (containerd 1.6 and 1.7: "unsupported CNI
// result version \"1.1.0\"", seen on the real cluster with thin Multus).
// CNI 1.1.0 changed no field of the ADD result, so 1.0.0 loses nothing.
func masterResultVersion(requested string) string {
	if requested == "" || requested == "1.1.0" {
		return "1.0.0"
	}
	return requested
}

// mergeDefault returns the cluster default network's result def followed
// by the primary network's own: own's address indexes shifted past def's
// interfaces, def's addresses without gateways and its default routes
// dropped (ovn-udn1 has the pod's default route).
func mergeDefault(def, own *current.Result) *current.Result {
	out := &current.Result{CNIVersion: current.ImplementedSpecVersion, DNS: def.DNS}
	out.Interfaces = append(append(out.Interfaces, def.Interfaces...), own.Interfaces...)
	for _, ip := range def.IPs {
		c := *ip
		c.Gateway = nil
		out.IPs = append(out.IPs, &c)
	}
	for _, ip := range own.IPs {
		c := *ip
		if c.Interface != nil {
			idx := *c.Interface + len(def.Interfaces)
			c.Interface = &idx
		}
		out.IPs = append(out.IPs, &c)
	}
	for _, rt := range def.Routes {
		if ones, _ := rt.Dst.Mask.Size(); ones == 0 {
			continue
		}
		out.Routes = append(out.Routes, rt)
	}
	out.Routes = append(out.Routes, own.Routes...)
	return out
}

// addedWithDefault reports whether the container's interface args.IfName
// of a primary network was added by addWithDefault, whose configuration
// of the default network is kept: DEL must undo both even when its
// configuration lacks DefaultNetworkArg (a runtime or Multus that
// reloaded the NAD without the element's cni-args).
func addedWithDefault(args *skel.CmdArgs, r *request) bool {
	if !r.served.IsPrimary() || args.IfName == multus.PrimaryInterface {
		return false
	}
	_, err := os.Stat(savedConfPath(args.ContainerID))
	return err == nil
}

// delWithDefault undoes addWithDefault: ovn-udn1's host end, then the
// cluster default network with the configuration eth0 was added with (the
// node's current one if ADD never kept one). It succeeds when everything
// is gone already.
func delWithDefault(args *skel.CmdArgs, r *request) error {
	// The default network's DEL runs even when ovn-udn1's fails: its
	// addresses must not leak; the runtime retries DEL on an error.
	var teardown error
	if err := datapath.TeardownPodInterface(HostIfName(args.ContainerID, multus.PrimaryInterface)); err != nil {
		teardown = types.NewError(types.ErrInternal, "tear down pod interface", err.Error())
	}
	if err := delDefault(args, r); err != nil {
		return err
	}
	return teardown
}

// delDefault runs the cluster default network's DEL for the container
// with the configuration its ADD kept (the node's current one when none
// was kept), then forgets that configuration and its record.
func delDefault(args *skel.CmdArgs, r *request) error {
	saved := savedConfPath(args.ContainerID)
	list, err := libcni.ConfListFromFile(saved)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		dir, derr := cniConfDir.find(hostRoot, "", os.Getenv)
		if derr != nil {
			return nil // no default network on this node: nothing was added
		}
		if list, _, err = clusterDefaultNetwork(dir); err != nil {
			return nil
		}
	case err != nil:
		return types.NewError(types.ErrInternal, "read the default network's configuration", err.Error())
	}
	if err := cniExec(args).DelNetworkList(context.Background(), list, runtimeConf(args, r)); err != nil {
		return types.NewError(types.ErrInternal, fmt.Sprintf("cluster default network %q", list.Name), err.Error())
	}
	for _, p := range []string{saved, keptRecordPath(args.ContainerID)} {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return types.NewError(types.ErrInternal, "forget the default network's configuration", err.Error())
		}
	}
	return nil
}

// checkWithDefault is CHECK as the default network: the cluster default
// network's own CHECK (libcni has its cached result), then ovn-udn1.
func checkWithDefault(args *skel.CmdArgs, r *request, a podnetworks.Attachment) error {
	list, err := libcni.ConfListFromFile(savedConfPath(args.ContainerID))
	if err != nil {
		return types.NewError(types.ErrInternal, "read the default network's configuration", err.Error())
	}
	if err := cniExec(args).CheckNetworkList(context.Background(), list, runtimeConf(args, r)); err != nil {
		return types.NewError(types.ErrInternal, fmt.Sprintf("cluster default network %q", list.Name), err.Error())
	}
	return checkInterface(args.Netns, multus.PrimaryInterface, a)
}
