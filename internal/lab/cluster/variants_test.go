package cluster

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"kvnet.io/kvnet/internal/manifests"
)

func TestUpRejectsUnknownVariant(t *testing.T) {
	for _, cfg := range []Config{
		{Nodes: 1, Multus: "thinn"},
		{Nodes: 1, DefaultNetwork: "calico"},
	} {
		cfg.Dir = t.TempDir()
		_, err := Up(context.Background(), cfg)
		if err == nil {
			t.Fatalf("Up(%+v): no error", cfg)
		}
		bad := cfg.Multus + cfg.DefaultNetwork
		namesValid := strings.Contains(err.Error(), `"`+MultusThin+`"`) || strings.Contains(err.Error(), `"`+NetworkPTP32+`"`)
		if !strings.Contains(err.Error(), `"`+bad+`"`) || !namesValid {
			t.Errorf("Up(%+v): %v, want the bad value %q and the valid ones named", cfg, err, bad)
		}
	}
}

// TestMultusThinManifest: the thin manifest renders with the image in
// both containers, which run what the multus-thin image holds.
func TestMultusThinManifest(t *testing.T) {
	const image = "10.89.0.1:5000/kvnet-lab/multus-thin:lab"
	b, err := renderManifest("multus-thin", map[string]string{"Image": image})
	if err != nil {
		t.Fatal(err)
	}
	objs, err := manifests.Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	var ds *appsv1.DaemonSet
	for _, o := range objs {
		if o.GetKind() == "DaemonSet" {
			ds = &appsv1.DaemonSet{}
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, ds); err != nil {
				t.Fatal(err)
			}
		}
	}
	if ds == nil || ds.Name != MultusDaemonSet || ds.Namespace != "kube-system" {
		t.Fatalf("no DaemonSet kube-system/%s in the manifest: %+v", MultusDaemonSet, ds)
	}
	dir := t.TempDir()
	for _, b := range multusThinBinaries {
		if err := os.WriteFile(filepath.Join(dir, b), []byte(b), 0o755); err != nil { //nolint:gosec // a test file
			t.Fatal(err)
		}
	}
	img, err := multusThinImage(dir)
	if err != nil {
		t.Fatal(err)
	}
	has := map[string]bool{}
	for _, f := range img.files {
		has["/"+f.path] = !f.dir
	}
	pod := ds.Spec.Template.Spec
	for _, ctr := range append(pod.InitContainers, pod.Containers...) {
		if ctr.Image != image {
			t.Errorf("container %s: image %q, want %q", ctr.Name, ctr.Image, image)
		}
		if len(ctr.Command) == 0 || !has[ctr.Command[0]] {
			t.Errorf("container %s runs %v, which the multus-thin image lacks", ctr.Name, ctr.Command)
		}
	}
	if got := strings.Join(img.entry, " "); got != "/thin_entrypoint" {
		t.Errorf("multus-thin entrypoint %q, want /thin_entrypoint (upstream's)", got)
	}
	// thin_entrypoint copies the plugin from its default --multus-bin-file.
	if !has["/usr/src/multus-cni/bin/multus"] {
		t.Error("multus-thin lacks /usr/src/multus-cni/bin/multus")
	}
}

// TestPTP32Conflist: ptp with host-local on the node's pod subnet and the
// link-local gateway, then the lab's ptp32.
func TestPTP32Conflist(t *testing.T) {
	b, err := node{i: 2}.ptp32Conflist()
	if err != nil {
		t.Fatal(err)
	}
	var conf struct {
		Plugins []struct {
			Type string `json:"type"`
			IPAM struct {
				Type   string                `json:"type"`
				Ranges [][]map[string]string `json:"ranges"`
			} `json:"ipam"`
		} `json:"plugins"`
	}
	if err := json.Unmarshal(b, &conf); err != nil {
		t.Fatal(err)
	}
	if len(conf.Plugins) != 2 || conf.Plugins[0].Type != "ptp" || conf.Plugins[1].Type != ptp32Plugin {
		t.Fatalf("plugins %s: want ptp, then ptp32", b)
	}
	ipam := conf.Plugins[0].IPAM
	if ipam.Type != "host-local" || len(ipam.Ranges) != 1 || len(ipam.Ranges[0]) != 1 ||
		ipam.Ranges[0][0]["subnet"] != "10.244.2.0/24" || ipam.Ranges[0][0]["gateway"] != "169.254.1.1" {
		t.Errorf("ptp's IPAM %+v: want host-local on 10.244.2.0/24 with gateway 169.254.1.1", ipam)
	}
}
