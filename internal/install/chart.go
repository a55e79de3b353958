package install

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

// ChartDir is where kvnet's Helm chart is, relative to the repo's root.
const ChartDir = "deploy/helm/kvnet"

// chartSettings maps each create-only ConfigMap of config/default to the
// chart value that fills it at install.
var chartSettings = map[string]string{
	"kvnet-node-config":      "nodeConfig",
	"kvnet-reserved-subnets": "reservedSubnets",
}

// generatedHeader starts every generated file of the chart.
const generatedHeader = "Generated from config/ by `make generate` (hack/gen-chart); do not edit: edit config/ and regenerate."

// ChartFiles returns the files of the Helm chart in ChartDir that are
// generated from config/, keyed by their path in the chart, so that the
// chart and kvnet install apply the same objects:
//
//   - crds/<name>.yaml: config/default's CRDs. Helm creates what is absent
//     and never changes or deletes a CRD after, as kvnet install keeps
//     foreign CRDs and kvnet uninstall keeps CRDs without --crds;
//   - templates/kvnet.yaml: every other object of config/default, with
//     the images from the values image.registry and image.tag, and the
//     create-only ConfigMaps' data from the values nodeConfig and
//     reservedSubnets (created from them, then kept as the cluster has
//     them: the helper kvnet.settings);
//   - templates/monitoring.yaml: config/monitoring, with
//     monitoring.enabled;
//   - values.yaml and values.schema.json: the defaults, which are
//     config/'s, and the checks kvnet install makes of the same settings.
//
// Templates' own {{ }} (the alerts') are escaped. The hand-written files
// (Chart.yaml, templates/_helpers.tpl, templates/pre-delete.yaml,
// templates/NOTES.txt) are not returned.
func ChartFiles() (map[string][]byte, error) {
	objs, err := RenderObjects(Options{})
	if err != nil {
		return nil, err
	}
	mon, err := MonitoringObjects()
	if err != nil {
		return nil, err
	}
	images := map[string]string{} // config/default's image reference -> template
	registry, tag := "", ""
	for _, ref := range ContainerImages(objs) {
		for _, im := range Images {
			reg, t, ok := splitImage(ref, im)
			if !ok {
				continue
			}
			if (registry != "" && reg != registry) || (tag != "" && t != tag) {
				return nil, fmt.Errorf("config/default: images %s and %s/...:%s differ in registry or tag; the chart has one of each", ref, registry, tag)
			}
			registry, tag = reg, t
			images[ref] = fmt.Sprintf(`{{ include "kvnet.image" (list . %q) | quote }}`, im)
		}
	}
	if len(images) != len(Images) {
		return nil, fmt.Errorf("config/default runs images %v; the chart needs one of each of %v", ContainerImages(objs), Images)
	}

	files := map[string][]byte{}
	var main bytes.Buffer
	fmt.Fprintf(&main, "{{- /* %s */ -}}\n{{- include \"kvnet.checkReleaseNamespace\" . }}\n", generatedHeader)
	settings := map[string]map[string]string{} // value -> defaults
	for _, u := range objs {
		if u.GetKind() == "CustomResourceDefinition" {
			b, err := yaml.Marshal(u.Object)
			if err != nil {
				return nil, err
			}
			files["crds/"+u.GetName()+".yaml"] = append([]byte("# "+generatedHeader+"\n"), b...)
			continue
		}
		obj := u.DeepCopy()
		value := ""
		if obj.GetKind() == "ConfigMap" && obj.GetAnnotations()[InstallAnnotation] == CreateOnly {
			var ok bool
			if value, ok = chartSettings[obj.GetName()]; !ok {
				return nil, fmt.Errorf("config/default: create-only ConfigMap %s has no chart value (install.chartSettings)", obj.GetName())
			}
			data, _, err := unstructured.NestedStringMap(obj.Object, "data")
			if err != nil {
				return nil, fmt.Errorf("ConfigMap %s: %w", obj.GetName(), err)
			}
			settings[value] = data
			obj.Object["data"] = "KVNET_CHART_SETTINGS"
		}
		b, err := yaml.Marshal(obj.Object)
		if err != nil {
			return nil, err
		}
		text := escapeTemplate(string(b))
		if value != "" {
			text = strings.Replace(text, "data: KVNET_CHART_SETTINGS\n",
				fmt.Sprintf("data:\n  {{- include \"kvnet.settings\" (list . %q %q) | nindent 2 }}\n", obj.GetName(), value), 1)
		}
		for ref, tmpl := range images {
			text = strings.ReplaceAll(text, "image: "+ref+"\n", "image: "+tmpl+"\n")
		}
		main.WriteString("---\n")
		main.WriteString(text)
	}
	files["templates/kvnet.yaml"] = main.Bytes()
	for value := range chartSettings {
		if _, ok := settings[chartSettings[value]]; !ok {
			return nil, fmt.Errorf("config/default has no create-only ConfigMap %s", value)
		}
	}

	var m bytes.Buffer
	fmt.Fprintf(&m, "{{- /* %s */ -}}\n{{- if .Values.monitoring.enabled }}\n{{- include \"kvnet.checkMonitoringCRDs\" . }}\n", generatedHeader)
	for _, u := range mon {
		b, err := yaml.Marshal(u.Object)
		if err != nil {
			return nil, err
		}
		m.WriteString("---\n")
		m.WriteString(escapeTemplate(string(b)))
	}
	m.WriteString("{{- end }}\n")
	files["templates/monitoring.yaml"] = m.Bytes()

	if files["values.yaml"], err = chartValues(registry, tag, settings); err != nil {
		return nil, err
	}
	if files["values.schema.json"], err = chartSchema(settings); err != nil {
		return nil, err
	}
	return files, nil
}

