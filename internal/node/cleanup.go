package node

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"kvnet.io/kvnet/internal/cni"
	"kvnet.io/kvnet/internal/datapath"
	"kvnet.io/kvnet/internal/netconf"
)

// CleanupConfig says where a node's kvnet state is, for Cleanup.
type CleanupConfig struct {
	// Datapath names the node's network namespace (NetNS, "" for the
	// caller's) and its router namespaces (RouterNSPrefix), as kvnet-node
	// ran with them.
	Datapath datapath.NodeConfig
	// HostRoot is where the node's root file system is seen: "/" on the
	// node itself, "/host" in the kvnet-node-cleanup DaemonSet's pod.
	HostRoot string
	// CNIBinDir is the node's CNI bin directory, where kvnet-node
	// installed kvnet-cni and kvnet-ipam; "" is <HostRoot>/opt/cni/bin.
	CNIBinDir string
}

// cniCacheDir is kvnet-cni's cache on the node (internal/cni: libcni's
// results and the configuration of each pod's default network).
const cniCacheDir = "/var/lib/cni/kvnet"

// kvnetDirs are the node's directories that are kvnet's alone, removed
// with everything in them: kvnet-node's run directory (the CNI status
// file), kvnet-cni's configuration directory (its kubeconfig) and
// kvnet-cni's cache.
var kvnetDirs = []string{
	filepath.Dir(cni.DefaultStatusFile),
	filepath.Dir(cni.DefaultKubeconfig),
	cniCacheDir,
}

// Cleanup removes everything kvnet-node and kvnet-cni made on the node:
// the datapath (datapath.Cleanup: links, pod host veths, router
// namespaces, nftables tables), kvnet-cni and kvnet-ipam in the CNI bin
// directory (and temporary copies InstallCNI may have left), and kvnet's
// own directories (kvnetDirs). Nothing else is touched. It returns what
// it removed, one entry per object, and tries everything even when one
// part fails; a second run removes nothing and succeeds.
//
// kvnet-node must not run on the node meanwhile, or it makes it all again.
func Cleanup(cfg CleanupConfig) ([]string, error) {
	if cfg.HostRoot == "" {
		return nil, fmt.Errorf("clean up node: no host root")
	}
	removed, err := datapath.Cleanup(cfg.Datapath)
	errs := []error{err}
	files, err := cleanupFiles(cfg)
	return append(removed, files...), errors.Join(append(errs, err)...)
}

// Leftovers lists what Cleanup would remove, without removing anything.
func Leftovers(cfg CleanupConfig) ([]string, error) {
	found, err := datapath.Leftovers(cfg.Datapath)
	errs := []error{err}
	for _, p := range cleanupPaths(cfg) {
		if _, err := os.Lstat(p); err == nil {
			found = append(found, "file "+p)
		} else if !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return found, errors.Join(errs...)
}

// cleanupPaths returns the files and directories Cleanup removes that
// exist now.
func cleanupPaths(cfg CleanupConfig) []string {
	bin := cfg.CNIBinDir
	if bin == "" {
		bin = filepath.Join(cfg.HostRoot, "opt/cni/bin")
	}
	var out []string
	for _, name := range []string{netconf.PluginType, netconf.IPAMType} {
		out = append(out, filepath.Join(bin, name))
		// InstallCNI's temporary copies: "."+name+"-"+random.
		tmps, _ := filepath.Glob(filepath.Join(bin, "."+name+"-*"))
		out = append(out, tmps...)
	}
	for _, d := range kvnetDirs {
		out = append(out, filepath.Join(cfg.HostRoot, d))
	}
	return out
}

// cleanupFiles removes cleanupPaths; it returns the ones it removed.
func cleanupFiles(cfg CleanupConfig) ([]string, error) {
	var removed []string
	var errs []error
	for _, p := range cleanupPaths(cfg) {
		if _, err := os.Lstat(p); errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err := os.RemoveAll(p); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, "file "+p)
	}
	if err := errors.Join(errs...); err != nil {
		return removed, fmt.Errorf("clean up node files: %w", err)
	}
	return removed, nil
}
