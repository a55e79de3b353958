// Package install implements "kvnet install", "kvnet uninstall" and
// "kvnet check": kvnet's manifests, embedded in the binary, rendered with
// the images the user names and server-side applied; and a check of the
// cluster for what kvnet needs and for kvnet itself.
package install

import (
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/discovery"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"kvnet.io/kvnet/internal/cli/kubeflags"
	"kvnet.io/kvnet/internal/install"
)

// ErrNotReady is returned by check when something kvnet needs is missing.
var ErrNotReady = errors.New("cluster not ready for kvnet")

type options struct {
	conn   kubeflags.Flags
	images install.Options
	dryRun bool
	crds   bool
	// monitoring adds config/monitoring (install --monitoring).
	monitoring bool
	// webhookTimeout bounds install's wait for kvnet-controller to serve
	// its webhooks before it applies their configuration.
	webhookTimeout time.Duration
	// uninstall tunes uninstall's node cleanup.
	uninstall install.UninstallOptions
}

func (o *options) addImageFlags(cmd *cobra.Command) {
	cmd.Flags().StringVar(&o.images.Registry, "registry", "", "registry (and path) of the kvnet-controller and kvnet-node images (default: config/default's, ghcr.io/kvnet)")
	cmd.Flags().StringVar(&o.images.Tag, "tag", "", "tag of the images (default: config/default's)")
}

// objects renders config/default with o's images and connects to the
// cluster.
func (o *options) objects() ([]*unstructured.Unstructured, client.Client, error) {
	objs, err := install.RenderObjects(o.images)
	if err != nil {
		return nil, nil, err
	}
	c, err := o.conn.Client()
	return objs, c, err
}

// NewCommand returns "kvnet install".
func NewCommand() *cobra.Command {
	o := &options{}
	cmd := &cobra.Command{
		Use:   "install",
		Short: "Install kvnet into the cluster (config/default, with the images you name)",
		Long: "Renders config/default (embedded in this binary) with kustomize, pointing kvnet-controller\n" +
			"and kvnet-node at <registry>/<name>:<tag>, and applies it with server-side apply (field\n" +
			"manager kvnet-install): CRDs, RBAC, the kvnet-system namespace, the Deployment, the DaemonSet\n" +
			"and the admission policy; then, once kvnet-controller serves its webhooks (its Service has a\n" +
			"ready endpoint and its CA exists), the webhook configurations with that CA, so that no VM or\n" +
			"pod create fails for want of a webhook server (--webhook-timeout). Run it again to upgrade.\n" +
			"`kvnet check` reports what is missing; --dry-run prints the manifests instead of applying them.\n" +
			"--monitoring also applies config/monitoring where the Prometheus Operator's CRDs exist.",
		Args:         cobra.NoArgs,
		SilenceUsage: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.dryRun {
				rendered, err := install.Render(o.images)
				if err != nil {
					return err
				}
				if o.monitoring {
					mon, err := install.RenderMonitoring()
					if err != nil {
						return err
					}
					rendered = append(append(rendered, "---\n"...), mon...)
				}
				_, err = cmd.OutOrStdout().Write(rendered)
				return err
			}
			objs, c, err := o.objects()
			if err != nil {
				return err
			}
			var mon []*unstructured.Unstructured
			if o.monitoring {
				// Before anything is applied: a cluster without the
				// Prometheus Operator's CRDs is told so, and nothing
				// changes.
				if err := install.CheckMonitoringCRDs(c); err != nil {
					return fmt.Errorf("--monitoring: %w", err)
				}
				if mon, err = install.MonitoringObjects(); err != nil {
					return err
				}
			}
			if err := install.Apply(cmd.Context(), c, objs, cmd.OutOrStdout(), install.ApplyOptions{WebhookTimeout: o.webhookTimeout}); err != nil {
				return err
			}
			if err := install.Apply(cmd.Context(), c, mon, cmd.OutOrStdout(), install.ApplyOptions{}); err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), "installed; `kvnet check` reports when kvnet is ready")
			return nil
		},
	}
	o.conn.Add(cmd.Flags())
	o.addImageFlags(cmd)
	cmd.Flags().BoolVar(&o.dryRun, "dry-run", false, "print the manifests, apply nothing")
	cmd.Flags().BoolVar(&o.monitoring, "monitoring", false,
		"also apply config/monitoring (metrics Service, ServiceMonitor, PodMonitor, PrometheusRule with kvnet's alerts); needs the Prometheus Operator's CRDs")
	cmd.Flags().DurationVar(&o.webhookTimeout, "webhook-timeout", install.DefaultWebhookTimeout,
		"how long to wait for kvnet-controller to serve its webhooks before applying their configuration (a webhook without a server would fail VM creates)")
	return cmd
}