// splitImage splits ref, an image of config/default, into registry and
// tag when its name is im.
func splitImage(ref, im string) (registry, tag string, ok bool) {
	rest, tag, ok := strings.Cut(ref, "/"+im+":")
	if !ok || strings.Contains(tag, "/") {
		return "", "", false
	}
	return rest, tag, true
}

// escapeTemplate makes text, YAML that may hold {{ }} of its own (the
// alerts' Prometheus templates), print itself through Helm's templates.
func escapeTemplate(text string) string {
	return strings.NewReplacer("{{", `{{ "{{" }}`, "}}", `{{ "}}" }}`).Replace(text)
}

// chartValues writes values.yaml: the defaults, which are config/'s.
func chartValues(registry, tag string, settings map[string]map[string]string) ([]byte, error) {
	var b bytes.Buffer
	fmt.Fprintf(&b, `# %s
# kvnet's Helm chart applies the objects kvnet install applies (config/),
# with these settings; docs/install.md, "Helm".

image:
  # Registry (and path) of the kvnet-controller and kvnet-node images
  # (kvnet install --registry).
  registry: %s
  # Tag of both images (kvnet install --tag).
  tag: %s

`, generatedHeader, registry, tag)
	doc := map[string]string{
		"nodeConfig": `# kvnet-node's cluster settings: ConfigMap kvnet-system/kvnet-node-config
# (docs/install.md, "Cluster DNS, the API server and Services"); empty
# keeps kvnet-node's default. As with kvnet install, the ConfigMap is
# created from these values once and then kept as the cluster has it: edit
# it (kubectl -n kvnet-system edit configmap kvnet-node-config), then
# restart kvnet-node.`,
		"reservedSubnets": `# The cluster's reserved subnets: ConfigMap kvnet-system/kvnet-reserved-subnets
# (docs/udn.md, "Reserved subnets"), one IPv4 and one IPv6 subnet each.
# Created from these values once, then kept as the cluster has it.`,
	}
	for _, value := range sortedKeys(settings) {
		fmt.Fprintf(&b, "%s\n%s:\n", doc[value], value)
		for _, k := range sortedKeys(settings[value]) {
			v, err := json.Marshal(settings[value][k])
			if err != nil {
				return nil, err
			}
			fmt.Fprintf(&b, "  %s: %s\n", k, v)
		}
		b.WriteString("\n")
	}
	b.WriteString(`monitoring:
  # The ServiceMonitor, PodMonitor and PrometheusRule of config/monitoring
  # (kvnet install --monitoring); needs the Prometheus Operator's CRDs.
  enabled: false

preDelete:
  # helm uninstall first runs a Job (kvnet-controller --pre-delete) that
  # refuses while user-defined networks exist and runs kvnet-node --cleanup
  # on every node, as kvnet uninstall does; this bounds its wait for the
  # nodes. Keep it below helm's --timeout (default 5m).
  nodeCleanupTimeout: 4m
`)
	return b.Bytes(), nil
}

// chartSchema writes values.schema.json: Helm refuses values that kvnet
// install would refuse, naming the value.
func chartSchema(settings map[string]map[string]string) ([]byte, error) {
	obj := func(props map[string]any, required ...string) map[string]any {
		o := map[string]any{"type": "object", "additionalProperties": false, "properties": props}
		if len(required) > 0 {
			o["required"] = required
		}
		return o
	}
	props := map[string]any{
		"image": obj(map[string]any{
			"registry": map[string]any{"type": "string", "pattern": registryRE.String(),
				"description": "registry host[:port][/path] in lower case"},
			"tag": map[string]any{"type": "string", "pattern": tagRE.String(),
				"description": "1-128 of [A-Za-z0-9_.-], not starting with . or -"},
		}, "registry", "tag"),
		"monitoring": obj(map[string]any{"enabled": map[string]any{"type": "boolean"}}),
		"preDelete": obj(map[string]any{"nodeCleanupTimeout": map[string]any{"type": "string",
			"pattern": `^([0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h))+$`, "description": "a Go duration, e.g. 4m"}}),
	}
	for value, data := range settings {
		p := map[string]any{}
		for k := range data {
			p[k] = map[string]any{"type": []string{"string", "integer", "boolean"}}
		}
		props[value] = obj(p)
	}
	schema := map[string]any{
		"$schema":              "http://json-schema.org/draft-07/schema#",
		"title":                "kvnet",
		"type":                 "object",
		"additionalProperties": false,
		"properties":           props,
	}
	b, err := json.MarshalIndent(schema, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
