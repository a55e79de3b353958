package install

import (
	"context"
	"fmt"
	"io"
	"slices"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"kvnet.io/kvnet/internal/install/teardown"
)

// The node side of an uninstall lives in package teardown, which
// kvnet-controller links for the Helm chart's pre-delete hook; these
// names keep kvnet uninstall's API in this package.
const (
	NodeDaemonSet             = teardown.NodeDaemonSet
	NodeCleanupDaemonSet      = teardown.NodeCleanupDaemonSet
	DefaultNodeCleanupTimeout = teardown.DefaultNodeCleanupTimeout
)

// UninstallOptions tune Uninstall.
type UninstallOptions = teardown.Options

var (
	// ErrNetworksExist: see teardown.ErrNetworksExist.
	ErrNetworksExist = teardown.ErrNetworksExist
	// ErrNodeCleanup: see teardown.ErrNodeCleanup.
	ErrNodeCleanup = teardown.ErrNodeCleanup
)

// Uninstall removes kvnet: it refuses while user-defined networks exist
// (ErrNetworksExist), then, when the objects hold kvnet-node's DaemonSet,
// removes kvnet's state from every node (CleanNodes), then deletes the
// objects (Delete).
func Uninstall(ctx context.Context, c client.Client, objs []*unstructured.Unstructured, opts UninstallOptions, log io.Writer) error {
	if slices.ContainsFunc(objs, func(u *unstructured.Unstructured) bool {
		return u.GetKind() == "Deployment" && u.GetName() == "kvnet-controller"
	}) {
		if err := teardown.NoNetworks(ctx, c); err != nil {
			return err
		}
	}
	i := slices.IndexFunc(objs, func(u *unstructured.Unstructured) bool {
		return u.GetKind() == "DaemonSet" && u.GetName() == NodeDaemonSet
	})
	switch {
	case i < 0:
	case opts.SkipNodeCleanup:
		fmt.Fprintln(log, "skipped the node cleanup: kvnet's links, nftables tables and files stay on the nodes")
	default:
		if err := teardown.CleanNodes(ctx, c, objs[i].GetNamespace(), opts, log); err != nil {
			return err
		}
	}
	return Delete(ctx, c, objs, opts.CRDs, log)
}
