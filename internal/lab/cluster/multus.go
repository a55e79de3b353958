package cluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The Multus modes Config.Multus names.
const (
	// MultusThick is Multus's thick plugin: the multus-daemon DaemonSet,
	// whose init container copies multus-shim to the node's /opt/cni/bin
	// (upstream's multus-daemonset-thick.yml).
	MultusThick = "thick"
	// MultusThin is Multus's thin plugin: the multus CNI binary itself in
	// the node's /opt/cni/bin, which the runtime runs and which calls the
	// delegates, installed and configured by a DaemonSet running
	// thin_entrypoint (upstream's multus-daemonset.yml; multus_thin.go).
	MultusThin = "thin"
	// MultusNone installs no Multus.
	MultusNone = "none"
)

// multusBinaries are the Multus commands the image holds, at
// /usr/src/multus-cni/bin as upstream's image has them: the daemon and
// the shim (thick), the thin plugin, and install_multus (the init
// container's installer, which also copies passthru).
var multusBinaries = []string{"multus-daemon", "multus-shim", "multus", "install_multus", "passthru"}

// multusImage assembles kvnet-lab/multus from binDir: Multus's binaries
// (hack/tools/cluster) where upstream's image has them, entrypoint
// multus-daemon as upstream's thick image. The daemon runs the delegate
// CNI plugins chrooted into the node's root (chrootDir in its
// configuration), so the image needs nothing else but /etc/passwd,
// /etc/group and the /var/run link.
func multusImage(binDir string) (labImage, error) {
	files := []file{
		{path: "tmp", dir: true, mode: 0o1777},
		// multus-daemon checks that it runs as root with os/user, which
		// (built without cgo) reads these files: without them it panics.
		// Upstream's image has them from its Debian base.
		{path: "etc/passwd", content: []byte("root:x:0:0:root:/root:/sbin/nologin\n"), mode: 0o644},
		{path: "etc/group", content: []byte("root:x:0:\n"), mode: 0o644},
		// The runtime names pod network namespaces /var/run/netns/…; the
		// daemon checks them in its own file system, where the manifest
		// mounts the node's /run/netns. Debian (upstream's base) links
		// /var/run to /run.
		{path: "run", dir: true, mode: 0o755},
		{path: "var", dir: true, mode: 0o755},
		{path: "var/run", link: "../run"},
	}
	for _, b := range multusBinaries {
		content, err := os.ReadFile(filepath.Join(binDir, b))
		if err != nil {
			return labImage{}, fmt.Errorf("multus image: %w (run hack/build-cluster-tools.sh)", err)
		}
		files = append(files, file{path: "usr/src/multus-cni/bin/" + b, content: content, mode: 0o755})
	}
	return labImage{name: "multus", files: withParents(files), entry: []string{"/usr/src/multus-cni/bin/multus-daemon"}}, nil
}

// installMultus installs Multus's thick plugin from
// manifests/multus-thick.yaml (upstream's, with the registry's image) and
// waits until its DaemonSet is ready on every node. Multus takes the
// node's first CNI configuration (Flannel's conflist, or the bridge
// layout's) as the cluster default network and writes its own
// 00-multus.conflist before it.
func (c *Cluster) installMultus(ctx context.Context) error {
	return c.installMultusManifest(ctx, "multus-thick", c.Images["multus"])
}

// installMultusManifest applies manifests/<manifest>.yaml with image and
// waits until its DaemonSet (MultusDaemonSet) is ready on every node.
func (c *Cluster) installMultusManifest(ctx context.Context, manifest, image string) error {
	if err := c.applyManifest(ctx, manifest, map[string]string{"Image": image}); err != nil {
		return err
	}
	return c.waitFor(ctx, 3*time.Minute, "DaemonSet kube-system/kube-multus-ds ready on every node", func() (bool, error) {
		ds, err := c.Client.AppsV1().DaemonSets("kube-system").Get(ctx, MultusDaemonSet, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		n := int32(len(c.Nodes))
		return ds.Status.ObservedGeneration >= ds.Generation && ds.Status.DesiredNumberScheduled == n &&
			ds.Status.NumberReady == n && ds.Status.UpdatedNumberScheduled == n, nil
	})
}

// MultusDaemonSet is the Multus DaemonSet in kube-system (thick or thin:
// upstream's manifests name both so).
const MultusDaemonSet = "kube-multus-ds"
