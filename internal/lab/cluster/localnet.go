package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"kvnet.io/kvnet/internal/physnet"
)

// createLocalnet maps PhysNetwork to PhysNodeBridge on every Ready node,
// as an admin does (kubectl annotate node ... kvnet.io/bridge-mappings=),
// and creates the Localnet CUDN localnetName over PhysSubnet, selecting
// nsLocalnet. Without a datacenter network it does nothing: the
// scenario reports why.
func (s *scenarios) createLocalnet(ctx context.Context) error {
	if !s.t.Datacenter.IsValid() {
		return nil
	}
	nodes, err := s.t.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("scenarios: list nodes: %w", err)
	}
	mapping := PhysNetwork + ":" + PhysNodeBridge
	for _, n := range nodes.Items {
		have := n.Annotations[physnet.BridgeMappingsAnnotation]
		m, err := physnet.ParseBridgeMappings(have)
		if err != nil {
			return fmt.Errorf("scenarios: node %s: annotation %s: %w", n.Name, physnet.BridgeMappingsAnnotation, err)
		}
		if _, ok := m[PhysNetwork]; ok {
			continue // the admin's choice stands
		}
		want := mapping
		if have != "" {
			want = have + "," + mapping
		}
		patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{physnet.BridgeMappingsAnnotation: want}}})
		if err != nil {
			return err
		}
		if _, err := s.t.Client.CoreV1().Nodes().Patch(ctx, n.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			return fmt.Errorf("scenarios: node %s: annotate %s=%s: %w", n.Name, physnet.BridgeMappingsAnnotation, want, err)
		}
	}
	cudn := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "k8s.ovn.org/v1", "kind": "ClusterUserDefinedNetwork",
		"metadata": map[string]any{"name": localnetName, "labels": map[string]any{ScenarioLabel: ""}},
		"spec": map[string]any{
			"namespaceSelector": map[string]any{"matchLabels": map[string]any{"kubernetes.io/metadata.name": nsLocalnet}},
			"network": map[string]any{"topology": "Localnet", "localnet": map[string]any{
				"role": "Secondary", "physicalNetworkName": PhysNetwork,
				"subnets":        []any{PhysSubnet.String()},
				"excludeSubnets": []any{netip.PrefixFrom(s.t.Datacenter, 32).String()},
			}},
		},
	}}
	if _, err := s.dyn.Resource(cudnGVR).Create(ctx, cudn, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("scenarios: create ClusterUserDefinedNetwork %s: %w", localnetName, err)
	}
	return nil
}

// localnet: see ScenarioLocalnet. This host serves, on its datacenter
// address, each client's own address as it sees it.
func (s *scenarios) localnet(ctx context.Context) (string, error) {
	if !s.t.Datacenter.IsValid() {
		return "", errors.New("no datacenter network on this host (ScenarioTarget.Datacenter)")
	}
	ps, err := s.need(ctx, nsLocalnet+"/loc-1", nsLocalnet+"/loc-2")
	if err != nil {
		return "", err
	}
	pair, err := s.reachEachOther(ctx, ps[0], ps[1], "net1", PhysSubnet)
	if err != nil {
		return "", err
	}
	ln, err := net.Listen("tcp4", netip.AddrPortFrom(s.t.Datacenter, 0).String())
	if err != nil {
		return "", fmt.Errorf("this host on the datacenter network: %w (a cluster made before it had one: make cluster-down, make cluster-up)", err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host, _, _ := net.SplitHostPort(r.RemoteAddr)
		fmt.Fprintf(w, "seen %s.\n", host)
	})}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	url := "http://" + ln.Addr().String() + "/"
	var seen []string
	for _, p := range ps {
		a, err := p.addr("net1", PhysSubnet)
		if err != nil {
			return "", err
		}
		body, err := s.reach(ctx, p, url, "seen "+a.String()+".")
		if err != nil {
			return "", fmt.Errorf("to the datacenter's host %s, which must see the pod's own address: %w", s.t.Datacenter, err)
		}
		seen = append(seen, fmt.Sprintf("%s %s", p, strings.TrimSuffix(body, ".")))
	}
	return fmt.Sprintf("%s; the datacenter's host %s: %s", pair, s.t.Datacenter, strings.Join(seen, ", ")), nil
}
