// Package install renders kvnet's manifests (config/default, embedded in
// the binary) with the images the user names, applies them to a cluster
// with server-side apply, removes them again, and checks a cluster for what
// kvnet needs (Multus, KubeVirt, the binding plugin) and for kvnet itself.
package install

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"regexp"
	"slices"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/api/types"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"kvnet.io/kvnet/config"
	"kvnet.io/kvnet/internal/install/teardown"
	"kvnet.io/kvnet/internal/manifests"
)

// FieldOwner is the server-side apply field manager of kvnet install.
const FieldOwner = "kvnet-install"

// Images are the image names config/ uses, which Render points at
// <registry>/<name>:<tag>.
var Images = []string{"kvnet-controller", "kvnet-node"}

// Options choose the images.
type Options struct {
	// Registry is the registry and path the images are under
	// ("ghcr.io/kvnet", "localhost:5000"); empty keeps config/default's.
	Registry string
	// Tag of the images; empty keeps config/default's.
	Tag string
}

var (
	registryRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9.-]*[a-z0-9])?(:[0-9]+)?(/[a-z0-9]+([._-][a-z0-9]+)*)*$`)
	tagRE      = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$`)
)

// Validate reports a registry or tag that no image reference can have.
func (o Options) Validate() error {
	if o.Registry != "" && !registryRE.MatchString(o.Registry) {
		return fmt.Errorf("registry %q: not a registry host[:port][/path] in lower case", o.Registry)
	}
	if o.Tag != "" && !tagRE.MatchString(o.Tag) {
		return fmt.Errorf("tag %q: a tag is 1-128 of [A-Za-z0-9_.-], not starting with . or -", o.Tag)
	}
	return nil
}

// Render returns config/default rendered by kustomize, with the images
// set from o.
func Render(o Options) ([]byte, error) {
	o.Registry = strings.TrimSuffix(o.Registry, "/")
	if err := o.Validate(); err != nil {
		return nil, err
	}
	return kustomize("default", func(k *types.Kustomization) error {
		for _, im := range Images {
			i := indexOfImage(k.Images, im)
			if i < 0 {
				return fmt.Errorf("config/default/kustomization.yaml: no images entry for %s", im)
			}
			if o.Registry != "" {
				k.Images[i].NewName = o.Registry + "/" + im
			}
			if o.Tag != "" {
				k.Images[i].NewTag = o.Tag
			}
		}
		return nil
	})
}

// RenderMonitoring returns config/monitoring rendered by kustomize:
// kvnet-controller's metrics Service, the ServiceMonitor and PodMonitor
// (monitoring.coreos.com/v1) and the PrometheusRule with kvnet's alerts.
func RenderMonitoring() ([]byte, error) {
	return kustomize("monitoring", nil)
}

// MonitoringObjects renders config/monitoring (RenderMonitoring) and
// decodes it (Objects), in order.
func MonitoringObjects() ([]*unstructured.Unstructured, error) {
	rendered, err := RenderMonitoring()
	if err != nil {
		return nil, err
	}
	return Objects(rendered)
}

// MonitoringKinds are the Prometheus Operator's kinds config/monitoring
// uses; --monitoring needs them served.
var MonitoringKinds = []string{"ServiceMonitor", "PodMonitor", "PrometheusRule"}

// ErrNoMonitoringCRDs is returned by CheckMonitoringCRDs when the cluster
// does not serve the Prometheus Operator's kinds.
var ErrNoMonitoringCRDs = errors.New("no Prometheus Operator CRDs")

// CheckMonitoringCRDs reports whether the cluster serves every kind of
// MonitoringKinds (monitoring.coreos.com/v1), naming the first missing.
func CheckMonitoringCRDs(c client.Client) error {
	for _, kind := range MonitoringKinds {
		gk := schema.GroupKind{Group: "monitoring.coreos.com", Kind: kind}
		if _, err := c.RESTMapper().RESTMapping(gk, "v1"); err != nil {
			if meta.IsNoMatchError(err) {
				return fmt.Errorf("%w: the cluster does not serve %s (monitoring.coreos.com/v1); install the Prometheus Operator (kube-prometheus) first, or scrape kvnet-controller (port 8080) and kvnet-node (port 9464) yourself", ErrNoMonitoringCRDs, kind)
			}
			return fmt.Errorf("look up %s (monitoring.coreos.com/v1): %w", kind, err)
		}
	}
	return nil
}

