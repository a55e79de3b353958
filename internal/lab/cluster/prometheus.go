package cluster

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"
)

// A real Prometheus for the real cluster (the e2e's PrometheusAlerts):
// Debian's prometheus server, configured from config/monitoring as the
// Prometheus Operator would configure one: a scrape job per
// ServiceMonitor endpoint and PodMonitor endpoint, the targets each
// selects, labelled namespace, pod, container (and service) and job as
// the operator labels them, and the PrometheusRule's groups as its rule
// file. Debian's build has no Kubernetes service discovery (promtool
// rejects kubernetes_sd_configs), so the selection is kvnet's
// (DiscoverTargets), handed to Prometheus through file_sd_configs; the
// scraping, the rules and the alerts are Prometheus's own.

// PromJob is one scrape job: the targets of one endpoint of a
// ServiceMonitor or PodMonitor, listed in File.
type PromJob struct {
	Name string // serviceMonitor/<ns>/<name>/<i> or podMonitor/...
	File string // its file_sd file
	// Kind is ServiceMonitor or PodMonitor; Namespace and Monitor name it.
	Kind, Namespace, Monitor string
	// Match is the monitor's spec.selector.matchLabels; Port the
	// endpoint's named port.
	Match map[string]string
	Port  string
}

// PrometheusConfig returns a Prometheus configuration with a job per
// endpoint of the ServiceMonitors and PodMonitors among objs, each
// reading its targets from a file in sdDir (DiscoverTargets writes them),
// scraped every interval (the monitors' own intervals are overridden, so
// that a test need not wait), with rule files rules; and the jobs.
func PrometheusConfig(objs []*unstructured.Unstructured, sdDir string, interval time.Duration, rules []string) ([]byte, []PromJob, error) {
	var jobs []PromJob
	var scrape []any
	for _, u := range objs {
		var endpoints []any
		prefix := ""
		switch u.GetKind() {
		case "ServiceMonitor":
			prefix = "serviceMonitor"
			endpoints, _, _ = unstructured.NestedSlice(u.Object, "spec", "endpoints")
		case "PodMonitor":
			prefix = "podMonitor"
			endpoints, _, _ = unstructured.NestedSlice(u.Object, "spec", "podMetricsEndpoints")
		default:
			continue
		}
		match, _, err := unstructured.NestedStringMap(u.Object, "spec", "selector", "matchLabels")
		if err != nil || len(match) == 0 {
			return nil, nil, fmt.Errorf("%s %s/%s: spec.selector.matchLabels: want a non-empty map of strings (%v)", u.GetKind(), u.GetNamespace(), u.GetName(), err)
		}
		if len(endpoints) == 0 {
			return nil, nil, fmt.Errorf("%s %s/%s: no endpoints", u.GetKind(), u.GetNamespace(), u.GetName())
		}
		for i, e := range endpoints {
			ep, _ := e.(map[string]any)
			port, _ := ep["port"].(string)
			if port == "" {
				return nil, nil, fmt.Errorf("%s %s/%s: endpoint %d has no named port", u.GetKind(), u.GetNamespace(), u.GetName(), i)
			}
			path, _ := ep["path"].(string)
			if path == "" {
				path = "/metrics"
			}
			j := PromJob{Name: fmt.Sprintf("%s/%s/%s/%d", prefix, u.GetNamespace(), u.GetName(), i), Kind: u.GetKind(),
				Namespace: u.GetNamespace(), Monitor: u.GetName(), Match: match, Port: port}
			j.File = filepath.Join(sdDir, fmt.Sprintf("%s-%s-%s-%d.json", prefix, u.GetNamespace(), u.GetName(), i))
			jobs = append(jobs, j)
			scrape = append(scrape, map[string]any{
				"job_name":        j.Name,
				"scrape_interval": interval.String(),
				"metrics_path":    path,
				"file_sd_configs": []any{map[string]any{"files": []string{j.File}, "refresh_interval": interval.String()}},
				// The operator's job label, not the scrape job's name.
				"relabel_configs": []any{map[string]any{"source_labels": []string{"__tmp_job"}, "target_label": "job"}},
			})
		}
	}
	if len(jobs) == 0 {
		return nil, nil, fmt.Errorf("no ServiceMonitor or PodMonitor among %d objects", len(objs))
	}
	conf, err := yaml.Marshal(map[string]any{
		"global":         map[string]any{"scrape_interval": interval.String(), "evaluation_interval": interval.String()},
		"rule_files":     rules,
		"scrape_configs": scrape,
	})
	return conf, jobs, err
}