// NewUninstallCommand returns "kvnet uninstall".
func NewUninstallCommand() *cobra.Command {
	o := &options{}
	cmd := &cobra.Command{
		Use:   "uninstall",
		Short: "Remove what kvnet install applied (CRDs only with --crds)",
		Long: "Deletes every object of config/default (and of config/monitoring, where they exist) in reverse order. CRDs stay unless --crds is given:\n" +
			"deleting them deletes every UserDefinedNetwork, NAD and IPAMClaim in the cluster, and with\n" +
			"the claims the VMs' addresses. It refuses while user-defined networks exist (their finalizers need kvnet-controller).\n" +
			"First it removes kvnet's state from every node: it deletes the kvnet-node DaemonSet, runs\n" +
			"`kvnet-node --cleanup` on each of its nodes (DaemonSet kvnet-node-cleanup, same image) and waits\n" +
			"until that is done everywhere (--node-cleanup-timeout); pods still on a kvnet network lose it.",
		Args:         cobra.NoArgs,
		SilenceUsage: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			objs, c, err := o.objects()
			if err != nil {
				return err
			}
			// --monitoring's objects too, where they exist (deleted
			// first: Delete goes in reverse order).
			mon, err := install.MonitoringObjects()
			if err != nil {
				return err
			}
			objs = append(objs, mon...)
			o.uninstall.CRDs = o.crds
			return install.Uninstall(cmd.Context(), c, objs, o.uninstall, cmd.OutOrStdout())
		},
	}
	o.conn.Add(cmd.Flags())
	cmd.Flags().BoolVar(&o.crds, "crds", false, "also delete kvnet's CRDs, and with them every object of their kinds")
	cmd.Flags().DurationVar(&o.uninstall.NodeCleanupTimeout, "node-cleanup-timeout", install.DefaultNodeCleanupTimeout,
		"how long to wait for kvnet-node to stop and for the node cleanup to be done on every node; uninstall fails naming the nodes not done")
	cmd.Flags().BoolVar(&o.uninstall.SkipNodeCleanup, "skip-node-cleanup", false,
		"leave kvnet's links, nftables tables and files on the nodes (for nodes that are gone for good)")
	return cmd
}

// NewCheckCommand returns "kvnet check".
func NewCheckCommand() *cobra.Command {
	o := &options{}
	var checkOpts install.CheckOptions
	cmd := &cobra.Command{
		Use:   "check",
		Short: "Check the cluster for what kvnet needs (Multus, KubeVirt, l2bridge) and for kvnet itself",
		Long: "Prints one line per check: ok, warning (a feature will not work, or pods start slowly) or missing (kvnet cannot\n" +
			"work), with the fix. Exits 1 if anything is missing. --prerequisites checks only what must be\n" +
			"there before `kvnet install`.",
		Args:         cobra.NoArgs,
		SilenceUsage: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := o.conn.Client()
			if err != nil {
				return err
			}
			cfg, err := o.conn.RESTConfig()
			if err != nil {
				return err
			}
			dc, err := discovery.NewDiscoveryClientForConfig(cfg)
			if err != nil {
				return err
			}
			info, err := dc.ServerVersion()
			if err != nil {
				return fmt.Errorf("read the API server's version: %w", err)
			}
			checkOpts.KubernetesVersion = info.GitVersion
			fs, err := install.Check(cmd.Context(), c, checkOpts)
			if err != nil {
				return err
			}
			missing := 0
			for _, f := range fs {
				fmt.Fprintln(cmd.OutOrStdout(), f)
				if f.Status == install.Missing {
					missing++
				}
			}
			if missing > 0 {
				return fmt.Errorf("%w: %d missing", ErrNotReady, missing)
			}
			return nil
		},
	}
	o.conn.Add(cmd.Flags())
	cmd.Flags().StringVar(&checkOpts.Namespace, "kvnet-namespace", "kvnet-system", "namespace kvnet runs in")
	cmd.Flags().BoolVar(&checkOpts.Prerequisites, "prerequisites", false, "check only what kvnet install needs")
	return cmd
}