// kustomize renders config/<dir> (embedded) with kustomize, edit changing
// its kustomization.yaml first (nil: none).
func kustomize(dir string, edit func(*types.Kustomization) error) ([]byte, error) {
	mem := filesys.MakeFsInMemory()
	err := fs.WalkDir(config.Tree, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := config.Tree.ReadFile(p)
		if err != nil {
			return err
		}
		return mem.WriteFile(path.Join("/config", p), b)
	})
	if err != nil {
		return nil, err
	}
	if edit != nil {
		kpath := "/config/" + dir + "/kustomization.yaml"
		b, err := mem.ReadFile(kpath)
		if err != nil {
			return nil, err
		}
		var k types.Kustomization
		if err := yaml.Unmarshal(b, &k); err != nil {
			return nil, fmt.Errorf("config/%s/kustomization.yaml: %w", dir, err)
		}
		if err := edit(&k); err != nil {
			return nil, err
		}
		if b, err = yaml.Marshal(&k); err != nil {
			return nil, err
		}
		if err := mem.WriteFile(kpath, b); err != nil {
			return nil, err
		}
	}
	// Namespaces and CRDs first, webhooks last, as kubectl kustomize
	// orders them: Apply goes in this order.
	kopts := krusty.MakeDefaultOptions()
	kopts.Reorder = krusty.ReorderOptionLegacy
	rm, err := krusty.MakeKustomizer(kopts).Run(mem, "/config/"+dir)
	if err != nil {
		return nil, fmt.Errorf("kustomize config/%s: %w", dir, err)
	}
	return rm.AsYaml()
}

func indexOfImage(ims []types.Image, name string) int {
	for i, im := range ims {
		if im.Name == name {
			return i
		}
	}
	return -1
}

// Objects splits rendered YAML into objects, in order.
func Objects(rendered []byte) ([]*unstructured.Unstructured, error) {
	return manifests.Decode(rendered)
}

// RenderObjects renders config/default with o (Render) and decodes it
// (Objects), in order.
func RenderObjects(o Options) ([]*unstructured.Unstructured, error) {
	rendered, err := Render(o)
	if err != nil {
		return nil, err
	}
	return Objects(rendered)
}

// ContainerImages lists every container image the objects run.
func ContainerImages(objs []*unstructured.Unstructured) []string {
	var out []string
	for _, u := range objs {
		for _, field := range [][]string{{"spec", "template", "spec", "containers"}, {"spec", "template", "spec", "initContainers"}} {
			cs, _, _ := unstructured.NestedSlice(u.Object, field...)
			for _, c := range cs {
				if m, ok := c.(map[string]any); ok {
					if im, ok := m["image"].(string); ok {
						out = append(out, im)
					}
				}
			}
		}
	}
	return out
}

// InstallAnnotation, set to IfAbsent on an object of config/, makes
// Apply leave the object alone when it exists and kvnet did not create it
// (the MultiNetworkPolicy CRD, which the multi-networkpolicy project
// installs too), and Delete remove it only when kvnet created it.
//
// Set to CreateOnly (the cluster's settings: the ConfigMaps
// kvnet-reserved-subnets and kvnet-node-config), it makes Apply create the
// object where it is absent and never change it after, so an upgrade
// keeps what the admin set there; Delete removes it.
const (
	InstallAnnotation = "kvnet.io/install"
	IfAbsent          = "if-absent"
	CreateOnly        = "create-only"
)

// Apply server-side applies the objects in order (kustomize puts
// namespaces and CRDs first), taking ownership of conflicting fields;
// an IfAbsent object that exists and is not kvnet's is kept as it is.
// A CRD is waited for until the API server serves it, so that objects of
// its kind later in the list apply. Webhook configurations come last: a
// new one only once kvnet-controller serves it (prepareWebhooks), else
// Apply fails with ErrWebhookNotServed, everything else applied.
func Apply(ctx context.Context, c client.Client, objs []*unstructured.Unstructured, log io.Writer, opts ApplyOptions) error {
	var held []*unstructured.Unstructured
	for _, u := range objs {
		if isWebhookConfig(u) {
			held = append(held, u)
		}
	}
	for _, u := range objs {
		if isWebhookConfig(u) {
			continue
		}
		if err := applyOne(ctx, c, u, log); err != nil {
			return err
		}
	}
	for _, u := range held {
		ready, err := prepareWebhooks(ctx, c, u, opts, log)
		if err != nil {
			return err
		}
		if err := applyOne(ctx, c, ready, log); err != nil {
			return err
		}
	}
	return nil
}

