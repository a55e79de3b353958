package cluster

import (
	"bytes"
	"context"
	"embed"
	"fmt"
	"net/netip"
	"text/template"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"kvnet.io/kvnet/internal/lab/controlplane"
	"kvnet.io/kvnet/internal/manifests"
)

// The cluster's add-ons are installed from manifests in the repo, as a
// user installs them, with the images the repo built and pushed to the
// cluster's registry.
//
//go:embed manifests/*.yaml
var addonManifests embed.FS

// DNSServiceIP is the kube-dns Service's cluster IP: the kubelets'
// clusterDNS.
var DNSServiceIP = netip.MustParseAddr("10.96.0.10")

// renderManifest renders manifests/<name>.yaml with data.
func renderManifest(name string, data any) ([]byte, error) {
	b, err := addonManifests.ReadFile("manifests/" + name + ".yaml")
	if err != nil {
		return nil, err
	}
	t, err := template.New(name).Option("missingkey=error").Parse(string(b))
	if err != nil {
		return nil, fmt.Errorf("manifest %s: %w", name, err)
	}
	var out bytes.Buffer
	if err := t.Execute(&out, data); err != nil {
		return nil, fmt.Errorf("manifest %s: %w", name, err)
	}
	return out.Bytes(), nil
}

// applyManifest renders and server-side applies manifests/<name>.yaml.
func (c *Cluster) applyManifest(ctx context.Context, name string, data any) error {
	b, err := renderManifest(name, data)
	if err != nil {
		return err
	}
	objs, err := manifests.Decode(b)
	if err != nil {
		return fmt.Errorf("manifest %s: %w", name, err)
	}
	cl, err := client.New(c.CP.Config, client.Options{})
	if err != nil {
		return err
	}
	for _, o := range objs {
		if err := controlplane.Apply(ctx, cl, o); err != nil {
			return fmt.Errorf("manifest %s: apply %s %s: %w", name, o.GetKind(), o.GetName(), err)
		}
	}
	return nil
}

// The default networks Config.DefaultNetwork names.
const (
	NetworkFlannel = "flannel"
	NetworkBridge  = "bridge"
)

// installFlannel installs Flannel from manifests/flannel.yaml (upstream's
// kube-flannel.yml with the registry's images) on ClusterCIDR. The nodes
// turn Ready once its DaemonSet has written the CNI configuration.
func (c *Cluster) installFlannel(ctx context.Context, dual bool) error {
	params := map[string]string{
		"Image": c.Images["flannel"], "CNIPluginImage": c.Images["flannel-cni-plugin"], "Network": ClusterCIDR.String(), "IPv6Network": "",
	}
	if dual {
		params["IPv6Network"] = ClusterCIDR6.String()
	}
	return c.applyManifest(ctx, "flannel", params)
}

// installCoreDNS installs CoreDNS (manifests/coredns.yaml) and waits until
// its Deployment is available.
func (c *Cluster) installCoreDNS(ctx context.Context) error {
	if err := c.applyManifest(ctx, "coredns", map[string]string{"Image": c.Images["coredns"], "DNSIP": DNSServiceIP.String()}); err != nil {
		return err
	}
	return c.waitFor(ctx, 3*time.Minute, "Deployment kube-system/coredns available", func() (bool, error) {
		d, err := c.Client.AppsV1().Deployments("kube-system").Get(ctx, "coredns", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return deploymentAvailable(d), nil
	})
}

// deploymentAvailable reports whether every replica of d is updated and
// available.
func deploymentAvailable(d *appsv1.Deployment) bool {
	want := int32(1)
	if d.Spec.Replicas != nil {
		want = *d.Spec.Replicas
	}
	return d.Status.ObservedGeneration >= d.Generation && d.Status.UpdatedReplicas == want && d.Status.AvailableReplicas == want
}
