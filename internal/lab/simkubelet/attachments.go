package simkubelet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/containernetworking/cni/libcni"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nadv1 "kvnet.io/kvnet/api/k8scni/v1"
	"kvnet.io/kvnet/internal/k8s/nads"
	"kvnet.io/kvnet/internal/multus"
)

// PrimaryIfName is the pod interface of the primary user-defined network,
// as OVN-Kubernetes names it.
const PrimaryIfName = "ovn-udn1"

// attachment is one CNI attachment of a pod.
type attachment struct {
	nad     string // "<namespace>/<name>"; the network name for the cluster default network
	ifName  string
	primary bool
	// clusterDefault marks the cluster default network of Multus mode.
	clusterDefault bool
	list           *libcni.NetworkConfigList
	capArgs        map[string]any
}

// plugin names the attachment's plugin(s) for messages.
func (a *attachment) plugin() string {
	if a.list == nil {
		return "?"
	}
	var ts []string
	for _, p := range a.list.Plugins {
		ts = append(ts, p.Network.Type)
	}
	return strings.Join(ts, ",")
}

func (a *attachment) String() string {
	return fmt.Sprintf("attachment %s (NAD %s, plugin %s)", a.ifName, a.nad, a.plugin())
}

// permanentError marks a failure that retrying cannot fix: the pod itself
// must change (and its update triggers a new attempt).
type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// ClusterDefaultIfName is the interface of the cluster default network in
// Multus mode, as Multus names it.
const ClusterDefaultIfName = "eth0"

// attachments computes the pod's attachments as Multus does for kvnet.
// With clusterDefault (Multus mode) the pod gets it as eth0, then only
// what its networks annotation selects: a primary network is attached
// only when selected there (kvnet's webhook does that). Without it, the
// namespace's primary network comes first as ovn-udn1, as OVN-Kubernetes
// attaches it.
func attachments(ctx context.Context, c client.Reader, pod *corev1.Pod, clusterDefault *libcni.NetworkConfigList) ([]*attachment, error) {
	if pod.Spec.HostNetwork {
		return nil, nil
	}
	var out []*attachment
	labelled, primaryKey, err := nads.Primary(ctx, c, pod.Namespace)
	if err != nil {
		return nil, fmt.Errorf("primary network of namespace %q: %w", pod.Namespace, err)
	}
	if clusterDefault != nil {
		out = append(out, &attachment{nad: clusterDefault.Name, ifName: ClusterDefaultIfName, clusterDefault: true, list: clusterDefault})
		labelled = false
	}
	if labelled {
		if primaryKey == "" {
			return nil, fmt.Errorf("namespace %q is labelled %q but has no primary kvnet-cni network attachment definition (yet)", pod.Namespace, "k8s.ovn.org/primary-user-defined-network")
		}
		a, err := load(ctx, c, primaryKey, PrimaryIfName)
		if err != nil {
			return nil, err
		}
		a.primary = true
		out = append(out, a)
	}
	if value, ok := pod.Annotations[multus.NetworksAnnotation]; ok {
		elems, err := multus.ParseSelection(multus.NetworksAnnotation, value, pod.Namespace)
		if err != nil {
			return nil, &permanentError{err}
		}
		for i, e := range elems {
			ifName := e.InterfaceRequest
			if ifName == "" {
				ifName = fmt.Sprintf("net%d", i+1)
			}
			a, err := load(ctx, c, e.Key(), ifName)
			if err != nil {
				return nil, fmt.Errorf("annotation %s element %d: %w", multus.NetworksAnnotation, i, err)
			}
			a.primary = clusterDefault != nil && e.Key() == primaryKey
			if len(e.CNIArgs) > 0 {
				if a.list, err = withCNIArgs(a.list, e.CNIArgs); err != nil {
					return nil, fmt.Errorf("annotation %s element %d: %s: cni-args: %w", multus.NetworksAnnotation, i, a, err)
				}
			}
			a.capArgs = map[string]any{}
			if len(e.IPRequest) > 0 {
				a.capArgs["ips"] = e.IPRequest
			}
			if e.MacRequest != "" {
				a.capArgs["mac"] = e.MacRequest
			}
			out = append(out, a)
		}
	}
	seen := map[string]bool{}
	for _, a := range out {
		if seen[a.ifName] {
			return nil, &permanentError{fmt.Errorf("annotation %s: interface %q is used twice", multus.NetworksAnnotation, a.ifName)}
		}
		seen[a.ifName] = true
	}
	return out, nil
}

// load reads NAD key and parses its spec.config: a single plugin
// configuration (made a one-plugin list, as libcni runs it the same way)
// or a configuration list.
func load(ctx context.Context, c client.Reader, key, ifName string) (*attachment, error) {
	ns, name, _ := strings.Cut(key, "/")
	var nad nadv1.NetworkAttachmentDefinition
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &nad); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("attachment %s: network attachment definition %s not found", ifName, key)
		}
		return nil, fmt.Errorf("attachment %s: read network attachment definition %s: %w", ifName, key, err)
	}
	a := &attachment{nad: key, ifName: ifName}
	list, err := parseConfig([]byte(nad.Spec.Config))
	if err != nil {
		return nil, fmt.Errorf("attachment %s: network attachment definition %s: spec.config: %w", ifName, key, err)
	}
	a.list = list
	return a, nil
}

// parseConfig reads a CNI configuration or configuration list.
func parseConfig(b []byte) (*libcni.NetworkConfigList, error) {
	var probe map[string]json.RawMessage
	if err := json.Unmarshal(b, &probe); err != nil {
		return nil, fmt.Errorf("not a JSON object: %w", err)
	}
	if _, ok := probe["plugins"]; ok {
		return libcni.ConfListFromBytes(b)
	}
	conf, err := libcni.ConfFromBytes(b)
	if err != nil {
		return nil, err
	}
	if conf.Network.Name == "" {
		return nil, errors.New(`missing "name"`)
	}
	return libcni.ConfListFromConf(conf)
}

// withCNIArgs adds an element's cni-args to every plugin's "args": {"cni":
// ...}, as Multus does.
func withCNIArgs(list *libcni.NetworkConfigList, cniArgs map[string]any) (*libcni.NetworkConfigList, error) {
	var raw map[string]any
	if err := json.Unmarshal(list.Bytes, &raw); err != nil {
		return nil, err
	}
	plugins, _ := raw["plugins"].([]any)
	for _, p := range plugins {
		pm, ok := p.(map[string]any)
		if !ok {
			continue
		}
		args, _ := pm["args"].(map[string]any)
		if args == nil {
			args = map[string]any{}
		}
		cni, _ := args["cni"].(map[string]any)
		if cni == nil {
			cni = map[string]any{}
		}
		for k, v := range cniArgs {
			cni[k] = v
		}
		args["cni"] = cni
		pm["args"] = args
	}
	b, err := json.Marshal(raw)
	if err != nil {
		return nil, err
	}
	return libcni.ConfListFromBytes(b)
}
