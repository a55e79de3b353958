package controlplane

import (
	"context"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"kvnet.io/kvnet/internal/k8s/manager"
	"kvnet.io/kvnet/internal/manifests"
)

// FieldOwner is the server-side-apply field manager of manifests kvnet applies.
const FieldOwner = "kvnet"

// DefaultNetworkNAD is the cluster default network's NAD as the lab names
// it (OVN-Kubernetes' name), which kvnet-controller writes in launcher
// pods' default-network element when the lab's kubelet attaches primary
// networks (manager.PrimaryByDefaultNetwork).
const DefaultNetworkNAD = "ovn-kubernetes/default"

// WebhookOptions returns kvnet-controller's webhook options for a
// controller serving on 127.0.0.1:port in KvnetNamespace: the defaults
// (manager.DefaultWebhookOptions) but for where it listens and, unless
// multus, primary networks attached by the default network with
// DefaultNetworkNAD.
func WebhookOptions(port int, multus bool) *manager.WebhookOptions {
	w := manager.DefaultWebhookOptions()
	w.Host, w.Port, w.Namespace, w.IPs = "127.0.0.1", port, KvnetNamespace, []net.IP{net.IPv4(127, 0, 0, 1)}
	if !multus {
		w.PrimaryAttachment, w.DefaultNetworkNAD = manager.PrimaryByDefaultNetwork, DefaultNetworkNAD
	}
	return &w
}

// ApplyFiles server-side applies every object in the YAML files of dir
// (kustomization.yaml excepted), in file-name order.
func ApplyFiles(ctx context.Context, c client.Client, dir string) error {
	return ApplyDir(ctx, c, os.DirFS(dir), ".")
}

// ApplyDir is ApplyFiles for directory dir of fsys (an embedded FS).
func ApplyDir(ctx context.Context, c client.Client, fsys fs.FS, dir string) error {
	entries, err := fs.ReadDir(fsys, dir)
	if err != nil {
		return err
	}
	names := make([]string, 0, len(entries))
	for _, e := range entries {
		n := e.Name()
		if e.IsDir() || n == "kustomization.yaml" || !(strings.HasSuffix(n, ".yaml") || strings.HasSuffix(n, ".yml")) {
			continue
		}
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		if err := ApplyFile(ctx, c, fsys, path.Join(dir, n)); err != nil {
			return err
		}
	}
	return nil
}

// ApplyFile server-side applies every object in the YAML file name of fsys.
func ApplyFile(ctx context.Context, c client.Client, fsys fs.FS, name string) error {
	data, err := fs.ReadFile(fsys, name)
	if err != nil {
		return err
	}
	objs, err := manifests.Decode(data)
	if err != nil {
		return fmt.Errorf("decode %s: %w", name, err)
	}
	for _, o := range objs {
		if err := Apply(ctx, c, o); err != nil {
			return fmt.Errorf("apply %s %s from %s: %w", o.GetKind(), o.GetName(), name, err)
		}
	}
	return nil
}

// Apply server-side applies one object.
func Apply(ctx context.Context, c client.Client, o *unstructured.Unstructured) error {
	o = o.DeepCopy()
	o.SetManagedFields(nil)
	o.SetResourceVersion("")
	return c.Patch(ctx, o, client.Apply, client.FieldOwner(FieldOwner), client.ForceOwnership) //nolint:staticcheck // unstructured apply
}
