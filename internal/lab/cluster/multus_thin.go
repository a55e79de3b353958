package cluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
)

// multusThinBinaries are what upstream's thin image holds at
// /usr/src/multus-cni/bin and the manifest runs: the thin plugin (multus,
// which thin_entrypoint copies to the node), install_multus (the init
// container's, which copies multus and passthru) and thin_entrypoint.
var multusThinBinaries = []string{"multus", "passthru", "install_multus", "thin_entrypoint"}

// multusThinImage assembles kvnet-lab/multus-thin from binDir as
// upstream's thin image (images/Dockerfile) lays it out: the binaries at
// /usr/src/multus-cni/bin, install_multus and thin_entrypoint also at /
// (the manifest runs /install_multus and /thin_entrypoint), entrypoint
// /thin_entrypoint. The multus binary runs on the node (the runtime execs
// it), so the image needs nothing else.
func multusThinImage(binDir string) (labImage, error) {
	files := []file{{path: "tmp", dir: true, mode: 0o1777}}
	for _, b := range multusThinBinaries {
		content, err := os.ReadFile(filepath.Join(binDir, b))
		if err != nil {
			return labImage{}, fmt.Errorf("multus-thin image: %w (run hack/build-cluster-tools.sh)", err)
		}
		files = append(files, file{path: "usr/src/multus-cni/bin/" + b, content: content, mode: 0o755})
		if b == "install_multus" || b == "thin_entrypoint" {
			files = append(files, file{path: b, content: content, mode: 0o755})
		}
	}
	return labImage{name: "multus-thin", files: withParents(files), entry: []string{"/thin_entrypoint"}}, nil
}

// installMultusThin installs Multus's thin plugin from
// manifests/multus-thin.yaml (upstream's, with the registry's image) and
// waits until its DaemonSet is ready on every node. thin_entrypoint takes
// the node's first CNI configuration (Flannel's conflist, or the bridge or
// ptp32 layout's) as the cluster default network, writes
// 00-multus.conf (type multus; 00-multus.conflist when that network's
// CNI version is 1.0.0 or later, as the ptp32 layout's) before it and a
// kubeconfig for the plugin
// (the kubernetes Service's address and its ServiceAccount's token) in
// /etc/cni/net.d/multus.d.
func (c *Cluster) installMultusThin(ctx context.Context) error {
	return c.installMultusManifest(ctx, "multus-thin", c.Images["multus-thin"])
}
