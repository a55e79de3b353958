package install_test

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"kvnet.io/kvnet/internal/install"
	"kvnet.io/kvnet/internal/lab/controlplane"
	"kvnet.io/kvnet/internal/repo"
)

// TestChartGenerated fails when deploy/helm/kvnet's generated files are
// not what config/ renders today (run make generate).
func TestChartGenerated(t *testing.T) {
	root := repoRoot(t)
	files, err := install.ChartFiles()
	if err != nil {
		t.Fatal(err)
	}
	for rel, want := range files {
		got, err := os.ReadFile(filepath.Join(root, install.ChartDir, rel))
		if err != nil {
			t.Errorf("%s: %v (run make generate)", rel, err)
			continue
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s/%s is stale: run make generate", install.ChartDir, rel)
		}
	}
	crds, err := filepath.Glob(filepath.Join(root, install.ChartDir, "crds", "*"))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range crds {
		if _, ok := files["crds/"+filepath.Base(p)]; !ok {
			t.Errorf("%s: not a CRD of config/default (run make generate)", p)
		}
	}
}

// TestChartRendersInstallObjects renders the chart with helm (helm
// template, as helm install would apply it) and wants exactly the objects
// kvnet install applies for the same settings: default values, another
// registry and tag, and with monitoring.
func TestChartRendersInstallObjects(t *testing.T) {
	helm := helmBinary(t)
	chart := filepath.Join(repoRoot(t), install.ChartDir)
	if out, err := exec.Command(helm, "lint", "--strict", chart).CombinedOutput(); err != nil {
		t.Fatalf("helm lint --strict: %v\n%s", err, out)
	}
	monitoring, err := install.MonitoringObjects()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name       string
		opts       install.Options
		args       []string
		monitoring bool
	}{
		{name: "defaults"},
		{name: "registry and tag", opts: install.Options{Registry: "registry.example:5000/kv", Tag: "v1.2.3"},
			args: []string{"--set", "image.registry=registry.example:5000/kv", "--set", "image.tag=v1.2.3"}},
		{name: "monitoring", monitoring: true, args: []string{"--set", "monitoring.enabled=true",
			"--api-versions", "monitoring.coreos.com/v1/ServiceMonitor", "--api-versions", "monitoring.coreos.com/v1/PodMonitor",
			"--api-versions", "monitoring.coreos.com/v1/PrometheusRule"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want, err := install.RenderObjects(tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			if tc.monitoring {
				want = append(want, monitoring...)
			}
			got, hooks := helmTemplate(t, helm, chart, tc.args...)
			compareObjects(t, got, want)
			// The pre-delete hook runs kvnet-controller's image.
			if len(hooks) == 0 {
				t.Error("no pre-delete hook rendered")
			}
			for _, im := range install.ContainerImages(hooks) {
				if !slices.Contains(install.ContainerImages(want), im) {
					t.Errorf("pre-delete hook runs image %s, which kvnet install does not", im)
				}
			}
		})
	}
}

