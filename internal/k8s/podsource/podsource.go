// Package podsource reads a pod's kvnet.io/pod-networks annotation from the
// API server for kvnet-cni (internal/cni.PodSource).
//
// It asks with one plain GET through client-go's REST transport (the
// kubeconfig's TLS and credentials), and decodes only the pod's
// annotations: the typed clientset would register every API group's
// types at start, which made each kvnet-cni process take 23 MB before
// doing anything. Thick Multus runs delegates inside its daemon's
// container, whose upstream memory limit is 50 MiB: a few concurrent
// ADDs got the daemon OOM-killed.
package podsource

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/version"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"kvnet.io/kvnet/internal/cni"
	"kvnet.io/kvnet/internal/podnetworks"
)

type source struct {
	host   string // the API server's base URL
	client *http.Client
}

// New returns a PodSource using the kubeconfig at path.
func New(path string) (cni.PodSource, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		return nil, fmt.Errorf("load kubeconfig %q: %w", path, err)
	}
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig %q: %w", path, err)
	}
	return &source{host: strings.TrimSuffix(cfg.Host, "/"), client: hc}, nil
}

// podMeta is what kvnet-cni reads of a pod.
type podMeta struct {
	Metadata struct {
		Annotations map[string]string `json:"annotations"`
	} `json:"metadata"`
}

func (s *source) PodNetworks(ctx context.Context, namespace, name string) (podnetworks.Networks, error) {
	u := s.host + "/api/v1/namespaces/" + url.PathEscape(namespace) + "/pods/" + url.PathEscape(name)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", "kvnet-cni")
	resp, err := s.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("get pod %s/%s: %w", namespace, name, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return nil, fmt.Errorf("get pod %s/%s: %w", namespace, name, err)
	}
	switch {
	case resp.StatusCode == http.StatusNotFound:
		return nil, fmt.Errorf("pod %s/%s not found", namespace, name)
	case resp.StatusCode != http.StatusOK:
		return nil, fmt.Errorf("get pod %s/%s: %s: %s", namespace, name, resp.Status, strings.TrimSpace(string(body)))
	}
	var pod podMeta
	if err := json.Unmarshal(body, &pod); err != nil {
		return nil, fmt.Errorf("get pod %s/%s: decode: %w", namespace, name, err)
	}
	v, ok := pod.Metadata.Annotations[podnetworks.Annotation]
	if !ok {
		return nil, nil
	}
	return podnetworks.Parse(v)
}

// PluginMain runs kvnet-cni (or, named kvnet-ipam, its IPAM-only mode):
// the main of cmd/kvnet-cni, and of the kvnet binary when invoked under
// one of those names (the lab installs it so).
func PluginMain() {
	p := &cni.Plugin{NewSource: New}
	skel.PluginMainFuncs(p.Funcs(), version.All, "kvnet-cni: wires pods as kvnet-controller allocated them")
}