// TargetGroup is a file_sd target group.
type TargetGroup struct {
	Targets []string          `json:"targets"`
	Labels  map[string]string `json:"labels"`
}

// DiscoverTargets returns the target groups of job as the Prometheus
// Operator's configuration would find them: a ServiceMonitor's are the
// ready endpoints, on the named port, of the Services in its namespace
// with its labels (labels namespace, service, pod, job = the Service's
// name); a PodMonitor's the running pods in its namespace with its
// labels, at their container port of that name (labels namespace, pod,
// container, job = <namespace>/<monitor>). Prometheus's own label
// __tmp_job carries job (a relabelling sets it).
func DiscoverTargets(ctx context.Context, cs kubernetes.Interface, job PromJob) ([]TargetGroup, error) {
	sel := labels.SelectorFromSet(job.Match).String()
	var out []TargetGroup
	switch job.Kind {
	case "ServiceMonitor":
		svcs, err := cs.CoreV1().Services(job.Namespace).List(ctx, metav1.ListOptions{LabelSelector: sel})
		if err != nil {
			return nil, err
		}
		for _, svc := range svcs.Items {
			slices, err := cs.DiscoveryV1().EndpointSlices(job.Namespace).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + svc.Name})
			if err != nil {
				return nil, err
			}
			for _, es := range slices.Items {
				var port int32
				for _, p := range es.Ports {
					if p.Name != nil && *p.Name == job.Port && p.Port != nil {
						port = *p.Port
					}
				}
				if port == 0 {
					continue
				}
				for _, ep := range es.Endpoints {
					if ep.Conditions.Ready != nil && !*ep.Conditions.Ready || len(ep.Addresses) == 0 {
						continue
					}
					l := map[string]string{"namespace": job.Namespace, "service": svc.Name, "__tmp_job": svc.Name}
					if ep.TargetRef != nil && ep.TargetRef.Kind == "Pod" {
						l["pod"] = ep.TargetRef.Name
					}
					out = append(out, TargetGroup{Targets: []string{net.JoinHostPort(ep.Addresses[0], strconv.Itoa(int(port)))}, Labels: l})
				}
			}
		}
	case "PodMonitor":
		pods, err := cs.CoreV1().Pods(job.Namespace).List(ctx, metav1.ListOptions{LabelSelector: sel})
		if err != nil {
			return nil, err
		}
		for _, p := range pods.Items {
			if p.Status.Phase != corev1.PodRunning || p.Status.PodIP == "" || p.DeletionTimestamp != nil {
				continue
			}
			for _, c := range p.Spec.Containers {
				for _, cp := range c.Ports {
					if cp.Name != job.Port {
						continue
					}
					out = append(out, TargetGroup{Targets: []string{net.JoinHostPort(p.Status.PodIP, strconv.Itoa(int(cp.ContainerPort)))},
						Labels: map[string]string{"namespace": p.Namespace, "pod": p.Name, "container": c.Name, "__tmp_job": job.Namespace + "/" + job.Monitor}})
				}
			}
		}
	default:
		return nil, fmt.Errorf("job %s: kind %q", job.Name, job.Kind)
	}
	return out, nil
}

// PrometheusRules returns the groups of the PrometheusRules among objs as
// a Prometheus rule file. With noFor, every rule's "for" is dropped: the
// expressions as shipped, firing as soon as they hold, so that a test need
// not wait for their durations.
func PrometheusRules(objs []*unstructured.Unstructured, noFor bool) ([]byte, error) {
	var groups []any
	for _, u := range objs {
		if u.GetKind() != "PrometheusRule" {
			continue
		}
		gs, _, err := unstructured.NestedSlice(u.Object, "spec", "groups")
		if err != nil {
			return nil, fmt.Errorf("PrometheusRule %s/%s: spec.groups: %w", u.GetNamespace(), u.GetName(), err)
		}
		for _, g := range gs {
			gm, _ := g.(map[string]any)
			rules, _ := gm["rules"].([]any)
			for _, r := range rules {
				if rm, ok := r.(map[string]any); ok && noFor {
					delete(rm, "for")
				}
			}
			groups = append(groups, gm)
		}
	}
	if len(groups) == 0 {
		return nil, fmt.Errorf("no PrometheusRule groups among %d objects", len(objs))
	}
	return yaml.Marshal(map[string]any{"groups": groups})
}