// TestChartSettings: the create-only ConfigMaps are rendered from the
// values, as strings; a value kvnet would refuse is refused by helm,
// naming it.
func TestChartSettings(t *testing.T) {
	helm := helmBinary(t)
	chart := filepath.Join(repoRoot(t), install.ChartDir)
	got, _ := helmTemplate(t, helm, chart, "--set", "nodeConfig.vxlan-port=4790", "--set", "reservedSubnets.join-subnets=100.66.0.0/16\\,fd98::/64")
	data := map[string]map[string]string{}
	for _, u := range got {
		if u.GetKind() == "ConfigMap" {
			d, _, err := unstructured.NestedStringMap(u.Object, "data")
			if err != nil {
				t.Fatalf("ConfigMap %s: %v", u.GetName(), err)
			}
			data[u.GetName()] = d
		}
	}
	if v := data["kvnet-node-config"]["vxlan-port"]; v != "4790" {
		t.Errorf("kvnet-node-config vxlan-port = %q, want 4790", v)
	}
	if v := data["kvnet-reserved-subnets"]["join-subnets"]; v != "100.66.0.0/16,fd98::/64" {
		t.Errorf("kvnet-reserved-subnets join-subnets = %q", v)
	}
	if v := data["kvnet-reserved-subnets"]["masquerade-subnets"]; v != "169.254.0.0/17,fd69::/112" {
		t.Errorf("kvnet-reserved-subnets masquerade-subnets = %q: a value not set must keep config/'s default", v)
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--set", "image.tag=-bad"}, "/image/tag"},
		{[]string{"--set", "image.registry=Not/A/Registry"}, "/image/registry"},
		{[]string{"--set", "nodeConfig.vxlan-prot=4790"}, "vxlan-prot"},
		{[]string{"--set", "preDelete.nodeCleanupTimeout=soon"}, "/preDelete/nodeCleanupTimeout"},
		{[]string{"--namespace", "kvnet-system"}, "release namespace kvnet-system"},
		{[]string{"--set", "monitoring.enabled=true"}, "does not serve ServiceMonitor"},
	} {
		args := append([]string{"template", "kvnet", chart, "--namespace", "kube-system"}, tc.args...)
		out, err := exec.Command(helm, args...).CombinedOutput()
		if err == nil {
			t.Errorf("helm %s: no error", strings.Join(tc.args, " "))
			continue
		}
		if !strings.Contains(string(out), tc.want) {
			t.Errorf("helm %s: error does not name %q:\n%s", strings.Join(tc.args, " "), tc.want, out)
		}
	}
}

// helmTemplate runs helm template on the chart with args and returns the
// release's objects (with its CRDs) and, apart, its hooks.
func helmTemplate(t *testing.T, helm, chart string, args ...string) (objs, hooks []*unstructured.Unstructured) {
	t.Helper()
	cmd := exec.Command(helm, append([]string{"template", "kvnet", chart, "--namespace", "kube-system", "--include-crds"}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helm template %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	all, err := install.Objects(out)
	if err != nil {
		t.Fatalf("helm template's output: %v", err)
	}
	for _, u := range all {
		if u.GetAnnotations()["helm.sh/hook"] != "" {
			hooks = append(hooks, u)
		} else {
			objs = append(objs, u)
		}
	}
	return objs, hooks
}

// compareObjects wants got and want to hold the same objects, in any
// order.
func compareObjects(t *testing.T, got, want []*unstructured.Unstructured) {
	t.Helper()
	key := func(u *unstructured.Unstructured) string {
		return fmt.Sprintf("%s %s %s/%s", u.GetAPIVersion(), u.GetKind(), u.GetNamespace(), u.GetName())
	}
	index := func(objs []*unstructured.Unstructured) map[string]*unstructured.Unstructured {
		m := map[string]*unstructured.Unstructured{}
		for _, u := range objs {
			if _, dup := m[key(u)]; dup {
				t.Errorf("%s twice", key(u))
			}
			m[key(u)] = u
		}
		return m
	}
	g, w := index(got), index(want)
	for k, wu := range w {
		gu, ok := g[k]
		if !ok {
			t.Errorf("the chart lacks %s", k)
			continue
		}
		if !equality.Semantic.DeepEqual(gu.Object, wu.Object) {
			t.Errorf("the chart's %s differs from kvnet install's:\nchart:   %v\ninstall: %v", k, gu.Object, wu.Object)
		}
	}
	for k := range g {
		if _, ok := w[k]; !ok {
			t.Errorf("the chart has %s, which kvnet install does not apply", k)
		}
	}
}

// helmBinary is hack/build-tools.sh's helm; make test builds it.
func helmBinary(t *testing.T) string {
	t.Helper()
	p, err := controlplane.Tool("helm")
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := repo.Root()
	if err != nil {
		t.Fatal(err)
	}
	return root
}