// applyOne server-side applies u, unless it is IfAbsent and foreign, or
// CreateOnly and exists.
func applyOne(ctx context.Context, c client.Client, u *unstructured.Unstructured, log io.Writer) error {
	if foreign, err := foreignIfAbsent(ctx, c, u); err != nil {
		return err
	} else if foreign {
		fmt.Fprintf(log, "kept %s %s: it exists and was not installed by kvnet\n", u.GetKind(), objName(u))
		return nil
	}
	if u.GetAnnotations()[InstallAnnotation] == CreateOnly {
		cur := &unstructured.Unstructured{}
		cur.SetGroupVersionKind(u.GroupVersionKind())
		switch err := c.Get(ctx, client.ObjectKeyFromObject(u), cur); {
		case err == nil:
			fmt.Fprintf(log, "kept %s %s: the cluster's settings, created once and then yours to change\n", u.GetKind(), objName(u))
			return nil
		case !apierrors.IsNotFound(err):
			return fmt.Errorf("read %s %s: %w", u.GetKind(), objName(u), err)
		}
	}
	obj := u.DeepCopy()
	obj.SetResourceVersion("")
	if err := c.Patch(ctx, obj, client.Apply, client.FieldOwner(FieldOwner), client.ForceOwnership); err != nil { //nolint:staticcheck // unstructured apply
		return fmt.Errorf("apply %s %s: %w", u.GetKind(), objName(u), err)
	}
	fmt.Fprintf(log, "applied %s %s\n", u.GetKind(), objName(u))
	return nil
}

// Delete removes the objects in reverse order; CRDs only when crds is set
// (deleting a CRD deletes every object of its kind: the users' networks
// and claims). Objects already gone are skipped. When the objects hold
// kvnet-controller's Deployment and a UserDefinedNetwork or
// ClusterUserDefinedNetwork exists, it deletes nothing and returns
// ErrNetworksExist naming them.
func Delete(ctx context.Context, c client.Client, objs []*unstructured.Unstructured, crds bool, log io.Writer) error {
	if slices.ContainsFunc(objs, func(u *unstructured.Unstructured) bool {
		return u.GetKind() == "Deployment" && u.GetName() == "kvnet-controller"
	}) {
		if err := teardown.NoNetworks(ctx, c); err != nil {
			return err
		}
	}
	var errs []error
	for i := len(objs) - 1; i >= 0; i-- {
		u := objs[i]
		if u.GetKind() == "CustomResourceDefinition" && !crds {
			fmt.Fprintf(log, "kept %s %s (--crds deletes it with every object of its kind)\n", u.GetKind(), objName(u))
			continue
		}
		if foreign, err := foreignIfAbsent(ctx, c, u); err != nil {
			errs = append(errs, err)
			continue
		} else if foreign {
			fmt.Fprintf(log, "kept %s %s: not installed by kvnet\n", u.GetKind(), objName(u))
			continue
		}
		err := c.Delete(ctx, u.DeepCopy(), client.PropagationPolicy("Background"))
		switch {
		case err == nil:
			fmt.Fprintf(log, "deleted %s %s\n", u.GetKind(), objName(u))
		case apierrors.IsNotFound(err) || meta.IsNoMatchError(err):
		default:
			errs = append(errs, fmt.Errorf("delete %s %s: %w", u.GetKind(), objName(u), err))
		}
	}
	return errors.Join(errs...)
}

// foreignIfAbsent reports whether u is an IfAbsent object that exists in
// the cluster without kvnet install having applied it.
func foreignIfAbsent(ctx context.Context, c client.Client, u *unstructured.Unstructured) (bool, error) {
	if u.GetAnnotations()[InstallAnnotation] != IfAbsent {
		return false, nil
	}
	cur := &unstructured.Unstructured{}
	cur.SetGroupVersionKind(u.GroupVersionKind())
	switch err := c.Get(ctx, client.ObjectKeyFromObject(u), cur); {
	case apierrors.IsNotFound(err):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("read %s %s: %w", u.GetKind(), objName(u), err)
	}
	for _, m := range cur.GetManagedFields() {
		if m.Manager == FieldOwner {
			return false, nil
		}
	}
	return true, nil
}

func objName(u *unstructured.Unstructured) string {
	if u.GetNamespace() != "" {
		return u.GetNamespace() + "/" + u.GetName()
	}
	return u.GetName()
}
